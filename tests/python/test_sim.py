"""tpflex Python package on the simulator: every operation against torch references over random
T sequences (P in 1, 2, 4; fp32 and bf16), and every error path. unittest style (runs under
`python3 -m unittest` and pytest)."""
import os
import random
import sys
import time
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402

import tpflex  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402

H = 32
C = 64
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (0.02, 0.002)}
RING_RS = {"ring_rs": {"method": "ring", "coll": "rs"}}


def _t_sequence(P, n, rng):
    return [P * rng.randint(1, C // P) for _ in range(n)]


def _close(got, ref, dtype):
    rtol, atol = TOL[dtype]
    return torch.allclose(got.float(), ref.float(), rtol=rtol, atol=atol * max(1.0, ref.abs().max().item()))


class OperationsVsTorch(unittest.TestCase):
    def _check_all(self, P, dtype, steps=4, max_delay_us=0):
        rng = random.Random(1000 + P)
        g = torch.Generator().manual_seed(P)
        Ts = _t_sequence(P, steps, rng)
        N, K, M = 24, 16, 8
        data = []
        for T in Ts:
            d = {
                "x": [torch.randn(T // P, H, generator=g).to(dtype) for _ in range(P)],
                "w_ag": [torch.randn(N, H, generator=g).to(dtype) for _ in range(P)],
                "x_rs": [torch.randn(T, K, generator=g).to(dtype) for _ in range(P)],
                "w_rs": [torch.randn(H, K, generator=g).to(dtype) for _ in range(P)],
                "a": [torch.randn(M, K, generator=g).to(dtype) for _ in range(P)],
                "b": [torch.randn(N, K, generator=g).to(dtype) for _ in range(P)],
                "part": [torch.randn(T, H, generator=g).to(dtype) for _ in range(P)],
            }
            data.append((T, d))

        def body(r):
            mgr = tt.initialize_ub([C, H], P, dtype=dtype, ub_cfgs=RING_RS)
            fails = []
            for T, d in data:
                tt.set_ub_active_shape([T, H])
                rows = slice(r * T // P, (r + 1) * T // P)
                X = torch.cat(d["x"]).float()
                # ag_gemm (RING AG)
                ub = tt.get_ub("fc1_fprop")
                assert ub.active_shape == (T, H) and ub.capacity_shape == (C, H)
                ub.local_chunk().copy_(d["x"][r])
                y = ub.ag_gemm(d["w_ag"][r])
                if not _close(y, X @ d["w_ag"][r].float().T, dtype):
                    fails.append(("ag_gemm", T))
                if not torch.equal(ub.buffer().float(), X):
                    fails.append(("ag_gemm buffer", T))
                y32 = torch.empty(T, 24, dtype=torch.float32)
                ub.local_chunk().copy_(d["x"][r])
                ub.ag_gemm(d["w_ag"][r], out=y32)
                if not _close(y32, X @ d["w_ag"][r].float().T, dtype):
                    fails.append(("ag_gemm fp32 out", T))
                # gemm_rs: PIPELINE (fc2_fprop) and RING (ring_rs)
                S = sum(xr.float() @ wr.float().T for xr, wr in zip(d["x_rs"], d["w_rs"]))
                for name in ("fc2_fprop", "ring_rs"):
                    o = tt.get_ub(name).gemm_rs(d["x_rs"][r], d["w_rs"][r])
                    if o.shape != (T // P, H) or not _close(o, S[rows], dtype):
                        fails.append((name, T))
                # bulk AG (fc1_dgrad): buffer gathers, GEMM beside it
                ub = tt.get_ub("fc1_dgrad")
                ub.local_chunk().copy_(d["x"][r])
                o = ub.bulk_overlap(d["a"][r], d["b"][r])
                if not _close(o, d["a"][r].float() @ d["b"][r].float().T, dtype):
                    fails.append(("bulk ag gemm", T))
                if not torch.equal(ub.buffer().float(), X):
                    fails.append(("bulk ag buffer", T))
                # bulk RS (fc1_wgrad): partials reduced into the local chunk
                ub = tt.get_ub("fc1_wgrad")
                ub.buffer().copy_(d["part"][r])
                ub.bulk_overlap(d["a"][r], d["b"][r])
                R = sum(p.float() for p in d["part"])[rows]
                if not _close(ub.local_chunk(), R, dtype):
                    fails.append(("bulk rs", T))
            epochs = tt.get_ub("fc1_fprop").epoch
            n = len(mgr)
            tt.destroy_ub()
            return fails, epochs, n

        res = sim.run(P, body, timeout_ms=5000, max_delay_us=max_delay_us)
        for r, (fails, epochs, n) in enumerate(res):
            self.assertEqual(fails, [], f"P={P} {dtype} rank {r} T={Ts}")
            self.assertEqual(epochs, len(Ts))
            self.assertEqual(n, len(tt.DEFAULT_UB_CFGS) + 1)

    def test_p1_fp32(self):
        self._check_all(1, torch.float32)

    def test_p2_fp32(self):
        self._check_all(2, torch.float32)

    def test_p4_fp32(self):
        self._check_all(4, torch.float32)

    def test_p2_bf16(self):
        self._check_all(2, torch.bfloat16)

    def test_p4_bf16(self):
        self._check_all(4, torch.bfloat16)

    def test_p4_fp32_random_step_delays(self):
        self._check_all(4, torch.float32, steps=2, max_delay_us=50)

    def test_fp16_p2(self):
        TOL[torch.float16] = (0.01, 0.001)
        self._check_all(2, torch.float16, steps=2)


def _run_expect(P, body, *args, timeout_ms=3000):
    """Runs body on every rank; returns per-rank exceptions (None when the rank succeeded)."""
    def wrap(r):
        tt.initialize_ub([C, H], P, dtype=torch.bfloat16)
        try:
            body(r, *args)
            return None
        except tpflex.TpflexError as e:
            return e
        finally:
            tt.destroy_ub()
    return sim.run(P, wrap, timeout_ms=timeout_ms)


class ErrorPaths(unittest.TestCase):
    def _one(self, fn, exc, *words):
        errs = _run_expect(2, fn)
        for r, e in enumerate(errs):
            self.assertIsInstance(e, exc, f"rank {r}: {e!r}")
            for w in words:
                self.assertIn(w, str(e), f"rank {r}")
        return errs

    def test_wrong_dtype(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.float32))
        self._one(f, E.TpflexInvalidError, "weight", "float32", "bfloat16", "fc1_fprop")

    def test_wrong_device(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16, device="meta"))
        self._one(f, E.TpflexInvalidError, "weight", "meta", "cpu")

    def test_wrong_shape_names_both(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc2_fprop").gemm_rs(torch.zeros(8, 16, dtype=torch.bfloat16),
                                           torch.zeros(H, 12, dtype=torch.bfloat16))
        self._one(f, E.TpflexShapeError, "weight", "[32, 12]", "[32, 16]")

    def test_wrong_out_shape(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16),
                                           out=torch.zeros(6, 4, dtype=torch.bfloat16))
        self._one(f, E.TpflexShapeError, "out", "[6, 4]", "[8, 4]")

    def test_wrong_stride(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            w = torch.zeros(H, 4, dtype=torch.bfloat16).t()  # [4, H], column-major
            tt.get_ub("fc1_fprop").ag_gemm(w)
        self._one(f, E.TpflexShapeError, "weight", "strides")

    def test_padded_ld_is_accepted(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            base = torch.ones(4, H + 8, dtype=torch.bfloat16)
            tt.get_ub("fc1_fprop").local_chunk().fill_(1)
            y = tt.get_ub("fc1_fprop").ag_gemm(base[:, :H])
            assert torch.all(y == H), y
        self.assertEqual(_run_expect(2, f), [None, None])

    def test_capacity(self):
        errs = self._one(lambda r: tt.set_ub_active_shape([C + 2, H]), E.TpflexCapacityError,
                         str(C + 2), str(C))
        self.assertEqual(errs[0].status_name, "TPF_ECAPACITY")
        self.assertIn("exceed capacity", errs[0].detail)  # tpf_last_error() text
        self.assertEqual(errs[0].status, 3)

    def test_divisible(self):
        self._one(lambda r: tt.set_ub_active_shape([7, H]), E.TpflexDivisibleError, "7")

    def test_all_or_nothing(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            try:
                tt.set_ub_active_shape([C + 2, H])
            except E.TpflexCapacityError:
                pass
            assert tt.get_ub("fc1_fprop").active_shape == (8, H)
            assert tt.get_ub("fc1_fprop").epoch == 1
        self.assertEqual(_run_expect(2, f), [None, None])

    def test_mismatch_every_rank(self):
        def f(r):
            tt.set_ub_active_shape([8 if r == 1 else 4, H])
            ub = tt.get_ub("fc1_fprop")
            ub.ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
        errs = _run_expect(2, f)
        for r, e in enumerate(errs):
            self.assertIsInstance(e, E.TpflexMismatchError, f"rank {r}: {e!r}")
            self.assertEqual(e.status_name, "TPF_EMISMATCH")
            self.assertIn("[8, 32]", e.detail)
            self.assertIn("[4, 32]", e.detail)

    def test_timeout(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            if r == 0:
                tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
        t0 = time.monotonic()
        errs = _run_expect(2, f, timeout_ms=300)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIsInstance(errs[0], E.TpflexTimeoutError, repr(errs[0]))
        self.assertTrue(errs[0].detail, "timeout carries tpf_last_error() text")
        self.assertIsNone(errs[1])

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

    def test_unsupported_options(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16), transb=True)
        self._one(f, E.TpflexUnsupportedError, "transb")

    def test_default_options_accepted(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16), alpha=1.0,
                                           beta=0.0, bias=None, gelu=False, transa=False)
        self.assertEqual(_run_expect(2, f), [None, None])

    def test_cuda_backend_unsupported_here(self):
        with self.assertRaises(E.TpflexUnsupportedError):
            tt.initialize_ub([C, H], 1, backend="cuda")

    def test_sim_backend_outside_run(self):
        with self.assertRaises(E.TpflexStateError):
            tt.initialize_ub([C, H], 1, backend="sim")

    @unittest.skipUnless(hasattr(tt.Communicator, "abort"), "libtpflex has no tpf_comm_abort")
    def test_sync_async_error_abort(self):
        def f(r):
            tt.set_ub_active_shape([8, H])
            ub = tt.get_ub("fc1_fprop")
            ub.ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
            ub.sync()
            assert ub.async_error() is None
            ub.abort()
            ub.ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16))
        errs = _run_expect(2, f)
        for r, e in enumerate(errs):
            self.assertIsInstance(e, E.TpflexStateError, f"rank {r}: {e!r}")
            self.assertIn("abort", e.detail)

    def test_unknown_name(self):
        self._one(lambda r: tt.get_ub("nope"), E.TpflexInvalidError, "nope")

    def test_classes(self):
        self.assertEqual(len(E.STATUS_CLASSES), 12)
        for st, cls in E.STATUS_CLASSES.items():
            self.assertTrue(issubclass(cls, tpflex.TpflexError))
            from tpflex._lib import status_name
            self.assertEqual(cls.status_name, status_name(st))

    def test_results_in_rank_order_and_first_exception(self):
        self.assertEqual(sim.run(4, lambda r, k: r * k, 3), [0, 3, 6, 9])

        def f(r):
            if r >= 1:
                raise ValueError(f"rank {r}")
        with self.assertRaisesRegex(ValueError, "rank 1"):
            sim.run(3, f)


if __name__ == "__main__":
    unittest.main(verbosity=2)
