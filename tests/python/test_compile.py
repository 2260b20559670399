"""The operations as torch.library custom ops (torch.ops.tpflex.*) on the simulator: the schemas,
torch.library.opcheck, the fake implementations (no C call), torch.compile(fullgraph=True) with
the "eager" and "aot_eager" backends against eager results (also through an autograd.Function),
and the communicator key's resolution. "inductor" runs only with TPFLEX_TEST_INDUCTOR=1 (its C++
compilation takes tens of seconds on a cold cache). unittest style."""
import contextlib
import os
import sys
import threading
import unittest
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

import tpflex._lib as L  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402

C, H = 64, 32
RING_RS = {"ring_rs": {"method": "ring", "coll": "rs"}}
F32 = torch.float32
OPS = [getattr(torch.ops.tpflex, n).default for n in tt.OP_NAMES]
C_OPS = ("tpf_ag_gemm", "tpf_ag_gemm_ex", "tpf_gemm_rs", "tpf_gemm_rs_ex", "tpf_bulk_overlap",
         "tpf_bulk_overlap_ex")
C_QUERIES = ("tpf_comm_active_shape", "tpf_comm_epoch", "tpf_comm_buffer",
             "tpf_comm_local_chunk", "tpf_comm_registration")


@contextlib.contextmanager
def counting_c_calls(names=C_OPS + C_QUERIES):
    """Counts calls of the C entry points `names` per calling thread."""
    counts = {}
    saved = {n: getattr(L.lib, n) for n in names}

    def wrap(n, f):
        def g(*a):
            k = (threading.get_ident(), n)
            counts[k] = counts.get(k, 0) + 1
            return f(*a)
        return g
    for n, f in saved.items():
        setattr(L.lib, n, wrap(n, f))
    try:
        yield counts
    finally:
        for n, f in saved.items():
            setattr(L.lib, n, f)


def mine(counts, names=C_OPS):
    me = threading.get_ident()
    return sum(v for (t, n), v in counts.items() if t == me and n in names)


def run(P, fn, *args, timeout_ms=60000):
    """fn(rank, *args) on P ranks with a fp32 registration (TE's sites + a RING RS one)."""
    def body(rank):
        tt.initialize_ub([C, H], P, dtype=F32, ub_cfgs=RING_RS)
        try:
            return fn(rank, *args)
        finally:
            tt.destroy_ub()
    return sim.run(P, body, timeout_ms=timeout_ms)


def op_cases(rank, P, T=16):
    """(label, op, args) for each op with a few option combinations, at active shape [T, H]."""
    tt.set_ub_active_shape([T, H])
    g = torch.Generator().manual_seed(100 + rank)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    fp, rs, ring = tt.get_ub("fc1_fprop"), tt.get_ub("fc2_fprop"), tt.get_ub("ring_rs")
    dg, wg = tt.get_ub("fc1_dgrad"), tt.get_ub("fc1_wgrad")
    fp.local_chunk().copy_(rnd(T // P, H))
    dg.local_chunk().copy_(rnd(T // P, H))
    wg.buffer().copy_(rnd(T, H))
    o = torch.ops.tpflex
    key = lambda c: (c.name, c.key)  # noqa: E731
    return [
        ("ag_gemm", o.ag_gemm, (*key(fp), fp.buffer(), rnd(8, H), None, False, 1.0, False, 0,
                                None)),
        ("ag_gemm trans_w bias gelu", o.ag_gemm, (*key(fp), fp.buffer(), rnd(H, 8), rnd(8), True,
                                                  -0.5, True, 0, None)),
        ("ag_gemm_out beta", o.ag_gemm_out, (*key(fp), fp.buffer(), rnd(8, H), rnd(T, 8), None,
                                             False, 2.0, 0.5, False, P, None)),
        ("gemm_rs", o.gemm_rs, (*key(rs), P, rs.buffer(), rnd(T, 16), rnd(H, 16), None, False,
                                False, 1.0, False, 0, None)),
        ("gemm_rs_out ring trans_a trans_w beta bias", o.gemm_rs_out,
         (*key(ring), P, ring.buffer(), rnd(16, T), rnd(16, H), rnd(T // P, H), rnd(H), True,
          True, 1.0, 1.0, False, 0, None)),
        ("bulk_overlap ag", o.bulk_overlap, (*key(dg), dg.buffer(), rnd(8, 16), rnd(24, 16),
                                             None, False, False, 1.0, False, 0, None)),
        ("bulk_overlap_out rs wgrad", o.bulk_overlap_out,
         (*key(wg), wg.buffer(), rnd(T, 24), rnd(T, H), rnd(24, H), None, True, True, 1.0, 1.0,
          False, 0, None)),
    ]


def failures(report):
    return {k: repr(v)[:300] for k, v in report.items() if v != "SUCCESS"}


class Registered(unittest.TestCase):
    def test_ops_and_schemas(self):
        """Six ops: the functional ones return a tensor, the _out ones nothing; `buffer` is
        mutated by all, `out` by the _out ones, nothing else is."""
        self.assertEqual(len(OPS), 6)
        for name, op in zip(tt.OP_NAMES, OPS):
            s = op._schema
            mutated = {a.name for a in s.arguments
                       if a.alias_info is not None and a.alias_info.is_write}
            want = {"buffer", "out"} if name.endswith("_out") else {"buffer"}
            self.assertEqual(mutated, want, str(s))
            self.assertEqual(len(s.returns), 0 if name.endswith("_out") else 1, str(s))
            self.assertEqual([a.name for a in s.arguments[:2]], ["comm", "key"], str(s))
            # the fp8 scales (SPEC §11): optional tensors, last, default None
            tail = s.arguments[-2:]
            self.assertEqual([a.name for a in tail], ["a_scale_inv", "w_scale_inv"], str(s))
            for a in tail:
                self.assertEqual(str(a.type), "Optional[Tensor]", str(s))
                self.assertIsNone(a.default_value, str(s))
                self.assertTrue(a.has_default_value(), str(s))

    def test_methods_call_the_ops(self):
        seen = []

        class Mode(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in OPS:
                    seen.append(func.name())
                return func(*args, **(kwargs or {}))

        def f(rank):
            cases = op_cases(rank, 1)
            with Mode():
                tt.get_ub("fc1_fprop").ag_gemm(cases[0][2][3], gelu=True)
                tt.get_ub("fc2_fprop").gemm_rs(cases[3][2][4], cases[3][2][5],
                                               out=torch.empty(16, H), beta=0.0)
                tt.get_ub("fc1_dgrad").bulk_overlap(cases[5][2][3], cases[5][2][4])
        run(1, f)
        self.assertEqual(seen, ["tpflex::ag_gemm", "tpflex::gemm_rs_out", "tpflex::bulk_overlap"])


class OpCheck(unittest.TestCase):
    def test_opcheck_every_test_p1(self):
        """opcheck's default tests (schema, autograd registration, fake tensor, AOT dispatch
        with dynamic shapes) on one rank: its AOT tracing is not thread-safe, so it cannot run
        on several simulator ranks (threads) at once. No input requires grad here (the AOT
        test would need a backward), so the autograd registration test is done below."""
        def f(rank):
            return [(label, failures(torch.library.opcheck(op, args, raise_exception=False)))
                    for label, op, args in op_cases(rank, 1)]
        for label, bad in run(1, f)[0]:
            self.assertEqual(bad, {}, label)

    def test_opcheck_autograd_registration(self):
        """opcheck's autograd registration test with an input that requires grad (without one
        it checks nothing): the ops have custom_op's Autograd kernel (which raises on
        backward, test_no_autograd_formula); schema test with it too."""
        utils = ("test_schema", "test_autograd_registration")

        def f(rank):
            res = []
            for label, op, args in op_cases(rank, 1):
                tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
                i = tensors[1]  # the first operand after the buffer
                args = args[:i] + (args[i].detach().requires_grad_(),) + args[i + 1:]
                res.append((label, failures(torch.library.opcheck(op, args, test_utils=utils,
                                                                  raise_exception=False))))
            return res
        for label, bad in run(1, f)[0]:
            self.assertEqual(bad, {}, label)

    def test_opcheck_collective_p2(self):
        """The thread-safe subset (schema, autograd registration, fake tensor) with real
        collectives on two ranks; torch.compile below covers AOT dispatch with P = 2."""
        utils = ("test_schema", "test_autograd_registration", "test_faketensor")

        def f(rank):
            return [(label, failures(torch.library.opcheck(op, args, test_utils=utils,
                                                           raise_exception=False)))
                    for label, op, args in op_cases(rank, 2)]
        for r, res in enumerate(run(2, f)):
            for label, bad in res:
                self.assertEqual(bad, {}, f"rank {r}: {label}")


class Fake(unittest.TestCase):
    def test_fake_shapes_without_the_library(self):
        """Under FakeTensorMode, outside any simulator rank and with a key no communicator has:
        the fake implementations give shape, dtype and device and call no C operation and no
        communicator (only the pure operand rulebook, tpf_check_operands, for their checks)."""
        o = torch.ops.tpflex
        bf = torch.bfloat16
        with counting_c_calls() as counts, FakeTensorMode():
            buf = torch.empty(48, H, dtype=bf)
            y = o.ag_gemm("nope", 12345, buf, torch.empty(24, H, dtype=bf), None, False, 1.0,
                          False, 0, None)
            self.assertIsInstance(y, FakeTensor)
            self.assertEqual((tuple(y.shape), y.dtype, y.device.type), ((48, 24), bf, "cpu"))
            y = o.ag_gemm("nope", 1, buf, torch.empty(H, 8, dtype=bf), torch.empty(8, dtype=bf),
                          True, 1.0, True, 0, None)
            self.assertEqual(tuple(y.shape), (48, 8))
            y = o.gemm_rs("nope", 1, 4, buf, torch.empty(48, 16, dtype=bf),
                          torch.empty(H, 16, dtype=bf), None, False, False, 1.0, False, 0, None)
            self.assertEqual((tuple(y.shape), y.dtype), ((12, H), bf))
            y = o.gemm_rs("nope", 1, 2, buf, torch.empty(16, 48, dtype=bf),
                          torch.empty(16, H, dtype=bf), None, True, True, 1.0, False, 0, None)
            self.assertEqual(tuple(y.shape), (24, H))
            y = o.bulk_overlap("nope", 1, buf, torch.empty(16, 8, dtype=bf),
                               torch.empty(16, 24, dtype=bf), None, True, True, 1.0, False, 0,
                               None)
            self.assertEqual((tuple(y.shape), y.dtype), ((8, 24), bf))
            out = torch.empty(48, 24, dtype=F32)
            self.assertIsNone(o.ag_gemm_out("nope", 1, buf, torch.empty(24, H, dtype=bf), out,
                                            None, False, 1.0, 1.0, False, 0, None))
            self.assertIsNone(o.gemm_rs_out("nope", 1, 2, buf, torch.empty(48, 16, dtype=bf),
                                            torch.empty(H, 16, dtype=bf),
                                            torch.empty(24, H, dtype=bf), None, False, False,
                                            1.0, 0.0, False, 0, None))
            self.assertIsNone(o.bulk_overlap_out("nope", 1, buf, torch.empty(8, 16, dtype=bf),
                                                 torch.empty(24, 16, dtype=bf), out[:8], None,
                                                 False, False, 1.0, 1.0, False, 0, None))
            # the same checks and messages as the real implementation
            with self.assertRaisesRegex(E.TpflexShapeError, r"weight has shape \[24, 12\], "
                                        r"expected \[24, 32\]"):
                o.ag_gemm("fc1_fprop", 1, buf, torch.empty(24, 12, dtype=bf), None, False, 1.0,
                          False, 0, None)
            with self.assertRaisesRegex(E.TpflexShapeError, r"out has shape \[48, 8\], "
                                        r"expected \[48, 24\]"):
                o.ag_gemm_out("fc1_fprop", 1, buf, torch.empty(24, H, dtype=bf),
                              torch.empty(48, 8, dtype=bf), None, False, 1.0, 0.0, False, 0,
                              None)
            with self.assertRaisesRegex(E.TpflexInvalidError, "bias has dtype"):
                o.bulk_overlap("x", 1, buf, torch.empty(8, 16, dtype=bf),
                               torch.empty(24, 16, dtype=bf), torch.empty(24, dtype=F32), False,
                               False, 1.0, False, 0, None)
        self.assertEqual(counts, {})

    def test_tracing_calls_no_operation(self):
        """torch.compile traces (dynamo, then AOT's fake propagation) without running any C
        operation: counted when the backend is handed the graph, before it runs."""
        def f(rank):
            ub = tt.get_ub("fc1_fprop")
            tt.set_ub_active_shape([16, H])
            at_backend = []

            def backend(gm, example_inputs):
                compiled = torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)
                at_backend.append(mine(counts))
                return compiled

            def fn(x, w):
                ub.local_chunk().copy_(x)
                return ub.ag_gemm(w)
            with counting_c_calls() as counts:
                torch.compile(fn, backend=backend, fullgraph=True)(torch.ones(8, H),
                                                                  torch.ones(4, H))
                return at_backend, mine(counts)
        torch._dynamo.reset()
        for r, (at_backend, after) in enumerate(run(2, f)):
            self.assertEqual(at_backend, [0], f"rank {r}")
            self.assertEqual(after, 1, f"rank {r}: the compiled call runs the operation once")


# ---- torch.compile ----------------------------------------------------------------------------

def step(fp, rs, ring, dg, wg, x_local, w, b, x2, w2, a, bb, acc):
    """One function with every operation (and options) and reads of the buffers after them."""
    fp.local_chunk().copy_(x_local)
    y = fp.ag_gemm(w, bias=b, gelu=True)
    z = rs.gemm_rs(x2, w2, alpha=0.5)
    z2 = ring.gemm_rs(x2.t().contiguous(), w2.t().contiguous(), trans_a=True, trans_w=True)
    dg.local_chunk().copy_(x_local)
    u = dg.bulk_overlap(a, bb, trans_w=True)
    wg.buffer().copy_(fp.buffer() * 2)
    wg.bulk_overlap(a, bb, out=acc, beta=1.0, trans_w=True)
    return y, z, z2, u, fp.buffer() + 0, dg.buffer() + 0, wg.local_chunk() + 0


def compile_vs_eager(rank, P, backend, Ts):
    g = torch.Generator().manual_seed(7 + rank)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    ubs = [tt.get_ub(n) for n in ("fc1_fprop", "fc2_fprop", "ring_rs", "fc1_dgrad", "fc1_wgrad")]
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    fails = []
    for T in Ts:
        tt.set_ub_active_shape([T, H])
        args = (rnd(T // P, H), rnd(24, H), rnd(24), rnd(T, 16), rnd(H, 16), rnd(8, 16),
                rnd(16, 24))
        acc0 = rnd(8, 24)
        acc_e, acc_c = acc0.clone(), acc0.clone()
        want = step(*ubs, *args, acc_e) + (acc_e,)
        got = compiled(*ubs, *args, acc_c) + (acc_c,)
        for i, (e, c) in enumerate(zip(want, got)):
            if e.shape != c.shape or not torch.equal(e, c):
                fails.append((T, i, tuple(e.shape), tuple(c.shape)))
    return fails


class Compile(unittest.TestCase):
    P = 2
    Ts = (16, 32, 48)

    def _backend(self, backend):
        torch._dynamo.reset()
        c = torch._dynamo.utils.counters["stats"]
        before = c["unique_graphs"]
        res = run(self.P, compile_vs_eager, self.P, backend, self.Ts)
        for r, fails in enumerate(res):
            self.assertEqual(fails, [], f"{backend} rank {r}")
        # per rank: one graph for the first T, one with T dynamic for the others
        self.assertLessEqual(c["unique_graphs"] - before, 2 * self.P, backend)

    def test_eager_backend(self):
        self._backend("eager")

    def test_aot_eager_backend(self):
        self._backend("aot_eager")

    def test_errors_under_compile(self):
        """A C status at run time is raised as its class; a check that fails while tracing
        (the fake implementation) surfaces as dynamo's TorchRuntimeError carrying the tpflex
        exception's text."""
        def f(rank):
            tt.set_ub_active_shape([16, H])
            rs = tt.get_ub("fc2_fprop")
            out = []
            for kw, w in (({"num_splits": 3}, torch.ones(H, 16)), ({}, torch.ones(H, 12))):
                torch._dynamo.reset()
                fn = torch.compile(lambda x, w: rs.gemm_rs(x, w, **kw), backend="aot_eager",
                                   fullgraph=True)
                try:
                    fn(torch.ones(16, 16), w)
                    out.append(None)
                except Exception as e:  # noqa: BLE001 - the class is what is checked
                    out.append((type(e).__name__, str(e)))
            return out
        (c_cls, c_text), (t_cls, t_text) = run(1, f)[0]
        self.assertEqual(c_cls, "TpflexDivisibleError")
        self.assertIn("num_splits 3", c_text)
        self.assertEqual(t_cls, "TorchRuntimeError")
        self.assertIn("TpflexShapeError", t_text)
        self.assertIn("weight has shape [32, 12], expected [32, 16]", t_text)

    @unittest.skipUnless(os.environ.get("TPFLEX_TEST_INDUCTOR") == "1",
                         "set TPFLEX_TEST_INDUCTOR=1 (needs a C++ compiler; slow on a cold cache)")
    def test_inductor_backend(self):
        self._backend("inductor")

    def test_autograd_function_aot_eager(self):
        """A column-parallel linear as an autograd.Function (the example's pattern): forward
        RING AG+GEMM, backward BULK AG beside the dgrad GEMM then BULK RS beside the wgrad GEMM
        accumulated with beta=1, compiled with aot_eager: outputs and gradients as eager."""
        def f(rank, P):
            fp, dg, wg = tt.get_ub("fc1_fprop"), tt.get_ub("fc1_dgrad"), tt.get_ub("fc1_wgrad")

            class Linear(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x_local, w, main_grad):
                    fp.local_chunk().copy_(x_local)
                    ctx.save_for_backward(x_local, w)
                    ctx.main_grad = main_grad
                    return fp.ag_gemm(w)

                @staticmethod
                def backward(ctx, dy):
                    x_local, w = ctx.saved_tensors
                    dg.local_chunk().copy_(x_local)
                    dg.bulk_overlap(dy, w, out=wg.buffer(), trans_w=True)
                    wg.bulk_overlap(dy, dg.buffer(), out=ctx.main_grad, trans_a=True,
                                    trans_w=True, beta=1.0)
                    return wg.local_chunk().clone(), None, None

            def loss(x, w, mg):
                return (Linear.apply(x, w, mg) ** 2).sum()

            g = torch.Generator().manual_seed(rank)
            compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
            fails = []
            for T in (16, 32):
                tt.set_ub_active_shape([T, H])
                x, w = torch.randn(T // P, H, generator=g), torch.randn(24, H, generator=g)
                res = []
                for fn in (loss, compiled):
                    xr, mg = x.clone().requires_grad_(), torch.ones(24, H)
                    v = fn(xr, w, mg)
                    v.backward()
                    res.append((v.detach(), xr.grad, mg))
                for i, (e, c) in enumerate(zip(*res)):
                    if not torch.allclose(e, c, rtol=1e-5, atol=1e-4):
                        fails.append((T, i))
            return fails
        torch._dynamo.reset()
        for r, fails in enumerate(run(2, f, 2)):
            self.assertEqual(fails, [], f"rank {r}")


class Keys(unittest.TestCase):
    def test_key_resolves_only_on_its_rank(self):
        """A key is resolved in the calling thread's binding: rank 1 cannot reach rank 0's
        communicator (nothing collective is entered), nor can a thread outside the simulator;
        after destroy_ub the key names a destroyed communicator."""
        keys = {}

        def setup(rank):
            tt.initialize_ub([C, H], 2, dtype=F32)
            tt.set_ub_active_shape([16, H])
            ub = tt.get_ub("fc1_fprop")
            keys[rank] = ub
            return ub.key

        def cross(rank):
            other = keys[1 - rank]
            try:
                torch.ops.tpflex.ag_gemm(other.name, other.key, keys[rank].buffer(),
                                         torch.ones(4, H), None, False, 1.0, False, 0, None)
            except E.TpflexStateError as e:
                return str(e)
            return "no error"

        def teardown(rank):
            tt.destroy_ub()
            try:
                keys[rank].ag_gemm(torch.ones(4, H))
            except E.TpflexStateError as e:
                return str(e)

        with sim.World(2, timeout_ms=2000) as w:
            k = w.run(setup)
            self.assertNotEqual(k[0], k[1])
            for r, msg in enumerate(w.run(cross)):
                self.assertIn("no communicator 'fc1_fprop'", msg, f"rank {r}")
                self.assertIn(f"simulator rank {r}", msg, f"rank {r}")
            with self.assertRaisesRegex(E.TpflexStateError, "this process"):
                torch.ops.tpflex.ag_gemm("fc1_fprop", k[0], torch.empty(16, H),
                                         torch.ones(4, H), None, False, 1.0, False, 0, None)
            for msg in w.run(teardown):
                self.assertIn("used after destroy_ub()", msg)

    def test_buffer_argument_value_semantics(self):
        """The ops treat `buffer` as the registration's value: a copy (what functionalisation
        passes) is copied in before the C call and receives the result; a view from an older
        shape epoch is refused."""
        def f(rank):
            P = 2
            tt.set_ub_active_shape([8, H])
            ub = tt.get_ub("fc1_fprop")
            stale = ub.buffer()
            tt.set_ub_active_shape([16, H])
            try:
                torch.ops.tpflex.ag_gemm(ub.name, ub.key, stale, torch.ones(4, H), None, False,
                                         1.0, False, 0, None)
                stale_msg = "no error"
            except E.TpflexStateError as e:
                stale_msg = str(e)
            copy = torch.zeros(16, H)
            copy[rank * 8:(rank + 1) * 8] = rank + 1  # this rank's chunk, in the copy only
            ub.buffer().fill_(-1)
            w = torch.eye(H)[:4]
            y = torch.ops.tpflex.ag_gemm(ub.name, ub.key, copy, w, None, False, 1.0, False, 0,
                                         None)
            want = torch.cat([torch.full((16 // P, H), q + 1.0) for q in range(P)])
            return (stale_msg, torch.equal(copy, want), torch.equal(ub.buffer(), want),
                    torch.equal(y, want[:, :4]))
        for r, (stale_msg, copy_ok, reg_ok, y_ok) in enumerate(run(2, f)):
            self.assertIn("take buffer() again", stale_msg, f"rank {r}")
            self.assertTrue(copy_ok and reg_ok and y_ok, f"rank {r}")

    def test_no_autograd_formula(self):
        """The ops have no backward of their own: an input that requires grad gives an output
        whose backward raises (wrap them in an autograd.Function, as the example does)."""
        def f(rank):
            tt.set_ub_active_shape([16, H])
            w = torch.ones(4, H, requires_grad=True)
            y = tt.get_ub("fc1_fprop").ag_gemm(w)
            try:
                y.sum().backward()
            except RuntimeError as e:
                return str(e)
        self.assertIn("no autograd formula", run(1, f)[0])



# ---- fp8 operands with their scales through the ops (SPEC §11) ---------------------------------

E4, E5, BF = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
FP8_CFGS = {"ring_rs": {"method": "ring", "coll": "rs"}}


def fp8(shape, dtype, g):
    """Values in [-1, 1) rounded to `dtype`."""
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def run_fp8(P, fn, *args):
    """fn(rank, *args) on P ranks with TE's sites in fp8 (use_fp8: fc1_fprop / qkv_dgrad e4m3,
    proj_dgrad e5m2; the RS sites bf16)."""
    def body(rank):
        tt.initialize_ub([C, H], P, use_fp8=True, ub_cfgs=FP8_CFGS)
        try:
            return fn(rank, *args)
        finally:
            tt.destroy_ub()
    return sim.run(P, body, timeout_ms=60000)


def fp8_cases(rank, P, T=16):
    """(label, op, args) of each op with fp8 operands and both scales, at [T, H]."""
    tt.set_ub_active_shape([T, H])
    g = torch.Generator().manual_seed(200 + rank)
    fp, pd = tt.get_ub("fc1_fprop"), tt.get_ub("proj_dgrad")
    rs, ring, dg = tt.get_ub("fc2_fprop"), tt.get_ub("ring_rs"), tt.get_ub("qkv_dgrad")
    fp.local_chunk().copy_(fp8((T // P, H), E4, g))
    pd.local_chunk().copy_(fp8((T // P, H), E5, g))
    dg.local_chunk().copy_(fp8((T // P, H), E4, g))
    sa, sw = torch.tensor([0.75]), torch.tensor([2.0])
    o = torch.ops.tpflex
    key = lambda c: (c.name, c.key)  # noqa: E731
    return [
        ("ag_gemm e4m3 x e4m3", o.ag_gemm, (*key(fp), fp.buffer(), fp8((8, H), E4, g), None,
                                            False, 1.0, False, 0, None, sa, sw)),
        ("ag_gemm e5m2 x e4m3 trans_w bias", o.ag_gemm,
         (*key(pd), pd.buffer(), fp8((H, 8), E4, g), torch.randn(8, generator=g).to(BF), True,
          1.0, False, 0, None, sa, sw)),
        ("ag_gemm_out fp32", o.ag_gemm_out, (*key(fp), fp.buffer(), fp8((8, H), E5, g),
                                             torch.randn(T, 8, generator=g), None, False, 1.0,
                                             0.5, False, 0, None, sa, sw)),
        ("gemm_rs fp8 partials", o.gemm_rs, (*key(rs), P, rs.buffer(), fp8((T, 16), E4, g),
                                             fp8((H, 16), E5, g), None, False, False, 1.0, False,
                                             0, None, sa, sw)),
        ("gemm_rs_out ring fp32", o.gemm_rs_out,
         (*key(ring), P, ring.buffer(), fp8((T, 16), E4, g), fp8((H, 16), E4, g),
          torch.zeros(T // P, H), None, False, False, 1.0, 0.0, False, 0, None, sa, sw)),
        ("bulk_overlap fp8 ag", o.bulk_overlap, (*key(dg), dg.buffer(), fp8((8, 16), E5, g),
                                                 fp8((24, 16), E4, g), None, False, False, 1.0,
                                                 False, 0, None, sa, sw)),
        ("bulk_overlap_out", o.bulk_overlap_out,
         (*key(dg), dg.buffer(), fp8((8, 16), E4, g), fp8((24, 16), E4, g),
          torch.zeros(8, 24, dtype=torch.float16), None, False, False, 1.0, 0.0, False, 0, None,
          sa, sw)),
    ]


def fp8_step(fp, rs, dg, x_local, w, x2, w2, a, b, sa, sw, acc):
    """Every operation with fp8 operands and scales, through the methods."""
    fp.local_chunk().copy_(x_local)
    y = fp.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw)
    y32 = fp.ag_gemm(w, out=torch.zeros(y.shape[0], w.shape[0]), a_scale_inv=sa, w_scale_inv=sw)
    z = rs.gemm_rs(x2, w2, a_scale_inv=sa, w_scale_inv=sw)
    dg.local_chunk().copy_(x_local)
    u = dg.bulk_overlap(a, b, a_scale_inv=sa, w_scale_inv=sw)
    dg.bulk_overlap(a, b, out=acc, beta=1.0, a_scale_inv=sa, w_scale_inv=sw)
    return y, y32, z, u, fp.buffer().view(torch.uint8) + 0, dg.buffer().view(torch.uint8) + 0


def fp8_compile_vs_eager(rank, P, backend, Ts):
    g = torch.Generator().manual_seed(17 + rank)
    ubs = [tt.get_ub(n) for n in ("fc1_fprop", "fc2_fprop", "qkv_dgrad")]
    compiled = torch.compile(fp8_step, backend=backend, fullgraph=True)
    fails = []
    for T in Ts:
        tt.set_ub_active_shape([T, H])
        args = (fp8((T // P, H), E4, g), fp8((24, H), E5, g), fp8((T, 16), E4, g),
                fp8((H, 16), E4, g), fp8((8, 16), E4, g), fp8((24, 16), E5, g),
                torch.tensor([0.75]), torch.tensor([2.0]))
        acc0 = torch.randn(8, 24, generator=g)
        acc_e, acc_c = acc0.clone(), acc0.clone()
        want = fp8_step(*ubs, *args, acc_e) + (acc_e,)
        got = compiled(*ubs, *args, acc_c) + (acc_c,)
        for i, (e, c) in enumerate(zip(want, got)):
            if e.dtype != c.dtype or e.shape != c.shape or not torch.equal(e, c):
                fails.append((T, i, e.dtype, c.dtype, tuple(e.shape), tuple(c.shape)))
        if want[0].dtype != BF or want[1].dtype != F32 or want[2].dtype != BF:
            fails.append((T, "dtypes", want[0].dtype, want[1].dtype, want[2].dtype))
    return fails


class Fp8Ops(unittest.TestCase):
    """The scales are optional tensor arguments of every op: opcheck, the fake implementations
    (their checks name the tensor), and torch.compile of fp8 operations against eager, bit for
    bit (before, the ops refused scales: TpflexUnsupportedError)."""

    # opcheck's test_schema compares every tensor argument before and after the op with
    # torch.allclose, which torch does not implement for fp8 on the CPU ("mul_cpu_reduced_float"
    # not implemented for 'Float8_e4m3fn'): it runs on the fp32 cases (OpCheck above, the same
    # schemas), the other tests here.
    FP8_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")

    def test_opcheck_fp8_p1(self):
        def f(rank):
            return [(label, failures(torch.library.opcheck(op, args, test_utils=self.FP8_UTILS,
                                                           raise_exception=False)))
                    for label, op, args in fp8_cases(rank, 1)]
        for label, bad in run_fp8(1, f)[0]:
            self.assertEqual(bad, {}, label)

    def test_opcheck_fp8_collective_p2(self):
        utils = ("test_autograd_registration", "test_faketensor")

        def f(rank):
            return [(label, failures(torch.library.opcheck(op, args, test_utils=utils,
                                                           raise_exception=False)))
                    for label, op, args in fp8_cases(rank, 2)]
        for r, res in enumerate(run_fp8(2, f)):
            for label, bad in res:
                self.assertEqual(bad, {}, f"rank {r}: {label}")

    def test_fake_fp8_shapes_dtypes_and_scale_checks(self):
        """Under FakeTensorMode with no communicator: an fp8 GEMM's output is bf16 (ag_gemm,
        bulk_overlap) or the buffer's dtype (gemm_rs); a scale of the wrong dtype, shape or a
        missing one is refused naming the tensor, as in eager; no C call."""
        o = torch.ops.tpflex
        with counting_c_calls() as counts, FakeTensorMode():
            buf8, buf16 = torch.empty(48, H, dtype=E4), torch.empty(48, H, dtype=BF)
            sa, sw = torch.empty(1), torch.empty(1)
            y = o.ag_gemm("nope", 1, buf8, torch.empty(24, H, dtype=E5), None, False, 1.0, False,
                          0, None, sa, sw)
            self.assertEqual((tuple(y.shape), y.dtype), ((48, 24), BF))
            y = o.gemm_rs("nope", 1, 4, buf16, torch.empty(48, 16, dtype=E4),
                          torch.empty(H, 16, dtype=E4), None, False, False, 1.0, False, 0, None,
                          sa, sw)
            self.assertEqual((tuple(y.shape), y.dtype), ((12, H), BF))
            y = o.bulk_overlap("nope", 1, buf8, torch.empty(8, 16, dtype=E4),
                               torch.empty(24, 16, dtype=E4), None, False, False, 1.0, False, 0,
                               None, sa, sw)
            self.assertEqual((tuple(y.shape), y.dtype), ((8, 24), BF))
            self.assertIsNone(o.ag_gemm_out("nope", 1, buf8, torch.empty(24, H, dtype=E4),
                                            torch.empty(48, 24), None, False, 1.0, 0.0, False, 0,
                                            None, sa, sw))
            w8 = torch.empty(24, H, dtype=E4)
            for args, cls, text in (
                    ((sa.half(), sw), E.TpflexInvalidError,
                     "a_scale_inv (the scale of the buffer) has dtype torch.float16"),
                    ((sa, torch.empty(2)), E.TpflexInvalidError,
                     "w_scale_inv (the scale of weight) has dtype torch.float32 and shape [2]"),
                    ((sa, None), E.TpflexInvalidError,
                     "weight has dtype torch.float8_e4m3fn and needs its scale"),
                    ((None, None), E.TpflexInvalidError,
                     "the buffer has dtype torch.float8_e4m3fn and needs its scale")):
                with self.assertRaises(cls) as cm:
                    o.ag_gemm("nope", 1, buf8, w8, None, False, 1.0, False, 0, None, *args)
                self.assertIn(text, str(cm.exception))
            with self.assertRaisesRegex(E.TpflexInvalidError,
                                        "a_scale_inv is set but x has dtype bf16"):
                o.gemm_rs("nope", 1, 4, buf16, torch.empty(48, 16, dtype=BF),
                          torch.empty(H, 16, dtype=BF), None, False, False, 1.0, False, 0, None,
                          sa, None)
        self.assertEqual(counts, {})

    def _backend(self, backend):
        torch._dynamo.reset()
        for r, fails in enumerate(run_fp8(2, fp8_compile_vs_eager, 2, backend, (16, 32, 48))):
            self.assertEqual(fails, [], f"{backend} rank {r}")

    def test_compile_fp8_eager_backend(self):
        self._backend("eager")

    def test_compile_fp8_aot_eager_backend(self):
        self._backend("aot_eager")

    def test_scale_errors_under_compile(self):
        """A wrong scale fails while tracing (the fake implementation's check), carrying the
        eager message."""
        def f(rank):
            tt.set_ub_active_shape([16, H])
            fp = tt.get_ub("fc1_fprop")
            torch._dynamo.reset()
            fn = torch.compile(lambda w, sa, sw: fp.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw),
                               backend="aot_eager", fullgraph=True)
            try:
                fn(torch.zeros(8, H, dtype=E4), torch.ones(1, dtype=torch.float16),
                   torch.ones(1))
                return None
            except Exception as e:  # noqa: BLE001 - the class is what is checked
                return type(e).__name__, str(e)
        cls, text = run_fp8(1, f)[0]
        self.assertEqual(cls, "TorchRuntimeError")
        self.assertIn("TpflexInvalidError", text)
        self.assertIn("a_scale_inv (the scale of the buffer) has dtype torch.float16", text)

    def test_grad_input_with_scales_goes_through_the_op(self):
        """An fp8 call whose scale requires grad (so not the direct path): the op takes the
        scales (before: TpflexUnsupportedError) and gives the eager result."""
        def f(rank):
            tt.set_ub_active_shape([16, H])
            fp = tt.get_ub("fc1_fprop")
            g = torch.Generator().manual_seed(5)
            fp.local_chunk().copy_(fp8((16, H), E4, g))
            w = fp8((8, H), E4, g)
            sa, sw = torch.tensor([0.75]), torch.tensor([2.0])
            want = fp.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw)
            bias = torch.zeros(8, dtype=BF, requires_grad=True)
            got = fp.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw, bias=bias)
            return torch.equal(want, got.detach()), got.requires_grad
        same, needs_grad = run_fp8(1, f)[0]
        self.assertTrue(same)
        self.assertTrue(needs_grad)


if __name__ == "__main__":
    unittest.main(verbosity=2)
