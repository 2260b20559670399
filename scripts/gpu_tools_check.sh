#!/usr/bin/env bash
# The tools on one GPU after issue 27's tools half (bench/ as a library, one CUDA rank environment
# in harness/cuda_env.c): builds a committed snapshot with CUDA (scripts/gpu_snapshot.sh writes
# .snap/src.tar; CMocka comes from .deps, as in scripts/gpu_round.sh), then runs, each bounded
# and logged under $OUT/<step>.log with a summary in $OUT/summary.txt:
#   conf-quick, conf-procs   conformance_cuda --quick, threads and --procs (the rank environment:
#                            tpf_conf_env on tpf_cuda_ranks, and its process mode)
#   gpu-ctest                ctest -L gpu (every CUDA test of the tree)
#   demo                     tpflex demo --backend cuda (the environment through the tool)
#   bench-tp, bench-setshape tpflex bench --backend cuda --quick, the tp section in threads and
#                            procs mode at P = 2 (bench's groups: tpf_cuda_ranks in-process and over
#                            the processes' bootstrap), and section 1 with its cudaMalloc/IPC rows
#   bench-planner            --section planner --quick --tp 2 (the variants runner)
#   calibrate                tpflex calibrate --backend cuda --quick (to $OUT/calibrated.txt)
#
#   on the device, with .deps and .snap carried (bash scripts/gpu_snapshot.sh here first):
#   OUT=$OUT bash scripts/gpu_tools_check.sh
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs}
SRC=${SRC:-/tmp/tpf-src-tools}
BUILD=$SRC/build-gpu
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=32
DEPS=$SRC/.deps/root
S=$OUT/summary.txt
note() { echo "$*" | tee -a "$S"; }
step() { # step NAME TIMEOUT CMD...
  local name=$1 to=$2; shift 2
  local t0=$(date +%s)
  (cd "$SRC" && timeout "$to" bash -c "$*") >"$OUT/$name.log" 2>&1
  local rc=$?
  note "step $name: rc=$rc in $(( $(date +%s) - t0 )) s: $*"
  return $rc
}
if [ ! -d "$SRC/core" ]; then
  mkdir -p "$SRC" && tar -xf "$ROOT/.snap/src.tar" -C "$SRC" && cp -r "$ROOT/.deps" "$SRC/.deps"
fi
note "snapshot: $(cat "$SRC/.snap-commit" 2>/dev/null || echo '?')"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
T=$BUILD/tpflex
step configure 120 "cmake -S . -B $BUILD -G Ninja -DTPF_WITH_CUDA=ON -DTPF_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMOCKA_INCLUDE_DIR=$DEPS/usr/include -DCMOCKA_LIBRARY=$DEPS/usr/lib/x86_64-linux-gnu/libcmocka.so.0"
step build 300 "cmake --build $BUILD -j 16" || { tail -30 "$OUT/build.log"; exit 1; }
step conf-quick 180 "$BUILD/tests/conformance/conformance_cuda --quick"
step conf-procs 240 "$BUILD/tests/conformance/conformance_cuda --procs --quick"
step gpu-ctest 400 "cd $BUILD && ctest -L gpu --output-on-failure --timeout 240 -j 1"
step demo 120 "$T demo --backend cuda --tp 2 --microbatches 3"
step bench-tp 300 "$T bench --backend cuda --quick --section tp --mode both --tp-list 2 --tokens 4096,8192 --capacity 8192 --csv $OUT/bench-tp.csv --json $OUT/bench-tp.json"
step bench-setshape 120 "$T bench --backend cuda --quick --section setshape --tp 2 --capacity 8192 --calls 2000"
step bench-planner 300 "$T bench --backend cuda --quick --section planner --tp 2 --capacity 8192"
step calibrate 300 "$T calibrate --backend cuda --quick --out $OUT/calibrated.txt"
for f in conf-quick conf-procs demo; do tail -1 "$OUT/$f.log" | tee -a "$S"; done
grep -E "tests passed|Failed|\*\*\*|Skipped" "$OUT/gpu-ctest.log" | tee -a "$S"
for f in bench-tp bench-setshape bench-planner; do
  grep -E "^# bench finished|FAILED" "$OUT/$f.log" | head -5 | sed "s/^/$f: /" | tee -a "$S"
done
grep -E "^calibrate summary|FAILED" "$OUT/calibrate.log" | head -3 | tee -a "$S"
