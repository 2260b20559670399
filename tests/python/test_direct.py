"""On the simulator: an eager operation calls its implementation directly, not
through its torch.library custom op (whose dispatch cost tens of µs per call); the op is still
used where it matters: an input that requires grad (its backward raises 'no autograd formula'),
under a dispatch mode (fake tensors) and under torch.compile. Results are the same either way.

The eager fast path (FastPath below): a call whose signature passed every check before is one C
call (and the epoch query), with the same results bit for bit, the same errors for anything
else, fast_options agreeing with parse_options, and the binding checks kept."""
import contextlib
import itertools
import os
import sys
import threading
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex._comm as cm  # noqa: E402
import tpflex._lib as L  # noqa: E402
import tpflex._ops as ops  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402
from tpflex._options import fast_options, parse_options  # noqa: E402

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
    """set_ub_active_shape is the shape change and one tpf_manager_geometry read: the geometry
    the compiled code reads comes from its records, the eager views are taken on first use.
    Both must equal the C library's per-communicator views (tpf_comm_buffer / _local_chunk)."""

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
                        esz = c._reg.element_size()
                        base = c.registration()[0]
                        views = []
                        for fn in (L.lib.tpf_comm_buffer, L.lib.tpf_comm_local_chunk):
                            mx = L.Matrix()
                            L.check(fn(c._h, mx))
                            views.append((mx.rows, mx.cols, mx.ld, (mx.ptr - base) // esz))
                        # every site's geometry and epoch is the C library's; external sites
                        # keep capacity
                        if lazy != (views[0], views[1], L.lib.tpf_comm_epoch(c._h)):
                            bad.append((c.name, T, lazy, views))
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



# ---- the eager fast path ----------------------------------------------------------------------

C_OPS = ("tpf_ag_gemm", "tpf_ag_gemm_ex", "tpf_gemm_rs", "tpf_gemm_rs_ex", "tpf_bulk_overlap",
         "tpf_bulk_overlap_ex")
C_QUERIES = ("tpf_comm_epoch", "tpf_comm_active_shape", "tpf_comm_buffer", "tpf_comm_local_chunk",
             "tpf_comm_registration")
_count_lock = threading.Lock()


@contextlib.contextmanager
def counting_c_calls():
    """Counts the calling thread's calls of C_OPS and C_QUERIES inside the block ({name: n})."""
    me = threading.get_ident()
    counts = {}
    saved = {n: getattr(L.lib, n) for n in C_OPS + C_QUERIES}

    def wrap(n, f):
        def g(*a):
            if threading.get_ident() == me:
                counts[n] = counts.get(n, 0) + 1
            return f(*a)
        return g
    with _count_lock:  # one thread patches the library at a time (P = 1 below)
        for n, f in saved.items():
            setattr(L.lib, n, wrap(n, f))
        try:
            yield counts
        finally:
            for n, f in saved.items():
                setattr(L.lib, n, f)


def calls(T, P, r, g):
    """(label, communicator name, method name, args, options) of every operation, functional and
    out= forms, with the options the layers use, at active shape [T, H]."""
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    R = T // P
    return [
        ("ag_gemm", "fc1_fprop", "ag_gemm", (rnd(8, H),), {}),
        ("ag_gemm out", "fc1_fprop", "ag_gemm", (rnd(8, H), torch.empty(T, 8)), {}),
        ("ag_gemm trans_w bias gelu", "fc1_fprop", "ag_gemm", (rnd(H, 8),),
         {"trans_w": True, "bias": rnd(8), "gelu": True}),
        ("ag_gemm out beta alpha splits", "fc1_fprop", "ag_gemm", (rnd(8, H), rnd(T, 8)),
         {"beta": 0.5, "alpha": -2, "num_splits": P}),
        ("gemm_rs", "fc2_fprop", "gemm_rs", (rnd(T, 16), rnd(H, 16)), {}),
        ("gemm_rs out accumulate", "fc2_fprop", "gemm_rs", (rnd(T, 16), rnd(H, 16), rnd(R, H)),
         {"accumulate": True}),
        ("gemm_rs ring trans_a trans_w bias", "ring_rs", "gemm_rs", (rnd(16, T), rnd(16, H)),
         {"trans_a": True, "trans_w": True, "bias": rnd(H)}),
        ("bulk_overlap ag", "fc1_dgrad", "bulk_overlap", (rnd(8, 16), rnd(24, 16)), {}),
        ("bulk_overlap rs wgrad out beta", "fc1_wgrad", "bulk_overlap",
         (rnd(T, 24), rnd(T, H), rnd(24, H)), {"trans_a": True, "trans_w": True, "beta": 1.0}),
        ("bulk_overlap out, strided a", "fc1_dgrad", "bulk_overlap",
         (rnd(8, 20)[:, :16], rnd(24, 16), torch.empty(8, 24)), {"splits": None}),
    ]


def fill(P, r, T, g):
    """The registrations' inputs (each operation reads its buffer)."""
    tt.get_ub("fc1_fprop").local_chunk().copy_(torch.randn(T // P, H, generator=g))
    tt.get_ub("fc1_dgrad").local_chunk().copy_(torch.randn(T // P, H, generator=g))
    tt.get_ub("fc1_wgrad").buffer().copy_(torch.randn(T, H, generator=g))


def same_bits(a, b):
    """Equal bytes (rows a call never writes may hold NaN: torch.equal would say no)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def invoke(name, meth, args, opts):
    """The call with fresh copies of its tensors (out= is read when beta != 0)."""
    args = tuple(a.clone() if a.dim() and a.is_contiguous() else a for a in args)
    return getattr(tt.get_ub(name), meth)(*args, **opts)


class FastPath(unittest.TestCase):
    def run_ranks(self, P, body, **kw):
        def f(rank):
            tt.initialize_ub([64, H], P, dtype=kw.get("dtype", torch.float32), backend="sim",
                             ub_cfgs={"ring_rs": {"method": "ring", "coll": "rs"}})
            try:
                return body(P, rank)
            finally:
                tt.destroy_ub()
        return sim.run(P, f)

    def test_fast_options_agree_with_parse_options(self):
        """fast_options gives parse_options' values or None (then parse_options decides),
        over every option with values of every kind, alone and in pairs."""
        t, p = torch.ones(3), torch.nn.Parameter(torch.ones(3))
        vals = {
            "bool": [True, False, 0, 1, 2, None, 1.0, "x"],
            "num": [1.0, 0.5, -0.0, 0.0, 2, -3, float("nan"), float("inf"), 3.4e38, 3.5e38,
                    2 ** 200, True, None, "x", torch.tensor(2.0)],
            "splits": [0, 2, None, -1, 2 ** 31 - 1, 2 ** 31, 2.0, True, torch.tensor(2)],
            "tensor": [None, t, p, 1.0, "x"],
            "stream": [None, 0, 5],
            "other": [None, 1, t],
        }
        kinds = {"trans_a": "bool", "trans_w": "bool", "gelu": "bool", "accumulate": "bool",
                 "alpha": "num", "beta": "num", "num_splits": "splits", "splits": "splits",
                 "bias": "tensor", "a_scale_inv": "tensor", "w_scale_inv": "tensor",
                 "stream": "stream", "gelu_out": "other", "transa": "other", "foo": "other"}
        dicts = [{k: v} for k, kind in kinds.items() for v in vals[kind]]
        dicts += [{k1: v1, k2: v2} for (k1, k2) in itertools.combinations(kinds, 2)
                  for v1 in vals[kinds[k1]][:4] for v2 in vals[kinds[k2]][:4]]
        dicts += [{"beta": 0.0, "accumulate": True}, {"beta": 1.0, "accumulate": True},
                  {"num_splits": 2, "splits": 2}, {"num_splits": 2, "splits": 4}, {}]
        fields = ("trans_a", "trans_w", "alpha", "beta", "bias", "gelu", "num_splits",
                  "a_scale_inv", "w_scale_inv")
        n_fast = 0
        for d in dicts:
            f = fast_options(d)
            try:
                o = parse_options("here", d)
            except E.TpflexError:
                o = None
            if f is None:
                continue
            n_fast += 1
            self.assertIsNotNone(o, f"{d}: fast_options accepts what parse_options refuses")
            self.assertIsNone(o.stream, d)
            for name, v in zip(fields, f):
                want = getattr(o, name)
                if isinstance(want, torch.Tensor) or want is None:
                    self.assertIs(v, want, f"{d}: {name}")
                else:  # the same value and type (repr tells -0.0 from 0.0)
                    self.assertEqual((type(v), repr(v)), (type(want), repr(want)),
                                     f"{d}: {name}")
        # the usual options take the fast way (the comparison above is not vacuous)
        for d in ({"trans_w": True, "bias": t}, {"beta": 1.0}, {"accumulate": True},
                  {"trans_a": True, "trans_w": True, "alpha": 2}, {"num_splits": 2},
                  {"a_scale_inv": t, "w_scale_inv": t}, {"stream": None, "gelu": True}):
            self.assertIsNotNone(fast_options(d), d)
        self.assertGreater(n_fast, 200)

    def test_a_repeated_call_is_one_c_call(self):
        """The second call of a signature calls the operation's C function once and queries
        only the shape epoch (the first took the full path: the active shape, a second epoch
        query); after a shape change the views are taken again once."""
        def body(P, r):
            g = torch.Generator().manual_seed(3)
            res = []
            for T in (16, 32, 16):
                tt.set_ub_active_shape([T, H])
                fill(P, r, T, g)
                for label, name, meth, args, opts in calls(T, P, r, g):
                    invoke(name, meth, args, opts)  # the full path, remembered
                    with counting_c_calls() as n:
                        invoke(name, meth, args, opts)
                    res.append((T, label, n))
            return res
        for T, label, n in self.run_ranks(1, body)[0]:
            ops_called = {k: v for k, v in n.items() if k in C_OPS}
            self.assertEqual(list(ops_called.values()), [1], f"T={T} {label}: {n}")
            self.assertEqual({k: v for k, v in n.items() if k in C_QUERIES},
                             {"tpf_comm_epoch": 1}, f"T={T} {label}: {n}")

    def test_fast_path_results_equal_the_full_path(self):
        """Bit for bit, every operation and option, P = 1, 2, 4, T changing: the remembered
        call (fast) against the first (the full path) and against the full path forced again
        (memo cleared)."""
        for P in (1, 2, 4):
            def body(P, r):
                bad = []
                for T in (16, 32, 16):
                    tt.set_ub_active_shape([T, H])
                    for label, name, meth, args, opts in calls(T, P, r, torch.Generator()
                                                               .manual_seed(T)):
                        fill(P, r, T, torch.Generator().manual_seed(T + 1))
                        c = tt.get_ub(name)
                        c._memo.clear()
                        full = invoke(name, meth, args, opts).clone()
                        after_full = c.buffer().clone()
                        fill(P, r, T, torch.Generator().manual_seed(T + 1))
                        n0 = len(c._memo)
                        fast = invoke(name, meth, args, opts).clone()
                        if n0 == 0 or len(c._memo) != n0:
                            bad.append((T, label, "not remembered"))
                        if not (same_bits(full, fast) and same_bits(after_full, c.buffer())):
                            bad.append((T, label))
                return bad
            for r, bad in enumerate(self.run_ranks(P, body)):
                self.assertEqual(bad, [], f"P={P} rank {r}")

    def test_errors_after_a_remembered_signature(self):
        """Every bad input still raises its error, with the message the full path gives on a
        communicator that has remembered nothing (the signatures that passed are remembered,
        the others are checked every time)."""
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            ag, rs, bk = tt.get_ub("fc1_fprop"), tt.get_ub("fc2_fprop"), tt.get_ub("fc1_dgrad")
            w, out, x, wr = torch.ones(8, H), torch.empty(16, 8), torch.ones(16, 16), \
                torch.ones(H, 16)
            a, b = torch.ones(8, 16), torch.ones(24, 16)
            bad_calls = [
                ("weight columns", lambda: ag.ag_gemm(torch.ones(8, 12), out=out)),
                ("weight dtype", lambda: ag.ag_gemm(w.double(), out=out)),
                ("weight transposed view", lambda: ag.ag_gemm(torch.ones(H, 8).t(), out=out)),
                ("out rows", lambda: ag.ag_gemm(w, out=torch.empty(32, 8))),
                ("out dtype", lambda: ag.ag_gemm(w, out=out.half())),
                ("bias dtype", lambda: ag.ag_gemm(w, out=out, bias=torch.ones(8).double())),
                ("bias length", lambda: ag.ag_gemm(w, out=out, bias=torch.ones(7))),
                ("beta without out", lambda: ag.ag_gemm(w, beta=1.0)),
                ("trans_a on ag", lambda: ag.ag_gemm(w, out=out, trans_a=True)),
                ("bad option", lambda: ag.ag_gemm(w, out=out, transb=True)),
                ("alpha nan", lambda: ag.ag_gemm(w, out=out, alpha=float("nan"))),
                ("weight not a tensor", lambda: ag.ag_gemm([[1.0]], out=out)),
                ("weight None", lambda: ag.ag_gemm(None, out=out)),
                ("out not a tensor", lambda: ag.ag_gemm(w, out=3)),
                ("x rows", lambda: rs.gemm_rs(torch.ones(8, 16), wr)),
                ("x weight dtypes", lambda: rs.gemm_rs(x, wr.double())),
                ("rs out shape", lambda: rs.gemm_rs(x, wr, out=torch.empty(16, H))),
                ("rs scale on fp32", lambda: rs.gemm_rs(x, wr, a_scale_inv=torch.ones(1))),
                ("b columns", lambda: bk.bulk_overlap(a, torch.ones(24, 12))),
                ("b dtype", lambda: bk.bulk_overlap(a, b.half())),
                ("bulk out shape", lambda: bk.bulk_overlap(a, b, out=torch.empty(8, 23))),
                ("C status: splits", lambda: rs.gemm_rs(x, wr, num_splits=3)),
            ]
            good = [lambda: ag.ag_gemm(w, out=out), lambda: ag.ag_gemm(w),
                    lambda: ag.ag_gemm(w, out=out, bias=torch.ones(8)),
                    lambda: rs.gemm_rs(x, wr), lambda: rs.gemm_rs(x, wr, out=torch.empty(8, H)),
                    lambda: bk.bulk_overlap(a, b), lambda: bk.bulk_overlap(a, b,
                                                                          out=torch.empty(8, 24))]

            def errors():
                res = []
                for label, fn in bad_calls:
                    try:
                        fn()
                        res.append((label, "no error"))
                    except E.TpflexError as e:
                        tb, names = e.__traceback__, []
                        while tb is not None:
                            names.append(tb.tb_frame.f_code.co_name)
                            tb = tb.tb_next
                        res.append((label, type(e).__name__, str(e), names[1:]))
                return res
            for c in (ag, rs, bk):
                c._memo.clear()
            fresh = errors()
            for fn in good:
                fn()
                fn()
            self.assertTrue(all(len(c._memo) for c in (ag, rs, bk)))
            remembered = errors()
            # after a shape change, the remembered signatures of T = 16 do not fit T = 32
            tt.set_ub_active_shape([32, H])
            try:
                ag.ag_gemm(w, out=out)
                stale = "no error"
            except E.TpflexShapeError as e:
                stale = str(e)
            return fresh, remembered, stale
        fresh, remembered, stale = self.run_ranks(2, body)[0]
        self.assertEqual(remembered, fresh)
        for label, *rest in fresh:
            self.assertNotEqual(rest, ["no error"], label)
            # raised from the method's own frame: nothing below it (views) in the traceback
            self.assertEqual(rest[2][1:], [rest[2][1]], f"{label}: {rest}")
            self.assertIn(rest[2][1], ("ag_gemm", "gemm_rs", "bulk_overlap"), label)
        got = dict((label, rest[:2]) for label, *rest in fresh)
        self.assertEqual(got["weight columns"][0], "TpflexShapeError")
        self.assertIn("weight has shape [8, 12], expected [8, 32]", got["weight columns"][1])
        self.assertEqual(got["C status: splits"][0], "TpflexDivisibleError")
        self.assertIn("num_splits 3", got["C status: splits"][1])
        self.assertIn("out has shape [16, 8], expected [32, 8]", stale)

    def test_a_c_status_on_the_fast_path(self):
        """A signature remembered with the communicator's split count, then num_splits=3 (not
        part of the checked signature): the C library refuses it on the fast path, raised as
        its class from the method's frame; the next good call still works."""
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            rs = tt.get_ub("fc2_fprop")
            x, wr = torch.ones(16, 16), torch.ones(H, 16)
            rs.gemm_rs(x, wr, num_splits=0)
            rs.gemm_rs(x, wr, num_splits=0)
            with counting_c_calls() as n:
                try:
                    rs.gemm_rs(x, wr, num_splits=3)
                    res = "no error"
                except E.TpflexDivisibleError as e:
                    tb, depth = e.__traceback__, 0
                    while tb is not None:
                        depth, tb = depth + 1, tb.tb_next
                    res = (str(e), depth)
            y = rs.gemm_rs(x, wr)
            return res, n, torch.equal(y, torch.full((16 // P, H), 16.0 * P))
        (msg, depth), n, ok = self.run_ranks(1, body)[0]
        self.assertIn("num_splits 3", msg)
        self.assertEqual(depth, 2)  # this frame and gemm_rs's
        self.assertEqual(n, {"tpf_comm_epoch": 1, "tpf_gemm_rs_ex": 1})  # the fast path did it
        self.assertTrue(ok)

    def test_parameters_go_direct(self):
        """A layer's weight is an nn.Parameter: with grad off (as in an autograd.Function's
        forward) it takes the direct path, with grad on the op (whose backward raises)."""
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            ag = tt.get_ub("fc1_fprop")
            ag.local_chunk().fill_(1.0)
            w = torch.nn.Parameter(torch.ones(4, H))
            with torch.no_grad(), Counting() as c:
                y1 = ag.ag_gemm(w)
                y2 = ag.ag_gemm(w)
                n_nograd = c.total()
            with Counting() as c:
                y3 = ag.ag_gemm(w)
                n_grad = c.total()
            return n_nograd, n_grad, torch.equal(y1, y2) and torch.equal(y1, y3.detach())
        n_nograd, n_grad, same = self.run_ranks(1, body)[0]
        self.assertEqual((n_nograd, n_grad), (0, 1))
        self.assertTrue(same)

    def test_bindings_are_still_checked(self):
        """A communicator (whose signature is remembered) used from another simulator rank's
        thread is refused as the op refuses it, naming the calling rank; after destroy_ub it is
        refused as destroyed."""
        comms = {}

        def setup(rank):
            tt.initialize_ub([64, H], 2, dtype=torch.float32, backend="sim")
            tt.set_ub_active_shape([16, H])
            c = tt.get_ub("fc1_dgrad")
            c.bulk_overlap(torch.ones(8, 16), torch.ones(24, 16))
            c.bulk_overlap(torch.ones(8, 16), torch.ones(24, 16))
            comms[rank] = c
            return len(c._memo)

        def cross(rank):
            try:
                comms[1 - rank].bulk_overlap(torch.ones(8, 16), torch.ones(24, 16))
                return "no error"
            except E.TpflexStateError as e:
                return str(e)

        def teardown(rank):
            tt.destroy_ub()
            try:
                comms[rank].bulk_overlap(torch.ones(8, 16), torch.ones(24, 16))
                return "no error"
            except E.TpflexStateError as e:
                return str(e)
        with sim.World(2, timeout_ms=2000) as w:
            self.assertEqual(w.run(setup), [1, 1])
            for r, msg in enumerate(w.run(cross)):
                self.assertIn(f"no communicator 'fc1_dgrad' with key {comms[1 - r].key} on "
                              f"simulator rank {r}", msg)
            for msg in w.run(teardown):
                self.assertIn("used after destroy_ub()", msg)
        with self.assertRaisesRegex(E.TpflexStateError, "used after destroy_ub"):
            comms[0].bulk_overlap(torch.ones(8, 16), torch.ones(24, 16))


if __name__ == "__main__":
    unittest.main()
