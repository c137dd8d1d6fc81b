# `make demo` and `make test` are the two set-up commands: each creates .venv when missing,
# installs the project with what it needs, then runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,dev]'
	@touch $(STAMP)

# Until the RL demo lands (pearl demo), the most end-to-end thing that runs: pearld on the paper's
# cluster with sim engines, a real Bamboo segment replayed against it, training steps between.
demo: $(STAMP)
	@echo "make demo: pearld + a replayed Bamboo trace on sim engines (the RL demo is not built yet)"
	$(PY) examples/elastic_trace.py --seconds 60

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check pearl actors transports tests benchmarks examples
	$(VENV)/bin/mypy pearl actors transports

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
