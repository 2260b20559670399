"""FP8 against bf16 on the CUDA backend at P = 1 (one process), through tpflex.torch: ag_gemm
(RING AG) and bulk_overlap (BULK AG) at K = H = 8192, N = 3584, T = 1k / 4k / 16k (TS overrides);
median ms of 20 after 5 warm-ups, bytes of the gathered buffer, speedup fp8 / bf16. Needs a GPU
and torch with CUDA. scripts/gpu.sh's step fp8-bench-python runs it:

    TPFLEX_LIBRARY=build/libtpflex.so PYTHONPATH=python python3 scripts/fp8_vs_bf16.py
"""
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
