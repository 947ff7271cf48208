#!/usr/bin/env bash
# issue 28: the pytest plugin as a user gets it. A fresh venv, podvisor installed from this
# checkout (as `pip install podvisor` would install it) with plain pytest, and only
# docs/examples/test_workload.py, run by `pytest` in a folder of its own (no conftest, no
# pyproject of ours around it).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/pvexample.XXXXXX)
trap 'rm -rf "$dir"' EXIT
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q . pytest
cp docs/examples/test_workload.py "$dir/"
cd "$dir"
"$dir/venv/bin/pytest" -q -p no:cacheprovider test_workload.py
