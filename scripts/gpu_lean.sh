#!/usr/bin/env bash
# Issue 13, sessions 5-6: the lean enqueue of in-process groups on one GPU. Builds the working tree
# (CMocka from .deps/root when the system has none), then runs the steps named on the command
# line, each bounded by `timeout --signal=KILL`, each logged to $LOGS/<step>.log, one line per
# step in $OUT/summary.txt; at the end every log goes into $OUT/logs.tgz (the device tool returns
# at most 8 files).
#
#   OUT=/tmp/out bash scripts/gpu_lean.sh build correct bench-lean modes procs
#
# Steps:
#   build       configure (-DTPF_WERROR=OFF: the GPU image's gcc warns differently) and build
#   correct     conformance_cuda --quick, full, --adaptive; ctest -L gpu without the process
#               groups (canary, mismatch, epilogue, capture, IPC, both sanitizers)
#   bench-lean  tpflex bench --section tp, threads, P = 8, C = 32768, H = 8192, N = 3584,
#               T = 1k .. 32k: TPF_CUDA_LEAN_ENQUEUE=0, then 1 (the same binary)
#   modes       the same in both modes in one run, under MPS (CUDA_DEVICE_MAX_CONNECTIONS=8),
#               with --adaptive rows on a cost table calibrated with --schedules first
#   procs-adaptive  process-mode conformance --adaptive, P = 2, 4, 8, under MPS
#   flags       threads with TPF_CUDA_DEVICE_FLAGS=1 (device flags) against 0 (events):
#               conformance --quick, then the tp bench of each (threads only)
#   faults-memops  the 9 process-mode fault cases with TPF_CUDA_MEMOPS=1, then without
#   planner     tpflex bench --section planner on the modes step's calibrated table (session 6:
#               RING RS beside RING AG and PIPELINE RS)
#   procs       process-mode conformance P = 2, 3, 4, 8 under MPS; then without MPS the fault
#               cases, compute-sanitizer on P = 4 processes, /dev/shm (scripts/gpu_proc.sh)
# Knobs: ITERS (default 10), TOKENS (default 1024,...,32768), ADAPTIVE=0 (skip the adaptive rows).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-lean-logs}
LOGS=${LOGS:-/tmp/gpu-lean-logs}
BUILD=${BUILD:-/tmp/tpf-build-lean}
ITERS=${ITERS:-10}
TOKENS=${TOKENS:-1024,2048,4096,8192,16384,32768}
mkdir -p "$OUT" "$LOGS"
export PATH=/usr/local/cuda/bin:$PATH
export TPF_BOOT_TIMEOUT_MS=${TPF_BOOT_TIMEOUT_MS:-60000}
S=$OUT/summary.txt
: >"$S"
note() { echo "$*" | tee -a "$S"; }
step() { # step NAME LIMIT CMD... (CMD runs under bash -c in $ROOT)
  local name=$1 to=$2; shift 2
  local t0; t0=$(date +%s)
  (cd "$ROOT" && timeout --signal=KILL "$to" bash -c "$*") >"$LOGS/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-22s rc=%-3s %4s s  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$*")"
  return $rc
}
finish() { tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; }
trap finish EXIT
TPF=$BUILD/tpflex
DEPS=$ROOT/.deps/root
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
note "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) + $(git -C "$ROOT" status --short 2>/dev/null | wc -l) changed files"
BENCH=(bench --backend cuda --section tp --tp-list 8 --capacity 32768 --hidden 8192 --n 3584
       --tokens "$TOKENS" --iters "$ITERS" --warmup 3)
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d && note "MPS: started" || note "MPS: failed to start"
}
mps_off() { echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control 2>/dev/null; sleep 1; }
for s in "$@"; do
  case $s in
  build)
    CM=(-DTPF_WITH_CUDA=ON -DTPF_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
    if [ ! -f /usr/include/cmocka.h ]; then
      CM+=(-DCMOCKA_INCLUDE_DIR=$DEPS/usr/include -DCMOCKA_LIBRARY=$DEPS/usr/lib/x86_64-linux-gnu/libcmocka.so.0)
    fi
    command -v ninja >/dev/null && CM+=(-G Ninja)
    step configure 120 "cmake -S . -B $BUILD ${CM[*]}" || exit 1
    step build 400 "cmake --build $BUILD -j $(nproc)" || { tail -30 "$LOGS/build.log"; exit 1; } ;;
  correct)
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    C=$BUILD/tests/conformance/conformance_cuda
    step conf-quick 120 "$C --quick"; tail -1 "$LOGS/conf-quick.log" | tee -a "$S"
    step conf-full 240 "$C"; tail -1 "$LOGS/conf-full.log" | tee -a "$S"
    step conf-adaptive 120 "$C --quick --adaptive"; tail -1 "$LOGS/conf-adaptive.log" | tee -a "$S"
    step conf-quick-full-enqueue 120 "TPF_CUDA_LEAN_ENQUEUE=0 $C --quick"
    tail -1 "$LOGS/conf-quick-full-enqueue.log" | tee -a "$S"
    step gpu-ctest 400 "cd $BUILD && ctest -L gpu -E 'procs|proc_faults|modes' --output-on-failure --timeout 240 -j 1"
    grep -E "tests passed|Failed|\*\*\*" "$LOGS/gpu-ctest.log" | tee -a "$S" ;;
  bench-lean)
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    for lean in 0 1; do
      step "bench-threads-lean$lean" 200 "TPF_CUDA_LEAN_ENQUEUE=$lean $TPF ${BENCH[*]} --mode threads"
      sed -n '/^# Section 4\/5 modes/,/^$/p' "$LOGS/bench-threads-lean$lean.log" | tee -a "$S"
      sed -n '/enqueue breakdown/,/^$/p' "$LOGS/bench-threads-lean$lean.log" | tee -a "$S"
      cp "$LOGS/bench-threads-lean$lean.log" "$OUT/" 2>/dev/null
    done ;;
  modes)
    export CUDA_DEVICE_MAX_CONNECTIONS=8
    EXTRA=""
    if [ "${ADAPTIVE:-1}" = 1 ]; then
      step calibrate 150 "$TPF calibrate --backend cuda --schedules --out $LOGS/tuned.txt" &&
        EXTRA="--adaptive --cost $LOGS/tuned.txt"
      cp "$LOGS/tuned.txt" "$OUT/tuned-cost.txt" 2>/dev/null
    fi
    mps_on
    step modes-p8 330 "$TPF ${BENCH[*]} --mode both --timeout 150 $EXTRA --csv $LOGS/modes.csv"
    mps_off
    cp "$LOGS/modes-p8.log" "$OUT/" 2>/dev/null
    sed -n '/^# Section 4\/5 modes/,/^$/p' "$LOGS/modes-p8.log" | tee -a "$S"
    sed -n '/enqueue breakdown/,/^$/p' "$LOGS/modes-p8.log" | tee -a "$S" ;;
  procs-adaptive)
    # Process-mode conformance on adaptive communicators (a RING RS one runs the pull baseline
    # where its synthetic table says so), under MPS.
    export CUDA_DEVICE_MAX_CONNECTIONS=8
    mps_on
    C=$BUILD/tests/conformance/conformance_cuda
    for P in 2 4 8; do
      step "conf-procs-adaptive-p$P" 120 "$C --procs --quick --adaptive --tp $P"
      tail -1 "$LOGS/conf-procs-adaptive-p$P.log" | tee -a "$S"
    done
    mps_off ;;
  flags)
    # Ranks as threads with the device flags (TPF_CUDA_DEVICE_FLAGS set: signal kernels, as in
    # process mode) against the default host-ordered events (unset): conformance, then the tp bench
    # of each, threads only, the same binary, one after the other.
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    C=$BUILD/tests/conformance/conformance_cuda
    step conf-quick-flags 120 "TPF_CUDA_DEVICE_FLAGS=1 $C --quick"
    tail -1 "$LOGS/conf-quick-flags.log" | tee -a "$S"
    for fl in 0 1; do # a FLAG parameter: its presence is the setting, so 0 = unset
      FE=""; [ "$fl" = 1 ] && FE="TPF_CUDA_DEVICE_FLAGS=1"
      step "bench-threads-flags$fl" 200 "$FE $TPF ${BENCH[*]} --mode threads"
      sed -n '/^# Section 4\/5 modes/,/^$/p' "$LOGS/bench-threads-flags$fl.log" | tee -a "$S"
      cp "$LOGS/bench-threads-flags$fl.log" "$OUT/" 2>/dev/null
    done ;;
  faults-memops)
    # The process-mode fault cases with stream-memory waits (TPF_CUDA_MEMOPS=1, 3 s timeout),
    # then with the default flag kernels: a survivor must name the dead rank even where its own
    # wait blamed a live peer stuck behind it (session 6: tpf_cuda__blame_gone). No MPS.
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    F=$BUILD/tests/proc/test_proc_faults_gpu
    for mo in 1 0; do # a FLAG parameter: presence is the setting, so 0 = unset
      ME=""; [ "$mo" = 1 ] && ME="TPF_CUDA_MEMOPS=1"
      for c in kill-host kill-hub kill-inflight kill-in-create exit-early exit-before-be capacity mismatch absent; do
        step "faults-memops$mo-$c" 60 "$ME TPF_CUDA_TIMEOUT_MS=3000 $F $c"
        tail -2 "$LOGS/faults-memops$mo-$c.log" | tee -a "$S"
      done
    done
    ls /dev/shm | grep -c tpflex | sed 's/^/dev-shm tpflex entries: /' | tee -a "$S" ;;
  planner)
    # The planner section (adaptive vs fixed vs no overlap, every schedule timed in turn) on the
    # table the modes step calibrated (or a fresh one), rank threads, no MPS.
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    [ -f "$LOGS/tuned.txt" ] ||
      step calibrate 150 "$TPF calibrate --backend cuda --schedules --out $LOGS/tuned.txt"
    step planner 240 "$TPF bench --backend cuda --section planner --cost $LOGS/tuned.txt --csv $LOGS/planner.csv"
    cp "$LOGS/planner.log" "$OUT/" 2>/dev/null
    grep -E '^# (adaptive|decisions by source|bench finished)' "$LOGS/planner.log" | tee -a "$S" ;;
  procs)
    export CUDA_DEVICE_MAX_CONNECTIONS=8
    mps_on
    C=$BUILD/tests/conformance/conformance_cuda
    for P in 2 3 4 8; do
      step "conf-procs-p$P" 90 "$C --procs --quick --tp $P"; tail -1 "$LOGS/conf-procs-p$P.log" | tee -a "$S"
    done
    mps_off
    # The fault cases, compute-sanitizer on P = 4 processes and the /dev/shm check, without MPS
    # (as in session 4): scripts/gpu_proc.sh.
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    step proc-faults-san 260 "SKIP_BUILD=1 SKIP_CONF=1 BUDGET=240 BUILD=$BUILD OUT=$LOGS/proc bash scripts/gpu_proc.sh"
    cat "$LOGS/proc/summary.txt" | tee -a "$S" ;;
  *) note "unknown step $s" ;;
  esac
done
note "done"
