#!/usr/bin/env bash
# Runs every libFuzzer target of a TPF_FUZZ=ON build for SECONDS each and prints, per target,
# executions, executions per second and corpus growth. `make fuzz FUZZ_SECONDS=N` calls it.
#
#   bash fuzz/run.sh BUILD_DIR [SECONDS] [TARGET...]
#
# New inputs go to BUILD_DIR/fuzz-work/<target>/ (the committed seeds in fuzz/corpus/<target>/ are
# read only). A finding is written to fuzz/findings/<target>-crash-* (git-ignored), the script
# prints the commands to reproduce and minimize it, and exits 1 once every target has run.
# FUZZ_MERGE=1 afterwards adds to fuzz/corpus/<target>/ the work inputs that reach new coverage
# features (libFuzzer -merge=1; existing seeds are kept), which is how seeds are refreshed.
# One process per target, one target at a time, so the run stays on one core.
set -u
build=${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-60}
shift $(($# >= 2 ? 2 : 1))
here=$(cd "$(dirname "$0")" && pwd)
list="$build/fuzz/targets.txt"
if [ $# -gt 0 ]; then
  targets="$*"
elif [ -f "$list" ]; then
  targets=$(cat "$list")
else
  echo "fuzz/run.sh: $list missing; configure with -DTPF_FUZZ=ON first" >&2
  exit 2
fi

# Longest input per target: enough bytes for the parameters (and for schedule_replay and api_sim,
# for the interleaving choices and the command program).
max_len() {
  case "$1" in
  schedule_replay) echo 512 ;;
  api_sim) echo 256 ;;
  *) echo 64 ;;
  esac
}

count_files() { find "$@" -maxdepth 1 -type f 2>/dev/null | wc -l | tr -d ' '; }

mkdir -p "$here/findings"
failed=0
rows=()
for t in $targets; do
  exe="$build/fuzz/fuzz_$t"
  seeds="$here/corpus/$t"
  work="$build/fuzz-work/$t"
  log="$build/fuzz-work/$t.log"
  mkdir -p "$work" "$seeds"
  if [ ! -x "$exe" ]; then
    echo "fuzz/run.sh: $exe not built" >&2
    failed=1
    rows+=("$(printf '%-16s %s' "$t" 'NOT BUILT')")
    continue
  fi
  before=$(($(count_files "$work") + $(count_files "$seeds")))
  echo "== fuzz $t: ${seconds}s (seeds: $(count_files "$seeds"), work corpus: $(count_files "$work"))"
  "$exe" -max_total_time="$seconds" -print_final_stats=1 -max_len="$(max_len "$t")" \
    -timeout=30 -rss_limit_mb=2048 -artifact_prefix="$here/findings/$t-" \
    "$work" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -E '^#[0-9]+.*(DONE|INITED|NEW|REDUCE|pulse)' "$log" | tail -1 | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  after=$(($(count_files "$work") + $(count_files "$seeds")))
  if [ $rc -eq 0 ]; then
    result=ok
  else
    result="FAILED (rc $rc)"
    failed=1
    grep -E 'invariant failed|ERROR: |SUMMARY|^  ' "$log" | head -8
    art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    if [ -n "$art" ]; then
      echo "   reproduce: $exe $art"
      echo "   minimize:  $exe -minimize_crash=1 -runs=20000 -exact_artifact_path=$art.min $art"
      echo "   then fix, and commit the minimized input as fuzz/corpus/$t/<name>"
    fi
    echo "   full log: $log"
  fi
  rows+=("$(printf '%-16s %6ss %12s %10s %8s -> %-8s %+6d %8s  %s' "$t" "$seconds" "${execs:-?}" \
    "${eps:-?}" "$before" "$after" $((after - before)) "${cov:-?}" "$result")")
  if [ "${FUZZ_MERGE:-0}" = 1 ] && [ $rc -eq 0 ]; then
    # Adds to the seeds only the work inputs that reach new features; existing seeds stay.
    n0=$(count_files "$seeds")
    "$exe" -merge=1 -max_len="$(max_len "$t")" "$seeds" "$work" >>"$log" 2>&1 &&
      echo "   merged: fuzz/corpus/$t: $n0 -> $(count_files "$seeds") inputs"
  fi
done

echo
printf '%-16s %7s %12s %10s %8s    %-8s %6s %8s  %s\n' target time execs 'execs/s' corpus after growth cov result
for r in "${rows[@]}"; do echo "$r"; done
exit $failed
