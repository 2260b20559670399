"""tpflex Python package on the simulator: every operation and every option against torch
references over random T sequences (P in 1, 2, 4; fp32, bf16, fp16), and every error path
(the cases shared with test_cuda.py live in cases.py), plus what only the simulator runner has.
unittest style (runs under `python3 -m unittest` and pytest)."""
import ctypes
import os
import re
import sys
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

    @unittest.skipUnless(hasattr(tt.Communicator, "abort"), "libtpflex has no tpf_comm_abort")
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

    @unittest.skipUnless(L.HAVE_BACKEND_CAPS, "libtpflex has no tpf_comm_backend_caps")
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
            cfg = L.CommConfig(size=ctypes.sizeof(L.CommConfig) + 8, name=b"x", capacity=L.Shape(C, H))
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
        with self.assertRaisesRegex(ValueError, "rank 1"):
            sim.run(3, f)


if __name__ == "__main__":
    unittest.main(verbosity=2)
