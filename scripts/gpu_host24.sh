#!/usr/bin/env bash
# Issue 24's host-path figures on a GPU machine, side by side in one run: the C enqueue per
# operation (tpflex bench --section tp, enqueue breakdown), the Python overhead above the raw C
# call (examples/bench_python_overhead.py --backend cuda) and the THD training step against
# plain torch at P = 1 and at P = 2 processes (examples/bench_thd_step.py), and the host section's
# CUDA table (tpflex bench --section host: per operation the host and device cost against a plain
# cuBLASLt matmul, NO_BENCH_HOST=1 skips it); all under
# MPS, so that ranks in several processes share the GPU as in production.
# BUILD: a CUDA build folder with tpflex and libtpflex.so (scripts/gpu_round.sh build makes
# /tmp/tpf-src/build-gpu). Logs and summary.txt under $OUT.
#
#   OUT=/tmp/out BUILD=/tmp/tpf-src/build-gpu bash scripts/gpu_host24.sh
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs/host24}
BUILD=${BUILD:-/tmp/tpf-src/build-gpu}
BENCH_T=${BENCH_T:-1024,4096,16384}
mkdir -p "$OUT"
S=$OUT/summary.txt
export PATH=/usr/local/cuda/bin:$PATH CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_MAX_CONNECTIONS=32
export PYTHONPATH=$ROOT/python PYTHONWARNINGS=ignore OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
export TPFLEX_LIBRARY=$BUILD/libtpflex.so TPF_CUDA_BOOT_TIMEOUT_MS=60000
step() { # step NAME TIMEOUT CMD...
  local n=$1 to=$2; shift 2
  local t0=$(date +%s)
  (cd "$ROOT" && timeout "$to" "$@") >"$OUT/$n.log" 2>&1
  echo "$n rc=$? $(( $(date +%s) - t0 )) s: $*" | tee -a "$S"
}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps /tmp/mps-log
PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d && echo "MPS: started" | tee -a "$S"
[ -n "${NO_BENCH_TP:-}" ] || step bench_tp 150 "$BUILD/tpflex" bench --backend cuda --section tp \
  --mode both --tp-list 1,2,8 --capacity 4096 --tokens 1024
# The host section on CUDA (bench/bench_host_cuda.c): per operation kind, P = 1, 2 and T = 1k, 4k,
# 16k, the tpf_* call's host us, CUDA calls and device us against one cuBLASLt matmul of the same
# shape in the same run (after the CPU tables of the core and the simulator).
[ -n "${NO_BENCH_HOST:-}" ] || step bench_host 300 "$BUILD/tpflex" bench --backend cuda \
  --section host --csv "$OUT/bench_host.csv" --json "$OUT/bench_host.json"
step overhead_cuda 90 python3 examples/bench_python_overhead.py --backend cuda --iters 2000
step thd_p1 120 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
  examples/bench_thd_step.py --T "$BENCH_T" --profile
step thd_p2_mps 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
  examples/bench_thd_step.py --T "$BENCH_T"
echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control 2>/dev/null
