#!/usr/bin/env bash
# compute-sanitizer (memcheck, then racecheck) over every kernel's small-shape reference tests, on the
# GPU machine: the same tests as the interpreter runs, with edge shapes (single token, odd lengths,
# empty and -1 slots, page crossings). Run inside `make gpu-suite`'s environment (PYTHONPATH set).
# Usage: [SANITIZE_TOOLS="memcheck racecheck"] [SANITIZE_FILES="test files, in order"] [SANITIZE_K="pytest -k
# expression", default: every reference-comparison test] scripts/sanitize.sh OUT_DIR -> OUT_DIR/sanitize-<tool>.log,
# exit 1 on any error
set -uo pipefail
OUT_DIR=${1:?out dir}
mkdir -p "$OUT_DIR"
# reference-comparison tests of every op (small shapes by construction; upstream comparisons excluded:
# their kernels are not ours to sanitize)
SELECT="matches_reference or vs_reference or matches_spec or reference_bitwise or sets or bitwise \
or logits or rows_match or gather_matches or scatter_matches or replay"
DESELECT="upstream or hardware or 2_31 or fuzz"
status=0
for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
  log="$OUT_DIR/sanitize-$tool.log"
  compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 99 \
    python3 -m pytest -v -p no:cacheprovider ${SANITIZE_FILES:-overlay/tests/ops} -k "${SANITIZE_K:-($SELECT) and not ($DESELECT)}" \
    >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$log" | tail -3 | tr '\n' ' ')
  echo "sanitize $tool: exit $rc | $summary"
  [ $rc -eq 0 ] || status=1
done
exit $status
