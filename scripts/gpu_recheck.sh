#!/usr/bin/env bash
# One device call after a change that moves code the GPU runs (the import-circle refactor of issue 31:
# the binding table, the KV cache shapes, sparse MLA's verdict helper): every GPU test of the overlay
# but TileLang's mHC ones (TileLang does not travel in this call), the entry-point A/B through the
# binding hook at forced capability 8.0, and the KV / combiner benches next to upstream's kernels.
# Usage (on the device, .gpu-bundle carried): DEEPINFER_GIT_SHA=<sha> scripts/gpu_recheck.sh OUT_DIR
# Each step is time-boxed and logs one outcome line; a failing step never stops the call; the whole
# work directory lands in OUT_DIR/gpu-recheck.tar.gz.
set -uo pipefail
OUT_DIR=${1:?out dir}
[ -n "${DEEPINFER_GIT_SHA:-}" ] || { echo "gpu_recheck: set DEEPINFER_GIT_SHA (the device copy's .git may be stale)" >&2; exit 2; }
WORK=/tmp/gpu-recheck; rm -rf "$WORK"; mkdir -p "$WORK" "$OUT_DIR"
export PYTEST_WORKERS=${PYTEST_WORKERS:-12} PYTHONUNBUFFERED=1
T0=$SECONDS
BUDGET=${GPU_RECHECK_BUDGET_S:-560}  # the call's 600 s less the tarball and the reply
# shellcheck source=scripts/timebox.sh
. "$(dirname "$0")/timebox.sh"  # step NAME SECONDS CMD...
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv >"$WORK/gpu-state.txt" 2>&1
step tests 300 env SKIP_BENCH=1 TESTS="overlay/tests --ignore=overlay/tests/ops/test_mhc.py" \
  bash scripts/gpu_suite.sh .gpu-bundle "$WORK/tests"
step entry_ab 90 env DEEPINFER_SM80_FORCE_CAPABILITY=80 \
  PYTHONPATH="$PWD/overlay:/tmp/deepinfer-site:/tmp/deepinfer-vllm" \
  python3 scripts/entry_point_ab.py --out "$WORK/entry_ab" --quick
step bench_kv 150 env SKIP_TESTS=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/bench" topk_swa_combine kv_gather kv_quant_insert
echo "done in $((SECONDS - T0)) s"
tar czf "$OUT_DIR/gpu-recheck.tar.gz" -C "$WORK" .
ls -la "$OUT_DIR"
