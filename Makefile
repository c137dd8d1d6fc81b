# `make demo` and `make test` are the two set-up commands: each creates .venv when missing,
# installs the project with what it needs, then runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench lint format clean

LINTED := pearl actors transports tests benchmarks examples

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,dev]'
	@touch $(STAMP)

# The main job on the embedded default: asynchronous agentic RL on an elastic pool (pearl demo).
demo: $(STAMP)
	$(VENV)/bin/pearl demo --config configs/local-cpu.toml

test: $(STAMP)
	$(PY) -m pytest --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy pearl actors transports

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINTED)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
