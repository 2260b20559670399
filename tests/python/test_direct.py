"""On the simulator: an eager operation calls its implementation directly, not
through its torch.library custom op (whose dispatch cost tens of µs per call); the op is still
used where it matters: an input that requires grad (its backward raises 'no autograd formula'),
under a dispatch mode (fake tensors) and under torch.compile. Results are the same either way."""
import os
import sys
import threading
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex._comm as cm  # noqa: E402
import tpflex._ops as ops  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402

H = 32
NAMES = ("op_ag_gemm", "op_ag_gemm_out", "op_gemm_rs", "op_gemm_rs_out", "op_bulk_overlap",
         "op_bulk_overlap_out")


_tls = threading.local()
_ORIGINAL = {k: getattr(ops, k) for k in NAMES}


def _wrap(k):
    def wrapped(*a, **kw):
        _tls.n = getattr(_tls, "n", 0) + 1
        return _ORIGINAL[k](*a, **kw)
    return wrapped


def setUpModule():
    """The custom-op handles counted per thread (sim ranks are threads), patched once; the
    direct path can be turned off per thread (_tls.force_op)."""
    for k in NAMES:
        setattr(ops, k, _wrap(k))
    direct = cm._direct
    _ORIGINAL["_direct"] = direct
    cm._direct = lambda *t: False if getattr(_tls, "force_op", False) else direct(*t)


def tearDownModule():
    cm._direct = _ORIGINAL.pop("_direct")
    for k, v in _ORIGINAL.items():
        setattr(ops, k, v)


class Counting:
    """The calls this thread makes through the custom ops inside the block."""

    def __enter__(self):
        self.n0 = getattr(_tls, "n", 0)
        return self

    def __exit__(self, *exc):
        return False

    def total(self):
        return getattr(_tls, "n", 0) - self.n0


def every_op(P, r):
    """Each operation once (functional and out= forms) at T = 16; the results."""
    g = torch.Generator().manual_seed(7 + r)
    T = 16
    tt.set_ub_active_shape([T, H])
    res = []
    ag = tt.get_ub("fc1_fprop")
    ag.local_chunk().copy_(torch.randn(T // P, H, generator=g))
    w = torch.randn(8, H, generator=g)
    res.append(ag.ag_gemm(w).clone())
    res.append(ag.ag_gemm(w, out=torch.empty(T, 8)).clone())
    rs = tt.get_ub("fc2_fprop")
    x, wr = torch.randn(T, 16, generator=g), torch.randn(H, 16, generator=g)
    res.append(rs.gemm_rs(x, wr).clone())
    res.append(rs.gemm_rs(x, wr, out=torch.empty(T // P, H)).clone())
    bk = tt.get_ub("fc1_dgrad")
    a, b = torch.randn(8, 16, generator=g), torch.randn(4, 16, generator=g)
    res.append(bk.bulk_overlap(a, b).clone())
    res.append(bk.bulk_overlap(a, b, out=torch.empty(8, 4)).clone())
    return res


class Direct(unittest.TestCase):
    def run_ranks(self, P, body):
        def f(rank):
            tt.initialize_ub([64, H], P, dtype=torch.float32, backend="sim")
            try:
                return body(P, rank)
            finally:
                tt.destroy_ub()
        return sim.run(P, f)

    def test_eager_skips_the_op_with_the_same_results(self):
        for P in (1, 2):
            def body(P, r):
                with Counting() as c:
                    direct = every_op(P, r)
                    n_direct = c.total()
                # The same operations through the custom ops (the path that tracing and grad
                # inputs take): the direct path turned off for this thread.
                _tls.force_op = True
                try:
                    with Counting() as c:
                        via_op = every_op(P, r)
                        n_op = c.total()
                finally:
                    _tls.force_op = False
                return n_direct, n_op, [torch.equal(a, b) for a, b in zip(direct, via_op)]
            for r, (n_direct, n_op, same) in enumerate(self.run_ranks(P, body)):
                self.assertEqual(n_direct, 0, f"P={P} rank {r}: eager calls went through the op")
                self.assertEqual(n_op, 6)
                self.assertTrue(all(same), f"P={P} rank {r}: {same}")

    def test_grad_input_goes_through_the_op(self):
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            w = torch.ones(4, H, requires_grad=True)
            with Counting() as c:
                y = tt.get_ub("fc1_fprop").ag_gemm(w)
                n = c.total()
            try:
                y.sum().backward()
                msg = ""
            except RuntimeError as e:
                msg = str(e)
            with torch.no_grad(), Counting() as c:  # no grad mode: direct again
                tt.get_ub("fc1_fprop").ag_gemm(w)
                n_nograd = c.total()
            return n, msg, n_nograd
        n, msg, n_nograd = self.run_ranks(1, body)[0]
        self.assertEqual(n, 1)
        self.assertIn("no autograd formula", msg)
        self.assertEqual(n_nograd, 0)


class LazyViews(unittest.TestCase):
    """set_ub_active_shape is one C call: the geometry the compiled code reads is computed in
    Python, the eager views are taken again on first use. Both must equal the C library's."""

    def test_geometry_equals_the_c_views(self):
        # TE's default sites (ring AG, pipeline RS, bulk AG and RS) and a ring RS.
        cfgs = {"ring_rs": {"method": "ring", "coll": "rs"}}

        def f(rank, P):
            tt.initialize_ub([64, H], P, dtype=torch.float32, backend="sim", ub_cfgs=cfgs)
            try:
                m = tt.get_ub("fc1_fprop")._mgr
                bad = []
                for T in (16, 8 * P, 64, 4 * P, 16):
                    if T % P:
                        continue
                    tt.set_ub_active_shape([T, H])
                    for c in m._comms.values():
                        lazy = (c._gbuf, c._gchunk, c._vepoch)
                        c._vepoch = -1
                        c._refresh_views()  # the C library's buffer and local chunk
                        # external sites keep capacity (and their views); the others are
                        # left for the eager path to take again (epoch -1)
                        if lazy[:2] != (c._gbuf, c._gchunk) or (lazy[2] != -1) != c.external:
                            bad.append((c.name, T, lazy, c._gbuf, c._gchunk))
                        buf, chunk = c.buffer(), c.local_chunk()
                        if c.external:
                            continue
                        R = T // P
                        if chunk.shape != (R, H):
                            bad.append((c.name, T, tuple(chunk.shape)))
                return bad
            finally:
                tt.destroy_ub()
        for P in (1, 2, 4):
            for r, bad in enumerate(sim.run(P, lambda rank: f(rank, P))):
                self.assertEqual(bad, [], f"P={P} rank {r}")


if __name__ == "__main__":
    unittest.main()
