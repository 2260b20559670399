"""TransformerLayer, MultiheadAttention, LayerNormLinear, LayerNorm and RMSNorm
(python/tpflex/torch/) on the simulator (SPEC §13).

The layer on THD: P in 1, 2, 4, bf16 and fp32, six microbatches under one registration whose T
and sequence boundaries change (a sequence of length 1, one filling the capacity, many short
ones, a padded tail past cu_seqlens[-1]); causal and not; GQA; the ub overlaps (TE's
ub_tp_comm_overlap with its per-site flags) and the plain path. The output, the input gradient
and every parameter gradient are judged against an unsharded fp64 reference of the same math
with SPEC §7's per-element verdict (test_layers.verdict): the reference's attention is its own
(a loop over the sequences, softmax in fp64), its linears nn.Linear's, and it rounds to the
compute dtype where the module stores a tensor (test_layers.q / col_linear / row_linear), so
the bf16 comparison is one of the same rounding points. Reduced results (row-parallel outputs,
summed partial gradients) carry SPEC §7's partial-rounding slack; fp64 sums of token rows carry
the fp32 summation bound (test_layers.sum_slack).

TE's layer-overlap test (tests/pytorch/distributed/run_layer_with_overlap.py), in our words:
each layer type (Linear column/row, LayerNormLinear, LayerNormMLP, MultiheadAttention,
TransformerLayer) built twice from one seed, with the ub flags that test sets and without
them ("reference"), on the same inputs; the outputs and every parameter gradient of the two
runs are compared (TE: max abs diff within its tolerance; here SPEC §7 per element), with
ub_overlap_rs_dgrad and with the bulk dgrad/wgrad overlaps.
unittest style."""
import copy
import io
import os
import sys
import unittest
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex import errors as E  # noqa: E402
from test_layers import (F64, col_linear, q, row_linear, sum_slack, ulp,  # noqa: E402
                         verdict)

H, FF, NH, C = 32, 64, 8, 48
D = H // NH
RS_DGRAD = {"qkv_dgrad": {"method": "pipeline", "coll": "rs"},
            "fc1_dgrad": {"method": "pipeline", "coll": "rs"}}
# Six microbatches: (T, sequence lengths). T is a multiple of 4 (every P divides it); the
# last entry's sequences end before T (a padded tail, zero attention output as TE's).
MBS = [(16, [1, 15]), (48, [48]), (40, [3, 5, 2, 7, 1, 4, 6, 8, 4]), (8, [8]),
       (32, [1, 1, 1, 29]), (24, [12, 9])]


def cu_of(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


# ---- the unsharded reference --------------------------------------------------------------------

def ref_attention(qh, kh, vh, lens, causal):
    """qh [T, nq, d], kh/vh [T, ng, d] (fp64): each sequence on its own, query head h on group
    h // (nq / ng); tokens past the sequences get 0."""
    T, nq, d = qh.shape
    rep = nq // kh.shape[1]
    k = kh.repeat_interleave(rep, 1)
    v = vh.repeat_interleave(rep, 1)
    outs, s0 = [], 0
    for n in lens:
        qs, ks, vs = qh[s0:s0 + n], k[s0:s0 + n], v[s0:s0 + n]
        sc = torch.einsum("ihd,jhd->hij", qs, ks) / d ** 0.5
        if causal:
            sc = sc.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", sc.softmax(-1), vs))
        s0 += n
    if s0 < T:
        outs.append(torch.zeros(T - s0, nq, d, dtype=qh.dtype) * qh[s0:].sum())
    return torch.cat(outs).reshape(T, nq * d)


def split_heads(blk, npp, ngp, interleaved=True):
    """One rank's fused qkv columns [T, (npp + 2 ngp) d] -> q, k, v (TE's layout)."""
    T = blk.shape[0]
    r = npp // ngp
    if interleaved:
        m = blk.reshape(T, ngp, r + 2, D)
        return (m[:, :, :r].reshape(T, npp, D), m[:, :, r].reshape(T, ngp, D),
                m[:, :, r + 1].reshape(T, ngp, D))
    m = blk.reshape(T, r + 2, ngp, D)
    return (m[:, :r].reshape(T, npp, D), m[:, r].reshape(T, ngp, D),
            m[:, r + 1].reshape(T, ngp, D))


def lin(w, b=None):
    m = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, dtype=F64)
    with torch.no_grad():
        m.weight.copy_(w)
        if b is not None:
            m.bias.copy_(b)
    return m


def add(a, b, dt):
    return q(a + b, dt)


def ref_layer(p, x, dy, lens, dt, P, groups, causal, fused=True):
    """TransformerLayer's reference: (out, dx, {param name: grad}, {name: slack})."""
    ln1 = torch.nn.LayerNorm(H, eps=1e-5, dtype=F64)
    ln2 = torch.nn.LayerNorm(H, eps=1e-5, dtype=F64)
    with torch.no_grad():
        ln1.weight.copy_(p["ln1w"]), ln1.bias.copy_(p["ln1b"])
        ln2.weight.copy_(p["ln2w"]), ln2.bias.copy_(p["ln2b"])
    qkv, proj = lin(p["wqkv"], p["bqkv"]), lin(p["wproj"])
    fc1, fc2 = lin(p["w1"], p["b1"]), lin(p["w2"])
    x = x.to(F64).requires_grad_(True)
    bproj, b2 = (p[k].clone().requires_grad_(True) for k in ("bproj", "b2"))
    # Each consumer of a tensor gets its gradient rounded as the module's autograd stores it
    # (qb), and the sum of the consumers' gradients is rounded again (the q around a value).
    qb = lambda t: q(t, dt, fwd=False)  # noqa: E731
    a1 = q(ln1(qb(x)), dt)
    mixed = col_linear(qkv, a1, dt, P)
    n = mixed.shape[1] // P
    ctx = []
    for r in range(P):
        qh, kh, vh = split_heads(mixed[:, r * n:(r + 1) * n], NH // P, groups // P, fused)
        ctx.append(q(ref_attention(qh, kh, vh, lens, causal), dt))
    ctx = torch.cat(ctx, 1)
    parts1 = []
    att = row_linear(proj, ctx, dt, P, bias=False, partials=parts1)
    x1 = add(add(att, bproj, dt), qb(x), dt)
    a2 = q(ln2(qb(x1)), dt)
    h = col_linear(fc1, a2, dt, P)
    g = q(Fn.gelu(h, approximate="tanh"), dt)
    parts2 = []
    m = row_linear(fc2, g, dt, P, bias=False, partials=parts2)
    out = add(add(m, b2, dt), qb(x1), dt)
    for t in (a1, mixed, ctx, att, x1, a2, h, g):
        t.retain_grad()
    out.backward(dy.to(F64))
    grads = {"self_attention.layernorm_qkv.layer_norm_weight": ln1.weight.grad,
             "self_attention.layernorm_qkv.layer_norm_bias": ln1.bias.grad,
             "self_attention.layernorm_qkv.weight": qkv.weight.grad,
             "self_attention.layernorm_qkv.bias": qkv.bias.grad,
             "self_attention.proj.weight": proj.weight.grad,
             "layernorm_mlp.layer_norm_weight": ln2.weight.grad,
             "layernorm_mlp.layer_norm_bias": ln2.bias.grad,
             "layernorm_mlp.fc1_weight": fc1.weight.grad, "layernorm_mlp.fc1_bias": fc1.bias.grad,
             "layernorm_mlp.fc2_weight": fc2.weight.grad,
             "self_attention.proj.bias": bproj.grad, "layernorm_mlp.fc2_bias": b2.grad}
    T = x.shape[0]
    # Slack (test_layers' model): a value the module stores in the compute dtype may sit k
    # ulps from the reference's (one ulp: a rounding-boundary flip between fp32 and fp64
    # arithmetic; in fp32 the fp32 arithmetic before the rounding, up to K ulps for K = H
    # terms), and such a difference moves what reads it by that much times the other
    # operand; a parameter gradient sums T token rows in fp32 (sum_slack); reduced values
    # carry the ulps of their rounded partials (SPEC §7).
    k = 1 if dt == torch.bfloat16 else H
    with torch.no_grad():
        u = lambda t: k * ulp(t.detach(), dt)  # noqa: E731
        A = lambda t: t.detach().abs()  # noqa: E731

        def mag(dg, v):   # slack of dW = dg^T v over T rows
            return sum_slack(T, A(dg).t() @ A(v)) + u(dg).t() @ A(v) + A(dg).t() @ u(v)

        def colsum(dg):
            return sum_slack(T, A(dg).sum(0)) + u(dg).sum(0)

        def norm_w(mod, a, inp):
            xhat = (a.detach() - mod.bias) / mod.weight
            return (sum_slack(T, (A(a.grad) * xhat.abs()).sum(0)) +
                    (u(a.grad) * xhat.abs()).sum(0))
        slack = {"self_attention.layernorm_qkv.layer_norm_weight": norm_w(ln1, a1, x),
                 "self_attention.layernorm_qkv.layer_norm_bias": colsum(a1.grad),
                 "self_attention.layernorm_qkv.weight": mag(mixed.grad, a1),
                 "self_attention.layernorm_qkv.bias": colsum(mixed.grad),
                 "self_attention.proj.weight": mag(att.grad, ctx),
                 "layernorm_mlp.layer_norm_weight": norm_w(ln2, a2, x1),
                 "layernorm_mlp.layer_norm_bias": colsum(a2.grad),
                 "layernorm_mlp.fc1_weight": mag(h.grad, a2),
                 "layernorm_mlp.fc1_bias": colsum(h.grad),
                 "layernorm_mlp.fc2_weight": mag(dy.to(F64), g),
                 "self_attention.proj.bias": colsum(x1.grad),
                 "layernorm_mlp.fc2_bias": colsum(dy.to(F64))}
        # out: three roundings at out's magnitude (the reduce-scatter's result, + fc2's bias,
        # + the residual), the rounded partials, and the flips of what the GEMMs read.
        sl_out = 3 * ulp(out.detach(), dt) + sum(ulp(t, dt) for t in parts1 + parts2) + \
            u(g) @ A(fc2.weight).t() + u(ctx) @ A(proj.weight).t() + u(x1)
        # dx: the sum of its two consumers' rounded gradients, then rounded: the residual's
        # (x1's gradient, up to k ulps off) and the norm's, whose input gradient error e (a1's
        # gradient k ulps off, and mixed's through the qkv GEMM) the LayerNorm backward maps
        # to at most (|w| e + mean(|w| e) + |xhat| mean(|w| e |xhat|)) / sigma per element.
        xv = x.detach()
        sig = (xv.var(1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        xhat = (xv - xv.mean(1, keepdim=True)) / sig
        e = A(ln1.weight) * (u(a1.grad) + u(mixed.grad) @ A(qkv.weight))
        ax = xhat.abs()
        sl_dx = 2 * ulp(x.grad, dt) + u(x1.grad) + \
            (e + e.mean(1, keepdim=True) + ax * (e * ax).mean(1, keepdim=True)) / sig
    return out.detach(), x.grad, grads, slack, sl_out, sl_dx


def full_params(seed, dt, groups):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    nq = (NH + 2 * groups) * D
    p = {"ln1w": 1 + 0.2 * r(H), "ln1b": 0.2 * r(H), "wqkv": r(nq, H) / H ** 0.5,
         "bqkv": 0.5 * r(nq), "wproj": r(H, NH * D) / H ** 0.5, "bproj": 0.5 * r(H),
         "ln2w": 1 + 0.2 * r(H), "ln2b": 0.2 * r(H), "w1": r(FF, H) / H ** 0.5,
         "b1": 0.5 * r(FF), "w2": r(H, FF) / FF ** 0.5, "b2": 0.5 * r(H)}
    return {k: v.to(dt).to(F64) for k, v in p.items()}


NAMES = {"self_attention.layernorm_qkv.layer_norm_weight": ("ln1w", None),
         "self_attention.layernorm_qkv.layer_norm_bias": ("ln1b", None),
         "self_attention.layernorm_qkv.weight": ("wqkv", 0),
         "self_attention.layernorm_qkv.bias": ("bqkv", 0),
         "self_attention.proj.weight": ("wproj", 1), "self_attention.proj.bias": ("bproj", None),
         "layernorm_mlp.layer_norm_weight": ("ln2w", None),
         "layernorm_mlp.layer_norm_bias": ("ln2b", None),
         "layernorm_mlp.fc1_weight": ("w1", 0), "layernorm_mlp.fc1_bias": ("b1", 0),
         "layernorm_mlp.fc2_weight": ("w2", 1), "layernorm_mlp.fc2_bias": ("b2", None)}


def shard(t, dim, rank, P):
    if dim is None:
        return t
    n = t.shape[dim] // P
    return t.narrow(dim, rank * n, n)


def make_data(seed, dt):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(T, H, generator=g).to(dt), torch.randn(T, H, generator=g).to(dt))
            for T, _ in MBS]


def run_layer(P, dt, groups, causal, ub, p, data, cfgs=None, fused=True):
    """Per rank: a TransformerLayer on THD loaded with its shards of p, six microbatches;
    returns per rank [(out, dx, {param: grad})]."""
    flags = ub or {}

    def body(rank):
        torch.set_num_threads(1)
        te.initialize_ub([C, H], P, dtype=dt, ub_cfgs=cfgs)
        try:
            m = te.TransformerLayer(
                H, FF, NH, groups, hidden_dropout=0.0, attention_dropout=0.0, tp_size=P,
                params_dtype=dt, sequence_parallel=P > 1, set_parallel_mode=True,
                fuse_qkv_params=fused, attn_input_format="thd",
                self_attn_mask_type="padding_causal" if causal else "padding",
                ub_tp_comm_overlap=bool(flags), **flags)
            with torch.no_grad():
                for nm, (key, dim) in NAMES.items():
                    if fused or "layernorm_qkv.weight" not in nm and "qkv.bias" not in nm:
                        m.get_parameter(nm).copy_(shard(p[key], dim, rank, P))
                        continue
                    # TE's split parameters: rank r's block of the (non-interleaved) fused
                    # rows is [query_r | key_r | value_r].
                    blk = shard(p[key], 0, rank, P)
                    nq, nk = NH * D // P, groups * D // P
                    for part, (a, b) in zip(("query", "key", "value"),
                                            ((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk))):
                        m.get_parameter(nm.replace("weight", f"{part}_weight").replace(
                            "bias", f"{part}_bias")).copy_(blk[a:b])
            recs = []
            for (T, lens), (x, dy) in zip(MBS, data):
                xl = x[rank * T // P:(rank + 1) * T // P].clone().requires_grad_(True)
                cu = cu_of(lens)
                with te.active_tokens(T):
                    out = m(xl, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lens),
                            max_seqlen_kv=max(lens))
                    out.backward(dy[rank * T // P:(rank + 1) * T // P])
                grads = {n: prm.grad.clone() for n, prm in m.named_parameters()}
                if not fused:   # back to the fused rows of this rank's block
                    for kind in ("weight", "bias"):
                        grads[f"self_attention.layernorm_qkv.{kind}"] = torch.cat(
                            [grads.pop(f"self_attention.layernorm_qkv.{part}_{kind}")
                             for part in ("query", "key", "value")])
                m.zero_grad(set_to_none=True)
                recs.append((out.detach(), xl.grad, grads))
            return recs
        finally:
            te.destroy_ub()
    return sim.run(P, body, timeout_ms=30000)


def gathered(res, i, nm, P):
    """The unsharded gradient from the ranks' (TE's layout; SP norm params: the sum)."""
    key, dim = NAMES[nm]
    parts = [r[i][2][nm] for r in res]
    if dim is not None:
        return torch.cat(parts, dim), None
    # The norms' parameters and (TransformerLayer adds them to its rows, return_bias) the
    # row-parallel biases: per-rank partial sums, marked sequence_parallel (SPEC §12).
    return sum(t.double() for t in parts), parts


def check_layer(P, dt, groups, causal, ub=None, cfgs=None, seed=0, fused=True):
    p = full_params(seed, dt, groups)
    data = make_data(seed + 1, dt)
    res = run_layer(P, dt, groups, causal, ub, p, data, cfgs, fused)
    fails = []
    for i, ((T, lens), (x, dy)) in enumerate(zip(MBS, data)):
        out, dx, grads, slack, sl_out, sl_dx = ref_layer(p, x, dy, lens, dt, P, groups, causal,
                                                           fused)
        tag = f"mb{i} T={T} lens={lens}"
        fails += verdict(f"{tag} out", torch.cat([r[i][0] for r in res]), out, dt, slack=sl_out)
        fails += verdict(f"{tag} dx", torch.cat([r[i][1] for r in res]), dx, dt, slack=sl_dx)
        for nm, ref in grads.items():
            got, parts = gathered(res, i, nm, P)
            sl = slack[nm]
            if parts is not None and P > 1:
                sl = sl + sum(ulp(t, dt) for t in parts)
            fails += verdict(f"{tag} {nm}", got, ref, dt, slack=sl)
    return fails[:12]


UB = {"ub_overlap_ag": True, "ub_overlap_rs": True, "ub_bulk_dgrad": True,
      "ub_bulk_wgrad": True}
UB_RS_DGRAD = {"ub_overlap_ag": True, "ub_overlap_rs": True, "ub_overlap_rs_dgrad": True}
PLAIN_AG = {"method": "bulk", "is_reduce_scatter": False, "external": False}
RS_DGRAD_LAYER = dict(RS_DGRAD, proj_wgrad=PLAIN_AG,
                      fc2_wgrad=dict(PLAIN_AG, is_reduce_scatter=True))


class Layer(unittest.TestCase):
    """The grid: every P and dtype, causal and not, GQA (4 groups for 8 heads) and MHA, the
    ub overlaps and the plain path, spread so that each appears in both dtypes."""

    def _one(self, P, dt, groups, causal, ub=None, cfgs=None, seed=0, fused=True):
        with self.subTest(P=P, dtype=dt, groups=groups, causal=causal, ub=ub, fused=fused):
            self.assertEqual(check_layer(P, dt, groups, causal, ub, cfgs, seed, fused), [])

    def test_p1(self):
        self._one(1, torch.float32, NH, True)
        self._one(1, torch.bfloat16, 4, False, seed=1)

    def test_p2(self):
        self._one(2, torch.float32, 4, True, seed=2)
        self._one(2, torch.bfloat16, NH, True, UB, seed=3)
        self._one(2, torch.bfloat16, 4, False, seed=4, fused=False)   # TE's split qkv

    def test_p4(self):
        self._one(4, torch.float32, 4, False, UB, seed=5)
        self._one(4, torch.bfloat16, 4, True, UB_RS_DGRAD, RS_DGRAD_LAYER, seed=6)


# ---- TE's layer-overlap test, in our words ------------------------------------------------------

def overlap_pair(layer, P, dt, overlap_rs_dgrad, seed=0):
    """TE's run_layer_with_overlap: the layer with its ub flags and without ("reference"), one
    seed, the same inputs (sequence-parallel rows); returns per rank (outputs, grads) of both.
    'transformerlayer_x2': TE's --num-layers 2 (two stacked layers)."""
    T = 16
    n_layers = 2 if layer.endswith("_x2") else 1
    layer = layer[:-3] if n_layers > 1 else layer

    def args(reference):
        kw = dict(params_dtype=dt, tp_size=P, sequence_parallel=True,
                  ub_overlap_ag=not reference, ub_overlap_rs=not reference)
        a = [H]
        if layer in ("linear_row", "linear_col", "layernormlinear"):
            if layer == "linear_row":
                a = [FF, H]
                kw.update(parallel_mode="row", ub_name="proj")
            else:
                a = [H, 3 * H]
                kw.update(parallel_mode="column", ub_name="qkv",
                          ub_overlap_rs_dgrad=overlap_rs_dgrad and not reference,
                          ub_bulk_dgrad=not overlap_rs_dgrad and not reference,
                          ub_bulk_wgrad=not overlap_rs_dgrad and not reference)
            return a, kw
        if layer in ("layernormmlp", "transformerlayer"):
            a.append(FF)
            kw["seq_length"] = T
        if layer in ("multiheadattention", "transformerlayer"):
            a.append(NH)
            kw.update(attention_dropout=0.0, fuse_qkv_params=True)
            if layer == "multiheadattention":
                kw["input_layernorm"] = True
            else:
                kw.update(ub_tp_comm_overlap=not reference, hidden_dropout=0.0)
        kw.update(set_parallel_mode=True, ub_overlap_rs_dgrad=overlap_rs_dgrad and not reference,
                  ub_bulk_dgrad=not overlap_rs_dgrad and not reference,
                  ub_bulk_wgrad=not overlap_rs_dgrad and not reference)
        return a, kw

    cls = {"linear_row": te.Linear, "linear_col": te.Linear,
           "layernormlinear": te.LayerNormLinear, "layernormmlp": te.LayerNormMLP,
           "multiheadattention": te.MultiheadAttention,
           "transformerlayer": te.TransformerLayer}[layer]
    # With both dgrad sites reduce-scattering, TE's sites keep no BULK AG for the simulator's
    # plain path (the reference run, the wgrad's gather): 'proj_wgrad' (unused by the
    # row-parallel proj) is registered as one.
    cfgs = RS_DGRAD_LAYER if overlap_rs_dgrad else None

    def body(rank):
        torch.set_num_threads(1)
        te.initialize_ub([C, H], P, dtype=dt, ub_cfgs=cfgs)
        try:
            outs, models = [], []
            for reference in (False, True):
                a, kw = args(reference)
                mods = [cls(*a, **kw) for _ in range(n_layers)]
                models.append(mods[0] if n_layers == 1 else torch.nn.Sequential(*mods))
            # TE's test seeds both models alike (a process per rank); the simulator's ranks are
            # threads sharing torch's RNG, so the reference takes the overlapped model's values.
            models[1].load_state_dict(models[0].state_dict(), strict=True)
            for m in models:
                g = torch.Generator().manual_seed(seed + 10)
                K = a[0] if layer != "linear_row" else FF
                x = torch.randn(T, 2, K, generator=g).to(dt)   # sbhd [s, b, h]
                if layer == "linear_row":
                    x = x[..., rank * K // P:(rank + 1) * K // P]
                else:
                    x = x[rank * T // P:(rank + 1) * T // P]
                x = x.clone().requires_grad_(True)
                with te.active_tokens(T * 2):
                    y = m(x)
                    y = y[0] if isinstance(y, tuple) else y
                    dy = torch.randn(y.shape, generator=g).to(dt)
                    y.backward(dy)
                outs.append((y.detach(), x.grad,
                             {n: prm.grad.clone() for n, prm in m.named_parameters()}))
            return outs
        finally:
            te.destroy_ub()
    return sim.run(P, body, timeout_ms=30000)


class LayerOverlap(unittest.TestCase):
    LAYERS = ("linear_row", "linear_col", "layernormlinear", "layernormmlp",
              "multiheadattention", "transformerlayer", "transformerlayer_x2")

    def test_overlap_against_reference(self):
        for i, layer in enumerate(self.LAYERS):
            for rs_dgrad in (False, True):
                if layer == "linear_row" and rs_dgrad:
                    continue
                P = 2 if (i + rs_dgrad) % 2 else 4
                dt = torch.bfloat16 if i % 2 else torch.float32
                with self.subTest(layer=layer, rs_dgrad=rs_dgrad, P=P, dtype=dt):
                    res = overlap_pair(layer, P, dt, rs_dgrad, seed=i)
                    # The overlapped and the plain path reduce the same rounded partials in
                    # another order: SPEC §7's partial-rounding slack (an ulp per rounding).
                    fails = []
                    for r, ((y, dx, g), (y0, dx0, g0)) in enumerate(res):
                        fails += verdict(f"rank {r} out", y, y0, dt, slack=2 * ulp(y0, dt))
                        fails += verdict(f"rank {r} dx", dx, dx0, dt, slack=2 * ulp(dx0, dt))
                        self.assertEqual(sorted(g), sorted(g0))
                        for n in g:
                            fails += verdict(f"rank {r} {n}", g[n], g0[n], dt,
                                             slack=4 * ulp(g0[n], dt))
                    self.assertEqual(fails[:8], [])


# ---- LayerNormLinear, LayerNorm, RMSNorm, attention formats --------------------------------------

class Modules(unittest.TestCase):
    def test_layernorm_linear_split_and_ln_output(self):
        """parameters_split (TE's names), return_layernorm_output, zero_centered_gamma, RMSNorm,
        at P = 2 column-parallel with the qkv overlaps, against fp64."""
        P, dt, N = 2, torch.float32, 48
        g = torch.Generator().manual_seed(3)
        wq, wk, wv = (torch.randn(16, H, generator=g) / H ** 0.5 for _ in range(3))
        gam = 0.2 * torch.randn(H, generator=g)
        x = torch.randn(C, H, generator=g)
        dy = torch.randn(C, N, generator=g)

        def body(rank):
            te.initialize_ub([C, H], P, dtype=dt)
            try:
                m = te.LayerNormLinear(H, N, 1e-5, True, False, None, P, normalization="RMSNorm",
                                       params_dtype=dt, parallel_mode="column", bias=False,
                                       return_layernorm_output=True, zero_centered_gamma=True,
                                       parameters_split=("query_", "key_", "value_"),
                                       ub_name="qkv", ub_overlap_ag=True, ub_bulk_dgrad=True,
                                       ub_bulk_wgrad=True)
                self.assertEqual([n for n, _ in m.named_parameters()],
                                 ["layer_norm_weight", "query_weight", "key_weight",
                                  "value_weight"])
                with torch.no_grad():
                    m.layer_norm_weight.copy_(gam)
                    for nm, w in (("query_weight", wq), ("key_weight", wk), ("value_weight", wv)):
                        getattr(m, nm).copy_(w[rank * 8:(rank + 1) * 8])
                xl = x[rank * C // P:(rank + 1) * C // P].clone().requires_grad_(True)
                with te.active_tokens(C):
                    y, ln = m(xl)
                    y.backward(dy[:, rank * N // P:(rank + 1) * N // P])
                return y.detach(), ln.detach(), xl.grad, m.query_weight.grad.clone()
            finally:
                te.destroy_ub()
        res = sim.run(P, body)
        xr = x.double().requires_grad_(True)
        lnr = Fn.rms_norm(xr, (H,), 1 + gam.double(), 1e-5)
        W = torch.cat([torch.cat([w[r * 8:(r + 1) * 8] for w in (wq, wk, wv)])
                       for r in range(P)]).double().requires_grad_(True)
        yr = lnr @ W.t()
        yr.backward(torch.cat([dy[:, r * N // P:(r + 1) * N // P] for r in range(P)], 1).double())
        fails = verdict("out", torch.cat([r[0] for r in res], 1),
                        torch.cat([yr[:, r * N // P:(r + 1) * N // P] for r in range(P)], 1), dt)
        fails += verdict("ln", torch.cat([r[1] for r in res]), lnr, dt)
        fails += verdict("dx", torch.cat([r[2] for r in res]), xr.grad, dt,
                         slack=sum_slack(N, (dy.double().abs() @ W.abs()).detach()))
        gq = torch.cat([res[r][3] for r in range(P)])
        refq = torch.cat([W.grad[r * 24:r * 24 + 8] for r in range(P)])
        fails += verdict("query_weight grad", gq, refq, dt, slack=sum_slack(C, refq.abs() + 1))
        self.assertEqual(fails, [])

    def test_norm_modules(self):
        x = torch.randn(5, 3, 16, dtype=torch.float64)
        ln = te.LayerNorm(16, 1e-6, params_dtype=torch.float64)
        rms = te.RMSNorm(16, zero_centered_gamma=True, dtype=torch.float64)
        with torch.no_grad():
            ln.weight.normal_(), ln.bias.normal_(), rms.weight.normal_()
        self.assertEqual([n for n, _ in ln.named_parameters()], ["weight", "bias"])
        self.assertEqual([n for n, _ in rms.named_parameters()], ["weight"])
        torch.testing.assert_close(ln(x), Fn.layer_norm(x, (16,), ln.weight, ln.bias, 1e-6))
        torch.testing.assert_close(rms(x), Fn.rms_norm(x, (16,), 1 + rms.weight, 1e-5))
        with self.assertRaisesRegex(E.TpflexShapeError, "trailing"):
            ln(torch.randn(4, 8, dtype=torch.float64))
        with self.assertRaisesRegex(E.TpflexInvalidError, "normalized_shape"):
            te.LayerNorm()

    def test_formats_agree(self):
        """sbhd and bshd with causal masks give what THD gives for equal-length sequences; a
        padding mask in sbhd equals THD with the shorter sequences."""
        torch.manual_seed(0)
        s, b = 6, 3
        dpa = {f: te.DotProductAttention(4, 8, 2, qkv_format=f, attn_mask_type=mt)
               for f, mt in (("sbhd", "causal"), ("bshd", "causal"), ("thd", "padding_causal"))}
        qh, kh, vh = torch.randn(s, b, 4, 8), torch.randn(s, b, 2, 8), torch.randn(s, b, 2, 8)
        o_s = dpa["sbhd"](qh, kh, vh)
        o_b = dpa["bshd"](*(t.transpose(0, 1) for t in (qh, kh, vh)))
        flat = [t.transpose(0, 1).reshape(s * b, -1, 8) for t in (qh, kh, vh)]
        cu = torch.arange(0, s * b + 1, s, dtype=torch.int32)
        o_t = dpa["thd"](*flat, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s,
                         max_seqlen_kv=s)
        torch.testing.assert_close(o_b.transpose(0, 1), o_s)
        torch.testing.assert_close(o_t.reshape(b, s, -1).transpose(0, 1), o_s)
        lens = [6, 4, 2]
        mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
        for i, n in enumerate(lens):
            mask[i, ..., :n] = False
        pad = te.DotProductAttention(4, 8, 2, qkv_format="sbhd", attn_mask_type="padding")
        o_p = pad(qh, kh, vh, attention_mask=mask)
        packed = [torch.cat([t[:n, i] for i, n in enumerate(lens)]) for t in (qh, kh, vh)]
        o_pt = te.DotProductAttention(4, 8, 2, qkv_format="thd", attn_mask_type="padding")(
            *packed, cu_seqlens_q=cu_of(lens), cu_seqlens_kv=cu_of(lens))
        torch.testing.assert_close(torch.cat([o_p[:n, i] for i, n in enumerate(lens)]), o_pt)

    def test_thd_matches_reference_and_no_cross_talk(self):
        """A token's output depends on its own sequence only: changing another sequence's
        tokens leaves it bit for bit; values against the fp64 reference."""
        torch.manual_seed(1)
        lens = [1, 5, 3]
        T = sum(lens) + 2   # a padded tail
        qh, kh, vh = torch.randn(T, 4, 8), torch.randn(T, 2, 8), torch.randn(T, 2, 8)
        dpa = te.DotProductAttention(4, 8, 2, qkv_format="thd", attn_mask_type="padding_causal")
        cu = cu_of(lens)
        o = dpa(qh, kh, vh, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        ref = ref_attention(qh.double(), kh.double(), vh.double(), lens, True)
        self.assertEqual(verdict("thd", o, ref, torch.float32), [])
        k2 = kh.clone()
        k2[1:6] += 1.0   # the second sequence's keys
        o2 = dpa(qh, k2, vh, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        self.assertTrue(torch.equal(o2[:1], o[:1]) and torch.equal(o2[6:], o[6:]))
        self.assertFalse(torch.equal(o2[1:6], o[1:6]))
        self.assertTrue(torch.equal(o[9:], torch.zeros_like(o[9:])))


    def test_dropout_follows_torch_rng(self):
        """attention_dropout and hidden_dropout: active in training only, drawn from torch's
        RNG (the same seed, the same mask), off in eval (= the layer without dropout)."""
        torch.manual_seed(3)
        kw = dict(params_dtype=torch.float32, attn_input_format="thd", fuse_qkv_params=True)
        m = te.TransformerLayer(32, 64, 4, hidden_dropout=0.3, attention_dropout=0.3, **kw)
        m0 = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0, **kw)
        m0.load_state_dict(m.state_dict())
        x, cu = torch.randn(12, 32), cu_of([5, 7])
        call = lambda mod: mod(x, cu_seqlens_q=cu, cu_seqlens_kv=cu)  # noqa: E731
        torch.manual_seed(7)
        a = call(m)
        torch.manual_seed(7)
        b = call(m)
        c = call(m)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(a, c))
        self.assertFalse(torch.allclose(a, call(m0)))
        m.eval()
        self.assertTrue(torch.equal(call(m), call(m0)))

    def test_checkpoint_core_attention(self):
        """checkpoint_core_attention recomputes the attention in backward: same values."""
        torch.manual_seed(4)
        m = te.MultiheadAttention(32, 4, attention_dropout=0.0, params_dtype=torch.float32,
                                  input_layernorm=True, qkv_format="sbhd")
        x = torch.randn(6, 2, 32)
        res = []
        for ck in (False, True):
            xi = x.clone().requires_grad_(True)
            y = m(xi, checkpoint_core_attention=ck)
            y.sum().backward()
            res.append((y.detach(), xi.grad, m.proj.weight.grad.clone()))
            m.zero_grad()
        for u, v in zip(*res):
            torch.testing.assert_close(u, v)


    def test_varlen_path_plumbing(self):
        """The CUDA varlen path's arguments and result handling, on the CPU: the kernel stood
        in for by a function that checks what it is given (int32 offsets, int maxima, the
        causal window, GQA) and answers with the fp64 reference; the padded tail must come
        back zero, the maxima must come from cu_seqlens when not given."""
        import tpflex.torch.attention.dot_product_attention as dpa_mod
        seen = []

        def fake(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
            self.assertEqual((cu_q.dtype, cu_k.dtype), (torch.int32, torch.int32))
            self.assertTrue(isinstance(max_q, int) and isinstance(max_k, int))
            seen.append((max_q, max_k, kw))
            lens = (cu_q[1:] - cu_q[:-1]).tolist()
            causal = kw.get("window_size", (-1, -1)) == (-1, 0) or kw.get("is_causal", False)
            o = ref_attention(q.double(), k.double(), v.double(), lens, causal)
            return (o.reshape(q.shape) + 7.0).to(q.dtype)   # garbage in the tail rows
        saved = (dpa_mod._varlen_attn, dpa_mod._use_varlen)
        dpa_mod._varlen_attn, dpa_mod._use_varlen = fake, lambda *a: True
        try:
            torch.manual_seed(5)
            lens, T = [3, 1, 6], 12
            qh, kh, vh = torch.randn(T, 4, 8), torch.randn(T, 2, 8), torch.randn(T, 2, 8)
            cu = cu_of(lens).long()
            m = te.DotProductAttention(4, 8, 2, qkv_format="thd", attn_mask_type="padding_causal")
            o = m(qh, kh, vh, cu_seqlens_q=cu, cu_seqlens_kv=cu)
            o2 = m(qh, kh, vh, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=6, max_seqlen_kv=6)
        finally:
            dpa_mod._varlen_attn, dpa_mod._use_varlen = saved
        ref = ref_attention(qh.double(), kh.double(), vh.double(), lens, True)
        self.assertEqual(verdict("varlen", o[:10], ref[:10] + 7.0, torch.float32), [])
        self.assertTrue(torch.equal(o[10:], torch.zeros_like(o[10:])))
        self.assertTrue(torch.equal(o, o2))
        self.assertEqual([(a, b) for a, b, _ in seen], [(6, 6), (6, 6)])
        kw = seen[0][2]
        self.assertTrue(kw.get("window_size") == (-1, 0) or kw.get("is_causal") is True)
        self.assertTrue(kw.get("enable_gqa", True))


class Errors(unittest.TestCase):
    def test_heads_must_divide(self):
        with self.assertRaisesRegex(E.TpflexDivisibleError, "num_attention_heads 6 does not "
                                    "divide among tp_size 4"):
            te.MultiheadAttention(24, 6, tp_size=4, set_parallel_mode=True,
                                  input_layernorm=True)
        with self.assertRaisesRegex(E.TpflexDivisibleError, "num_gqa_groups 2 does not divide "
                                    "among tp_size 4"):
            te.TransformerLayer(32, 64, 8, 2, tp_size=4, set_parallel_mode=True)

    def test_unsupported_named_only_off_default(self):
        cases = [(lambda: te.TransformerLayer(32, 64, 4, output_layernorm=True),
                  "output_layernorm=True"),
                 (lambda: te.MultiheadAttention(32, 4, qk_norm_type="RMSNorm"),
                  "qk_norm_type='RMSNorm'"),
                 (lambda: te.Linear(8, 8, delay_wgrad_compute=True), "delay_wgrad_compute"),
                 (lambda: te.LayerNormMLP(8, 16, zero_centered_gamma=True),
                  "zero_centered_gamma"),
                 (lambda: te.LayerNormLinear(8, 8, symmetric_ar_type="ub"), "symmetric_ar_type"),
                 (lambda: te.DotProductAttention(4, 8, softmax_type="learnable"), "softmax_type")]
        for make, name in cases:
            with self.subTest(name=name), self.assertRaisesRegex(E.TpflexUnsupportedError, name):
                make()
        # TE's defaults of the same arguments are accepted.
        te.TransformerLayer(32, 64, 4, output_layernorm=False, qk_norm_type=None,
                            seq_length=128, micro_batch_size=2, window_size=None)
        m = te.MultiheadAttention(32, 4, attention_dropout=0.0, fuse_qkv_params=True,
                                  input_layernorm=True)
        with self.assertRaisesRegex(E.TpflexUnsupportedError, "rotary_pos_emb"):
            m(torch.randn(4, 2, 32), rotary_pos_emb=torch.zeros(4, 1, 1, 8))

    def test_thd_needs_cu_seqlens(self):
        m = te.DotProductAttention(4, 8, qkv_format="thd")
        with self.assertRaisesRegex(E.TpflexInvalidError, "cu_seqlens_q"):
            m(torch.randn(6, 4, 8), torch.randn(6, 4, 8), torch.randn(6, 4, 8))
        with self.assertRaisesRegex(E.TpflexShapeError, "end at most at the 6"):
            cu = torch.tensor([0, 4, 9], dtype=torch.int32)
            m(torch.randn(6, 4, 8), torch.randn(6, 4, 8), torch.randn(6, 4, 8),
              cu_seqlens_q=cu, cu_seqlens_kv=cu)


class State(unittest.TestCase):
    """deepcopy / torch.save / load_state_dict after a forward; a TE state_dict (its key set,
    with `_extra_state`) loads with strict=True."""

    TE_KEYS = sorted([
        "self_attention.layernorm_qkv.layer_norm_weight",
        "self_attention.layernorm_qkv.layer_norm_bias", "self_attention.layernorm_qkv.weight",
        "self_attention.layernorm_qkv.bias", "self_attention.layernorm_qkv._extra_state",
        "self_attention.core_attention._extra_state", "self_attention.proj.weight",
        "self_attention.proj.bias", "self_attention.proj._extra_state",
        "layernorm_mlp.layer_norm_weight", "layernorm_mlp.layer_norm_bias",
        "layernorm_mlp.fc1_weight", "layernorm_mlp.fc1_bias", "layernorm_mlp.fc2_weight",
        "layernorm_mlp.fc2_bias", "layernorm_mlp._extra_state"])

    def test_copy_save_load_after_forward(self):
        P = 2

        def body(rank):
            te.initialize_ub([C, H], P, dtype=torch.float32)
            try:
                m = te.TransformerLayer(H, FF, NH, tp_size=P, sequence_parallel=True,
                                        set_parallel_mode=True, fuse_qkv_params=True,
                                        params_dtype=torch.float32, hidden_dropout=0.0,
                                        attention_dropout=0.0, attn_input_format="thd",
                                        ub_tp_comm_overlap=True)
                x = torch.randn(8, H, generator=torch.Generator().manual_seed(rank))
                cu = cu_of([5, 11])
                with te.active_tokens(16):
                    y = m(x, cu_seqlens_q=cu, cu_seqlens_kv=cu)
                    y.sum().backward()
                    m2 = copy.deepcopy(m)
                    buf = io.BytesIO()
                    torch.save(m, buf)
                    buf.seek(0)
                    m3 = torch.load(buf, weights_only=False)
                    sd = io.BytesIO()
                    torch.save(m.state_dict(), sd)
                    sd.seek(0)
                    m4 = te.TransformerLayer(H, FF, NH, tp_size=P, sequence_parallel=True,
                                             set_parallel_mode=True, fuse_qkv_params=True,
                                             params_dtype=torch.float32, hidden_dropout=0.0,
                                             attention_dropout=0.0, attn_input_format="thd",
                                             ub_tp_comm_overlap=True)
                    m4.load_state_dict(torch.load(sd), strict=True)
                    ys = [mm(x, cu_seqlens_q=cu, cu_seqlens_kv=cu).detach()
                          for mm in (m2, m3, m4)]
                return y.detach(), ys, sorted(m.state_dict())
            finally:
                te.destroy_ub()
        for y, ys, keys in sim.run(P, body):
            for yy in ys:
                self.assertTrue(torch.equal(y, yy))
            self.assertEqual(keys, self.TE_KEYS)

    def test_deepcopy_shares_the_process_group(self):
        """A module built with tp_group deep-copies (the copy shares the group: a ProcessGroup
        cannot be copied) and computes the same."""
        import torch.distributed as dist
        if dist.is_initialized():
            self.skipTest("torch.distributed already initialised in this process")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            g = dist.new_group([0])
            m = te.TransformerLayer(H, FF, NH, tp_group=g, params_dtype=torch.float32,
                                    fuse_qkv_params=True, hidden_dropout=0.0,
                                    attention_dropout=0.0, attn_input_format="thd")
            x, cu = torch.randn(10, H), cu_of([4, 6])
            y = m(x, cu_seqlens_q=cu, cu_seqlens_kv=cu)
            m2 = copy.deepcopy(m)
            self.assertIs(m2.self_attention.proj.tp_group, g)
            self.assertIsNot(m2.self_attention.proj.weight, m.self_attention.proj.weight)
            self.assertTrue(torch.equal(m2(x, cu_seqlens_q=cu, cu_seqlens_kv=cu), y))
        finally:
            dist.destroy_process_group()

    def test_te_state_dict_loads_strict(self):
        m = te.TransformerLayer(H, FF, NH, fuse_qkv_params=True, params_dtype=torch.float32)
        sd = {k: torch.empty(0, dtype=torch.uint8) if k.endswith("_extra_state") else
              torch.full_like(m.state_dict()[k], 0.5) for k in self.TE_KEYS}
        m.load_state_dict(sd, strict=True)
        self.assertTrue(torch.equal(m.self_attention.proj.weight,
                                    torch.full_like(m.self_attention.proj.weight, 0.5)))
        fp8 = torch.frombuffer(bytearray(b"\x80\x04N."), dtype=torch.uint8)   # pickled None
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            m.self_attention.proj.set_extra_state(fp8)
        self.assertTrue(any("not apply" in str(w.message) for w in ws))
        self.assertTrue(torch.equal(m.self_attention.proj.get_extra_state(), fp8))
        with self.assertRaisesRegex(E.TpflexInvalidError, "_extra_state"):
            m.layernorm_mlp.set_extra_state(io.BytesIO())


if __name__ == "__main__":
    unittest.main()
