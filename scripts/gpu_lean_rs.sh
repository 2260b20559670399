#!/usr/bin/env bash
# Session 5 round 4: where the wrong elements of gemm+ring_rs[adaptive] in threads mode come from
# (round 3). The same bench rows (threads, P = 8, adaptive on the round-3 table) with the lean
# enqueue on and off, with and without MPS (CUDA_DEVICE_MAX_CONNECTIONS 8 and 32).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}; BUILD=${BUILD:-/tmp/tpf-build-lean}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu
if [ ! -x "$BUILD/tpflex" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DTPF_WITH_CUDA=ON -DTPF_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMOCKA_INCLUDE_DIR=$ROOT/.deps/root/usr/include \
    -DCMOCKA_LIBRARY=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu/libcmocka.so.0 >"$OUT/build.log" 2>&1
  cmake --build "$BUILD" -j 16 --target tpflex_cli >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
B=(bench --backend cuda --section tp --mode threads --tp-list 8 --capacity 32768 --hidden 8192 --n 3584
   --tokens 1024,4096,8192 --iters 5 --warmup 2 --adaptive --cost "$ROOT/docs/results/h200-2026-12-03-s5-tuned-cost.txt"
   --ops "${OPS:-gemm+ring_rs,gemm+pipeline_rs}")
run() { # NAME ENV...
  local n=$1; shift
  env "$@" timeout --signal=KILL 120 "$BUILD/tpflex" "${B[@]}" >"$OUT/$n.txt" 2>&1; local rc=$?
  echo "== $n rc=$rc ($*)"; sed -n '/^# Section 4\/5 modes/,/^$/p' "$OUT/$n.txt" | awk '{print $1, $2, $4, $6, $NF}' | grep -v '^#'
}
run lean1-c32 TPF_CUDA_LEAN_ENQUEUE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
run lean0-c32 TPF_CUDA_LEAN_ENQUEUE=0 CUDA_DEVICE_MAX_CONNECTIONS=32
run lean1-c8 TPF_CUDA_LEAN_ENQUEUE=1 CUDA_DEVICE_MAX_CONNECTIONS=8
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log; mkdir -p /tmp/mps /tmp/mps-log
PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d
run lean1-c8-mps TPF_CUDA_LEAN_ENQUEUE=1 CUDA_DEVICE_MAX_CONNECTIONS=8
run lean0-c8-mps TPF_CUDA_LEAN_ENQUEUE=0 CUDA_DEVICE_MAX_CONNECTIONS=8
echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control
