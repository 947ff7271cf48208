# podvisor developer tasks. `make run` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= deploy/podvisor.yaml

.PHONY: venv run test test-deps lint typecheck soak bench clean example

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The agent itself prints how to look at it from another shell (exact for its config).
run: venv
	@echo "podvisor: pods from deploy/examples"
	$(VENV)/bin/podvisor run --config $(CONFIG)

# mypy cannot follow setuptools' editable import hook, so check the package through a tree of
# symlinks that spells the installed layout (podvisor/{cli,supervisor,ipc,common,services,testing}).
typecheck: venv
	rm -rf .typecheck && mkdir -p .typecheck/podvisor
	for d in cli supervisor ipc common services testing; do ln -s ../../$$d .typecheck/podvisor/$$d; done
	cd .typecheck && ../$(VENV)/bin/mypy --config-file ../pyproject.toml -p podvisor

# lint-imports: the layering contracts in pyproject.toml ([tool.importlinter]).
lint: venv typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The outside tools the tests drive (.ci/test-packages.txt), from Debian when root with apt.
test-deps:
	bash .ci/test-deps.sh

# TEST_WORKERS=3: the suite in 3 processes (pytest-xdist): most tests wait on real processes,
# so 3 workers fill 2 cores; tests/conftest.py groups the tests that share a machine-wide
# resource. 0 (the default until runs in workers pass as often as runs in one process): one.
TEST_WORKERS ?= 0

test: test-deps lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup

# issue 28: docs/examples/test_workload.py with podvisor installed in a fresh venv (.ci/run too)
example:
	bash .ci/example.sh

soak: venv
	$(VENV)/bin/pytest -q -m slow

bench: venv
	$(PY) -m bench

clean:
	rm -rf $(VENV) .typecheck build *.egg-info
