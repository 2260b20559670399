#!/usr/bin/env bash
# Every output of the tpflex commands is checked for write and close errors:
# a command whose output cannot be written exits non-zero with a message naming the file (or
# standard output) and the error, and never says "all checks passed". /dev/full fails every write
# with ENOSPC; a file size limit (ulimit -f, SIGXFSZ ignored so the write returns EFBIG) fails a
# write that comes late, after the up-front checks passed. The same commands with a writable file
# succeed, so the test can tell a broken command from a refused output.
#
#   test_output_errors.sh TPFLEX
set -u
T=${1:?usage: test_output_errors.sh TPFLEX}
[ -w /dev/full ] || { echo "skipped: this system has no writable /dev/full"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
BENCH=(bench --backend sim --quick --section setshape --calls 100)
PLAN=(plan --tp 2 --capacity 8 --tokens 8 --hidden 4 --algo ring --coll ag)
DEMO=(demo --tp 2 --capacity 32 --hidden 16 --microbatches 1)

# expect NAME WANT_RC STDERR_PATTERN STDOUT_FILE -- COMMAND...: runs COMMAND with stdout to
# STDOUT_FILE and checks the exit status and that stderr holds the pattern (grep -E); stdout must
# never claim success when WANT_RC is not 0.
expect() {
  local name=$1 want=$2 pat=$3 out=$4
  shift 5
  "$@" >"$out" 2>"$tmp/err"
  local rc=$?
  local ok=1
  [ "$rc" = "$want" ] || ok=0
  [ -z "$pat" ] || grep -Eq -- "$pat" "$tmp/err" || ok=0
  if [ "$want" != 0 ] && [ "$out" != /dev/full ] && grep -q "all checks passed" "$out"; then ok=0; fi
  if [ $ok = 1 ]; then
    echo "ok   $name (exit $rc)"
  else
    echo "FAIL $name: exit $rc (want $want), stderr:"
    sed 's/^/       /' "$tmp/err"
    fails=$((fails + 1))
  fi
}

ENOSPC='No space left on device'
# Output files on /dev/full: refused before the benchmark runs.
expect "bench --csv /dev/full" 1 "writing --csv '/dev/full' failed: $ENOSPC" "$tmp/out" -- \
  "$T" "${BENCH[@]}" --csv /dev/full
expect "bench --json /dev/full" 1 "writing --json '/dev/full' failed: $ENOSPC" "$tmp/out" -- \
  "$T" "${BENCH[@]}" --json /dev/full
expect "demo --trace /dev/full" 1 "'/dev/full'.*$ENOSPC" "$tmp/out" -- \
  "$T" "${DEMO[@]}" --trace /dev/full
expect "calibrate --out /dev/full" 1 "writing --out '/dev/full' failed: $ENOSPC" "$tmp/out" -- \
  "$T" calibrate --backend sim --out /dev/full
expect "plan --svg /dev/full" 1 "writing '/dev/full' failed: $ENOSPC" "$tmp/out" -- \
  "$T" "${PLAN[@]}" --svg /dev/full
expect "plan --predict --svg /dev/full" 1 "writing '/dev/full' failed: $ENOSPC" "$tmp/out" -- \
  "$T" "${PLAN[@]}" --predict --svg /dev/full
# Standard output on /dev/full.
for c in BENCH PLAN DEMO; do
  eval "args=(\"\${$c[@]}\")"
  expect "${args[0]} > /dev/full" 1 "tpflex ${args[0]}: writing standard output failed: $ENOSPC" \
    /dev/full -- "$T" "${args[@]}"
done
expect "plan --json > /dev/full" 1 "writing standard output failed" /dev/full -- \
  "$T" "${PLAN[@]}" --json
expect "calibrate > /dev/full" 1 "writing standard output failed: $ENOSPC" /dev/full -- \
  "$T" calibrate --backend sim
expect "version > /dev/full" 1 "writing standard output failed: $ENOSPC" /dev/full -- \
  "$T" version
# A late failure: the JSON report (over 1 KiB) exceeds a 1 KiB file size limit after the
# up-front check (a short line) passed; the CSV (under 1 KiB) still fits.
# Standard output goes through a pipe (cat runs outside the limit), so only the report files
# are limited.
set -o pipefail
late() {
  (
    trap '' XFSZ
    ulimit -f 1
    exec "$T" "${BENCH[@]}" --csv "$tmp/late.csv" --json "$tmp/late.json"
  ) | cat
}
expect "bench --json over a file size limit" 1 "writing --json '$tmp/late.json' failed: File too large" \
  "$tmp/out" -- late
grep -q "bench finished with failures" "$tmp/out" || {
  echo "FAIL bench over a file size limit: the summary line does not say it failed"
  fails=$((fails + 1))
}
# The same commands with writable outputs succeed and write something.
expect "bench --csv/--json to files" 0 "" "$tmp/out" -- \
  "$T" "${BENCH[@]}" --csv "$tmp/b.csv" --json "$tmp/b.json"
grep -q "all checks passed" "$tmp/out" && [ -s "$tmp/b.csv" ] && [ -s "$tmp/b.json" ] &&
  [ "$(wc -c <"$tmp/b.json")" -gt 1024 ] || {
  echo "FAIL bench to files: no summary, an empty file, or a JSON report under 1 KiB (the late case needs more)"
  fails=$((fails + 1))
}
expect "calibrate --out file" 0 "" "$tmp/out" -- "$T" calibrate --backend sim --out "$tmp/cal.txt"
[ -s "$tmp/cal.txt" ] || { echo "FAIL calibrate --out file: empty"; fails=$((fails + 1)); }
expect "demo --trace file" 0 "" "$tmp/out" -- "$T" "${DEMO[@]}" --trace "$tmp/trace.json"
expect "plan to a pipe" 0 "" "$tmp/out" -- "$T" "${PLAN[@]}"

if [ $fails -ne 0 ]; then
  echo "output errors: $fails FAILED"
  exit 1
fi
echo "output errors: all refused with a message"
