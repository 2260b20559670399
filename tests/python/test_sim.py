"""tpflex Python package on the simulator: every operation and every option against torch
references over random T sequences (P in 1, 2, 4; fp32, bf16, fp16), and every error path
(the cases shared with test_cuda.py live in cases.py), plus what only the simulator runner has.
unittest style (runs under `python3 -m unittest` and pytest)."""
import ctypes
import inspect
import os
import re
import subprocess
import sys
import threading
import time
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex  # noqa: E402
import tpflex._lib as L  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex._options import parse_options  # noqa: E402
from tpflex._te import current_manager  # noqa: E402
from tpflex import errors as E  # noqa: E402

import cases  # noqa: E402
from cases import C, H, Env, Err, with_ub  # noqa: E402


def sim_run_ranks(P, body, *args, timeout_ms=5000, max_delay_us=0):
    def f(rank):
        env = Env("sim", torch.device("cpu"), P)
        try:
            return body(rank, env, *args)
        except Exception as e:  # reported per rank, like the CUDA runner
            return Err(e)
    return sim.run(P, f, timeout_ms=timeout_ms, max_delay_us=max_delay_us)


class Shared(cases.SharedCases, unittest.TestCase):
    backend = "sim"

    def run_ranks(self, P, body, *args, timeout_ms=5000):
        return sim_run_ranks(P, body, *args, timeout_ms=timeout_ms)

    def p_values(self, wanted):
        return list(wanted)


class TEVocabulary(unittest.TestCase):
    """initialize_ub in TransformerEngine's words (docs/SPEC.md §9): its signature, method names
    and every ub_cfgs key; the manager's legal_rows."""

    TE_PARAMS = ["shape", "tp_size", "use_fp8", "quantization_modes", "dtype", "ub_cfgs",
                 "bootstrap_backend", "with_cublasmp"]  # TE's initialize_ub, in order

    def test_signature_is_tes(self):
        sig = inspect.signature(tt.initialize_ub)
        pos = [n for n, p in sig.parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        self.assertEqual(pos, self.TE_PARAMS)
        defaults = {n: sig.parameters[n].default for n in self.TE_PARAMS[2:]}
        self.assertEqual(defaults, {"use_fp8": False, "quantization_modes": None,
                                    "dtype": torch.bfloat16, "ub_cfgs": None,
                                    "bootstrap_backend": None, "with_cublasmp": False})
        kw = [n for n, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY]
        self.assertEqual(kw, ["group", "backend", "device", "timeout_ms"])

    def test_te_positional_call_runs_the_ops(self):
        """TE's positional order, method names and keys; the operations against torch."""
        P, T = 2, 16
        cfgs = {"qkv_fprop": {"method": "ring_exchange", "is_reduce_scatter": False,
                              "num_splits": P, "aggregate": False, "atomic_gemm": False,
                              "use_ce": True, "fp8_buf": True},
                "proj_fprop": {"method": "pipeline", "is_reduce_scatter": True,
                               "num_splits": 4},
                "fc1_wgrad": {"method": "bulk", "is_reduce_scatter": True},
                "extra_rs": {"method": "ring", "is_reduce_scatter": True}}

        def f(r):
            g = torch.Generator().manual_seed(7)
            xs = [torch.randn(T // P, H, generator=g) for _ in range(P)]
            w = torch.randn(24, H, generator=g)
            xr = [torch.randn(T, 16, generator=g) for _ in range(P)]
            wr = [torch.randn(H, 16, generator=g) for _ in range(P)]
            tt.initialize_ub([C, H], P, False, None, torch.float32, cfgs, "gloo")
            try:
                tt.set_ub_active_shape([T, H])
                ub = tt.get_ub("qkv_fprop")
                ub.local_chunk().copy_(xs[r])
                y = ub.ag_gemm(w)
                ok_ag = cases.close(y, torch.cat(xs) @ w.T, torch.float32)
                S = sum(x @ wt.T for x, wt in zip(xr, wr))[r * T // P:(r + 1) * T // P]
                ok_rs = [cases.close(tt.get_ub(n).gemm_rs(xr[r], wr[r]), S, torch.float32)
                         for n in ("proj_fprop", "extra_rs")]
                kinds = {n: (tt.get_ub(n).algo, tt.get_ub(n).coll)
                         for n in ("qkv_fprop", "proj_fprop", "fc1_wgrad", "extra_rs")}
                return ok_ag, ok_rs, kinds
            finally:
                tt.destroy_ub()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            res = sim.run(P, f)
        # The honoured keys warn nothing; bootstrap_backend does not apply to the simulator.
        self.assertEqual({str(w.message) for w in ws if w.category is E.TpflexConfigWarning},
                         {"initialize_ub: bootstrap_backend='gloo' is ignored on the simulator "
                          "(its ranks share memory)"})
        for r, (ok_ag, ok_rs, kinds) in enumerate(res):
            self.assertTrue(ok_ag, f"rank {r}")
            self.assertEqual(ok_rs, [True, True], f"rank {r}")
            self.assertEqual(kinds, {"qkv_fprop": ("ring", "ag"), "proj_fprop": ("pipeline", "rs"),
                                     "fc1_wgrad": ("bulk", "rs"), "extra_rs": ("ring", "rs")})

    def _init(self, *args, **kw):
        """initialize_ub(*args, **kw) on tp_size ranks: rank 0's (communicator configs, the
        TpflexConfigWarnings of every rank) or Err. Warnings are caught around sim.run, on this
        thread (catch_warnings is process-global)."""
        def f(r):
            try:
                m = tt.initialize_ub(*args, **kw)
            except Exception as e:
                return Err(e)
            try:
                cfg = {}
                for n in m.names:
                    c = L.lib.tpf_comm_config_of(tt.get_ub(n)._h).contents
                    cfg[n] = (tt.get_ub(n).algo, tt.get_ub(n).coll, int(c.num_splits),
                              bool(c.aggregate), bool(c.external))
                return cfg
            finally:
                tt.destroy_ub()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            res = sim.run(args[1], f)[0]
        if isinstance(res, Err):
            return res
        return res, [str(w.message) for w in ws if issubclass(w.category, E.TpflexConfigWarning)]

    def test_method_names(self):
        for name, algo in (("ring_exchange", "ring"), ("ring", "ring"), ("pipeline", "pipeline"),
                           ("bulk", "bulk")):
            cfg, ws = self._init([C, H], 1, ub_cfgs={"fc2_fprop": {"method": name}})
            self.assertEqual(cfg["fc2_fprop"][:2], (algo, "rs"), name)
            self.assertEqual(ws, [])
        e = self._init([C, H], 1, ub_cfgs={"fc2_fprop": {"method": "ringexchange"}})
        self.assertEqual(e.cls, "TpflexInvalidError", e)
        self.assertIn("'ringexchange'", e.text)
        self.assertIn("'ring_exchange'", e.text)

    def test_honoured_keys(self):
        cfg, ws = self._init([C, H], 2, ub_cfgs={
            "fc1_fprop": {"num_splits": 1, "aggregate": True, "is_reduce_scatter": False,
                          "use_ce": True, "atomic_gemm": False, "fp8_buf": False},
            "fc2_fprop": {"num_splits": 8}})
        self.assertEqual(cfg["fc1_fprop"], ("ring", "ag", 1, True, False))
        self.assertEqual(cfg["fc2_fprop"], ("pipeline", "rs", 8, False, False))
        self.assertEqual(cfg["proj_wgrad"][4], True, "tpflex's external key")
        self.assertEqual(ws, [])

    def test_dgrad_method_makes_it_reduce_scatter(self):
        """As in TE: qkv_dgrad with a non-bulk method is the RS site and qkv_wgrad goes."""
        cfg, _ = self._init([C, H], 1, ub_cfgs={"qkv_dgrad": {"method": "ring_exchange"}})
        self.assertEqual(cfg["qkv_dgrad"][:2], ("ring", "rs"))
        self.assertNotIn("qkv_wgrad", cfg)
        e = self._init([C, H], 1, ub_cfgs={"qkv_dgrad": {"method": "ring_exchange"},
                                           "qkv_wgrad": {"method": "bulk"}})
        self.assertEqual(e.cls, "TpflexInvalidError", e)
        self.assertIn("qkv_wgrad", e.text)

    def test_ignored_keys_warn_once_each_naming_it(self):
        keys = {"num_sm": 4, "cga_size": 2, "set_sm_margin": True, "comm_priority": 1,
                "gemm_priority": -1, "pipeline_rs_overlap_first_gemm": True}
        cfg, ws = self._init([C, H], 1, ub_cfgs={"fc1_fprop": dict(keys),
                                                 "fc2_fprop": dict(keys, use_ce=False)})
        self.assertEqual(len(ws), len(keys) + 1, ws)
        for k in list(keys) + ["use_ce"]:
            mine = [w for w in ws if f"'{k}'" in w]
            self.assertEqual(len(mine), 1, (k, ws))
            self.assertIn("ignored", mine[0])
        self.assertIn("fc1_fprop, fc2_fprop", [w for w in ws if "'num_sm'" in w][0])
        self.assertEqual(cfg["fc1_fprop"][:2], ("ring", "ag"))

    def test_refused(self):
        for kw, cls, words in (
                ({"ub_cfgs": {"fc1_fprop": {"atomic_gemm": True}}},
                 "TpflexUnsupportedError", ("atomic_gemm", "fc1_fprop")),
                # use_fp8 / FP8 quantization modes register FP8 sites now (test_fp8.py); an
                # fp8_buf on a reduce-scatter site is what stays refused.
                ({"use_fp8": True, "ub_cfgs": {"fc2_fprop": {"fp8_buf": True}}},
                 "TpflexUnsupportedError", ("fp8_buf", "fc2_fprop")),
                ({"quantization_modes": ["int4"]}, "TpflexInvalidError", ("int4",)),
                ({"ub_cfgs": {"fc1_fprop": {"num_sm": 1, "bogus": 2}}},
                 "TpflexInvalidError", ("bogus", "num_sm")),
                ({"ub_cfgs": {"fc1_fprop": {"coll": "rs", "is_reduce_scatter": False}}},
                 "TpflexInvalidError", ("disagree",)),
                ({"ub_cfgs": {"new_site": {"num_splits": 1}}}, "TpflexInvalidError",
                 ("new_site", "method")),
                ({"ub_cfgs": ["fc1_fprop"]}, "TpflexInvalidError", ("ub_cfgs", "list")),
                ({"bootstrap_backend": "tcp"}, "TpflexInvalidError",
                 ("bootstrap_backend", "'tcp'", "gloo")),
                ({"dtype": "bf16"}, "TpflexInvalidError", ("dtype", "'bf16'"))):
            e = self._init([C, H], 1, **kw)
            self.assertIsInstance(e, Err, f"{kw}: {e!r}")
            self.assertEqual(e.cls, cls, f"{kw}: {e!r}")
            for w in words:
                self.assertIn(w, e.text, f"{kw}")
        cfg, _ = self._init([C, H], 1, quantization_modes=["NONE"])  # TE's unquantized mode
        self.assertEqual(len(cfg), len(tt.DEFAULT_UB_CFGS))

    def test_bootstrap_backend_accepted(self):
        for v in (None, "gloo", "nccl", "mpi"):
            cfg, ws = self._init([C, H], 1, bootstrap_backend=v)
            self.assertEqual(len(cfg), len(tt.DEFAULT_UB_CFGS), v)
            self.assertEqual(len(ws), 0 if v is None else 1, (v, ws))  # nothing to bootstrap
            if v is not None:
                self.assertIn("bootstrap_backend", ws[0])

    def test_legal_rows_every_communicator_accepts(self):
        """P = 4, fp32, H = 64, a pipelined site with 64 splits: one
        communicator's legal_rows(12) is 12, the manager's is the T every one accepts, and the
        refusal of 12 names the communicator that refuses it and suggests legal_rows."""
        P, Hh = 4, 64

        def f(r):
            tt.initialize_ub([64, Hh], P, dtype=torch.float32,
                             ub_cfgs={"fc2_fprop": {"num_splits": 64}})
            try:
                own = tt.get_ub("fc1_fprop").legal_rows(12)
                mgr = tt.legal_rows(12)
                try:
                    tt.set_ub_active_shape([12, Hh])
                    refusal = None
                except E.TpflexError as e:
                    refusal = Err(e)
                tt.set_ub_active_shape([mgr, Hh])
                return own, mgr, refusal, tt.legal_rows(1), tt.legal_rows(64)
            finally:
                tt.destroy_ub()
        def g(r):
            tt.initialize_ub([64, Hh], P, dtype=torch.float32,
                             ub_cfgs={"fc2_fprop": {"num_splits": 64}})
            try:
                tt.get_ub("fc2_fprop").set_active_shape([12, Hh])
            except E.TpflexAlignError as e:
                return str(e)
            finally:
                tt.destroy_ub()
        for text in sim.run(P, g):  # one communicator's own refusal names its legal_rows
            self.assertIn("'fc2_fprop'", text)
            self.assertIn("pad to legal_rows(12) = 16", text)
        for own, mgr, refusal, one, cap in sim.run(P, f):
            self.assertEqual((own, mgr, one, cap), (12, 16, 16, 64))
            self.assertIsNotNone(refusal)
            self.assertIn("'fc2_fprop'", refusal.text)
            self.assertIn("legal_rows(12) = 16", refusal.text)
        e = sim.run(P, lambda r: Err_of(lambda: (tt.initialize_ub([64, Hh], P,
                                                                  dtype=torch.float32),
                                                 tt.legal_rows(65))))[0]
        self.assertEqual(e.cls, "TpflexCapacityError", e)


def Err_of(fn):
    """fn()'s exception as an Err (and destroy_ub), or its result."""
    try:
        return fn()
    except Exception as e:
        return Err(e)
    finally:
        tt.destroy_ub()


class SimOnly(unittest.TestCase):
    def test_random_step_delays(self):
        res = sim_run_ranks(4, cases.ops_vs_torch, torch.float32, 2, 5, max_delay_us=50)
        for r, x in enumerate(res):
            self.assertNotIsInstance(x, Err, f"rank {r}: {x!r}")
            self.assertEqual(x[0], [], f"rank {r}")

    def test_options_with_step_delays(self):
        res = sim_run_ranks(2, cases.options_vs_torch, torch.bfloat16, 9, timeout_ms=20000,
                            max_delay_us=20)
        for r, x in enumerate(res):
            self.assertNotIsInstance(x, Err, f"rank {r}: {x!r}")
            self.assertEqual(x[0], [], f"rank {r}")

    def test_num_splits_reaches_the_schedule(self):
        """A per-operation split count changes the schedule (steps the simulator ran), not the
        result: RING AG with P splits vs 1, PIPELINE RS with 8 blocks vs 1."""
        P = 4

        def setup(r):
            tt.initialize_ub([C, H], P, dtype=torch.float32)
            tt.set_ub_active_shape([32, H])

        def one(r, name, n):
            if name == "fc1_fprop":
                tt.get_ub(name).ag_gemm(torch.ones(4, H), num_splits=n)
            else:
                tt.get_ub(name).gemm_rs(torch.ones(32, 16), torch.ones(H, 16), num_splits=n)

        with sim.World(P, timeout_ms=5000) as w:
            w.run(setup)
            steps = {}
            for name, ns in (("fc1_fprop", (P, 1)), ("fc2_fprop", (8, 1))):
                for n in ns:
                    s0 = w.stats().steps
                    w.run(one, name, n)
                    steps[(name, n)] = w.stats().steps - s0
        self.assertGreater(steps[("fc1_fprop", P)], steps[("fc1_fprop", 1)], steps)
        self.assertGreater(steps[("fc2_fprop", 8)], steps[("fc2_fprop", 1)], steps)

    def test_rank_exception_does_not_hang(self):
        def f(r):
            tt.initialize_ub([C, H], 2)
            tt.set_ub_active_shape([8, H])
            if r == 1:
                raise KeyError("rank one fails")
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
        t0 = time.monotonic()
        with self.assertRaises((KeyError, E.TpflexTimeoutError)):
            sim.run(2, f, timeout_ms=300)
        self.assertLess(time.monotonic() - t0, 10)

    def test_config_count_mismatch(self):
        """A rank with an extra communicator: the others fail at teardown, nobody hangs."""
        def f(r):
            cfgs = {"extra": {"method": "bulk", "coll": "ag"}} if r == 1 else None
            tt.initialize_ub([C, H], 2, ub_cfgs=cfgs)
            tt.destroy_ub()
        t0 = time.monotonic()
        with self.assertRaises(tpflex.TpflexError):
            sim.run(2, f, timeout_ms=300)
        self.assertLess(time.monotonic() - t0, 10)

    def test_cuda_backend_refused_here(self):
        if L.HAVE_CUDA and torch.cuda.is_available():
            self.skipTest("this machine has the CUDA backend and a GPU (test_cuda.py covers it)")
        with self.assertRaises(E.TpflexUnsupportedError):
            tt.initialize_ub([C, H], 1, backend="cuda")

    def test_default_backend_outside_run_is_cuda(self):
        if L.HAVE_CUDA and torch.cuda.is_available():
            self.skipTest("a GPU is present")
        with self.assertRaisesRegex(E.TpflexUnsupportedError, "CUDA"):
            tt.initialize_ub([C, H], 1)

    def test_sim_backend_outside_run(self):
        with self.assertRaises(E.TpflexStateError):
            tt.initialize_ub([C, H], 1, backend="sim")

    def test_sim_refuses_cuda_arguments(self):
        res = sim_run_ranks(1, lambda r, env: tt.initialize_ub([C, H], 1, backend="sim",
                                                               timeout_ms=5))
        self.assertEqual(res[0].cls, "TpflexInvalidError", res)

    def test_sim_refuses_a_stream(self):
        def f(r, env):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16), stream=1)
        res = sim_run_ranks(1, with_ub(f))
        self.assertEqual(res[0].cls, "TpflexInvalidError", res)
        self.assertIn("stream", res[0].text)

    def test_sync_async_error_abort(self):
        def f(r, env):
            tt.set_ub_active_shape([8, H])
            ub = tt.get_ub("fc1_fprop")
            ub.ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
            ub.sync()
            assert ub.async_error() is None
            ub.abort()
            ub.ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
        for r, e in enumerate(sim_run_ranks(2, with_ub(f))):
            self.assertIsInstance(e, Err, f"rank {r}: {e!r}")
            self.assertEqual(e.cls, "TpflexStateError", f"rank {r}: {e!r}")
            self.assertIn("abort", e.detail)

    def test_views_are_zero_copy_and_cached_per_epoch(self):
        def f(r, env):
            tt.set_ub_active_shape([8, H])
            ub = tt.get_ub("fc1_fprop")
            v1, v2 = ub.buffer(), ub.buffer()
            assert v1 is v2, "same epoch: the same view"
            ub.local_chunk().fill_(r + 1)
            assert torch.all(ub.buffer()[r * 4:(r + 1) * 4] == r + 1)
            base, nbytes = ub.registration()
            assert v1.data_ptr() == base and nbytes >= C * H * 2, (hex(v1.data_ptr()), base, nbytes)
            tt.set_ub_active_shape([16, H])
            assert ub.registration() == (base, nbytes), "a shape change keeps the registration"
            v3 = ub.buffer()
            assert v3 is not v1 and tuple(v3.shape) == (16, H), v3.shape
            rs = tt.get_ub("ring_rs").buffer()  # RING RS: all 2P-1 slots
            assert tuple(rs.shape) == ((2 * 2 - 1) * 16 // 2, H), rs.shape
            return True
        self.assertEqual(sim_run_ranks(2, with_ub(f, ub_cfgs=cases.RING_RS)), [True, True])

    def test_backend_caps(self):
        def f(r, env):
            ub = tt.get_ub("fc1_fprop")
            return ub.backend_name, ub.supports_options, bool(ub.backend_caps & L.CAP_HOST_MEMORY)
        self.assertEqual(sim_run_ranks(1, with_ub(f)), [("sim", True, True)])

    def test_dlpack_view_of_host_memory(self):
        base = torch.arange(40, dtype=torch.float32)
        v = tt.dlpack_view(base.data_ptr(), 4, 8, 10, torch.float32, torch.device("cpu"))
        self.assertEqual(tuple(v.stride()), (10, 1))
        self.assertTrue(torch.equal(v, base.view(4, 10)[:, :8]))
        v[3, 7] = -1
        self.assertEqual(base[37].item(), -1)
        for dt in (torch.bfloat16, torch.float16):
            b = torch.zeros(6, dtype=dt)
            w = tt.dlpack_view(b.data_ptr(), 2, 3, 3, dt, torch.device("cpu"))
            w.fill_(1.5)
            self.assertEqual(w.dtype, dt)
            self.assertEqual(b.float().sum().item(), 9.0)

    def test_dlpack_view_checks_its_arguments(self):
        b = torch.zeros(8)
        cpu = torch.device("cpu")
        for args, cls, word in (((b.data_ptr(), 2, 4, 3, torch.float32, cpu), E.TpflexInvalidError,
                                 "ld=3"),
                                ((b.data_ptr(), 2 ** 63, 4, 4, torch.float32, cpu),
                                 E.TpflexOverflowError, "rows"),
                                ((b.data_ptr(), 2, 4, 4, torch.int32, cpu), E.TpflexInvalidError,
                                 "dtype"),
                                ((b.data_ptr(), 2.5, 4, 4, torch.float32, cpu),
                                 E.TpflexInvalidError, "rows=2.5")):
            with self.assertRaisesRegex(cls, word, msg=str(args)):
                tt.dlpack_view(*args)

    def test_struct_sizes_match_the_library(self):
        """ctypes mirrors of tpf_op_options, tpf_comm_config and tpf_sim_config have the C
        sizes: the library refuses a size one word larger, naming the size it knows."""
        def f(r, env):
            tt.set_ub_active_shape([8, H])
            ub = tt.get_ub("fc1_fprop")
            w = torch.zeros(4, H, dtype=torch.bfloat16)
            d = torch.empty(8, 4, dtype=torch.bfloat16)
            mw = L.Matrix(w.data_ptr(), 4, H, H, 0)
            md = L.Matrix(d.data_ptr(), 8, 4, 4, 0)
            o = L.op_options_default()
            L.check(L.lib.tpf_ag_gemm_ex(ub._h, ctypes.byref(mw), ctypes.byref(md),
                                         ctypes.byref(o), None))
            o.size += 8
            rc = L.lib.tpf_ag_gemm_ex(ub._h, ctypes.byref(mw), ctypes.byref(md), ctypes.byref(o),
                                      None)
            opt_known = L.last_error()
            cfg = L.CommConfig(size=ctypes.sizeof(L.CommConfig) + 8, name=b"x",
                               capacity=L.Shape(C, H))
            h = ctypes.c_void_p()
            rc2 = L.lib.tpf_manager_add(current_manager()._h, ctypes.byref(cfg), ctypes.byref(h))
            return rc, opt_known, rc2, L.last_error()
        rc, opt_known, rc2, cfg_known = sim_run_ranks(1, with_ub(f))[0]
        self.assertEqual(rc, 1, opt_known)
        self.assertIn(f"knows {ctypes.sizeof(L.OpOptions)} bytes", opt_known)
        self.assertEqual(rc2, 1, cfg_known)
        self.assertIn(f"knows {ctypes.sizeof(L.CommConfig)} bytes", cfg_known)
        bad = L.SimConfig(size=ctypes.sizeof(L.SimConfig) + 8, tp_size=1)
        h = ctypes.c_void_p()
        self.assertEqual(L.lib.tpf_sim_world_create(ctypes.byref(bad), ctypes.byref(h)), 1)
        self.assertIn(f"knows {ctypes.sizeof(L.SimConfig)} bytes", L.last_error())

    def test_option_parsing(self):
        p = parse_options
        self.assertTrue(p("t", {}).is_default)
        self.assertEqual(p("t", {"accumulate": True}).beta, 1.0)
        self.assertEqual(p("t", {"splits": 2}).num_splits, 2)
        self.assertEqual(p("t", {"num_splits": None}).num_splits, 0)
        for bad in ({"alpha": float("nan")}, {"beta": "x"}, {"trans_w": 2},
                    {"num_splits": -1}, {"num_splits": 2, "splits": 4},
                    {"accumulate": True, "beta": 0.0}, {"bias": [1.0]}, {"gelu": None}):
            with self.assertRaises(E.TpflexInvalidError, msg=str(bad)):
                p("t", bad)

    def test_set_error_reaches_last_error(self):
        self.assertEqual(L.set_error(9, "from python 100%"), 9)
        self.assertEqual(L.last_error(), "from python 100%")

    def test_classes(self):
        self.assertEqual(len(E.STATUS_CLASSES), 12)
        for st, cls in E.STATUS_CLASSES.items():
            self.assertTrue(issubclass(cls, tpflex.TpflexError))
            self.assertEqual(cls.status_name, L.status_name(st))

    def test_results_in_rank_order_and_first_exception(self):
        self.assertEqual(sim.run(4, lambda r, k: r * k, 3), [0, 3, 6, 9])

        def f(r):
            if r >= 1:
                raise ValueError(f"rank {r}")
        with self.assertRaisesRegex(ValueError, "rank [12]") as cm:
            sim.run(3, f)
        e = cm.exception  # ranks 1 and 2 raise at the same time: either is first
        self.assertEqual([r for r, _ in e.peer_errors], [3 - e.tpflex_rank])
        self.assertIsInstance(e.peer_errors[0][1], ValueError)


class Reliability(unittest.TestCase):
    """Bad arguments, views outliving their registration, sim.run's root cause,
    teardown failures, the oracle."""

    def test_root_cause_not_the_consequent_timeout(self):
        """Rank 1 fails before the collective; rank 0's ag_gemm then times out (a consequence).
        sim.run raises rank 1's AssertionError, with rank 0's timeout attached. Rank 0 starts
        its operation only after rank 1 has raised (an event), and its wait is 3 s: rank 1's
        exception is caught long before rank 0's timeout can fire."""
        raised = threading.Event()

        def f(r):
            tt.initialize_ub([C, H], 2)
            try:
                tt.set_ub_active_shape([8, H])
                if r == 1:
                    try:
                        raise AssertionError("rank one's root cause")
                    finally:
                        raised.set()
                raised.wait()
                tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
            finally:
                tt.destroy_ub()
        with self.assertRaisesRegex(AssertionError, "rank one's root cause") as cm:
            sim.run(2, f, timeout_ms=3000)
        e = cm.exception
        self.assertEqual(e.tpflex_rank, 1)
        self.assertEqual(len(e.peer_errors), 1)
        self.assertEqual(e.peer_errors[0][0], 0)
        self.assertIsInstance(e.peer_errors[0][1], E.TpflexTimeoutError)
        self.assertTrue(any("rank 0: TpflexTimeoutError" in n for n in e.__notes__), e.__notes__)

    def test_view_read_after_the_world_closes(self):
        """A view returned out of sim.run (the world closes at its end) reads the registration,
        which is released with the view. In a subprocess: before, this read crashed."""
        code = (
            "import gc, torch, tpflex.sim as sim, tpflex.torch as tt\n"
            "def f(r):\n"
            "    tt.initialize_ub([64, 32], 1, dtype=torch.float32)\n"
            "    tt.set_ub_active_shape([8, 32])\n"
            "    v = tt.get_ub('fc1_fprop').buffer(); v.fill_(3)\n"
            "    return v, tt.get_ub('fc2_fprop').local_chunk()\n"
            "v, c = sim.run(1, f)[0]\n"
            "print('live', sim.live_worlds(), float(v.sum()), tuple(c.shape))\n"
            "del v; gc.collect(); print('after v', sim.live_worlds())\n"
            "del c; gc.collect(); print('after c', sim.live_worlds())\n")
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(r.stdout.split("\n")[:3],
                         ["live 1 768.0 (8, 32)", "after v 1", "after c 0"], r.stdout)

    def test_view_kept_across_destroy_and_initialize_does_not_alias(self):
        def f(r):
            tt.initialize_ub([C, H], 2, dtype=torch.float32)
            tt.set_ub_active_shape([8, H])
            v = tt.get_ub("fc1_fprop").buffer()
            v.fill_(1)
            old = current_manager()._life
            tt.destroy_ub()
            assert old.h is not None and old.views == 1, "destroy deferred while v lives"
            with self.assertRaises(E.TpflexStateError):  # the manager is gone
                tt.set_ub_active_shape([8, H])
            tt.initialize_ub([C, H], 2, dtype=torch.float32)
            try:
                tt.set_ub_active_shape([8, H])
                mgr = current_manager()
                for n in mgr.names:
                    tt.get_ub(n).buffer().fill_(2)
                regs = [tt.get_ub(n).registration() for n in mgr.names]
                lo, hi = v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()
                overlaps = [n for n, (b, k) in zip(mgr.names, regs) if b < hi and lo < b + k]
                return overlaps, bool(torch.all(v == 1)), old
            finally:
                tt.destroy_ub()
        res = sim.run(2, f)
        for overlaps, kept, old in res:
            self.assertEqual((overlaps, kept), ([], True))
            self.assertEqual((old.h, old.views), (None, 0), "destroyed when v died")

    def test_destroy_without_views_is_immediate(self):
        """No view kept: destroy_ub destroys at once (a world closes with nothing pending)."""
        def f(r):
            tt.initialize_ub([C, H], 1)
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").buffer().fill_(1)  # a view made and dropped
            mgr = current_manager()
            tt.destroy_ub()
            return mgr._life.h is None, mgr._life.views
        with sim.World(1) as w:
            self.assertEqual(w.run(f), [(True, 0)])

    def test_an_operation_error_holds_no_view(self):
        """A TpflexError out of an operation carries no frame whose locals hold a view, so
        destroy_ub while handling it destroys at once (on CUDA it would otherwise refuse)."""
        def f(r):
            tt.initialize_ub([C, H], 1)
            tt.set_ub_active_shape([8, H])
            life = current_manager()._life
            try:
                tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.float32))
            except E.TpflexInvalidError:
                tt.destroy_ub()
                return life.h is None, life.deferred
        self.assertEqual(sim.run(1, f), [(True, False)])

    def test_close_hook_failure_is_raised(self):
        """World.close no longer swallows teardown failures: a rank's close hook that raises
        fails close() (after the world is gone); with a body failure, the body's exception is
        raised and the teardown's is noted on it."""
        def hook(r):
            def boom():
                raise RuntimeError(f"teardown of rank {r} failed")
            sim.current().state.setdefault(sim.ON_CLOSE, {})["test"] = boom
        before = sim.live_worlds()
        w = sim.World(2)
        w.run(hook)
        with self.assertRaisesRegex(RuntimeError, "teardown of rank [01] failed"):
            w.close()
        self.assertEqual(sim.live_worlds(), before)
        with self.assertRaisesRegex(KeyError, "body") as cm:
            with sim.World(2) as w2:
                w2.run(hook)
                raise KeyError("body")
        self.assertTrue(any("closing the world also failed" in n
                            for n in cm.exception.__notes__))

    def test_bad_arguments_name_themselves(self):
        """No silent wrap or truncation; every bad argument is a TpflexError
        subclass naming the argument and its value (never ValueError / ctypes.ArgumentError)."""
        big = 2 ** 64 + 64

        def calls(r):
            ub = None
            out = []

            def attempt(label, fn):
                try:
                    fn()
                    out.append((label, None))
                except Exception as e:
                    out.append((label, Err(e)))
            attempt("init capacity", lambda: tt.initialize_ub([big, H], 1))
            attempt("init float rows", lambda: tt.initialize_ub([64.0, H], 1))
            attempt("init tp_size", lambda: tt.initialize_ub([C, H], 2 ** 31))
            attempt("init tp_size 0", lambda: tt.initialize_ub([C, H], 0))
            attempt("init num_splits", lambda: tt.initialize_ub(
                [C, H], 1, ub_cfgs={"fc2_fprop": {"num_splits": 2 ** 32 + 1}}))
            attempt("init timeout", lambda: tt.initialize_ub([C, H], 1, backend="cuda",
                                                             timeout_ms=-5))
            tt.initialize_ub([C, H], 1)
            try:
                ub = tt.get_ub("fc1_fprop")
                x = torch.zeros(4, H, dtype=torch.bfloat16)
                attempt("shape overflow", lambda: tt.set_ub_active_shape([2 ** 64 + 32, H]))
                attempt("shape float", lambda: tt.set_ub_active_shape([48.9, H]))
                attempt("shape negative", lambda: tt.set_ub_active_shape([-8, H]))
                attempt("shape 1-D", lambda: tt.set_ub_active_shape([8]))
                attempt("shape str", lambda: tt.set_ub_active_shape("8x32"))
                attempt("comm shape", lambda: ub.set_active_shape([8, 2 ** 64]))
                tt.set_ub_active_shape([8, H])
                attempt("splits wrap", lambda: ub.ag_gemm(x, num_splits=2 ** 32 + 1))
                attempt("splits float", lambda: ub.ag_gemm(x, num_splits=2.0))
                attempt("alpha float32", lambda: ub.ag_gemm(x, alpha=1e39))
                attempt("legal_rows float", lambda: ub.legal_rows(48.9))
                attempt("legal_rows negative", lambda: tt.legal_rows(-1))
                attempt("legal_rows overflow", lambda: tt.legal_rows(2 ** 64))
                attempt("get_ub int", lambda: tt.get_ub(3))
                return out, tt.get_ub("fc1_fprop").active_shape
            finally:
                tt.destroy_ub()
        out, shape = sim.run(1, calls)[0]
        self.assertEqual(shape, (8, H), "no bad call changed the shape")
        want = {
            "init capacity": ("TpflexOverflowError", "shape[0]", str(2 ** 64 + 64)),
            "init float rows": ("TpflexInvalidError", "shape[0]", "64.0"),
            "init tp_size": ("TpflexOverflowError", "tp_size", str(2 ** 31)),
            "init tp_size 0": ("TpflexInvalidError", "tp_size", "0"),
            "init num_splits": ("TpflexOverflowError", "num_splits", str(2 ** 32 + 1)),
            "init timeout": ("TpflexInvalidError", "timeout_ms", "-5"),
            "shape overflow": ("TpflexOverflowError", "shape[0]", str(2 ** 64 + 32)),
            "shape float": ("TpflexInvalidError", "shape[0]", "48.9"),
            "shape negative": ("TpflexShapeError", "shape[0]", "-8"),
            "shape 1-D": ("TpflexShapeError", "shape", "[8]"),
            "shape str": ("TpflexShapeError", "shape", "'8x32'"),
            "comm shape": ("TpflexOverflowError", "shape[1]", str(2 ** 64)),
            "splits wrap": ("TpflexOverflowError", "num_splits", str(2 ** 32 + 1)),
            "splits float": ("TpflexInvalidError", "num_splits", "2.0"),
            "alpha float32": ("TpflexInvalidError", "alpha", "1e+39"),
            "legal_rows float": ("TpflexInvalidError", "rows", "48.9"),
            "legal_rows negative": ("TpflexInvalidError", "tokens", "-1"),
            "legal_rows overflow": ("TpflexOverflowError", "tokens", str(2 ** 64)),
            "get_ub int": ("TpflexInvalidError", "3"),
        }
        self.assertEqual([k for k, _ in out], list(want))
        for label, e in out:
            cls, *words = want[label]
            self.assertIsInstance(e, Err, f"{label}: accepted")
            self.assertEqual(e.cls, cls, f"{label}: {e!r}")
            for w in words:
                self.assertIn(w, e.text, f"{label}: {e!r}")
        for kw, cls, words in (({"tp_size": 2 ** 31}, E.TpflexOverflowError, ("tp_size",)),
                               ({"tp_size": 2, "timeout_ms": -1}, E.TpflexInvalidError,
                                ("timeout_ms", "-1")),
                               ({"tp_size": 2, "seed": 1.5}, E.TpflexInvalidError,
                                ("seed", "1.5"))):
            with self.assertRaises(cls, msg=str(kw)) as cm:
                sim.run(kw.pop("tp_size"), lambda r: r, **kw)
            for w in words:
                self.assertIn(w, str(cm.exception))

    def test_oracle_is_per_element(self):
        """SPEC §7 in the Python oracle (cases.close): an element is wrong iff rel > rtol and
        abs > atol, rel = abs / max(|ref|, 1e-5); NaN/Inf must agree. The max-magnitude-scaled
        atol of before passed a wrong small element next to a large one."""
        bf = torch.bfloat16
        ref = torch.tensor([100.0, 0.0001])
        self.assertFalse(cases.close(torch.tensor([100.0, 0.1]), ref, bf))  # before: passed
        self.assertFalse(cases.close(torch.tensor([100.5, 0.4]), ref, bf))
        self.assertTrue(cases.close(torch.tensor([101.9, 0.0021]), ref, bf))  # rel .019, abs .002
        self.assertFalse(cases.close(torch.tensor([102.1, 0.0001]), ref, bf))  # rel .021
        self.assertTrue(cases.close(torch.tensor([1e-3 + 9e-7]), torch.tensor([1e-3]),
                                    torch.float32))  # abs 9e-7 <= atol 1e-6
        self.assertFalse(cases.close(torch.tensor([1e-3 + 2e-6]), torch.tensor([1e-3]),
                                     torch.float32))
        self.assertFalse(cases.close(torch.tensor([1.0 + 0.0105]), torch.tensor([1.0]),
                                     torch.float16))  # fp16: rtol 0.01
        nan, inf = float("nan"), float("inf")
        self.assertTrue(cases.close(torch.tensor([nan, inf, -inf]), torch.tensor([nan, inf, -inf]),
                                    bf))
        self.assertFalse(cases.close(torch.tensor([nan]), torch.tensor([1.0]), bf))
        self.assertFalse(cases.close(torch.tensor([1.0]), torch.tensor([inf]), bf))
        self.assertFalse(cases.close(torch.tensor([inf]), torch.tensor([-inf]), bf))
        self.assertFalse(cases.close(torch.zeros(2, 3), torch.zeros(3, 2), bf))


if __name__ == "__main__":
    unittest.main(verbosity=2)
