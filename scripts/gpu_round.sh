#!/usr/bin/env bash
# One GPU round on a lent machine: builds a committed snapshot (.snap/src.tar, written by
# scripts/gpu_snapshot.sh from `git archive`,
# so half-edited files of a working tree never reach the GPU), then runs the steps named on the
# command line, each bounded, each logged under $OUT/<step>.log, with a summary in $OUT/summary.txt.
#
#   steps: build gpu-ctest conformance python planner proc
#   usage: OUT=... bash scripts/gpu_round.sh build gpu-ctest conformance
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs}
SRC=${SRC:-/tmp/tpf-src}
BUILD=$SRC/build-gpu
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=32
DEPS=$SRC/.deps/root
S=$OUT/summary.txt
. "$ROOT/scripts/gpu_steps.sh" # note, step
if [ ! -d "$SRC/core" ]; then
  mkdir -p "$SRC" && tar -xf "$ROOT/.snap/src.tar" -C "$SRC" && cp -r "$ROOT/.deps" "$SRC/.deps"
fi
note "snapshot: $(cat "$SRC/.snap-commit" 2>/dev/null || echo '?')"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
for s in "$@"; do
  case $s in
  build)
    # -Werror stays in CI (the CPU machine's compilers); the GPU machine's gcc warns differently
    # (format-truncation on 2026-12-03) and a warning must not cost a GPU round.
    step configure 120 "cmake -S . -B $BUILD -G Ninja -DTPF_WITH_CUDA=ON -DTPF_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMOCKA_INCLUDE_DIR=$DEPS/usr/include -DCMOCKA_LIBRARY=$DEPS/usr/lib/x86_64-linux-gnu/libcmocka.so.0"
    step build 300 "cmake --build $BUILD -j 16" || { tail -30 "$OUT/build.log"; exit 1; }
    step symbols 30 "bash tests/install/check_symbols.sh $BUILD/libtpflex.so include" ;;
  gpu-ctest)
    step gpu-ctest 400 "cd $BUILD && ctest -L gpu --output-on-failure --timeout 240 -j 1"
    grep -E "tests passed|Failed|\*\*\*|Skipped" "$OUT/gpu-ctest.log" | tee -a "$S" ;;
  conformance)
    step conf-quick 120 "$BUILD/tests/conformance/conformance_cuda --quick"
    step conf-quick-fallback 120 "TPF_CUDA_GEMM_FALLBACK=1 $BUILD/tests/conformance/conformance_cuda --quick"
    step conf-adaptive 120 "$BUILD/tests/conformance/conformance_cuda --quick --adaptive"
    step conf-full 240 "$BUILD/tests/conformance/conformance_cuda"
    for f in conf-quick conf-quick-fallback conf-adaptive conf-full; do tail -1 "$OUT/$f.log" | tee -a "$S"; done ;;
  python)
    if [ -f scripts/gpu_python.sh ]; then
      step python 420 "OUT=$OUT/python BUILD=$BUILD bash scripts/gpu_python.sh"
    else note "python: scripts/gpu_python.sh not in this snapshot"; fi ;;
  planner)
    if [ -f scripts/gpu_planner.sh ]; then
      step planner 420 "OUT=$OUT/planner BUILD=$BUILD bash scripts/gpu_planner.sh"
    else note "planner: scripts/gpu_planner.sh not in this snapshot"; fi ;;
  proc)
    if [ -f scripts/gpu_proc.sh ]; then
      step proc 420 "OUT=$OUT/proc BUILD=$BUILD bash scripts/gpu_proc.sh"
    else note "proc: scripts/gpu_proc.sh not in this snapshot"; fi ;;
  *) note "unknown step $s" ;;
  esac
done
