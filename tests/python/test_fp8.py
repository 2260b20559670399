"""FP8 communicators through Python on the simulator (docs/SPEC.md §11): initialize_ub(use_fp8=True)
registers TE's fp8_buf sites in FP8 (torch.float8_e4m3fn, float8_e5m2 for the gradient sites),
they follow the active shape, and every operation with fp8 operands and a_scale_inv= /
w_scale_inv= matches an fp32 reference (the fp8 values decoded exactly, products summed in fp32,
scaled once) under SPEC §7's per-element verdict (bf16's tolerances for FP8 inputs, any D). Errors name the tensor."""
import os
import sys
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from cases import close, close_rs, mm, rs_reference  # noqa: E402
from tpflex import errors as E  # noqa: E402

H, C = 32, 64
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
SA, SW = 0.75, 2.0  # the scales: without them every result is off by 1.5x
CFGS = {"ring_rs": {"method": "ring", "coll": "rs"}}
BF16_TOL = torch.bfloat16  # SPEC §7: FP8-input GEMMs are judged with bf16's tolerances, any D


def fp8(shape, dtype, seed):
    """Random values in [-1, 1) rounded to `dtype` (torch's cast: round to nearest even)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def scales():
    return torch.tensor([SA]), torch.tensor([SW])


def run(P, body):
    def f(rank):
        tt.initialize_ub([C, H], P, use_fp8=True, ub_cfgs=CFGS, backend="sim")
        try:
            return body(P, rank)
        finally:
            tt.destroy_ub()
    return sim.run(P, f)


def ag_case(P, r, site, wdt, T, out_dtype):
    """ag_gemm on an fp8 ring AG site: every rank makes every shard from its seed."""
    tt.set_ub_active_shape([T, H])
    c = tt.get_ub(site)
    bdt = c.dtype
    shards = [fp8((T // P, H), bdt, 100 + q + T) for q in range(P)]
    c.local_chunk().copy_(shards[r])
    w = fp8((24, H), wdt, 7 + T)
    sa, sw = scales()
    if out_dtype is None:
        d = c.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw)
    else:
        d = c.ag_gemm(w, out=torch.empty(T, 24, dtype=out_dtype), a_scale_inv=sa, w_scale_inv=sw)
    x = torch.cat(shards)
    ref = mm(x, w) * (SA * SW)
    gathered_ok = torch.equal(c.buffer().view(torch.uint8), x.view(torch.uint8))
    return d.dtype, close(d, ref, BF16_TOL), gathered_ok


class Fp8(unittest.TestCase):
    def test_sites_register_in_fp8_and_follow_the_shape(self):
        def body(P, r):
            dts = {n: tt.get_ub(n).dtype for n in ("qkv_fprop", "fc1_fprop", "proj_dgrad",
                                                   "qkv_dgrad", "proj_fprop", "fc2_fprop",
                                                   "ring_rs", "fc1_wgrad", "proj_wgrad")}
            shapes = []
            for T in (16, 48, 4, C):
                tt.set_ub_active_shape([T, H])
                shapes.append(tuple(tt.get_ub("fc1_fprop").buffer().shape))
            return dts, shapes
        dts, shapes = run(2, body)[0]
        self.assertEqual(dts["qkv_fprop"], E4)
        self.assertEqual(dts["fc1_fprop"], E4)
        self.assertEqual(dts["qkv_dgrad"], E4)
        self.assertEqual(dts["proj_dgrad"], E5)
        for n in ("proj_fprop", "fc2_fprop", "ring_rs", "fc1_wgrad", "proj_wgrad"):
            self.assertEqual(dts[n], torch.bfloat16, n)
        self.assertEqual(shapes, [(16, H), (48, H), (4, H), (C, H)])

    def test_ag_gemm_e4m3_and_e5m2(self):
        for P in (1, 2, 4):
            def body(P, r):
                res = []
                for T, site, wdt, od in ((16, "fc1_fprop", E4, None), (48, "fc1_fprop", E5,
                                         torch.float32), (8, "proj_dgrad", E4, torch.float16),
                                         (C, "qkv_fprop", E4, torch.bfloat16)):
                    res.append((T, site) + ag_case(P, r, site, wdt, T, od))
                return res
            for r, res in enumerate(run(P, body)):
                for T, site, dt, ok, gathered in res:
                    self.assertTrue(ok, f"P={P} rank {r} {site} T={T} D {dt}")
                    self.assertTrue(gathered, f"P={P} rank {r} {site} T={T}: gathered bytes")
                self.assertEqual(res[0][2], torch.bfloat16)  # the default D of an fp8 GEMM

    def test_gemm_rs_fp8_operands_reduce_in_fp32(self):
        K = 16
        for P in (1, 2, 4):
            def body(P, r):
                res = []
                for site in ("fc2_fprop", "ring_rs"):
                    for T, od in ((16, None), (32, torch.float32)):
                        tt.set_ub_active_shape([T, H])
                        c = tt.get_ub(site)
                        xs = [fp8((T, K), E4, 300 + q + T) for q in range(P)]
                        ws = [fp8((H, K), E5 if T == 16 else E4, 400 + q + T) for q in range(P)]
                        sa, sw = scales()
                        out = None if od is None else torch.empty(T // P, H, dtype=od)
                        got = c.gemm_rs(xs[r], ws[r], out=out, a_scale_inv=sa, w_scale_inv=sw)
                        R = T // P
                        parts = [(mm(xs[q], ws[q]) * (SA * SW))[r * R:(r + 1) * R]
                                 for q in range(P)]
                        ref, slack = rs_reference(parts, torch.bfloat16)  # the bf16 buffer
                        res.append((site, T, got.dtype, close_rs(got, ref, slack, BF16_TOL, got.dtype)))
                return res
            for r, res in enumerate(run(P, body)):
                for site, T, dt, ok in res:
                    self.assertTrue(ok, f"P={P} rank {r} {site} T={T} out {dt}")

    def test_bulk_ag_moves_fp8_bytes_and_runs_an_fp8_gemm(self):
        for P in (1, 2, 4):
            def body(P, r):
                T = 16
                tt.set_ub_active_shape([T, H])
                c = tt.get_ub("qkv_dgrad")
                shards = [fp8((T // P, H), E4, 500 + q) for q in range(P)]
                c.local_chunk().copy_(shards[r])
                a, b = fp8((8, 16), E5, 600 + r), fp8((24, 16), E4, 700 + r)
                sa, sw = scales()
                d = c.bulk_overlap(a, b, a_scale_inv=sa, w_scale_inv=sw)
                ok = close(d, mm(a, b) * (SA * SW), BF16_TOL)
                x = torch.cat(shards)
                return ok, d.dtype, torch.equal(c.buffer().view(torch.uint8), x.view(torch.uint8))
            for r, (ok, dt, gathered) in enumerate(run(P, body)):
                self.assertTrue(ok and gathered, f"P={P} rank {r}: D ok {ok}, gathered {gathered}")
                self.assertEqual(dt, torch.bfloat16)

    def test_the_verdict_sees_missing_scales(self):
        """The reference check is not vacuous: the same call with scales of 1 differs by 1.5x."""
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            c = tt.get_ub("fc1_fprop")
            c.local_chunk().copy_(fp8((16, H), E4, 1))
            w = fp8((24, H), E4, 2)
            one = torch.tensor([1.0])
            d = c.ag_gemm(w, a_scale_inv=one, w_scale_inv=one)
            return close(d, mm(c.buffer(), w) * (SA * SW), BF16_TOL)
        self.assertFalse(run(1, body)[0])

    def test_errors_name_the_tensor(self):
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            c = tt.get_ub("fc1_fprop")
            w4, w5 = fp8((24, H), E4, 1), fp8((24, H), E5, 2)
            sa, sw = scales()
            errs = {}

            def expect(key, cls, fn):
                try:
                    fn()
                    errs[key] = "no error"
                except cls as e:
                    errs[key] = str(e)
            expect("missing w scale", E.TpflexInvalidError, lambda: c.ag_gemm(w4, a_scale_inv=sa))
            expect("bf16 weight", E.TpflexInvalidError,
                   lambda: c.ag_gemm(torch.zeros(24, H, dtype=torch.bfloat16), a_scale_inv=sa))
            expect("two-element scale", E.TpflexInvalidError,
                   lambda: c.ag_gemm(w4, a_scale_inv=torch.ones(2), w_scale_inv=sw))
            expect("fp16 scale", E.TpflexInvalidError,
                   lambda: c.ag_gemm(w4, a_scale_inv=sa.half(), w_scale_inv=sw))
            p = tt.get_ub("proj_dgrad")  # e5m2 buffer
            expect("e5m2 x e5m2", E.TpflexUnsupportedError,
                   lambda: p.ag_gemm(w5, a_scale_inv=sa, w_scale_inv=sw))
            expect("fp8 out", E.TpflexInvalidError,
                   lambda: c.ag_gemm(w4, out=torch.empty(16, 24, dtype=E4), a_scale_inv=sa,
                                     w_scale_inv=sw))
            rs = tt.get_ub("fc2_fprop")
            expect("scale on bf16 x", E.TpflexInvalidError,
                   lambda: rs.gemm_rs(torch.zeros(16, 16, dtype=torch.bfloat16),
                                      torch.zeros(H, 16, dtype=torch.bfloat16), a_scale_inv=sa))
            expect("fp8 x, bf16 w", E.TpflexInvalidError,
                   lambda: rs.gemm_rs(fp8((16, 16), E4, 3),
                                      torch.zeros(H, 16, dtype=torch.bfloat16), a_scale_inv=sa))
            expect("scale not a tensor", E.TpflexInvalidError,
                   lambda: c.ag_gemm(w4, a_scale_inv=0.5, w_scale_inv=sw))
            return errs
        errs = run(1, body)[0]
        want = {"missing w scale": "weight has dtype torch.float8_e4m3fn and needs its scale",
                # the operand rules are the C rulebook's (tpf_check_operands): C dtype names
                "bf16 weight": "weight has dtype bf16, expected fp8_e4m3 or fp8_e5m2",
                "two-element scale": "a_scale_inv (the scale of the buffer)",
                "fp16 scale": "a_scale_inv (the scale of the buffer) has dtype torch.float16",
                "e5m2 x e5m2": "are both fp8_e5m2",
                "fp8 out": "out has dtype fp8_e4m3; the output of an fp8 GEMM",
                "scale on bf16 x": "a_scale_inv is set but x has dtype bf16",
                "fp8 x, bf16 w": "x has dtype fp8_e4m3 but weight has bf16",
                "scale not a tensor": "a_scale_inv must be a one-element float32 torch.Tensor"}
        for k, v in want.items():
            self.assertIn(v, errs[k], k)

    def test_repeated_calls_take_the_fast_path_with_the_scales_of_the_call(self):
        """An fp8 signature that passed its checks is remembered (tpflex._comm's eager fast
        path): the repeated call gives the same bits, reads the scales' values at the call (a
        scale changed in place, another scale tensor), and a call without a scale is still
        refused naming the tensor."""
        def body(P, r):
            tt.set_ub_active_shape([16, H])
            c = tt.get_ub("fc1_fprop")
            c.local_chunk().copy_(fp8((16 // P, H), E4, 40 + r))
            w = fp8((24, H), E5, 41)
            sa, sw = scales()
            first = c.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw)
            n = len(c._memo)
            again = c.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw)
            sa.mul_(2)
            doubled = c.ag_gemm(w, a_scale_inv=sa, w_scale_inv=sw)
            other = c.ag_gemm(w, a_scale_inv=torch.tensor([SA * 4]), w_scale_inv=sw)
            try:
                c.ag_gemm(w, a_scale_inv=sa)
                err = "no error"
            except E.TpflexInvalidError as e:
                err = str(e)
            return (n, len(c._memo), torch.equal(first, again),
                    torch.equal(doubled, (first.float() * 2).to(first.dtype)),
                    torch.equal(other, (first.float() * 4).to(first.dtype)), err)
        for r, (n0, n1, same, doubled, other, err) in enumerate(run(2, body)):
            self.assertEqual((n0, n1), (1, 1), f"rank {r}: one signature remembered")
            self.assertTrue(same and doubled and other, f"rank {r}: {same} {doubled} {other}")
            self.assertIn("weight has dtype torch.float8_e5m2 and needs its scale", err)

    def test_fp8_buf_on_a_reduce_scatter_site_is_refused(self):
        def body(P, r):
            try:
                tt.initialize_ub([C, H], P, use_fp8=True, backend="sim",
                                 ub_cfgs={"fc2_fprop": {"fp8_buf": True}})
            except E.TpflexUnsupportedError as e:
                return str(e)
            tt.destroy_ub()
            return "no error"
        self.assertIn("fc2_fprop", run(1, body)[0])


if __name__ == "__main__":
    unittest.main()
