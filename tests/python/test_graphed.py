"""tpflex.torch.graphed (python/tpflex/_graphs.py, docs/SPEC.md §10): dynamic T under CUDA graphs.

Simulator part (make test-sim, CTest python_graphed): the wrapper on the simulator's stand-in
(EagerRerun: inputs copied into static buffers, fn re-run on them, outputs are static buffers):
a stream of random T across buckets equals eager fn at each T (tpflex operations ag_gemm and
gemm_rs at P = 1, 2, 4, sequence-parallel and full inputs, and tpflex.torch.Linear), the stats
counted exactly against the test's own count, set_ub_active_shape and eager operations between
replays, the default ladder, and every error (with its numbers, changing nothing).

CUDA part (class Cuda): torch.cuda.CUDAGraph capture of tpflex operations and of Linear at
several buckets, replayed over a random T stream against eager results. It needs a GPU and a
CUDA-enabled libtpflex and skips naming which is missing. Run it as

    python3 tests/python/test_graphed.py --cuda                   one process, P = 1
    torchrun --standalone --nproc-per-node 2 tests/python/test_graphed.py --cuda   P = 2

(CTest python_graphed_cuda, label gpu, in CUDA builds: exit 77, reported as skipped, without a
GPU; scripts/gpu.sh graphed runs both). unittest style."""
import math
import os
import random
import sys
import unittest
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex._lib as L  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402
from tpflex._graphs import EAGER_RERUN, CUDA_GRAPH, geometric_ladder  # noqa: E402

H, N, C = 32, 16, 64


def on_ranks(P, body, dtype=torch.float32, cap=C):
    def run(rank):
        torch.set_num_threads(1)
        tt.initialize_ub([cap, H], P, dtype=dtype)
        try:
            return body(rank)
        finally:
            tt.destroy_ub()
    return sim.run(P, run, timeout_ms=20000)


def weights(seed, dtype, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, H, generator=g).to(device, dtype),    # fc1_fprop's ag_gemm [N, H]
            torch.randn(H, N, generator=g).to(device, dtype))    # fc2_fprop's gemm_rs [H, N]


def block(w1, w2):
    """x_local [T/P, H] -> (AG + GEMM [T, N] -> tanh, GEMM + RS [T/P, H]): a full output and a
    local one."""
    def fn(x_local):
        ag = tt.get_ub("fc1_fprop")
        ag.local_chunk().copy_(x_local)
        h = torch.tanh(ag.ag_gemm(w1))
        return tt.get_ub("fc2_fprop").gemm_rs(h, w2), h
    return fn


def rs_only(w2):
    """x [T, N] (every rank's full rows) -> GEMM + RS [T/P, H]: a full input."""
    def fn(x):
        return tt.get_ub("fc2_fprop").gemm_rs(x, w2)
    return fn


def t_stream(seed, n, legal, top):
    rng = random.Random(seed)
    return [legal(rng.randint(1, top)) for _ in range(n)]


def expected_stats(ts, buckets):
    """What stats() must say after calls at ts: the test's own count."""
    per = {}
    for t in ts:
        b = min(x for x in buckets if x >= t)
        d = per.setdefault(b, {"captures": 0, "replays": 0, "rows": 0, "padded_rows": 0})
        d["captures" if d["captures"] == 0 else "replays"] += 1
        d["rows"] += t
        d["padded_rows"] += b - t
    return per


class Sim(unittest.TestCase):
    def stream_case(self, P, sp, buckets, n=24, seed=0):
        """n calls at random legal T: graphed output == eager output at T (bitwise: the
        simulator's GEMM sums each row in the same order whatever the rows around it)."""
        def body(rank):
            w1, w2 = weights(seed, torch.float32)
            fn = block(w1, w2) if sp else rs_only(w2)
            g = tt.graphed(fn, buckets, sequence_parallel=sp)
            ts = t_stream(seed + 1, n, tt.legal_rows, C)
            gen = torch.Generator().manual_seed(seed + 2)
            bad, used_buckets = [], []
            for i, T in enumerate(ts):
                x = torch.randn(T, H if sp else N, generator=gen)
                mine = x[rank * T // P:(rank + 1) * T // P] if sp else x
                got = g(mine)
                used_buckets.append(tt.get_ub("fc1_fprop").active_shape[0])
                with tt.active_tokens(T):
                    ref = fn(mine)
                got_l, ref_l = (got, ref) if sp else ((got,), (ref,))
                for k, (a, b) in enumerate(zip(got_l, ref_l)):
                    if a.shape != b.shape or not torch.equal(a, b):
                        bad.append(f"call {i} T={T} output {k}: {list(a.shape)} vs "
                                   f"{list(b.shape)}, max diff "
                                   f"{(a - b).abs().max().item() if a.shape == b.shape else '-'}")
            return bad, ts, g.stats(), g.buckets, used_buckets
        for rank, (bad, ts, st, bks, used) in enumerate(on_ranks(P, body)):
            self.assertEqual(bad, [], f"rank {rank}")
            per = expected_stats(ts, bks)
            self.assertEqual(st["buckets"], per, f"rank {rank}")
            self.assertEqual(st["calls"], len(ts))
            self.assertEqual(st["captures"], len(per))
            self.assertEqual(st["replays"], len(ts) - len(per))
            self.assertEqual(st["rows"], sum(ts))
            self.assertEqual(st["padded_rows"], sum(d["padded_rows"] for d in per.values()))
            self.assertEqual(st["mechanism"], EAGER_RERUN)
            self.assertNotIn("graph capture", st["mechanism_text"])
            self.assertIn("no CUDA graph", st["mechanism_text"])
            # the active shape after each call is the bucket it padded to
            self.assertEqual(used, [min(b for b in bks if b >= t) for t in ts])
            self.assertGreater(len(per), 1, "the stream must cross buckets")
            self.assertGreater(st["padded_rows"], 0, "the stream must pad")

    def test_stream_sp_p1_p2_p4(self):
        for P in (1, 2, 4):
            with self.subTest(P=P):
                self.stream_case(P, True, [16, 32, 48, 64])

    def test_stream_full_input_chunked_padding(self):
        """A full [T, N] input into a reduce-scatter: each rank's rows padded within its chunk
        (end padding would hand rank r other rows than eager)."""
        for P in (2, 4):
            with self.subTest(P=P):
                self.stream_case(P, False, [16, 32, 64])

    def test_default_ladder(self):
        def body(rank):
            g = tt.graphed(block(*weights(0, torch.float32)), sequence_parallel=True)
            before = g.buckets
            g(torch.randn(4, H))
            lad = g.buckets
            return before, lad, [tt.legal_rows(b) for b in lad]
        for before, lad, legal in on_ranks(2, body, cap=256):
            self.assertIsNone(before)
            self.assertEqual(lad, legal, "every rung is a legal T")
            self.assertEqual(lad[-1], 256)
            self.assertGreaterEqual(lad[0], 256 / 64)
            self.assertEqual(lad, geometric_ladder(256, _legal2))

    def test_geometric_ladder(self):
        leg = lambda t: -(-t // 8) * 8  # noqa: E731
        for cap, ratio, span in ((16384, 1.125, 64), (16384, 2.0, 64), (4096, 1.25, 16),
                                 (64, 1.125, 64), (8, 2.0, 64)):
            lad = geometric_ladder(cap, leg, ratio, span)
            self.assertEqual(lad, sorted(set(lad)))
            self.assertEqual(lad[-1], cap)
            self.assertGreaterEqual(lad[0], min(cap, math.ceil(cap / span)))
            self.assertTrue(all(b % 8 == 0 for b in lad))
            for a, b in zip(lad, lad[1:]):   # no gap wider than the ratio (plus the rounding)
                self.assertLessEqual(b, math.ceil(a * ratio) + 8, (cap, ratio, lad))
        self.assertEqual(len(geometric_ladder(16384, leg, 2.0, 64)), 7)
        for bad in (1.0, 0.5, float("inf"), "2"):
            with self.assertRaises(E.TpflexInvalidError):
                geometric_ladder(64, leg, bad)

    def test_shape_changes_between_replays(self):
        """set_ub_active_shape and eager operations at other T between replays: the next
        replay sets its bucket again and still equals eager."""
        def body(rank):
            w1, w2 = weights(3, torch.float32)
            fn = block(w1, w2)
            g = tt.graphed(fn, [16, 32, 64], sequence_parallel=True)
            gen = torch.Generator().manual_seed(4)
            out = []
            for T, other in ((10, 40), (26, 8), (10, 64), (64, 2), (26, 30)):
                x = torch.randn(T // 2, H, generator=gen)
                got = [t.clone() for t in g(x)]
                tt.set_ub_active_shape([other, H])
                eager_other = fn(torch.randn(other // 2, H, generator=gen))  # noqa: F841
                assert tt.get_ub("fc1_fprop").active_shape == (other, H)
                again = g(x)
                with tt.active_tokens(T):
                    ref = fn(x)
                out.append(all(torch.equal(a, b) and torch.equal(c, b)
                               for a, b, c in zip(got, ref, again)))
            return out, g.stats()["captures"], g.stats()["replays"]
        for ok, caps, reps in on_ranks(2, body):
            self.assertEqual(ok, [True] * 5)
            self.assertEqual((caps, reps), (3, 7))

    def test_linear_module(self):
        """tpflex.torch.Linear (column, ub_overlap_ag) graphed under no_grad equals eager."""
        def body(rank):
            torch.manual_seed(5)
            lin = tt.Linear(H, 2 * N, parallel_mode="column", sequence_parallel=True, tp_size=2,
                            ub_overlap_ag=True, ub_name="fc1", params_dtype=torch.float32)
            g = tt.graphed(lin, [16, 32, 64], sequence_parallel=True)
            gen = torch.Generator().manual_seed(6)
            bad = []
            with torch.no_grad():
                for T in (6, 18, 40, 64, 12, 30):
                    x = torch.randn(T // 2, H, generator=gen)
                    got = g(x)
                    with tt.active_tokens(T):
                        ref = lin(x)
                    if got.shape != ref.shape or not torch.equal(got, ref):
                        bad.append(T)
            return bad, g.stats()["captures"]
        for bad, caps in on_ranks(2, body):
            self.assertEqual(bad, [])
            self.assertEqual(caps, 3)

    def test_warmup_and_runs(self):
        """fn runs warmup + 1 times at a bucket's first use and once per later call (the
        stand-in re-runs it); non-tensor outputs and per-token outputs come back right."""
        def body(rank):
            runs = []

            def fn(x, scale):
                runs.append(x.shape[0])
                return x * scale, x.sum(), "tag"
            g = tt.graphed(fn, [8, 16], warmup=2)
            a = g(torch.ones(5, 3), 2.0)
            b = g(torch.ones(7, 3), 2.0)
            c = g(torch.ones(12, 3), 2.0)
            d = float(g(torch.ones(5, 3), 2.0)[1])   # after 7 rows at 8: rows 5, 6 zero again
            return runs, a, b, c, d, g.stats()
        for runs, a, b, c, d, st in on_ranks(1, body):
            self.assertEqual(runs, [8, 8, 8, 8, 16, 16, 16, 8])
            self.assertEqual(d, 15.0, "the rows a longer call left are zeroed")
            self.assertEqual(a[0].shape, (5, 3))
            self.assertTrue(torch.equal(a[0], torch.full((5, 3), 2.0)))
            self.assertEqual(float(a[1]), 5.0 * 3, "the output is the static one, overwritten "
                             "by the last call at bucket 8")
            self.assertEqual(float(c[1]), 36.0)
            self.assertEqual(a[2], "tag")
            self.assertEqual(st["warmup_runs"], 4)

    def test_no_manager(self):
        """Outside the simulator and without a manager: plain torch fn, explicit buckets."""
        g = tt.graphed(lambda x, y: (x * 2 + y, x[:, :1]), [4, 8])
        gen = torch.Generator().manual_seed(7)
        for T in (3, 8, 1, 5):
            x, y = torch.randn(T, 2, generator=gen), torch.randn(T, 2, generator=gen)
            a, b = g(x, y)
            self.assertTrue(torch.equal(a, x * 2 + y))
            self.assertTrue(torch.equal(b, x[:, :1]))
        st = g.stats()
        self.assertEqual((st["captures"], st["replays"], st["rows"], st["padded_rows"]),
                         (2, 2, 17, 1 + 0 + 3 + 3))
        self.assertIn("eager re-run", repr(g))
        with self.assertRaises(E.TpflexStateError) as cm:
            tt.graphed(lambda x: x)(torch.ones(2, 2))
        self.assertIn("default ladder needs the manager", str(cm.exception))

    def test_errors(self):
        def body(rank):
            fn = block(*weights(8, torch.float32))
            msgs = {}

            def catch(name, f, cls):
                try:
                    f()
                    msgs[name] = None
                except cls as e:
                    msgs[name] = str(e)
            catch("illegal", lambda: tt.graphed(fn, [16, 33])(torch.ones(8, H)),
                  E.TpflexInvalidError)
            catch("above_cap", lambda: tt.graphed(fn, [16, 128])(torch.ones(8, H)),
                  E.TpflexCapacityError)
            catch("bad_list", lambda: tt.graphed(fn, [16, 2.5]), E.TpflexInvalidError)
            catch("empty", lambda: tt.graphed(fn, []), E.TpflexInvalidError)
            catch("not_callable", lambda: tt.graphed(3), E.TpflexInvalidError)
            g = tt.graphed(fn, [16, 32], sequence_parallel=True)
            g(torch.ones(5, H))
            before = g.stats()
            catch("above_top", lambda: g(torch.ones(20, H)), E.TpflexCapacityError)
            catch("cols", lambda: g(torch.ones(5, H + 1)), E.TpflexShapeError)
            catch("dtype", lambda: g(torch.ones(5, H, dtype=torch.float64)), E.TpflexShapeError)
            catch("zero_dim", lambda: g(torch.tensor(1.0)), E.TpflexShapeError)
            h = tt.graphed(lambda x, y, k: x * k + y, [16, 32])
            h(torch.ones(4, 2), torch.ones(4, 2), 3)
            catch("baked", lambda: h(torch.ones(4, 2), torch.ones(4, 2), 4), E.TpflexInvalidError)
            catch("disagree", lambda: h(torch.ones(4, 2), torch.ones(6, 2), 3),
                  E.TpflexShapeError)
            catch("no_tensor", lambda: tt.graphed(lambda k: k, [16])(3), E.TpflexInvalidError)
            catch("odd_T", lambda: h(torch.ones(5, 2), torch.ones(5, 2), 3),
                  E.TpflexDivisibleError)
            after = g.stats()
            return msgs, before == after, h.stats()["calls"]
        for msgs, unchanged, hcalls in on_ranks(2, body):
            self.assertIn("bucket 33 is not a legal active row count: legal_rows(33) = 34",
                          msgs["illegal"])
            self.assertIn("bucket 128 is above the capacity 64", msgs["above_cap"])
            self.assertIn("bucket 2.5", msgs["bad_list"])
            self.assertIn("holds no bucket", msgs["empty"])
            self.assertIn("not callable", msgs["not_callable"])
            self.assertIn("T = 40 (20 rows x P = 2) is above the largest bucket 32 (buckets "
                          "[16, 32])", msgs["above_top"])
            self.assertIn(f"torch.float32 [T, {H + 1}]", msgs["cols"])
            self.assertIn(f"static buffers are torch.float32 [T, {H}]", msgs["cols"])
            self.assertIn("torch.float64", msgs["dtype"])
            self.assertIn("0-dimensional", msgs["zero_dim"])
            self.assertIn("argument 2 is 4 but was 3 at the first call", msgs["baked"])
            self.assertIn("baked into the graphs", msgs["baked"])
            self.assertIn("argument 1 has 6 rows but argument 0 has 4", msgs["disagree"])
            self.assertIn("no tensor argument", msgs["no_tensor"])
            self.assertIn("T = 5 rows do not divide among tp_size 2", msgs["odd_T"])
            self.assertTrue(unchanged, "a refused call changes no counter")
            self.assertEqual(hcalls, 1)

    def test_refused_first_calls_change_nothing(self):
        """A first call refused at binding (an illegal bucket) refuses again the same way; a
        first call whose fn raises leaves no bucket, signature or buffer behind."""
        def body(rank):
            g = tt.graphed(lambda x: x + 1, [16, 33])
            msgs = []
            for _ in range(2):
                try:
                    g(torch.ones(4, 2))
                except E.TpflexInvalidError as e:
                    msgs.append(str(e))

            def fn(x):
                if x.shape[1] == 3:
                    raise KeyError("three columns")
                return x * 2
            h = tt.graphed(fn, [8, 16])
            try:
                h(torch.ones(4, 3))
            except KeyError:
                pass
            st0 = h.stats()
            y = h(torch.ones(4, 2))     # another signature: accepted, as if it were the first
            return msgs, st0, y, h.stats()
        for msgs, st0, y, st in on_ranks(2, body):
            self.assertEqual(len(msgs), 2)
            self.assertEqual(msgs[0], msgs[1])
            self.assertIn("legal_rows(33) = 34", msgs[0])
            self.assertEqual((st0["calls"], st0["captures"], st0["buckets"]), (0, 0, {}))
            self.assertTrue(torch.equal(y, torch.full((4, 2), 2.0)))
            self.assertEqual((st["calls"], st["captures"]), (1, 1))

    def test_bound_to_its_manager(self):
        """A callable used after destroy_ub and a new initialize_ub refuses (its graphs use
        the old registrations); reset() is not enough to rebind: a new callable is."""
        def body(rank):
            g = tt.graphed(lambda x: x + 1, [8, 16])
            g(torch.ones(4, 2))
            tt.destroy_ub()
            tt.initialize_ub([C, H], 1, dtype=torch.float32)
            try:
                g(torch.ones(4, 2))
            except E.TpflexStateError as e:
                return str(e)
            return None
        msg = on_ranks(1, body)[0]
        self.assertIn("bound at its first call to another manager", msg or "")


def _legal2(t):
    """legal_rows of the P = 2 simulator manager at capacity 256 (H 32): even T."""
    return t + (t % 2)


# ---- CUDA ---------------------------------------------------------------------------------------

RANK, WORLD = 0, 1


def why_no_cuda():
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or a CPU build of torch)"
    if not L.HAVE_CUDA:
        return f"{L.LIBRARY_PATH} has no CUDA backend (build it with -DTPF_WITH_CUDA=ON)"
    return None


def cuda_group():
    """The gloo group of this process: torchrun's world, or a one-process group."""
    import torch.distributed as dist
    global RANK, WORLD
    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(0)
    return dist


@unittest.skipIf(why_no_cuda() is not None, f"needs the CUDA backend: {why_no_cuda()}")
class Cuda(unittest.TestCase):
    """torch.cuda.CUDAGraph capture at several buckets, replays over a random T stream against
    eager, bf16 (the ranks: this process, or torchrun's)."""
    TOL = (0.02, 0.002)  # SPEC §7's bf16 (cuBLASLt may pick another algorithm at B rows than at T)

    @classmethod
    def setUpClass(cls):
        cls.dist = cuda_group()

    def setUp(self):
        tt.initialize_ub([1024, 256], WORLD, dtype=torch.bfloat16)

    def tearDown(self):
        torch.cuda.synchronize()
        tt.destroy_ub()

    def check(self, fn, g, ts, make):
        P = WORLD
        bad = []
        for i, T in enumerate(ts):
            x = make(T)
            got = g(x)
            got = [t.float().cpu() for t in (got if isinstance(got, tuple) else (got,))]
            with tt.active_tokens(T):
                ref = fn(x)
            ref = [t.float().cpu() for t in (ref if isinstance(ref, tuple) else (ref,))]
            for k, (a, b) in enumerate(zip(got, ref)):
                if a.shape != b.shape or not torch.allclose(a, b, *self.TOL):
                    bad.append(f"rank {RANK} P {P} call {i} T={T} out {k}: {list(a.shape)} vs "
                               f"{list(b.shape)}")
        torch.cuda.synchronize()
        return bad

    def test_ops_stream(self):
        dev = torch.device("cuda", 0)
        g1 = torch.Generator().manual_seed(1)
        w1 = (torch.randn(64, 256, generator=g1) / 16).to(dev, torch.bfloat16)
        w2 = (torch.randn(256, 64, generator=g1) / 8).to(dev, torch.bfloat16)

        def fn(x_local):
            ag = tt.get_ub("fc1_fprop")
            ag.local_chunk().copy_(x_local)
            h = torch.tanh(ag.ag_gemm(w1))
            return tt.get_ub("fc2_fprop").gemm_rs(h, w2), h
        buckets = [b for b in (128, 256, 512, 1024)]
        g = tt.graphed(fn, buckets, sequence_parallel=True)
        ts = t_stream(11, 40, tt.legal_rows, 1024)
        gen = torch.Generator().manual_seed(12)

        def make(T):
            x = torch.randn(T, 256, generator=gen).to(dev, torch.bfloat16)
            return x[RANK * T // WORLD:(RANK + 1) * T // WORLD].contiguous()
        self.assertEqual(self.check(fn, g, ts, make), [])
        st = g.stats()
        self.assertEqual(st["mechanism"], CUDA_GRAPH)
        self.assertEqual(st["buckets"], expected_stats(ts, buckets))
        g.reset()

    def test_default_ladder_linear(self):
        dev = torch.device("cuda", 0)
        torch.manual_seed(13)
        col = tt.Linear(256, 128, parallel_mode="column", sequence_parallel=True, tp_size=WORLD,
                        ub_overlap_ag=True, ub_name="fc1", params_dtype=torch.bfloat16,
                        device=dev)
        row = tt.Linear(128, 256, parallel_mode="row", sequence_parallel=True, tp_size=WORLD,
                        ub_overlap_rs=True, ub_name="fc2", params_dtype=torch.bfloat16,
                        device=dev)

        def fn(x):
            return row(torch.nn.functional.gelu(col(x), approximate="tanh"))
        g = tt.graphed(fn, sequence_parallel=True)
        ts = t_stream(14, 30, tt.legal_rows, 1024)
        gen = torch.Generator().manual_seed(15)

        def make(T):
            return torch.randn(T // WORLD, 256, generator=gen).to(dev, torch.bfloat16)
        with torch.no_grad():
            self.assertEqual(self.check(fn, g, ts, make), [])
        st = g.stats()
        self.assertEqual(st["buckets"], expected_stats(ts, g.buckets))
        self.assertEqual(g.buckets, geometric_ladder(1024, tt.legal_rows))
        g.reset()

    def test_first_call_gradients(self):
        """A backward inside fn (issue 41): the first call at a bucket leaves one eager call's
        .grad (what the warmup runs accumulated is restored before the capture), and a replay
        adds one more, as an eager call would."""
        dev = torch.device("cuda", 0)
        torch.manual_seed(16)
        col = tt.Linear(256, 128, parallel_mode="column", sequence_parallel=True, tp_size=WORLD,
                        ub_overlap_ag=True, ub_name="fc1", params_dtype=torch.bfloat16,
                        device=dev)
        T = 256
        gen = torch.Generator().manual_seed(17)
        x = torch.randn(T // WORLD, 256, generator=gen).to(dev, torch.bfloat16)

        def fn(xs):
            y = col(xs)
            (y.float().square().sum() / T).backward()
            return y.detach()

        bad = []
        for base in (0.5, None):   # .grad held by the caller, or None (allocated by the warmup)
            def preset():
                for p in col.parameters():
                    p.grad = None if base is None else torch.full_like(p, base)
            preset()
            with tt.active_tokens(T):
                fn(x)
            off = 0.0 if base is None else base
            eager = [p.grad.float().cpu() - off for p in col.parameters()]
            preset()
            g = tt.graphed(fn, [T], sequence_parallel=True)
            for k in (1, 2):
                g(x)
                torch.cuda.synchronize()
                for i, p in enumerate(col.parameters()):
                    got = p.grad.float().cpu() - off
                    if not torch.allclose(got, k * eager[i], rtol=0.05, atol=0.01):
                        bad.append(f"rank {RANK} .grad {base} call {k} param {i}: "
                                   f"{got.flatten()[:3].tolist()} vs {k} x eager "
                                   f"{(k * eager[i]).flatten()[:3].tolist()}")
            g.reset()
        self.assertEqual(bad, [])


def cuda_main() -> int:
    """--cuda: the CUDA class alone (exit 77 when it cannot run here: CTest's skip)."""
    why = why_no_cuda()
    if why is not None:
        print(f"test_graphed --cuda: skipped: {why}")
        return 77
    dist = cuda_group()
    suite = unittest.TestLoader().loadTestsFromTestCase(Cuda)
    stream = sys.stdout if RANK == 0 else open(os.devnull, "w")
    res = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
    oks = [None] * WORLD
    dist.all_gather_object(oks, res.wasSuccessful() and not res.skipped)
    if RANK == 0:
        print(f"test_graphed --cuda: P={WORLD}: " + ("every test OK" if all(oks) else
                                                     f"FAILED (ranks ok: {oks})"), flush=True)
    dist.destroy_process_group()
    return 0 if all(oks) else 1


if __name__ == "__main__":
    if "--cuda" in sys.argv:
        sys.exit(cuda_main())
    unittest.main()
