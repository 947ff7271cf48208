#!/usr/bin/env bash
# Install the outside tools the tests drive as real clients (registry, browser, promtool, ...),
# from Debian's packages, when this machine can: root with apt-get. Each line of
# .ci/test-packages.txt is "COMMAND PACKAGE": PACKAGE is installed when COMMAND is missing
# (a COMMAND starting with / is a file, e.g. a header for the C monitor's build).
# Without root or apt-get it prints what is missing and exits 0: the tests that need a missing
# tool are skipped with the reason (CI runs as root, so there they all run).
set -uo pipefail
cd "$(dirname "$0")/.."

missing=()
while read -r cmd pkg; do
    [[ -z "${cmd:-}" || "$cmd" == \#* ]] && continue
    if [[ "$cmd" == /* ]]; then
        [[ -e "$cmd" ]] || missing+=("$pkg")
    else
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    fi
done < .ci/test-packages.txt
[[ ${#missing[@]} -eq 0 ]] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test-deps: not installed (their tests will be skipped): ${missing[*]}" \
         "(as root: apt-get install ${missing[*]})"
    exit 0
fi
echo "test-deps: installing ${missing[*]}"
apt-get update -qq >/dev/null 2>&1 || true
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null; then
    echo "test-deps: apt-get install failed; the tests that need these are skipped: ${missing[*]}"
fi
exit 0
