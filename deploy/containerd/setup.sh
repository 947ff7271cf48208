#!/usr/bin/env bash
# Prepare a private containerd instance directory for podvisor's tests, CI and benchmarks.
#
#   deploy/containerd/setup.sh [--no-install] DIR
#
# 1. Installs containerd, runc, busybox-static, gcc, libc6-dev, containernetworking-plugins and
#    iptables from the OS (Debian) packages when a tool is missing (needs root and apt-get;
#    --no-install makes a missing tool an error instead).
# 2. Builds a static pause binary (pause.c) and, offline, two OCI-layout image tarballs
#    (build_images.py): DIR/images/pause.tar and DIR/images/busybox.tar.
# 3. Renders DIR/config.toml from config.toml.in (every path under DIR: own socket, root, state,
#    runc root, network namespaces) and DIR/instance.env (ENDPOINT, IMAGE, PAUSE_IMAGE,
#    CGROUP_PARENT, and the pod network: BRIDGE, SUBNET, GATEWAY, NETWORK).
# 4. Writes the CNI conflist DIR/cni/net.d/10-podvisor.conflist (cni.py: bridge + host-local IPAM
#    on a /24 of 10.200.0.0/13 that nothing on this machine uses, portmap for hostPort; containerd
#    adds loopback itself), so pods without hostNetwork get their own network namespace and IP.
#    PODVISOR_CONTAINERD_CNI=off leaves it out (and removes it): containerd then reports
#    NetworkReady=false and runs hostNetwork pods only. Running start.sh again without it on a
#    running instance turns the network on (containerd reads the conf dir live).
# Idempotent: re-running changes nothing that is already in place. Then use start.sh DIR / stop.sh DIR.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PAUSE_IMAGE="localhost/podvisor/pause:1"
BUSYBOX_IMAGE="localhost/podvisor/busybox:1"
PACKAGES=(containerd runc busybox-static gcc libc6-dev containernetworking-plugins iptables)
CNI_BIN_DIR=/usr/lib/cni

die() { echo "setup.sh: $*" >&2; exit 1; }

install=1
if [[ "${1:-}" == "--no-install" ]]; then install=0; shift; fi
[[ $# -eq 1 ]] || die "usage: setup.sh [--no-install] DIR"
DIR="$1"
[[ "$DIR" == /* ]] || DIR="$(pwd)/$DIR"
DIR="${DIR%/}"
[[ "$DIR" =~ ^/[A-Za-z0-9._/+-]+$ ]] || die "DIR must be a plain absolute path (got '$DIR')"
# sockaddr_un holds 107 bytes; the longest socket we name is the ttrpc one.
(( ${#DIR} + 29 <= 107 )) || die "DIR is too long for a unix socket path: $DIR"

static_busybox() {
    local candidate
    for candidate in /bin/busybox /usr/bin/busybox; do
        if [[ -x "$candidate" && "$(ldd "$candidate" 2>&1 || true)" == *"not a dynamic executable"* ]]
        then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

missing_tools() {
    local tool
    for tool in containerd ctr containerd-shim-runc-v2 runc gcc iptables iptables-save ip; do
        command -v "$tool" >/dev/null 2>&1 || echo "$tool"
    done
    for plugin in loopback bridge host-local portmap; do
        [[ -x "$CNI_BIN_DIR/$plugin" ]] || echo "cni-$plugin"
    done
    static_busybox >/dev/null || echo "busybox-static"
    [[ -n "$(gcc -print-file-name=libc.a 2>/dev/null | grep /)" ]] || echo "libc.a"
}

missing="$(missing_tools | tr '\n' ' ')"
if [[ -n "$missing" ]]; then
    (( install )) || die "missing: $missing(install them: run $HERE/setup.sh $DIR as root)"
    [[ "$(id -u)" == 0 ]] || die "missing: $missing(installing needs root)"
    command -v apt-get >/dev/null || die "missing: $missing(and no apt-get to install them)"
    echo "setup.sh: installing ${PACKAGES[*]} (missing: $missing)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
    missing="$(missing_tools | tr '\n' ' ')"
    [[ -z "$missing" ]] || die "still missing after apt-get install: $missing"
fi

mkdir -p "$DIR"/{build,images,root,state,run,runc,opt,cni/net.d,cni/ipam}
chmod 0700 "$DIR/run"

if [[ ! -x "$DIR/build/pause" || "$HERE/pause.c" -nt "$DIR/build/pause" ]]; then
    gcc -static -O2 -Wall -Wextra -o "$DIR/build/pause.tmp" "$HERE/pause.c"
    strip "$DIR/build/pause.tmp" 2>/dev/null || true
    mv -f "$DIR/build/pause.tmp" "$DIR/build/pause"
fi
python3 "$HERE/build_images.py" --pause "$DIR/build/pause" \
    --busybox "$(static_busybox)" --out "$DIR/images"

if [[ "${PODVISOR_CONTAINERD_CNI:-on}" == off ]]; then  # hostNetwork pods only (tests)
    rm -f "$DIR/cni/net.d/10-podvisor.conflist"
    network=""
else
    network="$(python3 "$HERE/cni.py" conflist "$DIR")"  # BRIDGE= SUBNET= GATEWAY= NETWORK=
fi

render() {
    sed -e "s|@DIR@|$DIR|g" -e "s|@PAUSE_IMAGE@|$PAUSE_IMAGE|g" \
        -e "s|@RUNC@|$(command -v runc)|g" -e "s|@CNI_BIN_DIR@|$CNI_BIN_DIR|g" \
        "$HERE/config.toml.in"
}
render >"$DIR/config.toml.tmp" && mv -f "$DIR/config.toml.tmp" "$DIR/config.toml"

tag="$(printf '%s' "$DIR" | sha256sum | cut -c1-8)"
cat >"$DIR/instance.env.tmp" <<EOF
ENDPOINT=unix://$DIR/run/containerd.sock
IMAGE=$BUSYBOX_IMAGE
PAUSE_IMAGE=$PAUSE_IMAGE
CGROUP_PARENT=/podvisor-containerd-$tag
EOF
[[ -z "$network" ]] || tr ' ' '\n' <<<"$network" >>"$DIR/instance.env.tmp"
mv -f "$DIR/instance.env.tmp" "$DIR/instance.env"
echo "setup.sh: ready in $DIR (start it with: $HERE/start.sh $DIR)"
