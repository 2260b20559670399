#!/usr/bin/env bash
# One device call of a session's plan (docs/GPU_RUNS.md), packed to fit the tool's limits: every
# call builds the committed snapshot when the machine is fresh (scripts/gpu_round.sh build; carry
# ".snap" and ".deps"), runs its steps under one overall bound, then packs every log into
# $OUT/<call>.tgz and copies the summaries beside it (the tool returns at most 8 files).
#
#   check    the label-gpu tests but the full threads conformance and the bench (the creation
#            path in both rank modes: conformance quick, process conformance, the process
#            fault cases, mismatch, two_comms, capture, ipc, epilogue, graphed), then
#            test_cuda_gemm_plan and tests/python/test_fp8.py on the CUDA build
#   fp8      issue 28: FP8 against bf16 at P = 8 rank threads (`tpflex bench --section fp8`;
#            the P = 1 table is session 8's run 7), then the fp8_e4m3 GEMM points of
#            `tpflex calibrate` (scripts/gpu_calibrate_fp8.sh)
#   host     issue 24: scripts/gpu_host24.sh (C enqueue, host section, Python overhead, THD step
#            at P = 1 and P = 2 under MPS)
#   thd      issue 24 item 4's remaining steps: scripts/gpu_thd_host.sh but train_p1 and
#            layers_sim (CI runs the latter): bench_p1 with --ops --profile, graphed_p1,
#            train_p2_mps, bench_p2_mps
#
#   usage: OUT=... bash scripts/gpu_calls.sh CALL [BOUND_S]
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CALL=${1:?call: check fp8 host thd}
BOUND=${2:-570}
OUT=${OUT:-$ROOT/gpu-logs}
R=$OUT/$CALL
SRC=/tmp/tpf-src
BUILD=$SRC/build-gpu
mkdir -p "$R"
T0=$(date +%s)
left() { echo $((BOUND - ($(date +%s) - T0))); }
build() {
  [ -x "$BUILD/tpflex" ] && [ -f "$BUILD/libtpflex.so" ] && return 0
  OUT=$R/round bash "$ROOT/scripts/gpu_round.sh" build
}
case $CALL in
check)
  build || exit 1
  (cd "$BUILD" && LD_LIBRARY_PATH=$SRC/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} \
    PATH=/usr/local/cuda/bin:$PATH CUDA_DEVICE_MAX_CONNECTIONS=32 \
    timeout $(($(left) - 90)) ctest -L gpu -E '^(conformance_cuda|bench_tp_modes_gpu)$' \
    --output-on-failure --timeout 240 -j 1) >"$R/gpu-ctest.log" 2>&1
  echo "gpu-ctest rc=$? at $(($(date +%s) - T0)) s" >>"$R/summary.txt"
  grep -E "tests passed|Failed|\*\*\*|Skipped|Passed" "$R/gpu-ctest.log" >>"$R/summary.txt"
  timeout $(($(left) - 10)) env OUT=$R/fp8 bash "$ROOT/scripts/gpu_fp8.sh" plan python ;;
fp8)
  build || exit 1
  timeout $(($(left) - 250)) env OUT=$R/fp8 bash "$ROOT/scripts/gpu_fp8.sh" bench8
  timeout $(($(left) - 10)) env OUT=$R/cal bash "$ROOT/scripts/gpu_calibrate_fp8.sh" ;;
host)
  build || exit 1
  timeout $(($(left) - 10)) env OUT=$R/h24 BUILD=$BUILD bash "$ROOT/scripts/gpu_host24.sh" ;;
thd)
  build || exit 1
  timeout $(($(left) - 10)) env OUT=$R/thd BUILD=$BUILD SKIP="train_p1 layers_sim" \
    bash "$ROOT/scripts/gpu_thd_host.sh" ;;
*) echo "unknown call $CALL"; exit 2 ;;
esac
echo "call $CALL: $(($(date +%s) - T0)) s" >>"$R/summary.txt"
find "$R" -name summary.txt | sort | while read -r f; do echo "== $f"; cat "$f"; done >"$OUT/$CALL-summary.txt"
tar -czf "$OUT/$CALL.tgz" -C "$OUT" "$CALL" && rm -rf "$R"
cat "$OUT/$CALL-summary.txt"
