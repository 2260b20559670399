#!/usr/bin/env bash
# The planner proof on one GPU (issue 14): measure this machine's cost table, run the planner
# benchmark with it and with the shipped H200 table, and print the multi-GPU projection.
#
#   BUILD=/path/to/cuda-build OUT=/path/to/out scripts/gpu_planner.sh [--quick]
#
# BUILD: a build directory configured with -DTPF_WITH_CUDA=ON; its tpflex_cli target is brought up
# to date first (seconds when it is; a full build is not part of the time budget below). OUT
# (default ./planner-logs) receives, each step tee'd there as it runs:
#   env.txt                      GPU, driver, nvcc, commit
#   calibrate.txt, .err          `tpflex calibrate` summary, and its progress
#   h200_calibrated.txt          the measured cost table
#   h200_calibrated_nvlink.txt   the same with the shipped table's documented NVLink peer link
#                                (one GPU cannot measure NVLink), for the projection
#   bench_calibrated.{txt,err,csv,json}  planner benchmark, adaptive communicators on the
#                                measured table
#   bench_shipped.{txt,err,csv,json}     the same on the shipped data/cost/h200.txt
#   project_shipped.txt, project_calibrated.txt   `tpflex plan --project` (P = 8, PROJECTION)
#   summary.txt                  one line per step and the headline lines of each
# Every step runs under a timeout (90 + 120 + 120 + 10 + 10 s: under 6 minutes in all); nothing
# needs the network. --quick: fewer shapes and repetitions everywhere (a smoke test).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:?set BUILD to a build directory configured with -DTPF_WITH_CUDA=ON}
OUT=${OUT:-$ROOT/planner-logs}
QUICK=()
[ "${1:-}" = --quick ] && QUICK=(--quick)
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
TPF=$BUILD/tpflex
SHIPPED=$ROOT/data/cost/h200.txt
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -2
  date -u
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null), $(git -C "$ROOT" status --short 2>/dev/null | wc -l) changed files"
} >"$OUT/env.txt" 2>&1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

if ! cmake --build "$BUILD" -j "$(nproc)" --target tpflex_cli >"$OUT/build.log" 2>&1; then
  note "build of tpflex_cli in $BUILD FAILED (build.log)"; tail -30 "$OUT/build.log"; exit 1
fi
T0=$(date +%s)

# step NAME LIMIT CMD...: stdout to $OUT/NAME.txt and stderr to $OUT/NAME.err, both also shown.
step() {
  local name=$1 limit=$2; shift 2
  local s0; s0=$(date +%s)
  timeout --signal=KILL "$limit" "$@" 2> >(tee "$OUT/$name.err" >&2) | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  note "$(printf '%-20s rc=%-3s %4s s' "$name" "$rc" "$(( $(date +%s) - s0 ))")"
  return "$rc"
}

# 1. The cost table of this GPU.
CAL=$OUT/h200_calibrated.txt
rm -f "$CAL"
step calibrate 90 "$TPF" calibrate --backend cuda --out "$CAL" "${QUICK[@]}"
have_cal=0
if [ -s "$CAL" ] && grep -q '^gemm ' "$CAL"; then
  have_cal=1
  grep -v '^copy peer ' "$CAL" >"$OUT/h200_calibrated_nvlink.txt"
  echo "# copy peer: the shipped table's documented NVLink4 parameter (not measured here)" \
    >>"$OUT/h200_calibrated_nvlink.txt"
  grep '^copy peer ' "$SHIPPED" >>"$OUT/h200_calibrated_nvlink.txt"
  sed -n 's/^  /calibrate: /p' "$OUT/calibrate.txt" | tee -a "$SUMMARY" >/dev/null
else
  note "calibrate produced no table: the calibrated benchmark and projection are skipped"
fi

# 2. The planner benchmark: P = 2, 4, 8 ranks on this GPU, T = 512 .. 32768, N = 3584 and 1024.
bench() { # name table
  step "$1" 120 "$TPF" bench --backend cuda --section planner --cost "$2" "${QUICK[@]}" \
    --csv "$OUT/$1.csv" --json "$OUT/$1.json"
  grep -E '^# (adaptive <=|\|pred/meas|bench finished)' "$OUT/$1.txt" | sed "s/^/$1: /" |
    tee -a "$SUMMARY" >/dev/null
}
[ "$have_cal" = 1 ] && bench bench_calibrated "$CAL"
bench bench_shipped "$SHIPPED"

# 3. The projection to 8 GPUs over NVLink (predicted, not measured).
step project_shipped 10 "$TPF" plan --project --cost "$SHIPPED"
grep '^summary' "$OUT/project_shipped.txt" | sed 's/^/project_shipped: /' >>"$SUMMARY"
if [ "$have_cal" = 1 ]; then
  step project_calibrated 10 "$TPF" plan --project --cost "$OUT/h200_calibrated_nvlink.txt"
  grep '^summary' "$OUT/project_calibrated.txt" | sed 's/^/project_calibrated: /' >>"$SUMMARY"
fi
note "total: $(( $(date +%s) - T0 )) s (after the build check); logs in $OUT"
echo
cat "$SUMMARY"
