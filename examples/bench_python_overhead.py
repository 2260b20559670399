"""Benchmark (not a test): the Python overhead of tpflex.torch per call, in µs, against the same
C call made through ctypes with pre-built argument structs (the floor any binding pays), with
P = 1 (so no peer waits are timed). Small shapes so the C work itself is small.

  TPFLEX_LIBRARY=build/libtpflex.so python3 examples/bench_python_overhead.py [--iters 2000]
  TPFLEX_LIBRARY=build-cuda/libtpflex.so python3 examples/bench_python_overhead.py --backend cuda

A second table prices the profiler switch (SPEC §16: tpflex.torch.profile): the median of
timeit repeats per call with the ranges off, on (no profiler running: record_function's own
cost), and on inside a torch.profiler session (what looking costs); and stats(), whose counters
the C library keeps whatever the switch.

--backend sim: the simulator (the C call runs the operation before returning). --backend cuda:
one process, a gloo group of one (no torchrun needed), operations enqueued on the current
stream; both variants synchronise the device every --sync-every calls, so a queue that fills
up slows both alike (the table's overhead column is the difference)."""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import statistics
import timeit
import os
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
if importlib.util.find_spec("tpflex") is None:  # not installed: the source tree's
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex._lib import Matrix, Shape, lib, op_options_default  # noqa: E402


CLOCK = [time.perf_counter]


def per_call_us(fn, iters: int, sync=None, every: int = 0) -> float:
    clock = CLOCK[0]
    for i in range(min(100, iters)):
        fn()
    if sync:
        sync()
    t0 = clock()
    for i in range(iters):
        fn()
        if every and i % every == every - 1:
            sync()
    if sync:
        sync()
    return 1e6 * (clock() - t0) / iters


def paired(py, c, iters: int, sync=None, every: int = 0, blocks: int = 7, mm=None):
    """The variants in alternating blocks; the fastest block of each (robust to a busy
    machine: interference only ever adds time). mm: torch's same-shape matmul (out=), timed in
    the same blocks (None: the row has none)."""
    n = max(1, iters // blocks)
    fns = [py, c] + ([mm] if mm else [])
    ts = [[] for _ in fns]
    for _ in range(blocks):
        for f, t in zip(fns, ts):
            t.append(per_call_us(f, n, sync, every))
    return min(ts[0]), min(ts[1]), (min(ts[2]) if mm else float("nan"))


def body(rank: int, iters: int, device: torch.device, backend: str, every: int):
    torch.set_num_threads(1)
    H, T, N = 64, 16, 16
    mgr = te.initialize_ub([256, H], 1, dtype=torch.float32, backend=backend)
    te.set_ub_active_shape([T, H])
    ag, rs, bulk = te.get_ub("fc1_fprop"), te.get_ub("fc2_fprop"), te.get_ub("fc1_dgrad")
    dev = dict(device=device)
    w, d = torch.randn(N, H, **dev), torch.empty(T, N, **dev)
    wt = w.t().contiguous()                     # [H, N] for trans_w
    bias = torch.randn(N, **dev)
    x, w_rs, o_rs = torch.randn(T, N, **dev), torch.randn(H, N, **dev), torch.empty(T, H, **dev)
    a, b, o_b = torch.randn(8, 16, **dev), torch.randn(8, 16, **dev), torch.empty(8, 8, **dev)
    mat = lambda t: Matrix(t.data_ptr(), t.shape[0], t.shape[1], t.stride(0), 2)  # noqa: E731
    mw, mwt, md, mx, mwr, mor, ma, mb, mob = map(mat, (w, wt, d, x, w_rs, o_rs, a, b, o_b))
    opt = op_options_default()
    opt.trans_w, opt.bias = True, bias.data_ptr()
    h = {k: v._h for k, v in (("ag", ag), ("rs", rs), ("bulk", bulk))}
    s = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    r = ctypes.byref
    sh = Shape(T, H)
    t = lambda py, c, mm=None: paired(py, c, iters, sync, every, mm=mm)  # noqa: E731
    buf = ag.buffer()  # the gathered [T, H] the ag_gemm multiplies (P = 1: the local shard)
    rows = [
        ("set_ub_active_shape", *t(lambda: te.set_ub_active_shape([T, H]),
                                   lambda: lib.tpf_manager_set_active_shape(mgr._h, sh))),
        ("local_chunk() view", *t(lambda: ag.local_chunk(), lambda: lib.tpf_comm_epoch(h["ag"]))),
        ("ag_gemm", *t(lambda: ag.ag_gemm(w, out=d),
                       lambda: lib.tpf_ag_gemm(h["ag"], r(mw), r(md), s),
                       lambda: torch.mm(buf, w.t(), out=d))),
        ("ag_gemm trans_w+bias", *t(lambda: ag.ag_gemm(wt, out=d, trans_w=True, bias=bias),
                                    lambda: lib.tpf_ag_gemm_ex(h["ag"], r(mwt), r(md), r(opt), s),
                                    lambda: torch.addmm(bias, buf, wt, out=d))),
        ("gemm_rs", *t(lambda: rs.gemm_rs(x, w_rs, out=o_rs),
                       lambda: lib.tpf_gemm_rs(h["rs"], r(mx), r(mwr), r(mor), s),
                       lambda: torch.mm(x, w_rs.t(), out=o_rs))),
        ("bulk_overlap", *t(lambda: bulk.bulk_overlap(a, b, out=o_b),
                            lambda: lib.tpf_bulk_overlap(h["bulk"], r(ma), r(mb), r(mob), s),
                            lambda: torch.mm(a, b.t(), out=o_b))),
    ]
    if sync:
        sync()
    prof = profile_rows(T, H, ag, rs, bulk, w, d, x, w_rs, o_rs, a, b, o_b, iters, sync)
    te.destroy_ub()
    return rows, prof


def median_us(fn, iters: int, sync=None) -> float:
    """timeit's repeats (7) of iters // 7 calls each; the median per call, in µs."""
    n = max(1, iters // 7)
    for _ in range(min(100, n)):
        fn()
    if sync:
        sync()

    def block():
        for _ in range(n):
            fn()
        if sync:
            sync()
    return 1e6 * statistics.median(timeit.repeat(block, number=1, repeat=7,
                                                 timer=CLOCK[0])) / n


def profile_rows(T, H, ag, rs, bulk, w, d, x, w_rs, o_rs, a, b, o_b, iters, sync):
    """Per call: ranges off, on, and on under torch.profiler (median µs, side by side)."""
    calls = [("set_ub_active_shape", lambda: te.set_ub_active_shape([T, H])),
             ("ag_gemm", lambda: ag.ag_gemm(w, out=d)),
             ("gemm_rs", lambda: rs.gemm_rs(x, w_rs, out=o_rs)),
             ("bulk_overlap", lambda: bulk.bulk_overlap(a, b, out=o_b)),
             ("stats()", te.stats)]
    out = []
    for name, fn in calls:
        te.profile(False)
        off = median_us(fn, iters, sync)
        te.profile(True)
        on = median_us(fn, iters, sync)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            looking = median_us(fn, max(7, iters // 4), sync)
        te.profile(False)
        out.append((name, off, on, looking))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--backend", default="sim", choices=["sim", "cuda"])
    ap.add_argument("--sync-every", type=int, default=50, help="cuda: device sync period")
    ap.add_argument("--clock", choices=["thread", "wall"], default=None,
                    help="thread: CPU time of the calling thread (default for sim: insensitive to "
                         "other processes; the simulator runs P=1 steps on that thread); wall: "
                         "elapsed time (default for cuda, where a call may wait on the device)")
    a = ap.parse_args()
    a.clock = a.clock or ("thread" if a.backend == "sim" else "wall")
    CLOCK[0] = time.thread_time if a.clock == "thread" else time.perf_counter
    if a.backend == "sim":
        rows, prof = sim.run(1, body, a.iters, torch.device("cpu"), "sim", 0)[0]
        where = "simulator, P=1"
    else:
        import torch.distributed as dist
        store = os.path.join(tempfile.mkdtemp(prefix="tpflex-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        rows, prof = body(0, a.iters, device, "cuda", a.sync_every)
        dist.destroy_process_group()
        where = f"CUDA {torch.cuda.get_device_name(device)}, P=1, sync every {a.sync_every}"
    print(f"bench_python_overhead: {where}, {a.clock} clock, {a.iters} calls each in 7 "
          f"alternating blocks, the fastest block (the 'local_chunk()' row's C column is tpf_comm_epoch, the cache check)")
    print("torch.mm us: torch's matmul of the same shape (out=, addmm for the bias row) in the "
          "same blocks; tpflex/mm = tpflex.torch us / torch.mm us (issue 24: host <= 1.3x at "
          "P = 1 on CUDA; on the simulator both sides are CPU GEMMs of different code)")
    print(f"{'call':22s} {'tpflex.torch us':>16s} {'raw ctypes us':>14s} {'overhead us':>12s} "
          f"{'torch.mm us':>12s} {'tpflex/mm':>10s}")
    for name, py, c, mm in rows:
        ratio = f"{py / mm:10.2f}" if mm == mm else f"{'':>10s}"
        mms = f"{mm:12.2f}" if mm == mm else f"{'':>12s}"
        print(f"{name:22s} {py:16.2f} {c:14.2f} {py - c:12.2f} {mms} {ratio}")
    print("profiler switch (tpflex.torch.profile / TPFLEX_PROFILE=1), median of 7 timeit repeats "
          f"per call, {a.clock} clock; 'profiling' = inside a torch.profiler session (a quarter "
          "of the calls); figures printed, not judged")
    print(f"{'call':22s} {'off us':>10s} {'on us':>10s} {'on - off':>10s} {'profiling us':>13s}")
    for name, off, on, looking in prof:
        print(f"{name:22s} {off:10.2f} {on:10.2f} {on - off:10.2f} {looking:13.2f}")
    print("bench_python_overhead: done")


if __name__ == "__main__":
    main()
