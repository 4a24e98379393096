#!/usr/bin/env bash
# The integrated H200 run in two back-to-back calls (TileLang's wheels and the GPU bundle do not fit one
# 64 MiB transfer). Everything lands in OUT_DIR/final-<phase>.tar.gz (one file comes back per phase).
#   phase 1 (carries .gpu-bundle + .whl-mhc/b): every GPU test but mHC's, natively, in 12 processes; the
#           KV / combiner / DSpark benches (quick: no tile sweeps); the entry-point A/B of issue 16
#   phase 2 (carries .whl-mhc/a; the machine still warm): TileLang in, mHC tests + bench; compute-sanitizer
# The benches and test modules are declared where they live, not here: a bench module's line
# `H200_FINAL_PHASE = 1|2`, a test module's `H200_FINAL_TESTS = True` (phase 1, with overlay/tests/ops) or
# `H200_SANITIZE_ORDER = N` (phase 2's sanitizer, in N order). H200_FINAL_PRINT=1 prints the derived sets
# and exits (tests/test_h200_scripts.py).
# Usage: DEEPINFER_GIT_SHA=<sha> scripts/h200_final.sh 1|2 OUT_DIR
set -uo pipefail
PHASE=${1:?phase 1 or 2}; OUT_DIR=${2:?out dir}
case "$PHASE" in 1|2) ;; *) echo "h200_final: phase must be 1 or 2, got '$PHASE'" >&2; exit 2 ;; esac
benches_of_phase() {  # the short names of the bench modules declaring H200_FINAL_PHASE = $1, sorted
  grep -lx "H200_FINAL_PHASE = $1" overlay/deepinfer_sm80/bench/*.py | sort | xargs -r -n1 basename | sed 's/\.py$//' | tr '\n' ' ' | sed 's/ $//'
}
PHASE1_BENCHES=$(benches_of_phase 1); PHASE2_BENCHES=$(benches_of_phase 2)
PHASE2_TESTS=$(for b in $PHASE2_BENCHES; do printf '%s ' "overlay/tests/ops/test_$b.py"; done | sed 's/ $//')
PHASE1_TESTS="overlay/tests/ops $(grep -rlx --include='test_*.py' 'H200_FINAL_TESTS = True' overlay/tests | sort | tr '\n' ' ')$(
  for t in $PHASE2_TESTS; do printf -- '--ignore=%s ' "$t"; done | sed 's/ $//')"
SANITIZE_TESTS=$(grep -rHx --include='test_*.py' 'H200_SANITIZE_ORDER = [0-9]*' overlay/tests | sort -t= -k2 -n | cut -d: -f1 | tr '\n' ' ' | sed 's/ $//')
for set in PHASE1_BENCHES PHASE2_BENCHES SANITIZE_TESTS; do  # an empty bench list would run every bench
  [ -n "${!set}" ] || { echo "h200_final: no module declares the $set set (see the header)" >&2; exit 2; }
done
if [ "${H200_FINAL_PRINT:-}" = 1 ]; then
  printf 'phase1_benches=%s\nphase1_tests=%s\nphase2_benches=%s\nphase2_tests=%s\nsanitize_tests=%s\n' \
    "$PHASE1_BENCHES" "$PHASE1_TESTS" "$PHASE2_BENCHES" "$PHASE2_TESTS" "$SANITIZE_TESTS"
  exit 0
fi
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
  step tests 180 env TESTS="$PHASE1_TESTS" SKIP_BENCH=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/tests"
  # shellcheck disable=SC2086  # one argument per bench name
  step bench 100 env SKIP_TESTS=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/bench" $PHASE1_BENCHES
  step entry_ab 60 env DEEPINFER_SM80_FORCE_CAPABILITY=80 PYTHONPATH="$PWD/overlay:/tmp/deepinfer-site:/tmp/deepinfer-vllm" \
    python3 scripts/entry_point_ab.py --out "$WORK/entry_ab" --quick
else
  export TL_WHEELS=.whl-mhc/a
  # this session's new kernels first: whatever the time box leaves out is said in the log
  # shellcheck disable=SC2086  # one argument per bench name
  step mhc 130 env TESTS="$PHASE2_TESTS" bash scripts/gpu_suite.sh .gpu-bundle "$WORK/mhc" $PHASE2_BENCHES
  step sanitize 90 env SANITIZE_TOOLS=memcheck SANITIZE_FILES="$SANITIZE_TESTS" SKIP_TESTS=1 SKIP_BENCH=1 SANITIZE=1 bash scripts/gpu_suite.sh .gpu-bundle "$WORK/sanitize"
fi
tar czf "$OUT_DIR/final-$PHASE.tar.gz" -C "$WORK" .
ls -la "$OUT_DIR"
