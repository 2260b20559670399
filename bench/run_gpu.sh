#!/usr/bin/env bash
# Builds the tpflex CLI with the CUDA backend (no tests, so no CMocka) and runs
# `tpflex bench --backend cuda [args]`, writing everything into $OUT (default ./bench-logs):
# env.txt (GPU, driver, nvcc), build.log, bench.txt (the tables), bench.err (progress),
# bench.csv, bench.json. If the full run fails or exceeds BENCH_TIMEOUT, each section is rerun
# on its own (bench_sections.txt) so that one failing section does not hide the others.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/bench-logs}
BUILD=${BUILD:-/tmp/tpf-build-bench}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvcc --version | tail -2; date -u; } >"$OUT/env.txt" 2>&1
t0=$(date +%s)
if ! { cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DTPF_WITH_CUDA=ON -DBUILD_TESTING=OFF >"$OUT/build.log" 2>&1 &&
       cmake --build "$BUILD" -j "$(nproc)" --target tpflex_cli >>"$OUT/build.log" 2>&1; }; then
  echo "build FAILED"; tail -40 "$OUT/build.log"; exit 1
fi
echo "build: ok in $(( $(date +%s) - t0 )) s"
B="$BUILD/tpflex"
t0=$(date +%s)
timeout --signal=KILL "${BENCH_TIMEOUT:-300}" "$B" bench --backend cuda "$@" \
  --csv "$OUT/bench.csv" --json "$OUT/bench.json" >"$OUT/bench.txt" 2>"$OUT/bench.err"
rc=$?
echo "bench rc=$rc in $(( $(date +%s) - t0 )) s"
# Rerun section by section only when the full run did not reach its end (crash, hang, timeout);
# a finished run with failed checks already holds every table.
if ! grep -q '^# bench finished' "$OUT/bench.txt"; then
  : >"$OUT/bench_sections.txt"
  for s in chunking setshape dynamic tp; do
    echo "=== section $s" >>"$OUT/bench_sections.txt"
    timeout --signal=KILL "${SECTION_TIMEOUT:-120}" "$B" bench --backend cuda --section "$s" "$@" \
      >>"$OUT/bench_sections.txt" 2>&1
    echo "=== section $s rc=$?" >>"$OUT/bench_sections.txt"
  done
fi
cat "$OUT/bench.txt"
exit "$rc"
