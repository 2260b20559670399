#!/usr/bin/env bash
# The GPU step runner: every measurement tpflex makes on a GPU machine, as steps named by what they
# measure. Each step is bounded (`timeout`, and the caller's overall bound), logs every command to
# $OUT/<step>/<name>.log and one line per command to $OUT/<step>/summary.txt, and adds one line to
# $OUT/summary.txt. The results ledger (docs/results/) records what a step measured, with its log.
#
#   OUT=/path/out bash scripts/gpu.sh STEP...         the steps in order (a failed build stops)
#   OUT=/path/out bash scripts/gpu.sh --call CALL [BOUND_S]
#                                                     one device call: CALL's steps within BOUND_S
#                                                     (default 570), every log packed into
#                                                     $OUT/CALL.tgz, the summaries in
#                                                     $OUT/CALL-summary.txt (the device tool
#                                                     returns few files); scripts/gpu_calls.sh
#                                                     CALL BOUND_S is the same
#   bash scripts/gpu.sh --list                        the steps and calls
#
# Where it runs. Snapshot mode (BUILD unset, a lent machine without network): `build` extracts
# .snap/src.tar (scripts/gpu_snapshot.sh: `git archive HEAD`, so a half-edited tree never reaches
# the GPU) into $SRC (default /tmp/tpf-src) with the CMocka .debs unpacked in .deps/ (carry
# ".snap" and ".deps"), and builds $SRC/build-gpu; the steps run in $SRC. Tree mode (BUILD set to
# a CUDA build folder, as `make test-cuda` does): the steps run in this tree on that build.
#
# Steps (what each measures; the commands are in the functions below):
#   build              configure (-DTPF_WITH_CUDA=ON, -DTPF_WERROR=OFF: the GPU image's gcc warns
#                      differently) and build, then the exported-symbols check; skipped when the
#                      build already has tpflex and libtpflex.so
#   gpu-tests          ctest -L gpu (what `make test-cuda` runs in C)
#   gpu-tests-short    the same without the full threads conformance and the tp-modes bench
#   conformance        conformance_cuda: --quick, --quick with the GEMM fallback, --quick
#                      --adaptive, the full sweep (ranks as threads)
#   conformance-procs  conformance_cuda --procs --quick at P = 2, 4, 8 under MPS, fixed then
#                      adaptive communicators
#   sanitizers         compute-sanitizer memcheck/racecheck on the IPC test, memcheck on the
#                      conformance at P = 1
#   proc               process mode: conformance P = 2, 3, 4, 8, the fault cases, memcheck and
#                      racecheck on P = 4 processes, nothing left in /dev/shm
#   faults-memops      the process-mode fault cases with stream-memory waits, then flag kernels
#   gemm-plan          test_cuda_gemm_plan (cuBLASLt plans, the fp8 refusals)
#   fp8-tests          tests/python/test_fp8.py
#   fp8-bench          `tpflex bench --section fp8`: FP8 against bf16 at P = 8 rank threads
#   fp8-bench-python   FP8 against bf16 at P = 1 through tpflex.torch (scripts/fp8_vs_bf16.py)
#   fp8-calibrate      the cost table's fp8_e4m3 GEMM points (`tpflex calibrate`), the fp8/bf16
#                      speedup per shape, the shipped table with them, and `plan --predict`
#   host-path          the C enqueue per operation (bench --section tp), the host section
#                      (per operation host and device cost against one cuBLASLt matmul), the
#                      Python overhead, the THD step against plain torch at P = 1 and 2 (MPS)
#   layer              the transformer layer on THD: the training example (real attention)
#                      checked against fp32 torch, the step against plain torch with the FP8
#                      step beside it, bucketed graphs against one graph padded to the
#                      capacity (examples/bench_graphs_vs_padding.py); P = 1, P = 2 under MPS
#   fp8-step           the CUDA FP8 casts against torch's (bit for bit), the THD step in FP8
#                      against bf16 (delayed / current, H = 1024 and 4096, torch casts beside),
#                      its kernels, P = 2 under MPS
#   observe            the THD step under torch.profiler with tpflex's ranges and stats()'s
#                      exposed / hidden communication (examples/profile_thd_step.py), the graphed
#                      step against plain torch graphed; P = 1, P = 2 under MPS
#   thd-step           the THD step of the modules against plain torch (P = 1 with --ops
#                      --profile, P = 2 under MPS), the training example at P = 1 and 2, the
#                      graphed step at P = 1, test_layers.py; SKIP="name ..." leaves some out
#   graphed            tests/python/test_graphed.py on CUDA at P = 1 and 2, the graphed THD step
#                      against plain torch graphed at P = 1 and 2 (MPS), the bucket ladder
#   python             torchrun tests of tpflex.torch on CUDA at P = 2 and 4, the training
#                      example, its step-time comparison, the Python overhead
#   python-tests       the tests of `python` alone (make test-cuda)
#   planner            calibrate --schedules, the planner bench on the tuned and shipped tables
#                      (and the calibrated one when time allows), the 8-GPU projection
#   tp-modes           bench --section tp in both rank modes at P = 8 (then 2, 4), under MPS
#   lean-enqueue       bench --section tp, threads, P = 8 with TPF_CUDA_LEAN_ENQUEUE=0 then 1
#   device-flags       threads with device flags against host-ordered events: conformance, bench
#   bench-all          every `tpflex bench` section at its defaults (each section alone when the
#                      whole run does not finish)
#   tools-smoke        the tools on the GPU: demo, bench --quick (tp both modes, setshape,
#                      planner), calibrate --quick
#
# Knobs: SRC, BUILD, TOKENS (bench T list), ITERS, SKIP (thd-step), FULL=1 (proc: also the full
# capacity), DEADLINE (epoch seconds no command may pass; --call sets it).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs}
ME=$ROOT/scripts/gpu.sh

CALLS_HELP="calls (scripts/gpu_calls.sh): check = build gpu-tests-short gemm-plan fp8-tests;
  fp8 = build fp8-bench fp8-calibrate; host = build host-path;
  thd = build thd-step without train_p1 and layers_sim; layer = build layer;
  observe = build observe; fp8step = build fp8-step"

# ---- where: snapshot mode or tree mode ----
if [ -n "${BUILD:-}" ]; then
  SRC=$ROOT
else
  SRC=${SRC:-/tmp/tpf-src}
  BUILD=$SRC/build-gpu
fi
DEPS=$SRC/.deps/root
[ -d "$DEPS" ] || DEPS=$ROOT/.deps/root
TPF=$BUILD/tpflex
CONF=$BUILD/tests/conformance/conformance_cuda
export SRC BUILD
export PATH=/usr/local/cuda/bin:$PATH:/usr/local/nvidia/bin
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export TPF_BOOT_TIMEOUT_MS=${TPF_BOOT_TIMEOUT_MS:-60000} TPF_CUDA_BOOT_TIMEOUT_MS=${TPF_CUDA_BOOT_TIMEOUT_MS:-60000}
export PYTHONPATH=$SRC/python${PYTHONPATH:+:$PYTHONPATH} PYTHONWARNINGS=ignore
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export TPFLEX_LIBRARY=$BUILD/libtpflex.so
PY=${PYTHON:-python3}
TR="$PY -m torch.distributed.run --standalone"
TOKENS=${TOKENS:-1024,4096,16384}

# ---- helpers: D (the step's folder), note, run, MPS ----
D=$OUT
FAILS=0
note() { echo "$*" | tee -a "$D/summary.txt"; }
# run NAME CAP CMD: CMD (one string, bash -c, in $SRC) under min(CAP, DEADLINE - now - 5) seconds,
# its output in $D/NAME.log; notes rc, seconds and the verdict lines; returns rc. Not started
# once fewer than 5 s are left.
run() {
  local name=$1 cap=$2; shift 2
  local t=$cap
  if [ -n "${DEADLINE:-}" ]; then
    local left=$((DEADLINE - $(date +%s) - 5))
    [ "$left" -lt "$t" ] && t=$left
  fi
  case " ${SKIP:-} " in *" $name "*) note "$name: skipped (SKIP)"; return 0 ;; esac
  if [ "$t" -lt 5 ]; then note "$name: not run (bound spent)"; FAILS=$((FAILS + 1)); return 124; fi
  local t0; t0=$(date +%s)
  (cd "$SRC" && timeout --signal=TERM --kill-after=10 "$t" bash -c "$*") >"$D/$name.log" 2>&1
  local rc=$?
  local verdict
  verdict=$(grep -E 'PASSED|FAILED|every (check|test) OK|CHECK FAILED|tests passed|ERROR SUMMARY|skipped|bench finished| passed| failed|conformance\[' \
            "$D/$name.log" | tail -n 2 | tr '\n' ' ' | cut -c1-200)
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && verdict="TIMEOUT after ${t} s $verdict"
  note "$(printf '%-24s rc=%-3s %4s s  %s' "$name" "$rc" "$(($(date +%s) - t0))" "$verdict")"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || FAILS=$((FAILS + 1))
  return "$rc"
}
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  if nvidia-cuda-mps-control -d 2>/dev/null; then note "MPS: started"; else note "MPS: not started"; fi
}
mps_off() { echo quit | nvidia-cuda-mps-control 2>/dev/null; sleep 1; }
# section FILE: the tp-modes table and the enqueue breakdown of a bench log, into the summary.
section() {
  sed -n '/^# Section 4\/5 modes/,/^$/p' "$1" | tee -a "$D/summary.txt"
  sed -n '/enqueue breakdown/,/^$/p' "$1" | tee -a "$D/summary.txt"
}
BENCH_P8="bench --backend cuda --section tp --tp-list 8 --capacity 32768 --hidden 8192 --n 3584 \
--tokens ${BENCH_TOKENS:-1024,2048,4096,8192,16384,32768} --iters ${ITERS:-10} --warmup 3"

# ---- the steps ----
step_build() {
  # A folder left by another snapshot (a machine kept between calls) is replaced, never reused.
  if [ "$SRC" != "$ROOT" ] && [ -f "$ROOT/.snap/src.tar" ]; then
    local want have
    want=$(tar -xOf "$ROOT/.snap/src.tar" .snap-commit 2>/dev/null)
    have=$(cat "$SRC/.snap-commit" 2>/dev/null)
    if [ -d "$SRC" ] && [ "$want" != "$have" ]; then
      note "snapshot: $SRC held ${have:-?}, the carried one is ${want:-?}: replaced"
      rm -rf "${SRC:?}"
    fi
  fi
  if [ -x "$TPF" ] && [ -f "$BUILD/libtpflex.so" ]; then note "build: $BUILD already built"; return 0; fi
  if [ "$SRC" != "$ROOT" ] && [ ! -d "$SRC/core" ]; then
    [ -f "$ROOT/.snap/src.tar" ] || { note "no .snap/src.tar: run scripts/gpu_snapshot.sh and carry .snap"; return 1; }
    mkdir -p "$SRC" && tar -xf "$ROOT/.snap/src.tar" -C "$SRC" &&
      { [ ! -d "$ROOT/.deps" ] || cp -r "$ROOT/.deps" "$SRC/.deps"; }
  fi
  note "snapshot: $(cat "$SRC/.snap-commit" 2>/dev/null || git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')"
  note "python package: $(cd "$SRC" && $PY -c 'import tpflex; print(tpflex.__file__)' 2>&1 | tail -1)"
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  local cm="-DTPF_WITH_CUDA=ON -DTPF_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo"
  command -v ninja >/dev/null && cm="$cm -G Ninja"
  if [ ! -f /usr/include/cmocka.h ] && [ -f "$DEPS/usr/include/cmocka.h" ]; then
    cm="$cm -DCMOCKA_INCLUDE_DIR=$DEPS/usr/include -DCMOCKA_LIBRARY=$DEPS/usr/lib/x86_64-linux-gnu/libcmocka.so.0"
  fi
  run configure 120 "cmake -S . -B $BUILD $cm" || return 1
  run compile 400 "cmake --build $BUILD -j $(nproc)" || { tail -30 "$D/compile.log"; return 1; }
  run symbols 30 "bash tests/install/check_symbols.sh $BUILD/libtpflex.so include"
}
step_gpu_tests() {
  run ctest 500 "cd $BUILD && ctest -L gpu ${1:+-E '$1'} --output-on-failure --timeout 240 -j 1"
  grep -E "tests passed|Failed|\*\*\*|Skipped" "$D/ctest.log" | tee -a "$D/summary.txt"
}
step_gpu_tests_short() { step_gpu_tests '^(conformance_cuda|bench_tp_modes_gpu)$'; }
step_conformance() {
  run quick 120 "$CONF --quick"
  run quick-fallback 120 "TPF_CUDA_GEMM_FALLBACK=1 $CONF --quick"
  run adaptive 120 "$CONF --quick --adaptive"
  run full 240 "$CONF"
  grep -h "FAIL" "$D"/*.log 2>/dev/null | grep -c fp8 | sed 's/^/fp8 FAIL lines: /' | tee -a "$D/summary.txt"
}
step_conformance_procs() {
  export CUDA_DEVICE_MAX_CONNECTIONS=8
  mps_on
  for P in 2 4 8; do run "procs-p$P" 90 "$CONF --procs --quick --tp $P"; done
  for P in 2 4 8; do run "procs-adaptive-p$P" 120 "$CONF --procs --quick --adaptive --tp $P"; done
  mps_off
}
step_sanitizers() {
  command -v compute-sanitizer >/dev/null || { note "no compute-sanitizer"; return 77; }
  export TPF_CUDA_TIMEOUT_MS=300000 # processes: the sanitizer serialises one process's kernels
  run memcheck-ipc 300 "compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/tests/gpu/test_cuda_ipc"
  run racecheck-ipc 300 "compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/tests/gpu/test_cuda_ipc"
  run memcheck-p1 300 "compute-sanitizer --tool memcheck --error-exitcode 9 $CONF --quick --tp 1"
}
step_proc() {
  local faults=$BUILD/tests/proc/test_proc_faults_gpu noopt=""
  "$CONF" --help 2>/dev/null | grep -q -- '--no-options' && noopt=--no-options
  ls -1 /dev/shm >"$D/shm_before.txt" 2>/dev/null
  for P in 2 3 4; do run "conf-procs-p$P" 45 "$CONF --procs --quick --tp $P"; done
  run conf-procs-p8 70 "$CONF --procs --quick --tp 8 $noopt"
  for c in $("$faults" list); do run "fault-$c" 30 "$faults $c"; done
  if command -v compute-sanitizer >/dev/null; then
    run memcheck-p4 45 "TPF_CUDA_TIMEOUT_MS=300000 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 $CONF --procs --quick --tp 4 --kind ring-rs --no-history $noopt"
    run racecheck-p4 45 "TPF_CUDA_TIMEOUT_MS=300000 compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 $CONF --procs --quick --tp 4 --kind bulk-rs --no-history $noopt"
  fi
  if [ "${FULL:-0}" = 1 ]; then
    run conf-procs-full-p2 90 "$CONF --procs --tp 2"
    run conf-procs-full-p4 90 "$CONF --procs --tp 4"
  fi
  ls -1 /dev/shm >"$D/shm_after.txt" 2>/dev/null
  local new; new=$(comm -13 <(sort "$D/shm_before.txt") <(sort "$D/shm_after.txt") | tr '\n' ' ')
  if echo "$new" | grep -q tpflex; then note "/dev/shm: tpflex entries left behind: $new"; FAILS=$((FAILS + 1))
  else note "/dev/shm: nothing of tpflex left behind"; fi
}
step_faults_memops() {
  local faults=$BUILD/tests/proc/test_proc_faults_gpu
  for mo in 1 0; do # a flag parameter: its presence is the setting
    local me=""; [ "$mo" = 1 ] && me="TPF_CUDA_MEMOPS=1"
    for c in $("$faults" list); do run "memops$mo-$c" 60 "$me TPF_CUDA_TIMEOUT_MS=3000 $faults $c"; done
  done
}
step_gemm_plan() { run gemm-plan 60 "$BUILD/tests/cuda_cpu/test_cuda_gemm_plan"; }
step_fp8_tests() { run test-fp8 120 "$PY tests/python/test_fp8.py"; tail -3 "$D/test-fp8.log" | tee -a "$D/summary.txt"; }
step_fp8_bench() {
  run bench-fp8-p8 300 "$TPF bench --backend cuda --section fp8 --tp-list 8 --mode threads --csv $D/bench_fp8_p8.csv --json $D/bench_fp8_p8.json"
  grep -E "^(ring|bulk|serial|gemm)|FAILED|bench finished" "$D/bench-fp8-p8.log" | tee -a "$D/summary.txt"
}
step_fp8_bench_python() {
  run fp8-vs-bf16 240 "$PY scripts/fp8_vs_bf16.py"
  grep "|" "$D/fp8-vs-bf16.log" | tee "$D/figures.txt" | tee -a "$D/summary.txt"
}
step_fp8_calibrate() {
  local meas=$D/h200_measured.txt new=$D/h200_new.txt shipped=$SRC/data/cost/h200.txt
  run calibrate 240 "$TPF calibrate --backend cuda --out $meas"
  grep -E "^  " "$D/calibrate.log" | tee -a "$D/summary.txt"
  local n8 nb
  n8=$(grep -c '^gemm fp8_e4m3 ' "$meas" 2>/dev/null); nb=$(grep -c '^gemm bf16 ' "$meas" 2>/dev/null)
  note "measured gemm points: ${nb:-0} bf16, ${n8:-0} fp8_e4m3"
  if [ "${n8:-0}" = 0 ] || [ "${nb:-0}" = 0 ]; then note "FAILED: no bf16 or fp8_e4m3 gemm points"; return 1; fi
  awk '$1 == "gemm" && $2 == "bf16" { b[$3" "$4" "$5] = $6; order[++n] = $3" "$4" "$5 }
       $1 == "gemm" && $2 == "fp8_e4m3" { f[$3" "$4" "$5] = $6 }
       END { print "m n k | bf16 us | fp8_e4m3 us | speedup";
             for (i = 1; i <= n; i++) { k = order[i]; if (k in f)
               printf "%s | %.2f | %.2f | %.2f\n", k, b[k], f[k], b[k] / f[k] } }' "$meas" >"$D/fp8_speedup.txt"
  note "fp8_e4m3 / bf16 at N 3584, K 8192, T = 1k / 4k / 16k / 32k:"
  grep -E "^(1024|4096|16384|32768) 3584 8192 " "$D/fp8_speedup.txt" | tee -a "$D/summary.txt"
  { grep -v '^gemm ' "$shipped"; grep -E '^gemm (bf16|fp8_e4m3) ' "$meas"; } >"$new"
  local p8="--tp 8 --capacity 32768 --hidden 8192 --tokens 4096 --predict --cost $new"
  run predict-ag 20 "$TPF plan --algo ring --coll ag --dtype fp8_e4m3 $p8"
  run predict-rs 20 "$TPF plan --algo ring --coll rs --dtype fp8_e4m3 $p8"
  for s in predict-ag predict-rs; do
    grep -E "^(choice|note)" "$D/$s.log" | sed "s/^/$s: /" | tee -a "$D/summary.txt"
    grep -q "priced on its bf16 points" "$D/$s.log" && { note "FAILED: $s prices fp8 GEMMs on bf16 points"; FAILS=$((FAILS + 1)); }
  done
  note "the cost table with the measured gemm lines: $new"
}
step_host_path() {
  mps_on
  run bench-tp 150 "$TPF bench --backend cuda --section tp --mode both --tp-list 1,2,8 --capacity 4096 --tokens 1024"
  run bench-host 300 "$TPF bench --backend cuda --section host --csv $D/bench_host.csv --json $D/bench_host.json"
  run overhead-cuda 90 "$PY examples/bench_python_overhead.py --backend cuda --iters 2000"
  run thd-p1 120 "$TR --nproc-per-node 1 examples/bench_thd_step.py --T $TOKENS --profile"
  run thd-p2-mps 150 "$TR --nproc-per-node 2 examples/bench_thd_step.py --T $TOKENS"
  mps_off
}
step_thd_step() {
  run bench_p1 300 "$TR --nproc-per-node 1 examples/bench_thd_step.py --T $TOKENS --ops --profile"
  run train_p1 300 "$TR --nproc-per-node 1 examples/thd_training_step.py --backend cuda"
  run graphed_p1 400 "$TR --nproc-per-node 1 examples/thd_graphed_step.py --backend cuda --tokens $TOKENS --stream 50"
  mps_on
  run train_p2_mps 300 "$TR --nproc-per-node 2 examples/thd_training_step.py --backend cuda"
  run bench_p2_mps 300 "$TR --nproc-per-node 2 examples/bench_thd_step.py --T $TOKENS --ops"
  mps_off
  run layers_sim 600 "$PY tests/python/run_tests.py test_layers.py"
  {
    for f in bench_p1 bench_p2_mps; do echo "== $f"; grep -E '^bench_thd_step|^ *[0-9]+ |aten ops' "$D/$f.log"; done
    echo "== graphed_p1"; grep '^thd_graphed_step:' "$D/graphed_p1.log"
  } >"$D/figures.txt" 2>/dev/null
  if grep 'aten ops per step' "$D/bench_p1.log" 2>/dev/null | grep -vq 'differ (tpflex/torch): none$'; then
    note "bench_p1: the modules' aten operations differ from plain torch's at P = 1 (figures.txt)"
    FAILS=$((FAILS + 1))
  fi
}
step_graphed() {
  run graphed-cuda-p1 300 "$PY tests/python/test_graphed.py --cuda"
  run graphed-cuda-p2 300 "$TR --nproc-per-node 2 tests/python/test_graphed.py --cuda"
  run graphed-pytest 300 "$PY tests/python/run_tests.py test_graphed.py"
  run ladder 120 "$PY examples/graphed_buckets.py"
  run step-p1 400 "$TR --nproc-per-node 1 examples/thd_graphed_step.py --backend cuda --tokens $TOKENS --stream ${STREAM:-200}"
  mps_on
  run step-p2-mps 400 "$TR --nproc-per-node 2 examples/thd_graphed_step.py --backend cuda --tokens $TOKENS --stream ${STREAM:-200}"
  mps_off
  { for f in step-p1 step-p2-mps; do echo "== $f"; grep '^thd_graphed_step:' "$D/$f.log"; done
    echo "== ladder"; grep -v '^$' "$D/ladder.log"; } >"$D/figures.txt" 2>/dev/null
}
step_python_tests() {
  if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    note "SKIP: $PY has no torch with CUDA and a visible GPU"; return 77
  fi
  run bootstrap-gloo-cpu 100 "$TR --nproc-per-node 2 tests/python/test_bootstrap_gloo.py"
  for P in 2 4; do
    mkdir -p "$D/test_cuda_p$P"
    run "test-cuda-p$P" 100 "TPFLEX_TEST_LOGDIR=$D/test_cuda_p$P $TR --nproc-per-node $P tests/python/test_cuda.py"
  done
  for P in 2 4; do run "example-p$P" 100 "$TR --nproc-per-node $P examples/thd_training_step.py --backend cuda --steps 4"; done
}
step_python() {
  step_python_tests
  [ $? -eq 77 ] && return 77
  run bench-step-p1 100 "$TR --nproc-per-node 1 examples/bench_thd_step.py --T $TOKENS"
  run bench-step-p2 100 "$TR --nproc-per-node 2 examples/bench_thd_step.py --T $TOKENS"
  run overhead-cuda 100 "$PY examples/bench_python_overhead.py --backend cuda --iters 2000"
  run overhead-sim 100 "$PY examples/bench_python_overhead.py --backend sim --iters 2000"
  run sim-tests-cuda-build 100 "$PY tests/python/run_tests.py test_sim.py"
}
step_planner() {
  local tuned=$D/h200_tuned.txt cal=$D/h200_calibrated.txt nvl=$D/h200_calibrated_nvlink.txt
  local shipped=$SRC/data/cost/h200.txt
  run calibrate 150 "$TPF calibrate --backend cuda --schedules --out $tuned"
  if [ -s "$tuned" ] && grep -q '^gemm ' "$tuned"; then
    grep -v '^sched ' "$tuned" >"$cal"
    { grep -v '^copy peer ' "$cal"; echo "# copy peer: the shipped table's documented NVLink4 parameter (not measured here)"
      grep '^copy peer ' "$shipped"; } >"$nvl"
  fi
  local name table
  for name in tuned shipped calibrated; do
    case $name in tuned) table=$tuned ;; shipped) table=$shipped ;; calibrated) table=$cal ;; esac
    [ -s "$table" ] || { note "bench_$name: no table"; continue; }
    run "bench_$name" 120 "$TPF bench --backend cuda --section planner --cost $table --csv $D/bench_$name.csv --json $D/bench_$name.json"
    grep -E '^# (adaptive <=|\|pred/meas|model \|pred/meas|decisions by source|sched points|bench finished)' \
      "$D/bench_$name.log" | sed "s/^/bench_$name: /" | tee -a "$D/summary.txt"
  done
  run project_shipped 10 "$TPF plan --project --cost $shipped"
  [ -s "$nvl" ] && run project_calibrated 10 "$TPF plan --project --cost $nvl"
  grep -h '^summary' "$D"/project_*.log | tee -a "$D/summary.txt"
}
step_tp_modes() {
  export CUDA_DEVICE_MAX_CONNECTIONS=8
  mps_on
  run modes-p8 330 "$TPF $BENCH_P8 --mode both --timeout 150 --csv $D/modes_p8.csv --json $D/modes_p8.json"
  section "$D/modes-p8.log"
  run modes-p2-p4 300 "$TPF ${BENCH_P8/--tp-list 8/--tp-list 2,4} --mode both --timeout 150 --csv $D/modes_p2_p4.csv"
  section "$D/modes-p2-p4.log"
  mps_off
}
step_lean_enqueue() {
  for lean in 0 1; do
    run "bench-threads-lean$lean" 200 "TPF_CUDA_LEAN_ENQUEUE=$lean $TPF $BENCH_P8 --mode threads"
    section "$D/bench-threads-lean$lean.log"
  done
}
step_device_flags() {
  run conf-quick-flags 120 "TPF_CUDA_DEVICE_FLAGS=1 $CONF --quick"
  for fl in 0 1; do # a flag parameter: its presence is the setting
    local fe=""; [ "$fl" = 1 ] && fe="TPF_CUDA_DEVICE_FLAGS=1"
    run "bench-threads-flags$fl" 200 "$fe $TPF $BENCH_P8 --mode threads"
    section "$D/bench-threads-flags$fl.log"
  done
}
step_bench_all() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvcc --version | tail -2; date -u; } >"$D/env.txt" 2>&1
  run bench 300 "$TPF bench --backend cuda --csv $D/bench.csv --json $D/bench.json"
  grep -q '^# bench finished' "$D/bench.log" && return 0
  for s in chunking setshape dynamic tp; do run "bench-$s" 120 "$TPF bench --backend cuda --section $s"; done
}
step_tools_smoke() {
  run demo 120 "$TPF demo --backend cuda --tp 2 --microbatches 3"
  run bench-tp 300 "$TPF bench --backend cuda --quick --section tp --mode both --tp-list 2 --tokens 4096,8192 --capacity 8192 --csv $D/bench-tp.csv"
  run bench-setshape 120 "$TPF bench --backend cuda --quick --section setshape --tp 2 --capacity 8192 --calls 2000"
  run bench-planner 300 "$TPF bench --backend cuda --quick --section planner --tp 2 --capacity 8192"
  run calibrate 300 "$TPF calibrate --backend cuda --quick --out $D/calibrated.txt"
  grep -E "^calibrate summary|^  (gemm|reduce|launch_us) |FAILED" "$D/calibrate.log" | head -5 | tee -a "$D/summary.txt"
}
# The transformer layer on THD (SPEC §13-14): the training example with real attention checked
# against plain fp32 torch, the step against plain torch with the FP8 step beside it, and
# bucketed graphs against one graph padded to the capacity; P = 1, then P = 2 under MPS.
step_layer() {
  run train_p1 200 "$TR --nproc-per-node 1 examples/thd_training_step.py --backend cuda"
  run te_example_fp8_p1 120 "$TR --nproc-per-node 1 examples/te_layer_with_overlap.py -s 2048 -n 16 -d 64 --fp8"
  run bench_p1 200 "$TR --nproc-per-node 1 examples/bench_thd_step.py --T $TOKENS --fp8 delayed"
  run bench_h4096_p1 200 "$TR --nproc-per-node 1 examples/bench_thd_step.py --hidden 4096 --T 4096,16384 --fp8 delayed"
  run graphs_pad_p1 240 "$TR --nproc-per-node 1 examples/bench_graphs_vs_padding.py --capacity 8192"
  mps_on
  run train_p2_mps 200 "$TR --nproc-per-node 2 examples/thd_training_step.py --backend cuda"
  run bench_p2_mps 200 "$TR --nproc-per-node 2 examples/bench_thd_step.py --T $TOKENS --fp8 delayed"
  mps_off
  {
    for f in train_p1 te_example_fp8_p1 bench_p1 bench_h4096_p1 graphs_pad_p1 train_p2_mps bench_p2_mps; do
      echo "== $f"; grep -E '^(thd_training_step|bench_thd_step|bench_graphs_vs_padding|te_layer)|^ *[0-9]+ |FP8' "$D/$f.log"
    done
  } >"$D/figures.txt" 2>/dev/null
}
# Seeing the step (SPEC §16): the THD step under torch.profiler with tpflex's ranges on and
# stats()'s exposed / hidden communication (examples/profile_thd_step.py, its traces kept), then
# the graphed step against plain torch graphed; P = 1, then P = 2 under MPS.
step_observe() {
  run profile_p1 150 "$TR --nproc-per-node 1 examples/profile_thd_step.py --out $D/prof-p1"
  run profile_h4096_p1 150 "$TR --nproc-per-node 1 examples/profile_thd_step.py --hidden 4096 --T 16384 --kernels 16 --out $D/prof-h4096"
  run profile_h4096_fp8_p1 150 "$TR --nproc-per-node 1 examples/profile_thd_step.py --hidden 4096 --T 16384 --kernels 24 --fp8 delayed --out $D/prof-h4096-fp8"
  run graphed_p1 200 "$TR --nproc-per-node 1 examples/thd_graphed_step.py --backend cuda --capacity 8192 --tokens 1024,4096 --stream 30"
  mps_on
  run bench_p2_mps 200 "$TR --nproc-per-node 2 examples/bench_thd_step.py --T $TOKENS --fp8 delayed"
  run profile_p2_mps 150 "$TR --nproc-per-node 2 examples/profile_thd_step.py --out $D/prof-p2"
  run graphed_p2_mps 200 "$TR --nproc-per-node 2 examples/thd_graphed_step.py --backend cuda --capacity 8192 --tokens 1024,4096 --stream 30"
  run graphs_pad_p2_mps 200 "$TR --nproc-per-node 2 examples/bench_graphs_vs_padding.py --capacity 8192 --stream 50"
  mps_off
  { for f in profile_p1 profile_h4096_p1 profile_h4096_fp8_p1 profile_p2_mps; do echo "== $f"; grep -vE '^(W|E)[0-9]{4}|^\[' "$D/$f.log" | grep -E '^(profile_thd|tpflex|site|[a-z0-9_.]+ +[0-9]|no op|exposed|traces|kernels|  +[0-9])'; done
    echo "== bench_p2_mps"; grep -E '^bench_thd_step|^ *[0-9]+ ' "$D/bench_p2_mps.log"
    for f in graphed_p1 graphed_p2_mps; do echo "== $f"; grep '^thd_graphed_step:' "$D/$f.log"; done
    echo "== graphs_pad_p2_mps"; grep '^bench_graphs_vs_padding' "$D/graphs_pad_p2_mps.log"; } >"$D/figures.txt" 2>/dev/null
}
# FP8 (SPEC §14): the CUDA casts against torch's bit for bit, then the THD step in FP8 against
# bf16 (delayed and current scaling, H = 1024 and 4096, the torch casts beside at H = 4096), the
# FP8 step's kernels, and P = 2 under MPS.
step_fp8_step() {
  run fp8_cast_test 120 "$PY tests/python/test_fp8_cast_cuda.py"
  run bench_p1 150 "$TR --nproc-per-node 1 examples/bench_thd_step.py --T $TOKENS --fp8 delayed"
  run bench_h4096_p1 150 "$TR --nproc-per-node 1 examples/bench_thd_step.py --hidden 4096 --T 4096,16384 --fp8 delayed"
  run bench_h4096_current_p1 150 "$TR --nproc-per-node 1 examples/bench_thd_step.py --hidden 4096 --T 4096,16384 --fp8 current"
  [ -n "${FP8_TORCH_CAST_TOO:-}" ] && run bench_h4096_torchcast_p1 150 "TPFLEX_FP8_TORCH_CAST=1 $TR --nproc-per-node 1 examples/bench_thd_step.py --hidden 4096 --T 4096,16384 --fp8 delayed"
  run profile_h4096_fp8_p1 120 "$TR --nproc-per-node 1 examples/profile_thd_step.py --hidden 4096 --T 16384 --kernels 16 --fp8 delayed --out $D/prof-h4096-fp8"
  mps_on
  run bench_h4096_p2_mps 150 "$TR --nproc-per-node 2 examples/bench_thd_step.py --hidden 4096 --T 4096,16384 --fp8 delayed"
  mps_off
  { for f in bench_p1 bench_h4096_p1 bench_h4096_current_p1 bench_h4096_torchcast_p1 bench_h4096_p2_mps; do
      echo "== $f"; grep -E '^bench_thd_step|^ *[0-9]+ ' "$D/$f.log"; done
    echo "== profile_h4096_fp8_p1"; grep -E '^kernels|^  +[0-9]' "$D/profile_h4096_fp8_p1.log"; } >"$D/figures.txt" 2>/dev/null
}
STEPS="fp8-step layer observe build gpu-tests gpu-tests-short conformance conformance-procs sanitizers proc faults-memops
gemm-plan fp8-tests fp8-bench fp8-bench-python fp8-calibrate host-path thd-step graphed python
python-tests planner tp-modes lean-enqueue device-flags bench-all tools-smoke"

# do_step NAME: one step in $OUT/NAME (its logs, summary.txt), one line in $OUT/summary.txt.
do_step() {
  local s=$1
  case " $(echo $STEPS) " in *" $s "*) ;; *) echo "unknown step '$s' (steps: $(echo $STEPS))" >&2; return 2 ;; esac
  D=$OUT/$s
  mkdir -p "$D"
  : >"$D/summary.txt"
  FAILS=0
  local t0; t0=$(date +%s)
  "step_${s//-/_}"
  local rc=$?
  [ "$rc" -eq 0 ] && [ "$FAILS" -gt 0 ] && rc=1
  D=$OUT
  note "$(printf 'step %-18s rc=%-3s %4s s  %s failing command(s); logs in %s' "$s" "$rc" "$(($(date +%s) - t0))" "$FAILS" "$OUT/$s")"
  return "$rc"
}

# ---- one device call: named steps within a bound, packed ----
call_steps() {
  case $1 in
  check) echo "build gpu-tests-short gemm-plan fp8-tests" ;;
  fp8) echo "build fp8-bench fp8-calibrate" ;;
  host) echo "build host-path" ;;
  thd) echo "build thd-step" ;;
  layer) echo "build layer" ;;
  observe) echo "build observe" ;;
  fp8step) echo "build fp8-step" ;;
  *) return 1 ;;
  esac
}
do_call() {
  local call=$1 bound=${2:-570}
  local steps; steps=$(call_steps "$call") || { echo "unknown call '$call'; $CALLS_HELP" >&2; return 2; }
  local out=$OUT t0; t0=$(date +%s)
  mkdir -p "$out/$call"
  # thd: the training example at P = 1 and the simulator's layer tests leave room for the rest
  # (CI runs the latter; the former's values are checked at P = 2 too).
  [ "$call" = thd ] && export SKIP="${SKIP:-train_p1 layers_sim}"
  export DEADLINE=$((t0 + bound - 10))
  # fp8: the P = 8 bench leaves the calibration its 240 s.
  local s rc=0
  for s in $steps; do
    local dl=$DEADLINE
    [ "$call" = fp8 ] && [ "$s" = fp8-bench ] && dl=$((DEADLINE - 240))
    DEADLINE=$dl OUT=$out/$call bash "$ME" "$s" || { rc=1; [ "$s" = build ] && break; }
  done
  echo "call $call: $(($(date +%s) - t0)) s, rc=$rc" >>"$out/$call/summary.txt"
  find "$out/$call" -name summary.txt | sort | while read -r f; do echo "== $f"; cat "$f"; done >"$out/$call-summary.txt"
  tar -czf "$out/$call.tgz" -C "$out" "$call" && rm -rf "${out:?}/$call"
  cat "$out/$call-summary.txt"
  return "$rc"
}

case ${1:-} in
"" | -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
--list) echo "steps: $(echo $STEPS)"; echo "$CALLS_HELP"; exit 0 ;;
--call) shift; do_call "$@"; exit $? ;;
esac
mkdir -p "$OUT"
rc=0
for s in "$@"; do
  do_step "$s" || { rc=1; [ "$s" = build ] && break; }
done
exit "$rc"
