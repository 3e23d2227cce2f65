# The two entry points of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit oracle e2e local-cluster image gpu-test bench venv clean release-check

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
	-$(BIN)/python deploy/image/build.py
	$(BIN)/python -m tests.oracle.upstream
	$(BIN)/pytest -q -p no:cacheprovider

## Random cases answered by Kubernetes' own allocator and CEL (tests/oracle/), any seed and count:
## make oracle SEED=7 COUNT=20000 (COUNT cases of each kind; KINDS=cel,typed,allocate,wide picks
## the kinds; RECORD=dir keeps each disagreement; PROGRESS=1 prints the running summary after
## each round of chunks). Prints the typed cases' coverage.
SEED ?= 20260137
COUNT ?=
KINDS ?=
RECORD ?=
oracle: $(STAMP)
	$(BIN)/python -m tests.oracle.batch --seed $(SEED) $(if $(COUNT),--count $(COUNT)) $(if $(KINDS),--kinds $(KINDS)) $(if $(RECORD),--record $(RECORD)) $(if $(PROGRESS),--progress)

## The real-GPU suite (root, NVIDIA GPU) in the mode that never changes the GPU's settings,
## with a JSON report; elsewhere every test skips with the reason.
GPU_REPORT ?= gpu-report.json
gpu-test: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/gpu --keep-gpu-settings --gpu-report=$(GPU_REPORT)

## Build the upstream Kubernetes binaries and containerd (cached outside the checkout), then, in a
## sealed network namespace of the run's own (after `make image`, whose cached layers the run's
## image build reuses), start etcd, the control plane and a real node
## (containerd, kubelet, kube-proxy), install the chart with its defaults and run the examples'
## pods (tests/e2e/). K8S=1.36.3 runs the same against the second pinned release.
K8S ?=
e2e: $(STAMP)
	bash tests/install-helm.sh
	-$(BIN)/python deploy/image/build.py
	SHAREGPU_E2E_K8S=$(K8S) $(BIN)/python -m tests.e2e.binaries
	SHAREGPU_E2E_K8S=$(K8S) $(BIN)/pytest -q -p no:cacheprovider tests/e2e

## The same control plane with the CRDs, the controller and its webhook, kept running for kubectl;
## `make image` first, so that the cluster's image build finds its layers cached.
local-cluster: image
	bash tests/install-helm.sh
	$(BIN)/python -m tests.e2e.binaries
	$(BIN)/python -m tests.e2e.cluster

## Package the chart (build/release/) and check that its version and appVersion, the Python
## package's version, the image tag the chart renders and the one `make image` builds are all
## api/version.py's, and that CHANGELOG.md has its dated section.
release-check: $(STAMP)
	bash tests/install-helm.sh
	$(BIN)/python deploy/release_check.py $(BIN)/helm

## The driver's image without docker or a registry (deploy/image/build.py): a Debian bookworm root
## filesystem from Debian packages (mmdebstrap, installed with apt where missing; the packages are
## cached in ~/.cache/sharegpu-image), Debian's Python 3.11 and tini, and the project's wheels.
## Writes dist/sharegpu-image.tar (IMAGE_ARCHIVE=file elsewhere; an OCI layout that is also a docker
## archive) named sharegpu:<the chart's appVersion>;
## `podman load -i`, `ctr -n k8s.io images import` or `docker load -i` load it.
## IMAGE=registry.example.com/sharegpu:0.2.0 names it otherwise; REFRESH=1 makes the cached Debian
## layer anew and asks PyPI again (the updates since).
IMAGE ?=
IMAGE_ARCHIVE ?=
REFRESH ?=
image: $(STAMP)
	$(BIN)/python deploy/image/build.py $(if $(IMAGE),--name $(IMAGE)) \
		$(if $(IMAGE_ARCHIVE),--output $(IMAGE_ARCHIVE)) $(if $(REFRESH),--refresh-base)

## The benchmarks (bench/suite.py; as root): pod start on the real node against upstream's Go test
## driver, kube-scheduler throughput with the plugin's slices, the controller's tracker and webhook
## against the real API server, prepare against its floor (CDI specs on tmpfs and on disk), then
## the plots of docs/performance.md. PART=podstart runs one part (podstart, schedthroughput,
## controllerscale, prepare, prepare-disk, plots). Figures in bench/results/.
PART ?=
bench: $(STAMP)
	bash tests/install-helm.sh
	$(BIN)/python -m tests.e2e.binaries
	bash tests/e2e/build-binaries.sh test-driver
	$(BIN)/python -m bench.suite $(PART)

## Set up everything and run the whole test suite (linters, type checks, tests).
test: lint typecheck unit

clean:
	rm -rf $(VENV) build *.egg-info
