#!/usr/bin/env bash
# Ranks as processes on one GPU (issue 13): the process-mode conformance for P = 2, 3, 4, 8, the
# process-mode fault cases, and compute-sanitizer memcheck/racecheck on P = 4 processes, each
# step's output teed into $OUT/<step>.log and one line per step into $OUT/summary.txt.
#
#   BUILD=/tmp/b OUT=/tmp/out bash scripts/gpu_proc.sh
#
# BUILD: a CUDA build directory (configured here with -DTPF_WITH_CUDA=ON when it has no
# CMakeCache.txt; the targets this script runs are built either way, incrementally; SKIP_BUILD=1
# skips that). No network needed: CMocka from the system or from .deps/root, as gpu_run.sh.
# Bounded: the steps share BUDGET seconds (default 285, so the whole run stays under 5 minutes
# after the build); each step gets at most its own cap and what is left after the time kept for
# the later groups (faults, sanitizers); a step cut short is reported as a timeout (rc 137).
# Knobs: BUDGET, FULL=1 (also the full-capacity sweep at P = 2 and 4 when time is left),
# SKIP_SANITIZER=1, SKIP_BUILD=1, SKIP_CONF=1 (no conformance steps).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-proc-logs}
BUILD=${BUILD:-/tmp/tpf-build-cuda}
BUDGET=${BUDGET:-285}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

{ nvidia-smi; nvcc --version; uname -a; } >"$OUT/env.txt" 2>&1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
note "CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS budget=${BUDGET}s build=$BUILD"

# ---- build (not counted in the budget) ----
TARGETS=(conformance_cuda test_proc_faults_gpu test_proc_faults test_launcher)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  CMAKE_ARGS=(-DTPF_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  DEPS=$ROOT/.deps/root
  if [ ! -f /usr/include/cmocka.h ] && [ -f "$DEPS/usr/include/cmocka.h" ]; then
    CMAKE_ARGS+=(-DCMOCKA_INCLUDE_DIR="$DEPS/usr/include"
                 -DCMOCKA_LIBRARY="$DEPS/usr/lib/x86_64-linux-gnu/libcmocka.so.0")
    export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  fi
  b0=$(date +%s)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    command -v ninja >/dev/null && CMAKE_ARGS+=(-G Ninja)
    cmake -S "$ROOT" -B "$BUILD" "${CMAKE_ARGS[@]}" >"$OUT/build.log" 2>&1 ||
      { note "configure FAILED (build.log)"; tail -30 "$OUT/build.log"; exit 1; }
  fi
  if ! cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" >>"$OUT/build.log" 2>&1; then
    note "build FAILED (build.log)"; grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1
  fi
  note "build: ok in $(( $(date +%s) - b0 )) s"
elif [ -f "$ROOT/.deps/root/usr/include/cmocka.h" ]; then
  export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
CONF=$BUILD/tests/conformance/conformance_cuda
FAULTS=$BUILD/tests/proc/test_proc_faults_gpu
for f in "$CONF" "$FAULTS"; do
  [ -x "$f" ] || { note "missing $f"; exit 1; }
done

# ---- steps ----
T0=$(date +%s)
fails=0
skips=0
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
ls -1 /dev/shm >"$OUT/shm_before.txt" 2>/dev/null
# step NAME CAP RESERVE CMD...: runs under min(CAP, budget left - RESERVE) seconds (RESERVE keeps
# time for the later groups of steps), tees into $OUT/NAME.log, notes the result.
step() {
  local name=$1 cap=$2 reserve=$3; shift 3
  local t=$(( $(left) - reserve ))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 5 ]; then
    note "$(printf '%-24s not run: budget spent' "$name")"
    return
  fi
  local s0=$(date +%s)
  echo "=== $name (limit ${t}s): $*" | tee "$OUT/$name.log"
  timeout --signal=KILL "$t" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  local last
  last=$(grep -E '^(PASSED|FAILED|SKIPPED)|conformance\[.*(PASSED|FAILED)|ERROR SUMMARY|skipped' \
         "$OUT/$name.log" | tail -n 2 | tr '\n' ' ' | cut -c1-300)
  [ "$rc" -eq 137 ] && last="TIMEOUT after ${t}s (killed) $last"
  note "$(printf '%-24s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - s0 ))" "$last")"
  if [ "$rc" -eq 77 ]; then skips=$((skips + 1)); elif [ "$rc" -ne 0 ]; then fails=$((fails + 1)); fi
}

# The body's options differ between trees: use --no-options only where the body knows it.
NOOPT=""
"$CONF" --help 2>/dev/null | grep -q -- '--no-options' && NOOPT=--no-options

# 1. The conformance with every rank its own process: every algorithm/collective and dtype, every
#    T of the capacity (--quick: 4 per capacity), shape histories vs fresh communicators, options.
#    Time kept back: about 60 s for the fault cases and 90 s for the sanitizers.
SAN_RESERVE=90
[ "${SKIP_SANITIZER:-0}" = 1 ] && SAN_RESERVE=0
# SKIP_CONF=1 leaves them out (a caller that ran them under MPS already, scripts/gpu_lean.sh).
if [ "${SKIP_CONF:-0}" != 1 ]; then
  step conf_procs_p2 45 $((SAN_RESERVE + 60)) "$CONF" --procs --quick --tp 2
  step conf_procs_p3 45 $((SAN_RESERVE + 60)) "$CONF" --procs --quick --tp 3
  step conf_procs_p4 45 $((SAN_RESERVE + 60)) "$CONF" --procs --quick --tp 4
  # P = 8: the options sweep ran at P = 2, 3, 4; here every variant, T and history.
  step conf_procs_p8 70 $((SAN_RESERVE + 60)) "$CONF" --procs --quick --tp 8 $NOOPT
fi

# 2. Faults in process mode, one case per run (a case that needs a backend fix exits 77 and says
#    which; that is SKIPPED, not passed).
for c in $("$FAULTS" list); do
  step "fault_$c" 30 "$SAN_RESERVE" "$FAULTS" "$c"
done

# 3. compute-sanitizer on P = 4 processes, a small case each (one variant, no histories).
if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
  export TPF_CUDA_TIMEOUT_MS=300000
  step memcheck_p4 45 45 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
    "$CONF" --procs --quick --tp 4 --kind ring-rs --no-history $NOOPT
  step racecheck_p4 45 0 compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 \
    "$CONF" --procs --quick --tp 4 --kind bulk-rs --no-history $NOOPT
  unset TPF_CUDA_TIMEOUT_MS
else
  note "sanitizer: not run (SKIP_SANITIZER=1 or no compute-sanitizer)"
fi

# 4. With time left (FULL=1): the full capacity (16P, every T) at P = 2 and 4.
if [ "${FULL:-0}" = 1 ]; then
  step conf_procs_full_p2 90 0 "$CONF" --procs --tp 2
  step conf_procs_full_p4 90 0 "$CONF" --procs --tp 4
fi

# Nothing of tpflex may be left in /dev/shm by any step (host agreement tables are tpflex-*).
ls -1 /dev/shm >"$OUT/shm_after.txt" 2>/dev/null
NEW=$(comm -13 <(sort "$OUT/shm_before.txt") <(sort "$OUT/shm_after.txt") | tr '\n' ' ')
if echo "$NEW" | grep -q tpflex; then
  note "/dev/shm: tpflex entries left behind: $NEW"
  fails=$((fails + 1))
else
  note "/dev/shm: nothing of tpflex left behind${NEW:+ (other new entries: $NEW)}"
fi
note "total: $fails failing step(s), $skips skipped, $(( $(date +%s) - T0 )) s of ${BUDGET} s"
exit $((fails > 0))
