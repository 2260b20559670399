#!/usr/bin/env bash
# The Python package on a GPU machine: tpflex.torch's CUDA backend under torchrun with P = 2
# and 4 processes all on GPU 0 (bootstrapped over gloo; NCCL refuses several ranks on one
# device), the THD training example, its step-time comparison and the Python overhead bench.
# Needs python3 with torch built with CUDA; needs no network (torchrun --standalone rendezvous
# on this host). One log per step and summary.txt go to $OUT (default ./gpu-logs/python).
#
#   OUT=/tmp/out BUILD=/tmp/tpf-build-cuda bash scripts/gpu_python.sh          all steps
#   BUILD=build-cuda bash scripts/gpu_python.sh tests                          tests only
#                                                                              (make test-cuda)
# BUILD is a CUDA build directory (cmake -DTPF_WITH_CUDA=ON); when it has no libtpflex.so the
# library alone is configured and built there (CMocka from .deps/root like gpu_run.sh).
# Knobs: STEP_TIMEOUT (s per step, default 100), BUDGET (s; steps that would start later are
# skipped, default 240), BENCH_T (default 1024,4096,16384), PYTHON (default python3).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs/python}
BUILD=${BUILD:-/tmp/tpf-build-cuda}
MODE=${1:-all}
STEP_TIMEOUT=${STEP_TIMEOUT:-100}
BUDGET=${BUDGET:-240}
BENCH_T=${BENCH_T:-1024,4096,16384}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
T0=$(date +%s)

export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}   # every rank on GPU 0
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONWARNINGS=ignore OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TPF_CUDA_BOOT_TIMEOUT_MS=${TPF_CUDA_BOOT_TIMEOUT_MS:-60000}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}      # one host, no network: loopback

LIB=$BUILD/libtpflex.so
if [ ! -f "$LIB" ]; then
  note "no $LIB: configuring and building the library in $BUILD"
  ARGS=(-DTPF_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
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
export TPFLEX_LIBRARY=$LIB

{ nvidia-smi; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'; } >"$OUT/env.txt" 2>&1
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  note "SKIP: $PY has no torch with CUDA and a visible GPU (env.txt); nothing run"
  exit 77
fi
# (grep -c, not -q: under pipefail, grep -q closing the pipe early fails nm with SIGPIPE)
if [ "$(nm -D "$LIB" 2>/dev/null | grep -c ' T tpf_cuda_backend_create')" = 0 ]; then
  note "FAILED: $LIB has no CUDA backend (configure with -DTPF_WITH_CUDA=ON)"
  exit 1
fi
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(grep '^torch' "$OUT/env.txt"); library $LIB"

fails=0
# step NAME CMD...: bounded, logged to $OUT/NAME.log; the summary gets rc, seconds and the
# verdict line; skipped once the budget is spent.
step() {
  local name=$1; shift
  local now=$(( $(date +%s) - T0 ))
  if [ "$now" -ge "$BUDGET" ]; then
    note "$(printf '%-26s skipped (budget %ss spent)' "$name" "$BUDGET")"
    fails=$((fails + 1)); return
  fi
  local s0=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E 'every (check|test) OK|FAILED|CHECK FAILED|^(OK|FAILED)|Error|SKIP| passed| failed' "$OUT/$name.log" | tail -n 2 | tr '\n' ' ')
  note "$(printf '%-26s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - s0 ))" "${last:0:150}")"
  [ "$rc" -eq 0 ] || fails=$((fails + 1))
}
TR=("$PY" -m torch.distributed.run --standalone)

step bootstrap_gloo_cpu "${TR[@]}" --nproc-per-node 2 "$ROOT/tests/python/test_bootstrap_gloo.py"
for P in 2 4; do
  mkdir -p "$OUT/test_cuda_p$P"
  TPFLEX_TEST_LOGDIR=$OUT/test_cuda_p$P step "test_cuda_p$P" "${TR[@]}" --nproc-per-node "$P" \
    "$ROOT/tests/python/test_cuda.py"
done
for P in 2 4; do
  step "example_p$P" "${TR[@]}" --nproc-per-node "$P" "$ROOT/examples/thd_training_step.py" \
    --backend cuda --steps 4
done
if [ "$MODE" != tests ]; then
  step bench_step_p1 "$PY" "$ROOT/examples/thd_training_step.py" --backend cuda --bench "$BENCH_T"
  step bench_step_p2 "${TR[@]}" --nproc-per-node 2 "$ROOT/examples/thd_training_step.py" \
    --backend cuda --bench "$BENCH_T"
  step overhead_cuda "$PY" "$ROOT/examples/bench_python_overhead.py" --backend cuda --iters 2000
  step overhead_sim "$PY" "$ROOT/examples/bench_python_overhead.py" --backend sim --iters 2000
  step sim_tests_cuda_build "$PY" "$ROOT/tests/python/run_tests.py" test_sim.py
  # The figures in one file.
  {
    for f in bench_step_p1 bench_step_p2; do
      echo "== $f"; sed -n '/--bench:/,/every check OK\|CHECK FAILED/p' "$OUT/$f.log"
    done
    for f in overhead_cuda overhead_sim; do echo "== $f"; grep -v '^$' "$OUT/$f.log" | tail -8; done
  } >"$OUT/figures.txt" 2>/dev/null
fi
note "total: $fails failing step(s), $(( $(date +%s) - T0 )) s (logs in $OUT)"
exit $((fails > 0))
