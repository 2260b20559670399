#!/usr/bin/env bash
# The tp section in both modes on one GPU (issue 13): ranks as threads and ranks as processes
# (every rank its own process, sharing the GPU through CUDA IPC) side by side in one
# `tpflex bench` run: host wall per operation against the serial baseline in the same mode,
# time(T)/time(C) against T/C, host enqueue cost per operation, #wrong; plus the threads-only
# device-event table.
#
#   BUILD=/path/to/cuda-build OUT=/path/to/out bash scripts/gpu_modes.sh [--quick]
#
# BUILD: a build directory configured with -DTPF_WITH_CUDA=ON; its tpflex_cli target is brought up
# to date first (seconds when it is; a full build is not part of the time budget below). OUT
# (default ./modes-logs) receives, each step tee'd there as it runs:
#   env.txt                    GPU, driver, nvcc, commit
#   modes_p8.{txt,err,csv,json}    P = 8, C = 32768, H = 8192, N = 3584, T = 1k .. 32k, both modes
#   modes_p2_p4.{txt,err,csv,json} the same at P = 2 and 4, only when the budget has room left
#   summary.txt                one line per step, and the modes table rows (tp_modes) of each
# Bounds: every step runs under `timeout --signal=KILL` (the ranks die with it: the launcher's
# PR_SET_PDEATHSIG), and bench's --timeout bounds each process group; P = 8 gets 270 s, P = 2, 4
# whatever is left of BUDGET (default 290 s, so the script ends within about 5 minutes), and is
# skipped under 60 s. --quick: T = 4k .. 32k and fewer repetitions (a smoke test).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:?set BUILD to a build directory configured with -DTPF_WITH_CUDA=ON}
OUT=${OUT:-$ROOT/modes-logs}
BUDGET=${BUDGET:-290}
TOKENS=1024,2048,4096,8192,16384,32768
REPS=(--iters 10 --warmup 3)
if [ "${1:-}" = --quick ]; then
  TOKENS=4096,8192,16384,32768
  REPS=(--iters 5 --warmup 2)
fi
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
# A bootstrap wait of a rank process (a peer that died or hangs) fails after 60 s, not 120 s.
export TPF_BOOT_TIMEOUT_MS=${TPF_BOOT_TIMEOUT_MS:-60000}
TPF=$BUILD/tpflex
. "$ROOT/scripts/gpu_cli_lib.sh" # SUMMARY, note, gpu_cli_preamble, gpu_step
gpu_cli_preamble
T0=$(date +%s)

step() { gpu_step 14 "$@"; }

# modes NAME LIMIT PLIST: both modes at the P values PLIST, within LIMIT seconds.
modes() {
  local name=$1 limit=$2 plist=$3
  # bench's own bound per process group: what is left after the threads half (about a third).
  local group=$(( limit * 2 / 3 ))
  step "$name" "$limit" "$TPF" bench --backend cuda --section tp --mode both --tp-list "$plist" \
    --tokens "$TOKENS" "${REPS[@]}" --timeout "$group" --csv "$OUT/$name.csv" \
    --json "$OUT/$name.json"
  local rc=$?
  {
    echo "$name: modes table (op mode P T T/C time serial speedup tT/tC tT/tC/(T/C) enqueue vs_threads #wrong):"
    sed -n '/^# Section 4\/5 modes/,/^$/p' "$OUT/$name.txt" | grep -v '^#' | grep . | sed 's/^/  /'
    grep -E '^# (FAILED|bench finished)' "$OUT/$name.txt" | sed "s/^/$name: /"
  } >>"$SUMMARY"
  return "$rc"
}

# 1. The issue's configuration: P = 8 on one H200, T = 1k .. 32k.
modes modes_p8 270 8
# 2. P = 2 and 4 with the time that is left.
left=$(( BUDGET - ($(date +%s) - T0) ))
if [ "$left" -ge 60 ]; then
  modes modes_p2_p4 "$left" 2,4
else
  note "modes_p2_p4    skipped: ${left} s left of the ${BUDGET} s budget"
fi
note "total: $(( $(date +%s) - T0 )) s (after the build check); logs in $OUT"
echo
cat "$SUMMARY"
