#!/usr/bin/env bash
# CI fragment: set up and start a private containerd for the test suite when this machine can.
#
#   .ci/containerd.sh [DIR]        (DIR defaults to a new /tmp/pvctr.XXXXXX)
#
# Runs deploy/containerd/setup.sh DIR (installs containerd/runc/busybox-static and the CNI plugins
# (containernetworking-plugins, iptables) from apt when root and missing) and
# deploy/containerd/start.sh DIR: pods without hostNetwork get an IP on the instance's bridge.
# Exports nothing. The LAST line of its output is
#   PODVISOR_CONTAINERD_ENDPOINT=unix://DIR/run/containerd.sock   when containerd is up, or
#   containerd: unavailable: <why>                                 when it is not.
# Always exits 0: without containerd the suite still runs and its containerd tests say skipped
# with the reason. Stop it afterwards with: deploy/containerd/stop.sh [--purge] DIR (which also
# removes the bridge and the iptables rules of the instance's pod network).
set -uo pipefail
cd "$(dirname "$0")/.."

DIR="${1:-$(mktemp -d /tmp/pvctr.XXXXXX)}"

unavailable() {
    echo "containerd: unavailable: $*"
    exit 0
}

indent() { sed 's/^/  | /'; }

[[ "$(id -u)" == 0 ]] || unavailable "not root (uid $(id -u)); containerd needs root"
if ! command -v containerd >/dev/null 2>&1 && ! command -v apt-get >/dev/null 2>&1; then
    unavailable "containerd is not installed and there is no apt-get to install it"
fi

echo "containerd: setting up $DIR"
if ! out="$(bash deploy/containerd/setup.sh "$DIR" 2>&1)"; then
    indent <<<"$out"
    unavailable "setup failed: $(tail -n 1 <<<"$out")"
fi
indent <<<"$out"

echo "containerd: starting"
if ! out="$(bash deploy/containerd/start.sh "$DIR" 2>&1)"; then
    indent <<<"$out"
    bash deploy/containerd/stop.sh "$DIR" 2>&1 | indent
    unavailable "start failed: $(tail -n 1 <<<"$out")"  # start.sh prints its reason last
fi
indent <<<"$out"
endpoint="$(sed -n 's/^ENDPOINT=//p' <<<"$out" | tail -n 1)"
[[ -n "$endpoint" ]] || unavailable "start.sh printed no ENDPOINT line"
echo "PODVISOR_CONTAINERD_ENDPOINT=$endpoint"
