"""The THD block of the benchmarks (examples/bench_thd_step.py, examples/thd_graphed_step.py):
te.TransformerLayer on packed sequences (THD, causal attention within each sequence, every ub_*
overlap on) and the same block in plain PyTorch on this rank's shards (no communication).

Block(x) takes this rank's rows [T/P, H] of a microbatch of T tokens packed as sequences of SEQ
tokens (the last one shorter where SEQ does not divide T): cu_seqlens is built on x's device
from T alone (no host sync, and the same tensor values under a CUDA-graph capture of that T), and
max_seqlen is the int SEQ. A bucket's padded rows come after the real ones, so with the causal
mask they change no real row's output (thd_graphed_step's check compares graphed with eager).
PlainBlock: nn.LayerNorm / nn.Linear on the shard shapes (qkv 3H/P, fc1 4H/P columns) and
torch.nn.functional.scaled_dot_product_attention batched over the equal-length sequences (and
the shorter tail), on all T rows."""
import torch
import torch.nn.functional as Fn

import tpflex.torch as te

SEQ = 64


def heads_for(H: int) -> int:
    """Attention heads: head dim 64 from H = 256 up (TE's usual), 4 heads below."""
    return max(4, H // 64)


def cu_seqlens(T: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, T + SEQ, SEQ, dtype=torch.int32, device=device).clamp_(max=T)


class Block(torch.nn.Module):
    """te.TransformerLayer(H, 4H, heads) on THD with sequences of SEQ tokens."""

    def __init__(self, H, P, dt, dev):
        super().__init__()
        self.P = P
        self.layer = te.TransformerLayer(
            H, 4 * H, heads_for(H), tp_size=P, sequence_parallel=True, set_parallel_mode=True,
            fuse_qkv_params=True, params_dtype=dt, device=dev, attn_input_format="thd",
            self_attn_mask_type="padding_causal", hidden_dropout=0.0, attention_dropout=0.0,
            ub_tp_comm_overlap=True)

    def forward(self, x):
        T = x.shape[0] * self.P
        cu = cu_seqlens(T, x.device)
        return self.layer(x, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=min(SEQ, T),
                          max_seqlen_kv=min(SEQ, T))


class PlainBlock(torch.nn.Module):
    """The same block in plain torch on this rank's shards (heads/P heads, 4H/P MLP columns), on
    all T rows, without communication."""

    def __init__(self, H, P, dt, dev):
        super().__init__()
        kw = dict(dtype=dt, device=dev)
        self.h, self.d = heads_for(H) // P, H // heads_for(H)
        self.ln1, self.ln2 = torch.nn.LayerNorm(H, **kw), torch.nn.LayerNorm(H, **kw)
        self.qkv = torch.nn.Linear(H, 3 * H // P, **kw)
        self.proj = torch.nn.Linear(H // P, H, **kw)
        self.fc1 = torch.nn.Linear(H, 4 * H // P, **kw)
        self.fc2 = torch.nn.Linear(4 * H // P, H, **kw)

    def attention(self, qkv):
        """qkv [n, s, h*3*d] (TE's interleaved rows) -> [n, s, h*d], causal per sequence."""
        n, s = qkv.shape[:2]
        q, k, v = qkv.view(n, s, self.h, 3, self.d).permute(3, 0, 2, 1, 4)
        o = Fn.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(n, s, self.h * self.d)

    def forward(self, x):
        T = x.shape[0]
        full = T - T % SEQ
        a = self.qkv(self.ln1(x))
        parts = [self.attention(a[:full].view(full // SEQ, SEQ, -1)).reshape(full, -1)] \
            if full else []
        if T > full:
            parts.append(self.attention(a[full:][None])[0])
        x = x + self.proj(torch.cat(parts) if len(parts) > 1 else parts[0])
        return x + self.fc2(Fn.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
