"""The THD attention's varlen path (CUDA, bf16) and the padding tokens past cu_seqlens[-1]: torch's
varlen kernel leaves their output rows and, in its backward, their dq/dk/dv rows unwritten. On an
H100 at P = 2 (T padded to a multiple of P) those rows reached the qkv weight and norm gradients
and the THD example diverged. Here, on the CPU, a stand-in for the kernel that writes garbage into
exactly those rows (forward and backward) replaces torch's; the layer's gradients must equal the
masked-SDPA path's (which never reads the padding)."""
import os
import sys
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex.torch.attention import dot_product_attention as dpa  # noqa: E402

P, H, HEADS = 2, 32, 4
GARBAGE = 1.0e3


class _Unwritten(torch.autograd.Function):
    """Attention within each sequence of cu (causal), rows past cu[-1] left as 'garbage' in the
    output and in dq / dk / dv, as a kernel that never writes them."""

    @staticmethod
    def forward(ctx, q, k, v, cu, causal, scale):
        ctx.save_for_backward(q, k, v, cu)
        ctx.causal, ctx.scale = causal, scale
        with torch.enable_grad():
            o = _ref(q, k, v, cu, causal, scale)
        out = torch.full_like(q, GARBAGE)
        n = int(cu[-1])
        out[:n] = o[:n].detach()
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, cu = ctx.saved_tensors
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            o = _ref(qq, kk, vv, cu, ctx.causal, ctx.scale)
            n = int(cu[-1])
            dq, dk, dv = torch.autograd.grad(o[:n], (qq, kk, vv), do[:n])
        for g in (dq, dk, dv):
            g[n:] = GARBAGE
        return dq, dk, dv, None, None, None


def _ref(q, k, v, cu, causal, scale):
    """[T, h, d] attention per sequence (fp32), zeros past cu[-1]."""
    parts = []
    c = cu.tolist()
    for a, b in zip(c, c[1:]):
        if b > a:
            o = Fn.scaled_dot_product_attention(q[a:b].transpose(0, 1).float(),
                                                k[a:b].transpose(0, 1).float(),
                                                v[a:b].transpose(0, 1).float(),
                                                is_causal=causal, scale=scale)
            parts.append(o.transpose(0, 1).to(q.dtype))
    parts.append(torch.zeros_like(q[c[-1]:]))
    return torch.cat(parts)


def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, is_causal=False,
                window_size=None, enable_gqa=False, **_):
    causal = is_causal or (window_size is not None and tuple(window_size) == (-1, 0))
    return _Unwritten.apply(q, k, v, cu_q, causal, scale)


def grads(rank, use_fake):
    C = 64
    te.initialize_ub([C, H], P, dtype=torch.bfloat16, backend="sim")
    saved = (dpa._varlen_attn, dpa._use_varlen)
    try:
        torch.manual_seed(0)
        m = te.TransformerLayer(H, 4 * H, HEADS, tp_size=P, sequence_parallel=True,
                                set_parallel_mode=True, fuse_qkv_params=True,
                                params_dtype=torch.bfloat16, device="cpu",
                                attn_input_format="thd", self_attn_mask_type="padding_causal",
                                hidden_dropout=0.0, attention_dropout=0.0,
                                ub_tp_comm_overlap=True)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (p.dim() == 1) * 0.5)
        if use_fake:
            dpa._varlen_attn = fake_varlen
            dpa._use_varlen = lambda *a, **k: True
        T_raw, T = 41, 42                       # one padding row (T a multiple of P)
        x = torch.randn(T, H, generator=g).to(torch.bfloat16)
        dy = torch.randn(T, H, generator=g).to(torch.bfloat16)
        dy[T_raw:] = 0                          # the loss masks the padding row
        cu = torch.tensor([0, 1, 20, T_raw], dtype=torch.int32)
        mine = slice(rank * T // P, (rank + 1) * T // P)
        xl = x[mine].clone().requires_grad_(True)
        with te.active_tokens(T):
            y = m(xl, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=21, max_seqlen_kv=21)
            y.backward(dy[mine])
        return {n: p.grad.float().clone() for n, p in m.named_parameters()}
    finally:
        dpa._varlen_attn, dpa._use_varlen = saved
        te.destroy_ub()


class VarlenPadding(unittest.TestCase):
    def test_padding_rows_reach_no_gradient(self):
        ref = sim.run(P, lambda r: grads(r, False))
        got = sim.run(P, lambda r: grads(r, True))
        for r in range(P):
            for n, g in ref[r].items():
                e = float((got[r][n] - g).norm() / max(float(g.norm()), 1e-6))
                self.assertLess(e, 3e-2, f"rank {r}: {n} (relative error {e:.3g})")


if __name__ == "__main__":
    unittest.main(verbosity=2)
