#!/usr/bin/env bash
# tpflex.torch.graphed on a GPU machine (docs/SPEC.md §10): the CUDA part of
# tests/python/test_graphed.py (torch.cuda.CUDAGraph capture of tpflex operations and of Linear
# at several buckets, replayed over random T streams against eager) at P = 1 and at P = 2
# processes on GPU 0, the whole test file under pytest (simulator part against this library,
# CUDA class at P = 1), then the THD step graphed against plain torch graphed
# (examples/thd_graphed_step.py: T in 1024, 4096, 16384 and a random T stream; median ms,
# host µs per call, padding overhead) at P = 1 and at P = 2 under MPS, and the ladder table
# (examples/graphed_buckets.py, CPU). Logs, summary.txt and figures.txt under $OUT.
#
#   OUT=/tmp/out BUILD=/tmp/tpf-src/build-gpu bash scripts/gpu_graphed.sh [tests|bench|all]
#
# BUILD: a CUDA build folder (scripts/gpu_round.sh build makes /tmp/tpf-src/build-gpu); when it
# has no libtpflex.so the library alone is configured and built there. Knobs: STREAM (random-T
# microbatches, default 200), TOKENS (default 1024,4096,16384), PYTHON (default python3).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs/graphed}
BUILD=${BUILD:-/tmp/tpf-src/build-gpu}
MODE=${1:-all}
STREAM=${STREAM:-200}
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
  note "no $BUILD/libtpflex.so: configuring and building the library in $BUILD"
  ARGS=(-DTPF_WITH_CUDA=ON -DTPF_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  command -v ninja >/dev/null && ARGS+=(-G Ninja)
  D=$ROOT/.deps/root
  if [ ! -f /usr/include/cmocka.h ] && [ -f "$D/usr/include/cmocka.h" ]; then
    ARGS+=(-DCMOCKA_INCLUDE_DIR="$D/usr/include"
           -DCMOCKA_LIBRARY="$D/usr/lib/x86_64-linux-gnu/libcmocka.so.0")
  fi
  { cmake -S "$ROOT" -B "$BUILD" "${ARGS[@]}" &&
    cmake --build "$BUILD" -j "$(nproc)" --target tpflex_shared; } >"$OUT/build.log" 2>&1 ||
    { note "build FAILED (build.log)"; tail -30 "$OUT/build.log"; exit 1; }
fi
export TPFLEX_LIBRARY=$BUILD/libtpflex.so
{ nvidia-smi; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'; } >"$OUT/env.txt" 2>&1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(grep '^torch' "$OUT/env.txt"); library $TPFLEX_LIBRARY; commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || cat "$ROOT/.snap-commit" 2>/dev/null || echo '?')"

fails=0
step() { # step NAME TIMEOUT CMD...: logged to $OUT/NAME.log, rc and the verdict line in summary
  local n=$1 to=$2; shift 2
  local t0=$(date +%s)
  (cd "$ROOT" && timeout --signal=TERM --kill-after=10 "$to" "$@") >"$OUT/$n.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E 'every test OK|FAILED|skipped|passed|failed|done|CHECK' "$OUT/$n.log" | tail -n 2 | tr '\n' ' ')
  note "$(printf '%-22s rc=%-3s %4ss  %s' "$n" "$rc" "$(( $(date +%s) - t0 ))" "${last:0:160}")"
  [ "$rc" -eq 0 ] || fails=$((fails + 1))
}
TR=("$PY" -m torch.distributed.run --standalone)

if [ "$MODE" != bench ]; then
  step graphed_cuda_p1 300 "$PY" tests/python/test_graphed.py --cuda
  step graphed_cuda_p2 300 "${TR[@]}" --nproc-per-node 2 tests/python/test_graphed.py --cuda
  step graphed_pytest 300 "$PY" tests/python/run_tests.py test_graphed.py
fi
if [ "$MODE" != tests ]; then
  step ladder 120 "$PY" examples/graphed_buckets.py
  step step_p1 400 "${TR[@]}" --nproc-per-node 1 examples/thd_graphed_step.py --backend cuda \
    --tokens "$TOKENS" --stream "$STREAM"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  if PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d 2>/dev/null; then
    note "MPS: started"
  else
    note "MPS: not started (P = 2 runs without it)"
  fi
  step step_p2_mps 400 "${TR[@]}" --nproc-per-node 2 examples/thd_graphed_step.py \
    --backend cuda --tokens "$TOKENS" --stream "$STREAM"
  echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control 2>/dev/null
  {
    for f in step_p1 step_p2_mps; do echo "== $f"; grep '^thd_graphed_step:' "$OUT/$f.log"; done
    echo "== ladder"; grep -v '^$' "$OUT/ladder.log"
  } >"$OUT/figures.txt" 2>/dev/null
fi
note "total: $fails failing step(s) (logs in $OUT)"
exit $((fails > 0))
