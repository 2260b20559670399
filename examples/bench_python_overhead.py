"""Benchmark (not a test): the Python overhead of tpflex.torch per call, in µs, against the same
C call made through ctypes with pre-built argument structs (the floor any binding pays), on the
simulator with P = 1 (so no peer waits are timed). Small shapes so the C work itself is small.

  TPFLEX_LIBRARY=build/libtpflex.so python3 examples/bench_python_overhead.py [--iters 2000]"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex._lib import Matrix, Shape, lib  # noqa: E402


def per_call_us(fn, iters: int) -> float:
    for _ in range(min(100, iters)):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return 1e6 * (time.perf_counter() - t0) / iters


def body(rank: int, iters: int):
    torch.set_num_threads(1)
    H, T, N = 64, 16, 16
    mgr = te.initialize_ub([256, H], 1, dtype=torch.float32)
    te.set_ub_active_shape([T, H])
    ag, rs, bulk = te.get_ub("fc1_fprop"), te.get_ub("fc2_fprop"), te.get_ub("fc1_dgrad")
    w = torch.randn(N, H)
    d = torch.empty(T, N)
    x = torch.randn(T, N)
    w_rs = torch.randn(H, N)
    o_rs = torch.empty(T, H)
    a, b, o_b = torch.randn(8, 16), torch.randn(8, 16), torch.empty(8, 8)
    mat = lambda t: Matrix(t.data_ptr(), t.shape[0], t.shape[1], t.stride(0), 2)  # noqa: E731
    mw, md, mx, mwr, mor, ma, mb, mob = map(mat, (w, d, x, w_rs, o_rs, a, b, o_b))
    h = {k: v._h for k, v in (("ag", ag), ("rs", rs), ("bulk", bulk))}
    r = ctypes.byref
    rows = []
    sh = Shape(T, H)
    rows.append(("set_ub_active_shape", per_call_us(lambda: te.set_ub_active_shape([T, H]), iters),
                 per_call_us(lambda: lib.tpf_manager_set_active_shape(mgr._h, sh), iters)))
    rows.append(("ag_gemm", per_call_us(lambda: ag.ag_gemm(w, out=d), iters),
                 per_call_us(lambda: lib.tpf_ag_gemm(h["ag"], r(mw), r(md), None), iters)))
    rows.append(("gemm_rs", per_call_us(lambda: rs.gemm_rs(x, w_rs, out=o_rs), iters),
                 per_call_us(lambda: lib.tpf_gemm_rs(h["rs"], r(mx), r(mwr), r(mor), None), iters)))
    rows.append(("bulk_overlap", per_call_us(lambda: bulk.bulk_overlap(a, b, out=o_b), iters),
                 per_call_us(lambda: lib.tpf_bulk_overlap(h["bulk"], r(ma), r(mb), r(mob), None),
                             iters)))
    te.destroy_ub()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    rows = sim.run(1, body, a.iters)[0]
    print(f"{'call':22s} {'tpflex.torch us':>16s} {'raw ctypes us':>14s} {'overhead us':>12s}")
    for name, py, c in rows:
        print(f"{name:22s} {py:16.2f} {c:14.2f} {py - c:12.2f}")


if __name__ == "__main__":
    main()
