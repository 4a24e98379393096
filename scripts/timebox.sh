# Sourced by the device scripts (scripts/h200_run.sh, scripts/gpu_recheck.sh): their time-boxed steps.
# The caller sets WORK (logs), T0 (=$SECONDS at its start) and BUDGET (seconds for the whole call).
# step NAME SECONDS CMD...: runs CMD under `timeout`, never past the budget left, its log in
# WORK/NAME.log, and prints one outcome line; a failing step never stops the caller.
step() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS left=$((BUDGET - (SECONDS - T0)))
  [ "$secs" -le "$left" ] || secs=$left  # a step never runs past the phase budget
  if [ "$secs" -le 5 ]; then echo "step $name: not run (phase budget spent)"; return; fi
  timeout "$secs" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "step $name: exit $rc in $((SECONDS - t0)) s (phase at $((SECONDS - T0)) s) | $(grep -E ' passed| failed|error|wrote|ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/$name.log" | tail -2 | tr '\n' ' ' | cut -c1-300)"
}
