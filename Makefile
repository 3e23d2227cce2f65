# The two entry points of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit gpu-test venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Run the driver end to end on an embedded default (mock GPUs, in-process API server).
demo: $(STAMP)
	$(BIN)/sharegpu demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy api kubeletplugin controller sharegpu

unit: $(STAMP)
	bash tests/setup-system.sh
	$(BIN)/pytest -q -p no:cacheprovider

## The real-GPU suite (root, NVIDIA GPU) in the mode that never changes the GPU's settings,
## with a JSON report; elsewhere every test skips with the reason.
GPU_REPORT ?= gpu-report.json
gpu-test: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/gpu --keep-gpu-settings --gpu-report=$(GPU_REPORT)

## Set up everything and run the whole test suite (linters, type checks, tests).
test: lint typecheck unit

clean:
	rm -rf $(VENV) build *.egg-info
