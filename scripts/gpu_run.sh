#!/usr/bin/env bash
# Builds tpflex with the CUDA backend on a GPU machine and runs the GPU tests, writing one log per
# step and a summary into $OUT (default ./gpu-logs).
#
#   scripts/gpu_run.sh            canary sweep (P 1,2,4,8), 2-process IPC, conformance, sanitizers
#                                 (memcheck/racecheck on the IPC test, memcheck on conformance P=1)
#   scripts/gpu_run.sh ctest      ctest -L gpu (what `make test-cuda` runs)
#
# CMocka: taken from the system, or from .deps/root (apt-get download libcmocka0 libcmocka-dev,
# dpkg -x each into .deps/root) on machines without network. Environment knobs: BUILD (build
# dir), JOBS, STEP_TIMEOUT (seconds per step), SKIP_SANITIZER=1, CONF_ARGS (conformance args).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs}
BUILD=${BUILD:-/tmp/tpf-build-cuda}
JOBS=${JOBS:-$(nproc)}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
MODE=${1:-all}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

CMAKE_ARGS=(-DTPF_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
command -v ninja >/dev/null && CMAKE_ARGS+=(-G Ninja)
DEPS=$ROOT/.deps/root
if [ ! -f /usr/include/cmocka.h ] && [ -f "$DEPS/usr/include/cmocka.h" ]; then
  CMAKE_ARGS+=(-DCMOCKA_INCLUDE_DIR="$DEPS/usr/include"
               -DCMOCKA_LIBRARY="$DEPS/usr/lib/x86_64-linux-gnu/libcmocka.so.0")
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi

{ nvidia-smi; nvcc --version; } >"$OUT/env.txt" 2>&1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# tests/CMakeLists.txt adds tests/gpu; on an older tree, add it in this (throw-away) copy.
if ! grep -q 'add_subdirectory(gpu)' "$ROOT/tests/CMakeLists.txt"; then
  note "note: tests/CMakeLists.txt lacks add_subdirectory(gpu); adding it in this copy"
  printf 'if(TPF_HAVE_CUDA)\n  add_subdirectory(gpu)\nendif()\n' >>"$ROOT/tests/CMakeLists.txt"
fi

TARGETS=(test_cuda_canary test_cuda_ipc conformance_cuda)
t0=$(date +%s)
if ! cmake -S "$ROOT" -B "$BUILD" "${CMAKE_ARGS[@]}" >"$OUT/build.log" 2>&1; then
  note "configure FAILED (build.log)"; tail -40 "$OUT/build.log"; exit 1
fi
if [ "$MODE" = ctest ]; then
  cmake --build "$BUILD" -j "$JOBS" >>"$OUT/build.log" 2>&1 || { note "build FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  (cd "$BUILD" && ctest --output-on-failure -L gpu 2>&1) | tee "$OUT/ctest.log"
  rc=$?
  note "$(tail -n 20 "$OUT/ctest.log" | grep -E 'tests passed|tests failed' | head -1)"
  exit $rc
fi
if ! cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >>"$OUT/build.log" 2>&1; then
  note "build FAILED (build.log)"; grep -E 'error|FAILED' "$OUT/build.log" | head -30; exit 1
fi
note "build: ok in $(( $(date +%s) - t0 )) s"

fails=0
# step NAME CMD...: runs with a timeout, logs to $OUT/NAME.log, records the last line.
step() {
  local name=$1; shift
  local s0=$(date +%s)
  timeout --signal=KILL "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E 'PASSED|FAILED|ERROR SUMMARY|skipped|conformance\[' "$OUT/$name.log" | tail -n 2 | tr '\n' ' ')
  note "$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - s0 ))" "$last")"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || fails=$((fails + 1))
}

B=$BUILD/tests
step canary "$B/gpu/test_cuda_canary" -v
step ipc "$B/gpu/test_cuda_ipc"
step conformance "$B/conformance/conformance_cuda" ${CONF_ARGS:-}
if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
  export TPF_CUDA_TIMEOUT_MS=300000
  # Processes, not threads: the sanitizer serialises one process's kernels, so ranks as threads
  # would wait on each other's spinning kernels.
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$B/gpu/test_cuda_ipc"
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$B/gpu/test_cuda_ipc"
  step memcheck_p1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/conformance/conformance_cuda" --quick --tp 1
fi
note "total: $fails failing step(s), $(( $(date +%s) - t0 )) s"
exit $((fails > 0))
