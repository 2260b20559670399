"""The transformer layer (SPEC §13) under the precisions of SPEC §14, on the simulator at P = 2:
TE's bf16 pattern (fp32 parameters, torch.autocast(bf16) around the forward) against the same
layer built with bf16 parameters holding the same (rounded) values, and FP8 training
(tpflex.torch.autocast with DelayedScaling and Float8CurrentScaling, FP8 registrations beside
the bf16 ones) against the bf16 layer within FP8's error. THD input: three packed sequences,
causal attention within each, every ub_* overlap on."""
import os
import sys
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402

P, H, C, HEADS = 2, 32, 64, 4
BF = torch.bfloat16
MODES = [te.UserBufferQuantizationMode.NONE, te.UserBufferQuantizationMode.FP8]


def rnd(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1) * scale


def layer(params_dtype):
    return te.TransformerLayer(H, 4 * H, HEADS, tp_size=P, sequence_parallel=True,
                               set_parallel_mode=True, params_dtype=params_dtype, device="cpu",
                               attn_input_format="thd", self_attn_mask_type="padding_causal",
                               hidden_dropout=0.0, attention_dropout=0.0, ub_tp_comm_overlap=True)


def fill(m, seed):
    """The same values on every rank's shard (rounded to bf16, so both dtypes hold them)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(m.named_parameters())):
            p.copy_(rnd(*p.shape, seed=seed + i, scale=0.3).to(BF))
            if p.dim() == 1 and "layer_norm_weight" in _:
                p.add_(1.0)


def step(m, rank, ctx_fn, steps=1):
    """`steps` forward+backward passes at T = C (three sequences): (y, dx, grads) of the last."""
    n = C // P
    x = rnd(C, H, seed=5)[rank * n:(rank + 1) * n]
    dy = rnd(C, H, seed=6, scale=0.1)[rank * n:(rank + 1) * n]
    cu = torch.tensor([0, 1, 40, C], dtype=torch.int32)
    out = None
    for _ in range(steps):
        for p in m.parameters():
            p.grad = None
        xi = x.to(next(m.parameters()).dtype).clone().requires_grad_(True)
        with te.active_tokens(C):
            with ctx_fn():
                y = m(xi, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=39, max_seqlen_kv=39)
            y.backward(dy.to(y.dtype))
        out = (y.detach().float(), xi.grad.float(),
               {k: p.grad for k, p in m.named_parameters()}, y.dtype)
    return out


def on_ranks(body, **kw):
    def f(rank):
        te.initialize_ub([C, H], P, dtype=BF, backend="sim", **kw)
        try:
            torch.manual_seed(0)
            return body(rank)
        finally:
            te.destroy_ub()
    return sim.run(P, f)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


class LayerPrecision(unittest.TestCase):
    def test_torch_autocast_fp32_params(self):
        """fp32 parameters under torch.autocast(bf16) compute as the bf16-parameter layer does:
        outputs and gradients within bf16's rounding, gradients in fp32."""
        def body(rank, dt, auto):
            m = layer(dt)
            fill(m, 100)
            ctx = (lambda: torch.autocast("cpu", dtype=BF)) if auto else torch.enable_grad
            return step(m, rank, ctx)
        got = on_ranks(lambda r: body(r, torch.float32, True))
        ref = on_ranks(lambda r: body(r, BF, False))
        for r in range(P):
            y, dx, g, ydt = got[r]
            yr, dxr, gr, _ = ref[r]
            self.assertEqual(y.shape, yr.shape)
            self.assertEqual(ydt, BF)   # the GEMMs ran in the autocast dtype
            self.assertLess(rel(y, yr), 2 ** -6, f"rank {r}: y")
            self.assertLess(rel(dx, dxr), 2 ** -5, f"rank {r}: dx")
            for k in gr:
                self.assertEqual(g[k].dtype, torch.float32, k)   # the parameters' dtype
                if k.endswith("key_bias"):   # exactly 0 in exact arithmetic (softmax's shift
                    continue                 # invariance): both are rounding noise
                self.assertLess(rel(g[k], gr[k]), 2 ** -4, f"rank {r}: {k}")

    def test_fp8_recipes_within_fp8_error(self):
        """FP8 (delayed after 3 steps, and current scaling) against the same layer under
        torch.autocast(bf16): normwise relative error of the output within twice E4M3's
        roundoff (2^-4 per operand); a gradient passes up to two FP8 GEMMs in sequence (a dgrad
        in E5M2, 2^-3, then the wgrad or dgrad before it), so within twice one GEMM's bound
        (2 (2^-4 + 2^-3)). Measured here: y 0.07, gradients 0.07-0.25."""
        def body(rank, recipe):
            m = layer(torch.float32)
            fill(m, 200)
            if recipe is None:
                return step(m, rank, lambda: torch.autocast("cpu", dtype=BF))

            def ctx():
                a, f = torch.autocast("cpu", dtype=BF), te.autocast(recipe=recipe)
                import contextlib
                s = contextlib.ExitStack()
                s.enter_context(a)
                s.enter_context(f)
                return s
            return step(m, rank, ctx, steps=3)
        ref = on_ranks(lambda r: body(r, None), quantization_modes=MODES)
        for recipe in (te.DelayedScaling(amax_history_len=4), te.Float8CurrentScaling()):
            got = on_ranks(lambda r: body(r, recipe), quantization_modes=MODES)
            for r in range(P):
                y, dx, g, _ = got[r]
                yr, dxr, gr, _ = ref[r]
                e = rel(y, yr)
                self.assertLess(e, 2 * 2 ** -4, f"{type(recipe).__name__} rank {r}: y")
                self.assertGreater(e, 0.0)   # FP8 did run
                bound = 2 * (2 ** -4 + 2 ** -3)
                self.assertLess(rel(dx, dxr), bound, f"rank {r}: dx")
                for k in gr:
                    if not k.endswith("key_bias"):   # 0 in exact arithmetic: noise on both
                        self.assertLess(rel(g[k], gr[k]), bound, f"rank {r}: {k}")

    def test_fp8_operations_take_operands_as_they_multiply(self):
        """cuBLASLt runs FP8 GEMMs in the TN layout only (the CUDA backend refuses trans_a /
        trans_w with FP8 operands), so every FP8 operation of the layer's forward and backward
        gets its operands stored as they multiply (a cached transpose), never a trans flag:
        found on an H100 at P = 2, where the row-parallel dgrad's RING AG passed trans_w."""
        from tpflex import _comm
        fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
        seen = []

        def spy(name):
            real = getattr(_comm.Communicator, name)

            def op(self, *args, **kw):
                if any(isinstance(a, torch.Tensor) and a.dtype in fp8 for a in args):
                    seen.append((self.name, name, kw.get("trans_a", False),
                                 kw.get("trans_w", False)))
                return real(self, *args, **kw)
            return real, op
        saved = {n: spy(n) for n in ("ag_gemm", "gemm_rs", "bulk_overlap")}

        def body(rank):
            m = layer(BF)
            fill(m, 300)
            return step(m, rank, lambda: te.autocast(recipe=te.DelayedScaling()))
        try:
            for n, (_, op) in saved.items():
                setattr(_comm.Communicator, n, op)
            on_ranks(body, quantization_modes=MODES)
        finally:
            for n, (real, _) in saved.items():
                setattr(_comm.Communicator, n, real)
        ops = {(c, o) for c, o, _, _ in seen}
        self.assertTrue({("proj_dgrad.fp8", "ag_gemm"), ("fc1_wgrad", "bulk_overlap")} <= ops
                        or len(ops) >= 6, sorted(ops))   # the backward's FP8 operations ran
        self.assertEqual([s for s in seen if s[2] or s[3]], [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
