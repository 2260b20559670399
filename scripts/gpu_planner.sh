#!/usr/bin/env bash
# The planner proof on one GPU (issue 14): measure this machine's cost table together with the
# planner's candidate schedules (calibrate --schedules: the "tuned" table), run the planner
# benchmark with the tuned table and with the shipped H200 table (and, when time remains, with the
# measured table without its schedule points), and print the multi-GPU projection.
#
#   BUILD=/path/to/cuda-build OUT=/path/to/out scripts/gpu_planner.sh [--quick]
#
# BUILD: a build directory configured with -DTPF_WITH_CUDA=ON; its tpflex_cli target is brought up
# to date first (seconds when it is; a full build is not part of the time budget below). OUT
# (default ./planner-logs) receives, each step tee'd there as it runs:
#   env.txt                      GPU, driver, nvcc, commit
#   calibrate.txt, .err          `tpflex calibrate --schedules` summary, and its progress
#   h200_tuned.txt               the measured cost table with the measured schedules (sched lines:
#                                every candidate of RING AG and PIPELINE RS, P = 2, 4, 8 ranks
#                                sharing the GPU, T = 512 .. 32768, N = 3584 and 1024)
#   h200_calibrated.txt          the same table without its sched lines (its other lines are what
#                                a plain `tpflex calibrate` measures)
#   h200_calibrated_nvlink.txt   that with the shipped table's documented NVLink peer link (one
#                                GPU cannot measure NVLink), for the projection
#   bench_tuned.{txt,err,csv,json}       planner benchmark, adaptive communicators on the tuned
#                                table (decisions from the measured schedules; the pred and err
#                                columns stay the model's own)
#   bench_shipped.{txt,err,csv,json}     the same on the shipped data/cost/h200.txt (model only)
#   bench_calibrated.{txt,err,csv,json}  the same on h200_calibrated.txt, only when time allows
#   project_shipped.txt, project_calibrated.txt   `tpflex plan --project` (P = 8, PROJECTION)
#   summary.txt                  one line per step and the headline lines of each: rows within
#                                1.03x and the worst row, the model's median error (all T, and
#                                T >= 2048), the decisions' sources
# Every step runs under a timeout: 150 + 120 + 120 + 10 + 10 s (under 7 minutes), plus 120 s for
# the optional calibrated run only when the whole still fits BUDGET_S (default 420 s); nothing
# needs the network. --quick: fewer shapes and repetitions everywhere (a smoke test).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:?set BUILD to a build directory configured with -DTPF_WITH_CUDA=ON}
OUT=${OUT:-$ROOT/planner-logs}
BUDGET_S=${BUDGET_S:-420}
QUICK=()
[ "${1:-}" = --quick ] && QUICK=(--quick)
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
TPF=$BUILD/tpflex
SHIPPED=$ROOT/data/cost/h200.txt
. "$ROOT/scripts/gpu_cli_lib.sh" # SUMMARY, note, gpu_cli_preamble, gpu_step
gpu_cli_preamble
T0=$(date +%s)

step() { gpu_step 20 "$@"; }

# 1. The cost table of this GPU, with the planner's candidates measured as sched lines.
TUNED=$OUT/h200_tuned.txt
CAL=$OUT/h200_calibrated.txt
NVL=$OUT/h200_calibrated_nvlink.txt
rm -f "$TUNED" "$CAL" "$NVL"
step calibrate 150 "$TPF" calibrate --backend cuda --schedules --out "$TUNED" "${QUICK[@]}"
have_cal=0
have_tuned=0
if [ -s "$TUNED" ] && grep -q '^gemm ' "$TUNED"; then
  have_cal=1
  grep -q '^sched ' "$TUNED" && have_tuned=1
  grep -v '^sched ' "$TUNED" >"$CAL"
  grep -v '^copy peer ' "$CAL" >"$NVL"
  echo "# copy peer: the shipped table's documented NVLink4 parameter (not measured here)" >>"$NVL"
  grep '^copy peer ' "$SHIPPED" >>"$NVL"
  sed -n 's/^  /calibrate: /p' "$OUT/calibrate.txt" | tee -a "$SUMMARY" >/dev/null
else
  note "calibrate produced no table: the tuned and calibrated benchmarks and the projection are skipped"
fi

# 2. The planner benchmark: P = 2, 4, 8 ranks on this GPU, T = 512 .. 32768, N = 3584 and 1024.
bench() { # name table
  step "$1" 120 "$TPF" bench --backend cuda --section planner --cost "$2" "${QUICK[@]}" \
    --csv "$OUT/$1.csv" --json "$OUT/$1.json"
  grep -E '^# (adaptive <=|\|pred/meas|model \|pred/meas|decisions by source|sched points|bench finished)' \
    "$OUT/$1.txt" | sed "s/^/$1: /" | tee -a "$SUMMARY" >/dev/null
}
[ "$have_tuned" = 1 ] && bench bench_tuned "$TUNED"
bench bench_shipped "$SHIPPED"
# The measured table without its schedules: only when it fits (120 s, then 20 s of projections).
if [ "$have_cal" = 1 ]; then
  used=$(( $(date +%s) - T0 ))
  if [ $(( used + 120 + 20 )) -le "$BUDGET_S" ]; then
    bench bench_calibrated "$CAL"
  else
    note "bench_calibrated skipped: $used s used, 120 s more would pass BUDGET_S=$BUDGET_S"
  fi
fi

# 3. The projection to 8 GPUs over NVLink (predicted, not measured).
step project_shipped 10 "$TPF" plan --project --cost "$SHIPPED"
grep '^summary' "$OUT/project_shipped.txt" | sed 's/^/project_shipped: /' >>"$SUMMARY"
if [ "$have_cal" = 1 ]; then
  step project_calibrated 10 "$TPF" plan --project --cost "$NVL"
  grep '^summary' "$OUT/project_calibrated.txt" | sed 's/^/project_calibrated: /' >>"$SUMMARY"
fi
note "total: $(( $(date +%s) - T0 )) s (after the build check); logs in $OUT"
echo
cat "$SUMMARY"
