#!/usr/bin/env bash
# Issue 25's H200 run, one device call per phase; everything lands in OUT_DIR/h200-run-<phase>.tar.gz.
#   phase 1: the benches of the kernels issue 25 names (sparse-MLA decode with its opt-in variants, the
#            indexer paged-decode logits and its variants, KV insert / gather with their sweeps and a
#            same-size copy, the combiner), each next to upstream 0.32.0's kernels on the same inputs in
#            CUDA graphs with inputs rotated beyond L2 and the copy ceiling measured in the same run; the
#            GPU tests of these ops by name (-v: every outcome in the log); compute-sanitizer memcheck and
#            racecheck over the variants' tests (edge shapes: empty and zero-valid lists, dense rows
#            with invalid slots, TP8 heads, SWA only, page crossings, tiles past a row's length)
#   phase 2 (after the defaults moved on phase 1's numbers): the sparse-MLA bench again (the shipped
#            tile choice timed against every tile), the sanitizers and the ops' GPU tests again, the KV /
#            combiner benches (same-size-copy targets), the whole indexer bench (decode and prefill:
#            streamed top-k, workspace) and, with what time is left, the DSpark bench (graph target)
# Usage (on the device, bundle carried): DEEPINFER_GIT_SHA=<sha> scripts/h200_run.sh 1|2 OUT_DIR
# Each step is time-boxed and logs one outcome line; a failing step never stops the phase.
set -uo pipefail
PHASE=${1:?phase 1 or 2}; OUT_DIR=${2:?out dir}
case "$PHASE" in 1|2) ;; *) echo "h200_run: phase must be 1 or 2, got '$PHASE'" >&2; exit 2 ;; esac
# The names this run takes, once: issue 25's kernels. Each must exist (a renamed module stops the run
# here with its name, not in a step); H200_RUN_PRINT=1 prints the sets and exits (tests/test_h200_scripts.py).
SANITIZED_OPS="sparse_mla indexer_logits"  # the variants' tests under compute-sanitizer
TESTED_OPS="$SANITIZED_OPS indexer_topk kv_quant_insert kv_gather topk_swa_combine"
KV_BENCHES="kv_quant_insert kv_gather topk_swa_combine"
op_tests() { for op in "$@"; do printf '%s ' "overlay/tests/ops/test_$op.py"; done | sed 's/ $//'; }
# shellcheck disable=SC2086  # one argument per op name
OPS_TESTS=$(op_tests $SANITIZED_OPS); ALL_TESTS=$(op_tests $TESTED_OPS)
for f in $ALL_TESTS; do [ -f "$f" ] || { echo "h200_run: no test module $f" >&2; exit 2; }; done
for b in $KV_BENCHES sparse_mla indexer dspark_draft; do
  [ -f "overlay/deepinfer_sm80/bench/$b.py" ] || { echo "h200_run: no bench module $b" >&2; exit 2; }
done
if [ "${H200_RUN_PRINT:-}" = 1 ]; then
  printf 'sanitize_tests=%s\nall_tests=%s\nkv_benches=%s\n' "$OPS_TESTS" "$ALL_TESTS" "$KV_BENCHES"; exit 0
fi
[ -n "${DEEPINFER_GIT_SHA:-}" ] || { echo "h200_run: set DEEPINFER_GIT_SHA (the device copy's .git may be stale)" >&2; exit 2; }
WORK=/tmp/h200-run-$PHASE; rm -rf "$WORK"; mkdir -p "$WORK" "$OUT_DIR"
export PYTEST_WORKERS=${PYTEST_WORKERS:-12} PYTHONUNBUFFERED=1
T0=$SECONDS
BUDGET=${H200_RUN_BUDGET_S:-565}  # the call's 600 s less the tarball and the reply
# shellcheck source=scripts/timebox.sh
. "$(dirname "$0")/timebox.sh"  # step NAME SECONDS CMD...
suite() { bash scripts/gpu_suite.sh .gpu-bundle "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv >"$WORK/gpu-state.txt" 2>&1
compute-sanitizer --version >"$WORK/sanitizer-version.txt" 2>&1
if [ "$PHASE" = 1 ]; then
  step bench_sparse_mla 230 env SKIP_TESTS=1 bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" sparse_mla' "$WORK"
  step bench_indexer_decode 100 env SKIP_TESTS=1 DEEPINFER_BENCH_INDEXER_SECTIONS=decode \
    bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" indexer' "$WORK"
  # shellcheck disable=SC2086  # one argument per bench name
  step bench_kv 90 env SKIP_TESTS=1 bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" "$@"' "$WORK" $KV_BENCHES
  step tests 60 env SKIP_BENCH=1 TESTS="$ALL_TESTS" \
    bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/tests"' "$WORK"
  step sanitize 200 env SKIP_TESTS=1 SKIP_BENCH=1 SANITIZE=1 SANITIZE_FILES="$OPS_TESTS" SANITIZE_K="variant" \
    bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/sanitize"' "$WORK"
else
  step bench_sparse_mla 130 env SKIP_TESTS=1 bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" sparse_mla' "$WORK"
  step sanitize 70 env SKIP_TESTS=1 SKIP_BENCH=1 SANITIZE=1 SANITIZE_FILES="$OPS_TESTS" SANITIZE_K="variant" \
    bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/sanitize"' "$WORK"
  step tests 130 env SKIP_BENCH=1 TESTS="$ALL_TESTS" \
    bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/tests"' "$WORK"
  # shellcheck disable=SC2086  # one argument per bench name
  step bench_kv 70 env SKIP_TESTS=1 bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" "$@"' "$WORK" $KV_BENCHES
  step bench_indexer 200 env SKIP_TESTS=1 bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" indexer' "$WORK"
  step bench_dspark 90 env SKIP_TESTS=1 DEEPINFER_BENCH_DSPARK_QUICK=1 \
    bash -c 'bash scripts/gpu_suite.sh .gpu-bundle "$0/bench" dspark_draft' "$WORK"
fi
echo "phase $PHASE done in $((SECONDS - T0)) s"
tar czf "$OUT_DIR/h200-run-$PHASE.tar.gz" -C "$WORK" .
ls -la "$OUT_DIR"
