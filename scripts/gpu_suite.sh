#!/usr/bin/env bash
# `make gpu-suite`, run ON the GPU machine: unpack the bundle (no package index there), run every
# GPU test and benchmark, write JSON + logs under OUT_DIR.
# Usage: scripts/gpu_suite.sh BUNDLE_DIR OUT_DIR [bench module short names...]
# Environment:
#   TESTS=paths        pytest paths (default overlay/tests); SKIP_TESTS=1 / SKIP_BENCH=1 skip a phase
#   PYTEST_WORKERS=N   run the tests in N processes (pytest-xdist, where installed)
#   TL_WHEELS=dir      install TileLang's wheels from dir into /tmp/tl-site (TileLang is not on the image)
#   TL_Z3=file.tar.xz  unpack the z3 package into /tmp/tl-site (too big to travel with the wheels)
#   SANITIZE=1         also run scripts/sanitize.sh (compute-sanitizer memcheck + racecheck)
set -euo pipefail
BUNDLE=${1:?bundle dir}; OUT_DIR=${2:?out dir}; shift 2
SITE=/tmp/deepinfer-site; TREE=/tmp/deepinfer-vllm; TL_SITE=/tmp/tl-site
test -f "$BUNDLE/READY" || { echo "gpu-suite: $BUNDLE has no READY (run make gpu-bundle)"; exit 2; }
mkdir -p "$OUT_DIR"
if [ ! -f "$SITE/.done" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$BUNDLE"/wheels/*.whl
  touch "$SITE/.done"
fi
if [ ! -f "$TREE/.done" ]; then
  mkdir -p "$TREE" && tar xzf "$BUNDLE/vllm-tree.tar.gz" -C "$TREE" && touch "$TREE/.done"
fi
if [ -n "${TL_WHEELS:-}" ] && [ ! -f "$TL_SITE/.wheels-done" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TL_SITE" "$TL_WHEELS"/*.whl
  touch "$TL_SITE/.wheels-done"
fi
if [ -n "${TL_Z3:-}" ] && [ ! -f "$TL_SITE/.z3-done" ]; then
  mkdir -p "$TL_SITE" && tar xJf "$TL_Z3" -C "$TL_SITE" && touch "$TL_SITE/.z3-done"
fi
# TileLang's own apache-tvm-ffi must come before the bundle's newer one
TL_PATH=""; [ -d "$TL_SITE" ] && TL_PATH="$TL_SITE:"
export PYTHONPATH="$TL_PATH$PWD/overlay:$SITE:$TREE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export DEEPINFER_GIT_SHA=${DEEPINFER_GIT_SHA:-unknown}  # the tree travels without a current .git: pass HEAD
python3 -c 'import torch, triton; p = torch.cuda.get_device_properties(0); print(f"{p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs | torch {torch.__version__} | triton {triton.__version__}")'
status=0
if [ -z "${SKIP_TESTS:-}" ]; then
  XDIST=""
  if [ -n "${PYTEST_WORKERS:-}" ] && python3 -c "import xdist" 2>/dev/null; then XDIST="-n $PYTEST_WORKERS"; fi
  # -v: every outcome is logged as it happens, so a run cut by its time box still names its failures
  # shellcheck disable=SC2086
  python3 -m pytest -v -rfE -p no:cacheprovider $XDIST ${TESTS:-overlay/tests} --junitxml="$OUT_DIR/gpu-tests.xml" \
    2>&1 | tee "$OUT_DIR/gpu-tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -25 || status=1
  grep -qE "[0-9]+ (failed|error)" "$OUT_DIR/gpu-tests.log" && status=1
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 -m deepinfer_sm80.bench --out "$OUT_DIR" ${1:+--only "$@"} 2>&1 | tee "$OUT_DIR/bench.log" | grep -v "^\s*$" || status=1
fi
if [ -n "${SANITIZE:-}" ]; then
  bash scripts/sanitize.sh "$OUT_DIR" || status=1
fi
exit $status
