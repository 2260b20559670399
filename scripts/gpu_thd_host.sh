#!/usr/bin/env bash
# Issue 24 item 4 on a GPU machine: the THD step of tpflex.torch's modules against plain torch
# after session 9's host-path changes (python/tpflex/layers: torch's own ops at tp_size 1, the
# communicators resolved once per registration, one GEMM for a fused fp32 weight gradient).
#   bench_p1       examples/bench_thd_step.py at P = 1 with --ops --profile: median ms per step of
#                  the modules and of plain torch, the ratio (target <= 1.2 at T = 1k, 4k, 16k;
#                  run 7: 1.36 / 1.27 / 0.98), the aten operations per step of each and those
#                  whose counts differ (expected: none, as tests/python/test_layers.py asserts on
#                  the CPU), torch.profiler's host table at the first T
#   train_p1       examples/thd_training_step.py --backend cuda at P = 1: the modules' values on
#                  CUDA bf16 (the native path) against the fp32 reference, step by step
#   train_p2_mps   the same at P = 2 processes under MPS (the autograd functions on CUDA, the
#                  bias gradient as one bf16 reduction)
#   bench_p2_mps   bench_thd_step at P = 2 under MPS (target <= 1.3x the P = 1 time)
#   graphed_p1     examples/thd_graphed_step.py at P = 1 (graphed ratio; run 6: 1.21-1.28)
#   layers_sim     tests/python/test_layers.py (the simulator) on this machine's torch
# Logs, summary.txt and figures.txt under $OUT.
#
#   OUT=/tmp/out BUILD=/tmp/tpf-src/build-gpu bash scripts/gpu_thd_host.sh
#
# BUILD: a CUDA build folder with libtpflex.so (scripts/gpu_round.sh build makes
# /tmp/tpf-src/build-gpu; scripts/gpu_graphed.sh builds the library alone when it is missing).
# Knobs: TOKENS (default 1024,4096,16384), PYTHON (default python3), SKIP (step names to leave
# out, e.g. SKIP="train_p1 layers_sim" when a device call must stay under its 10 minutes).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs/thd_host}
BUILD=${BUILD:-/tmp/tpf-src/build-gpu}
TOKENS=${TOKENS:-1024,4096,16384}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
S=$OUT/summary.txt
: >"$S"
note() { echo "$*" | tee -a "$S"; }
export PATH=/usr/local/cuda/bin:$PATH CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH} PYTHONWARNINGS=ignore
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export TPF_CUDA_BOOT_TIMEOUT_MS=${TPF_CUDA_BOOT_TIMEOUT_MS:-60000}
if [ ! -f "$BUILD/libtpflex.so" ]; then
  note "no $BUILD/libtpflex.so: build it first (scripts/gpu_round.sh build)"
  exit 1
fi
export TPFLEX_LIBRARY=$BUILD/libtpflex.so
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null); commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || cat "$ROOT/.snap-commit" 2>/dev/null || echo '?')"

fails=0
step() { # step NAME TIMEOUT CMD...: logged to $OUT/NAME.log, rc and the verdict line in summary
  local n=$1 to=$2; shift 2
  case " ${SKIP:-} " in *" $n "*) note "$n: skipped (SKIP)"; return 0 ;; esac
  local t0=$(date +%s)
  (cd "$ROOT" && timeout --signal=TERM --kill-after=10 "$to" "$@") >"$OUT/$n.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E 'every check OK|CHECK FAILED|passed|failed|done|differ' "$OUT/$n.log" | tail -n 2 | tr '\n' ' ')
  note "$(printf '%-14s rc=%-3s %4ss  %s' "$n" "$rc" "$(( $(date +%s) - t0 ))" "${last:0:160}")"
  [ "$rc" -eq 0 ] || fails=$((fails + 1))
}
TR=("$PY" -m torch.distributed.run --standalone)

step bench_p1 300 "${TR[@]}" --nproc-per-node 1 examples/bench_thd_step.py --T "$TOKENS" \
  --ops --profile
step train_p1 300 "${TR[@]}" --nproc-per-node 1 examples/thd_training_step.py --backend cuda
step graphed_p1 400 "${TR[@]}" --nproc-per-node 1 examples/thd_graphed_step.py --backend cuda \
  --tokens "$TOKENS" --stream 50
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps /tmp/mps-log
if PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d 2>/dev/null; then
  note "MPS: started"
else
  note "MPS: not started (P = 2 runs without it)"
fi
step train_p2_mps 300 "${TR[@]}" --nproc-per-node 2 examples/thd_training_step.py --backend cuda
step bench_p2_mps 300 "${TR[@]}" --nproc-per-node 2 examples/bench_thd_step.py --T "$TOKENS" \
  --ops
echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control 2>/dev/null
step layers_sim 600 "$PY" tests/python/run_tests.py test_layers.py
{
  for f in bench_p1 bench_p2_mps; do
    echo "== $f"; grep -E '^bench_thd_step|^ *[0-9]+ |aten ops' "$OUT/$f.log"
  done
  echo "== graphed_p1"; grep '^thd_graphed_step:' "$OUT/graphed_p1.log"
} >"$OUT/figures.txt" 2>/dev/null
if grep -q 'aten ops per step' "$OUT/bench_p1.log" &&
   grep 'aten ops per step' "$OUT/bench_p1.log" | grep -vq 'differ (tpflex/torch): none$'; then
  note "bench_p1: the modules' aten operations differ from plain torch's at P = 1 (figures.txt)"
  fails=$((fails + 1))
fi
note "total: $fails failing step(s) (logs in $OUT; figures in $OUT/figures.txt)"
exit $((fails > 0))
