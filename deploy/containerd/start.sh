#!/usr/bin/env bash
# Start podvisor's private containerd instance in DIR (prepared by setup.sh) in the background.
#
#   deploy/containerd/start.sh DIR
#
# Runs `setup.sh --no-install DIR` (idempotent), creates the pod network's bridge (BRIDGE with
# GATEWAY/24 from DIR/instance.env; pods reach this machine through it, nothing else), starts
# containerd in its own session with
# DIR/config.toml (pid in DIR/containerd.pid, log in DIR/containerd.log), waits until its socket
# answers, imports the pause and busybox images into the k8s.io namespace, and prints
# `ENDPOINT=unix://DIR/run/containerd.sock` as its last line. If the instance is already running
# it only re-imports the images. On failure it exits 1 with the reason (and the log tail) on stderr.
# containerd is re-parented away from the caller (it is not the caller's child once this exits).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TIMEOUT="${PODVISOR_CONTAINERD_START_TIMEOUT:-30}"

started=""
die() {  # the reason goes last, so callers showing the tail of stderr show it
    if [[ -n "${DIR:-}" && -f "$DIR/containerd.log" ]]; then
        echo "--- last lines of $DIR/containerd.log:" >&2
        tail -n 15 "$DIR/containerd.log" >&2
    fi
    if [[ -n "$started" ]] && kill -0 "$started" 2>/dev/null; then
        "$HERE/stop.sh" "$DIR" >/dev/null 2>&1  # do not leave a half-started instance behind
    fi
    echo "start.sh: $*" >&2
    exit 1
}

[[ $# -eq 1 ]] || die "usage: start.sh DIR"
DIR="$1"
[[ "$DIR" == /* ]] || DIR="$(pwd)/$DIR"
DIR="${DIR%/}"
[[ "$(id -u)" == 0 ]] || die "containerd needs root (running as uid $(id -u))"
CONTAINERD="$(command -v containerd)" \
    || die "containerd is not installed (run $HERE/setup.sh $DIR as root)"
"$HERE/setup.sh" --no-install "$DIR" >/dev/null
SOCK="$DIR/run/containerd.sock"
env_() { sed -n "s/^$1=//p" "$DIR/instance.env"; }
BRIDGE="$(env_ BRIDGE)"
SUBNET="$(env_ SUBNET)"
GATEWAY="$(env_ GATEWAY)"
ctr_() { timeout 20 ctr --address "$SOCK" "$@"; }

running_pid() {
    local pid
    [[ -f "$DIR/containerd.pid" ]] || return 1
    pid="$(cat "$DIR/containerd.pid")"
    [[ "$pid" =~ ^[0-9]+$ && "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$CONTAINERD" ]] || return 1
    echo "$pid"
}

# The bridge the CNI bridge plugin attaches pods to, with its address set here (the conflist says
# isGateway: false, so the plugin never enables IP forwarding). A route to SUBNET through another
# device means another network already uses it: refuse rather than shadow it.
if [[ -n "$BRIDGE" ]]; then
    other="$(ip -4 -o route show "$SUBNET" | grep -v " dev $BRIDGE " || true)"
    [[ -z "$other" ]] || die "subnet $SUBNET of $DIR/cni/net.d is already routed here: $other"
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add name "$BRIDGE" type bridge \
        || die "cannot create bridge $BRIDGE"
    ip -4 addr show dev "$BRIDGE" | grep -q " $GATEWAY/" \
        || ip addr add "$GATEWAY/${SUBNET#*/}" dev "$BRIDGE" \
        || die "cannot set $GATEWAY on bridge $BRIDGE"
    ip link set "$BRIDGE" up || die "cannot bring bridge $BRIDGE up"
fi

if pid="$(running_pid)"; then
    echo "start.sh: containerd already running (pid $pid)"
else
    rm -f "$SOCK" "$SOCK.ttrpc"
    [[ -f "$DIR/containerd.log" ]] && mv -f "$DIR/containerd.log" "$DIR/containerd.log.1"
    # A non-interactive shell keeps background jobs in its own process group, so setsid execs
    # containerd directly (no extra fork) and $! is containerd's pid.
    setsid "$CONTAINERD" --config "$DIR/config.toml" </dev/null >>"$DIR/containerd.log" 2>&1 &
    pid=$!
    started="$pid"
    echo "$pid" >"$DIR/containerd.pid"
    echo "start.sh: started containerd (pid $pid), log $DIR/containerd.log"
fi

deadline=$((SECONDS + TIMEOUT))
until [[ -S "$SOCK" ]] && ctr_ version >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || die "containerd (pid $pid) exited during start-up"
    (( SECONDS < deadline )) || die "containerd socket $SOCK did not answer within ${TIMEOUT}s"
    sleep 0.1
done

for image in pause busybox; do
    out="$(ctr_ -n k8s.io images import "$DIR/images/$image.tar" 2>&1)" \
        || die "importing $DIR/images/$image.tar failed: $out"
done
images="$(ctr_ -n k8s.io images ls -q)" || die "listing images failed"
for image in localhost/podvisor/pause:1 localhost/podvisor/busybox:1; do
    [[ $'\n'"$images"$'\n' == *$'\n'"$image"$'\n'* ]] || die "$image missing after import"
done
echo "ENDPOINT=unix://$SOCK"
