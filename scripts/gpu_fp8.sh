#!/usr/bin/env bash
# FP8 communicators on one GPU (issue 28, docs/SPEC.md §11): builds the committed snapshot with
# CUDA (scripts/gpu_round.sh's build step: .snap/src.tar from scripts/gpu_snapshot.sh, the
# CMocka carry in .deps), then
#   conf-threads  conformance_cuda --quick (rank threads; the sweep includes fp8_e4m3 / fp8_e5m2
#                 on every operation, split count and T) and the full sweep
#   conf-procs    conformance_cuda --procs --quick --tp P for P = 2, 4, 8 under MPS
#   gemm-plan     test_cuda_gemm_plan (the fp8 refusals, CPU side)
#   python        tests/python/test_fp8.py (simulator) and the FP8 vs bf16 timing below
#   bench         FP8 vs bf16 at P = 1 on the CUDA backend through Python (tpflex.torch, one
#                 process): ag_gemm (RING AG) and bulk_overlap (BULK AG) at K = H = 8192,
#                 N = 3584, T = 1k / 4k / 16k; median ms of 20 after 5 warm-ups, bytes of the
#                 gathered buffer, speedup fp8 / bf16 (figures.txt); then `tpflex bench --section
#                 fp8` at P = 8 rank threads on the one GPU (C = 32768, H = 8192, N = 3584, T = 1k
#                 .. 32k): ring_ag+gemm, bulk_ag+gemm, gemm+ring_rs, gemm+pipeline_rs and the
#                 serial baselines in bf16 and fp8_e4m3 side by side, #wrong checked
#                 (bench-fp8-p8.log, bench_fp8_p8.csv / .json)
# Each step is bounded and logged under $OUT/<step>.log; summary in $OUT/summary.txt.
#
#   usage: OUT=/path/to/out bash scripts/gpu_fp8.sh [STEP...]
#   steps: plan threads procs python bench bench8 (bench8: the P = 8 `tpflex bench` rows alone;
#   default: all, about 6-8 minutes of device time after
#   the build; under a 10-minute cap per command run them in calls of their own, e.g. "plan
#   threads procs", then "python", then "bench" (its bounds add up to 9 minutes): the build is
#   kept in $SRC/build-gpu between calls on the same machine); calibrate (opt-in, about 2 min:
#   scripts/gpu_calibrate_fp8.sh, the cost table's fp8_e4m3 GEMM points for data/cost/h200.txt)
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs/fp8}
SRC=${SRC:-/tmp/tpf-src}
BUILD=$SRC/build-gpu
mkdir -p "$OUT"
S=$OUT/summary.txt
. "$ROOT/scripts/gpu_steps.sh" # note, step
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d && note "MPS: started" || note "MPS: failed to start"
}
mps_off() { echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control 2>/dev/null; sleep 1; }

# Build (gpu_round.sh's step: configure, build, symbols) unless BUILD already holds one.
if [ ! -x "$BUILD/tests/conformance/conformance_cuda" ]; then
  OUT=$OUT/round SRC=$SRC bash "$ROOT/scripts/gpu_round.sh" build || { note "build failed: $OUT/round"; exit 1; }
fi
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$SRC/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CUDA_DEVICE_MAX_CONNECTIONS=32
note "snapshot: $(cat "$SRC/.snap-commit" 2>/dev/null || echo '?')"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
C=$BUILD/tests/conformance/conformance_cuda
STEPS=${*:-plan threads procs python bench}
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
PYENV="TPFLEX_LIBRARY=$BUILD/libtpflex.so PYTHONPATH=$SRC/python PYTHONWARNINGS=ignore"

if has plan; then step gemm-plan 60 "$BUILD/tests/cuda_cpu/test_cuda_gemm_plan"; fi
if has threads; then
  step conf-threads-quick 120 "$C --quick"
  step conf-threads-full 240 "$C"
  for f in conf-threads-quick conf-threads-full; do tail -1 "$OUT/$f.log" | tee -a "$S"; done
  grep -h "FAIL" "$OUT"/conf-threads-*.log | grep -c fp8 | sed 's/^/fp8 FAIL lines (threads): /' | tee -a "$S"
fi
if has procs; then
  export CUDA_DEVICE_MAX_CONNECTIONS=8
  mps_on
  for P in 2 4 8; do
    step conf-procs-p$P 90 "$C --procs --quick --tp $P"
    tail -1 "$OUT/conf-procs-p$P.log" | tee -a "$S"
  done
  mps_off
  export CUDA_DEVICE_MAX_CONNECTIONS=32
fi
if has python; then
  step python 120 "$PYENV python3 tests/python/test_fp8.py"
  tail -3 "$OUT/python.log" | tee -a "$S"
fi
if has calibrate; then # opt-in, not in the default steps: the planner's fp8 GEMM points
  OUT=$OUT/calibrate SRC=$SRC bash "$ROOT/scripts/gpu_calibrate_fp8.sh"
  note "step calibrate: rc=$? (scripts/gpu_calibrate_fp8.sh, logs in $OUT/calibrate)"
fi
if has bench8 && ! has bench; then # the P = 8 rows alone (the P = 1 table: session 8, run 7)
  step bench-fp8-p8 300 "$BUILD/tpflex bench --backend cuda --section fp8 --tp-list 8 --mode threads --csv $OUT/bench_fp8_p8.csv --json $OUT/bench_fp8_p8.json"
  grep -E "^(ring|bulk|serial|gemm)|FAILED|bench finished" "$OUT/bench-fp8-p8.log" | tee -a "$S"
fi
has bench || { note "done: logs in $OUT"; exit 0; }

cat >"$OUT/fp8_bench.py" <<'EOF'
"""FP8 vs bf16 on the CUDA backend at P = 1 (one process): ag_gemm and bulk_overlap."""
import os
import statistics
import sys

import torch
import torch.distributed as dist

import tpflex.torch as tt

H, N = 8192, 3584
Ts = [int(t) for t in os.environ.get("TS", "1024 4096 16384").split()]
CAP = max(Ts)
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
dist.init_process_group("gloo", rank=0, world_size=1)


def timed(fn, n=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


rows = []
for use_fp8 in (False, True):
    tt.initialize_ub([CAP, H], 1, use_fp8=use_fp8, backend="cuda")
    for T in Ts:
        tt.set_ub_active_shape([T, H])
        ag, bk = tt.get_ub("fc1_fprop"), tt.get_ub("qkv_dgrad")
        dt = ag.dtype
        sa = torch.ones(1, device=dev)
        kw = {"a_scale_inv": sa, "w_scale_inv": sa} if use_fp8 else {}
        ag.local_chunk().copy_((torch.randn(T, H, device=dev) * 0.5).to(dt))
        w = (torch.randn(N, H, device=dev) * 0.5).to(dt)
        out = torch.empty(T, N, dtype=torch.bfloat16, device=dev)
        ms_ag = timed(lambda: ag.ag_gemm(w, out=out, **kw))
        a = (torch.randn(T, H, device=dev) * 0.5).to(dt)
        ms_bk = timed(lambda: bk.bulk_overlap(a, w, out=out, **kw))
        rows.append((str(dt), T, T * H * (1 if use_fp8 else 2), ms_ag, ms_bk))
    tt.destroy_ub()
base = {(r[1]): r for r in rows if "bfloat16" in r[0]}
print("dtype | T | buffer bytes | ag_gemm ms | bulk_overlap ms | ag speedup vs bf16 | bulk speedup")
for dt, T, by, a, b in rows:
    r = base[T]
    print(f"{dt} | {T} | {by} | {a:.3f} | {b:.3f} | {r[3] / a:.2f} | {r[4] / b:.2f}")
dist.destroy_process_group()
sys.exit(0)
EOF
step bench 240 "$PYENV python3 $OUT/fp8_bench.py"
grep "|" "$OUT/bench.log" | tee "$OUT/figures.txt" | tee -a "$S"
step bench-fp8-p8 300 "$BUILD/tpflex bench --backend cuda --section fp8 --tp-list 8 --mode threads --csv $OUT/bench_fp8_p8.csv --json $OUT/bench_fp8_p8.json"
grep -E "^(ring|bulk|serial|gemm)|FAILED|bench finished" "$OUT/bench-fp8-p8.log" | tee -a "$S"
note "done: logs in $OUT"
