#!/usr/bin/env bash
# The tools on one GPU after issue 27's tools half (bench/ as a library, one CUDA rank environment
# in harness/cuda_env.c): builds a committed snapshot with CUDA and runs ctest -L gpu through
# scripts/gpu_round.sh (sourced: its steps "build gpu-ctest", CMocka from .deps; the snapshot is
# extracted to $SRC, default /tmp/tpf-src-tools), then runs, each bounded and logged under
# $OUT/<step>.log with a summary in $OUT/summary.txt:
#   conf-quick, conf-procs   conformance_cuda --quick, threads and --procs (the rank environment:
#                            tpf_conf_env on tpf_cuda_ranks, and its process mode)
#   demo                     tpflex demo --backend cuda (the environment through the tool)
#   bench-tp, bench-setshape tpflex bench --backend cuda --quick, the tp section in threads and
#                            procs mode at P = 2 (bench's groups: tpf_cuda_ranks in-process and over
#                            the processes' bootstrap), and section 1 with its cudaMalloc/IPC rows
#   bench-planner            --section planner --quick --tp 2 (the variants runner)
#   calibrate                tpflex calibrate --backend cuda --quick (to $OUT/calibrated.txt):
#                            GEMMs as P = 1 operations, the tpf_cuda_probe_* probes
#
#   on the device, with .deps and .snap carried (bash scripts/gpu_snapshot.sh here first):
#   OUT=$OUT bash scripts/gpu_tools_check.sh
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=${SRC:-/tmp/tpf-src-tools}
# gpu_round.sh's snapshot, build (configure, build, symbols) and gpu-ctest steps, and its step and
# note helpers, BUILD and OUT for the steps below.
source "$ROOT/scripts/gpu_round.sh" build gpu-ctest
T=$BUILD/tpflex
step conf-quick 180 "$BUILD/tests/conformance/conformance_cuda --quick"
step conf-procs 240 "$BUILD/tests/conformance/conformance_cuda --procs --quick"
step demo 120 "$T demo --backend cuda --tp 2 --microbatches 3"
step bench-tp 300 "$T bench --backend cuda --quick --section tp --mode both --tp-list 2 --tokens 4096,8192 --capacity 8192 --csv $OUT/bench-tp.csv --json $OUT/bench-tp.json"
step bench-setshape 120 "$T bench --backend cuda --quick --section setshape --tp 2 --capacity 8192 --calls 2000"
step bench-planner 300 "$T bench --backend cuda --quick --section planner --tp 2 --capacity 8192"
step calibrate 300 "$T calibrate --backend cuda --quick --out $OUT/calibrated.txt"
for f in conf-quick conf-procs demo; do tail -1 "$OUT/$f.log" | tee -a "$S"; done
for f in bench-tp bench-setshape bench-planner; do
  grep -E "^# bench finished|FAILED" "$OUT/$f.log" | head -5 | sed "s/^/$f: /" | tee -a "$S"
done
# the GEMM points (P = 1 operations), reduce (tpf_cuda_probe_reduce) and launch_us (the enqueue
# counters, tpf_cuda_probe_empty_launch): the public paths calibrate measures the backend through
grep -E "^calibrate summary|^  (gemm|reduce|launch_us) |FAILED" "$OUT/calibrate.log" | head -5 | tee -a "$S"
