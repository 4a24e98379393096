#!/usr/bin/env bash
# The integrated H200 run in two back-to-back calls (TileLang's wheels and the GPU bundle do not fit one
# 64 MiB transfer). Everything lands in OUT_DIR/final-<phase>.tar.gz (one file comes back per phase).
#   phase 1 (carries .gpu-bundle + .whl-mhc/b): every GPU test but mHC's, natively, in 12 processes; the
#           KV / combiner / DSpark benches (quick: no tile sweeps); the entry-point A/B of issue 16
#   phase 2 (carries .whl-mhc/a; the machine still warm): TileLang in, mHC tests + bench; compute-sanitizer
# Usage: DEEPINFER_GIT_SHA=<sha> scripts/h200_final.sh 1|2 OUT_DIR
set -uo pipefail
PHASE=${1:?phase 1 or 2}; OUT_DIR=${2:?out dir}
WORK=/tmp/h200-final-$PHASE; rm -rf "$WORK"; mkdir -p "$WORK"
export DEEPINFER_BENCH_QUICK=1 DEEPINFER_BENCH_DSPARK_QUICK=1 DEEPINFER_MHC_QUICK=1 PYTEST_WORKERS=12
step() {  # step NAME SECONDS CMD...: one line of outcome per step, never aborts the phase
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "step $name: exit $rc in $((SECONDS - t0)) s | $(grep -E 'passed|failed|error|wrote|ERROR SUMMARY' "$WORK/$name.log" | tail -2 | tr '\n' ' ' | cut -c1-300)"
}
if [ "$PHASE" = 1 ]; then
  export TL_Z3=.whl-mhc/b/z3.tar.xz
  step tests 180 env TESTS="overlay/tests/ops overlay/tests/test_bindings.py overlay/tests/integration/test_sm8x_attention.py overlay/tests/integration/test_pack_seq.py --ignore=overlay/tests/ops/test_mhc.py" \
    SKIP_BENCH=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/tests"
  step bench 100 env SKIP_TESTS=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/bench" kv_gather kv_quant_insert topk_swa_combine dspark_draft
  step entry_ab 60 env DEEPINFER_SM80_FORCE_CAPABILITY=80 PYTHONPATH="$PWD/overlay:/tmp/deepinfer-site:/tmp/deepinfer-vllm" \
    python3 scripts/entry_point_ab.py --out "$WORK/entry_ab" --quick
else
  export TL_WHEELS=.whl-mhc/a
  # this session's new kernels first: whatever the time box leaves out is said in the log
  NEW_KERNEL_TESTS="overlay/tests/ops/test_sparse_mla.py overlay/tests/ops/test_indexer_quant.py \
overlay/tests/ops/test_indexer_logits.py overlay/tests/ops/test_dspark_draft.py overlay/tests/ops/test_compress_insert.py \
overlay/tests/ops/test_pp_records.py overlay/tests/ops/test_engram.py overlay/tests/ops/test_mhc.py"
  step mhc 130 env TESTS=overlay/tests/ops/test_mhc.py bash scripts/gpu_suite.sh .gpu-bundle "$WORK/mhc" mhc
  step sanitize 90 env SANITIZE_TOOLS=memcheck SANITIZE_FILES="$NEW_KERNEL_TESTS" SKIP_TESTS=1 SKIP_BENCH=1 SANITIZE=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/sanitize"
fi
tar czf "$OUT_DIR/final-$PHASE.tar.gz" -C "$WORK" .
ls -la "$OUT_DIR"
