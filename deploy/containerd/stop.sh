#!/usr/bin/env bash
# Stop podvisor's private containerd instance in DIR and leave nothing behind.
#
#   deploy/containerd/stop.sh [--purge] DIR
#
# 1. Deletes every task and container the instance holds (all namespaces), which stops their shims.
# 2. Stops containerd by the pid in DIR/containerd.pid (SIGTERM, then SIGKILL after 10 s).
# 3. Kills (by pid) any shim still serving this instance's socket, and any process left in one of
#    its containers' cgroups.
# 4. Unmounts everything mounted under DIR (network namespaces too), removes the containers' cgroup
#    folders and their empty parents (containerd 1.6 leaves pod-level folders behind) and the
#    whole CGROUP_PARENT tree from DIR/instance.env, and the instance's shim sockets under
#    /run/containerd/s.
# 5. Deletes the iptables nat rules CNI's portmap made for this instance's network (and portmap's
#    shared CNI-HOSTPORT-* chains once no port mapping of any network is left; cni.py cleanup)
#    and the pod network's bridge (BRIDGE in DIR/instance.env).
# 6. --purge: removes DIR itself (with the host-local IPAM state and the network namespaces).
# Safe to run twice, or on an instance that already died.
set -uo pipefail

die() { echo "stop.sh: $*" >&2; exit 1; }
purge=0
if [[ "${1:-}" == "--purge" ]]; then purge=1; shift; fi
[[ $# -eq 1 ]] || die "usage: stop.sh [--purge] DIR"
DIR="$1"
[[ "$DIR" == /* ]] || DIR="$(pwd)/$DIR"
DIR="${DIR%/}"
[[ -f "$DIR/config.toml" ]] || die "$DIR is not a containerd instance dir (no config.toml)"
SOCK="$DIR/run/containerd.sock"
TASKS="$DIR/state/io.containerd.runtime.v2.task"
CGROUP_PARENT="$(sed -n 's/^CGROUP_PARENT=//p' "$DIR/instance.env" 2>/dev/null)"
ctr_() { timeout 20 ctr --address "$SOCK" "$@"; }

alive() {  # a zombie (e.g. containerd, a child of a subreaping pytest) counts as gone
    [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null \
        && [[ "$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

wait_gone() {  # wait_gone SECONDS PID...: poll until every pid has exited
    local deadline=$((SECONDS + $1)) pid left
    shift
    while :; do
        left=0
        for pid in "$@"; do alive "$pid" && left=1; done
        (( left && SECONDS < deadline )) || return "$left"
        sleep 0.1
    done
}

stop_pids() {  # stop_pids PID...: SIGTERM, then SIGKILL what is left after 5 s
    (( $# )) || return 0
    kill -TERM "$@" 2>/dev/null
    wait_gone 5 "$@" || { kill -KILL "$@" 2>/dev/null; wait_gone 5 "$@"; }
}

# What the bundles tell us, read before deleting anything: cgroup paths and shim sockets.
declare -A CGROUPS=() SHIM_SOCKETS=()
for bundle in "$TASKS"/*/*; do
    [[ -f "$bundle/config.json" ]] || continue
    cg="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))
        .get("linux", {}).get("cgroupsPath", ""))' "$bundle/config.json" 2>/dev/null)"
    [[ -n "$cg" ]] && CGROUPS["$cg"]=1
    if [[ -f "$bundle/address" ]]; then
        addr="$(cat "$bundle/address")"
        SHIM_SOCKETS["${addr#unix://}"]=1
    fi
done

# 1. Tasks and containers, through containerd itself.
pid="$(cat "$DIR/containerd.pid" 2>/dev/null || true)"
[[ "$pid" =~ ^[0-9]+$ && "$(readlink "/proc/$pid/exe" 2>/dev/null)" == */containerd ]] || pid=""
if alive "$pid" && ctr_ version >/dev/null 2>&1; then
    for ns in $(ctr_ namespaces ls -q); do
        # Deleting a sandbox's task can take its containers' tasks with it: re-list a few times.
        for _ in 1 2 3; do
            tasks="$(ctr_ -n "$ns" tasks ls -q 2>/dev/null)"
            [[ -n "$tasks" ]] || break
            for id in $tasks; do
                ctr_ -n "$ns" tasks delete --force "$id" >/dev/null 2>&1
            done
        done
        [[ -z "$tasks" ]] || echo "stop.sh: tasks left in $ns: $(echo $tasks)" >&2
        for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
            ctr_ -n "$ns" containers delete "$id" >/dev/null 2>&1 \
                || echo "stop.sh: could not delete container $ns/$id" >&2
        done
    done
fi

# 2. containerd.
if alive "$pid"; then
    kill -TERM "$pid"
    wait_gone 10 "$pid" || { kill -KILL "$pid"; wait_gone 5 "$pid"; }
    echo "stop.sh: containerd (pid $pid) stopped"
fi

# 3. Shims of this instance (matched by the exact -address argument), then container leftovers.
shims=()
for proc in /proc/[0-9]*; do
    mapfile -d '' -t argv 2>/dev/null <"$proc/cmdline" || continue
    [[ "${argv[0]:-}" == *containerd-shim* ]] || continue
    for ((i = 1; i < ${#argv[@]}; i++)); do
        if [[ "${argv[i-1]}" == "-address" && "${argv[i]}" == "$SOCK" ]]; then
            shims+=("${proc#/proc/}")
        fi
    done
done
if (( ${#shims[@]} )); then
    echo "stop.sh: stopping leftover shims: ${shims[*]}"
    stop_pids "${shims[@]}"
fi

cgroup_dirs() {  # every hierarchy's folder for each recorded cgroup path and the CGROUP_PARENT tree
    local cg
    for cg in "${!CGROUPS[@]}" ${CGROUP_PARENT:+"$CGROUP_PARENT"}; do
        [[ "$cg" == *..* || "$cg" == *:* ]] && continue  # never walk outside; skip systemd slices
        compgen -G "/sys/fs/cgroup/*/${cg#/}" || true
        compgen -G "/sys/fs/cgroup/${cg#/}" || true
    done
}
mapfile -t dirs < <(cgroup_dirs | sort -u)
left=()
for d in "${dirs[@]}"; do
    [[ -d "$d" ]] || continue
    mapfile -t procs < <(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    left+=("${procs[@]}")
done
mapfile -t left < <(printf '%s\n' "${left[@]}" | grep -E '^[0-9]+$' | sort -u)
if (( ${#left[@]} )); then
    echo "stop.sh: killing processes left in the instance's cgroups: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null
    wait_gone 5 "${left[@]}"
fi

# 4a. Mounts under DIR, deepest first.
mapfile -t mounts < <(awk -v d="$DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo \
    | sort -r -u)
for m in "${mounts[@]}"; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "stop.sh: cannot unmount $m" >&2
done

# 4b. Cgroup folders: each leaf, then its empty parents up to (not including) the first level,
#     except that our own CGROUP_PARENT folder goes too.
for d in "${dirs[@]}"; do
    [[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    parent="$(dirname "$d")"
    while [[ "$(dirname "$(dirname "$parent")")" == /sys/fs/cgroup/* ]]; do
        rmdir "$parent" 2>/dev/null || break
        parent="$(dirname "$parent")"
    done
done

# 4c. Shim sockets and our own sockets.
for s in "${!SHIM_SOCKETS[@]}"; do
    [[ "$s" == /run/containerd/s/* ]] && rm -f "$s"
done
rm -f "$SOCK" "$SOCK.ttrpc" "$DIR/containerd.pid"

# 5. The pod network: iptables rules of this network, then the bridge. The host-local IPAM state
#    is reset with them (no pod of this instance holds an address any more).
if [[ -f "$DIR/cni/net.d/10-podvisor.conflist" ]]; then
    python3 "$(dirname "${BASH_SOURCE[0]}")/cni.py" cleanup "$DIR"
    rm -rf "$DIR/cni/ipam"
    mkdir -p "$DIR/cni/ipam"
fi
BRIDGE="$(sed -n 's/^BRIDGE=//p' "$DIR/instance.env" 2>/dev/null)"
if [[ -n "$BRIDGE" ]] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" && echo "stop.sh: removed bridge $BRIDGE"
fi

if (( purge )); then
    rm -rf --one-file-system "$DIR"
    echo "stop.sh: removed $DIR"
fi
echo "stop.sh: done"
