# The two entry points of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit oracle e2e local-cluster gpu-test venv clean

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
	$(BIN)/mypy api kubeletplugin controller sharegpu sharegpuctl

unit: $(STAMP)
	bash tests/setup-system.sh
	$(BIN)/python -m tests.e2e.binaries
	$(BIN)/python -m tests.oracle.upstream
	$(BIN)/pytest -q -p no:cacheprovider

## Random cases answered by Kubernetes' own allocator and CEL (tests/oracle/), any seed and count:
## make oracle SEED=7 COUNT=20000 (COUNT cases of each kind; KINDS=cel,typed,allocate,wide picks
## the kinds; RECORD=dir keeps each disagreement). Prints the typed cases' coverage.
SEED ?= 20260137
COUNT ?=
KINDS ?=
RECORD ?=
oracle: $(STAMP)
	$(BIN)/python -m tests.oracle.batch --seed $(SEED) $(if $(COUNT),--count $(COUNT)) $(if $(KINDS),--kinds $(KINDS)) $(if $(RECORD),--record $(RECORD))

## The real-GPU suite (root, NVIDIA GPU) in the mode that never changes the GPU's settings,
## with a JSON report; elsewhere every test skips with the reason.
GPU_REPORT ?= gpu-report.json
gpu-test: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/gpu --keep-gpu-settings --gpu-report=$(GPU_REPORT)

## Build the upstream Kubernetes binaries and containerd (cached outside the checkout), then, in a
## sealed network namespace of the run's own, start etcd, the control plane and a real node
## (containerd, kubelet, kube-proxy), install the chart with its defaults and run the examples'
## pods (tests/e2e/). K8S=1.36.3 runs the same against the second pinned release.
K8S ?=
e2e: $(STAMP)
	bash tests/install-helm.sh
	SHAREGPU_E2E_K8S=$(K8S) $(BIN)/python -m tests.e2e.binaries
	SHAREGPU_E2E_K8S=$(K8S) $(BIN)/pytest -q -p no:cacheprovider tests/e2e

## The same control plane with the CRDs, the controller and its webhook, kept running for kubectl.
local-cluster: $(STAMP)
	bash tests/install-helm.sh
	$(BIN)/python -m tests.e2e.binaries
	$(BIN)/python -m tests.e2e.cluster

## Set up everything and run the whole test suite (linters, type checks, tests).
test: lint typecheck unit

clean:
	rm -rf $(VENV) build *.egg-info
