"""tpflex.torch.Linear and LayerNormMLP (python/tpflex/layers/) on the simulator: P in 1, 2, 4,
bf16 and fp32, every applicable ub_* combination, six microbatches with changing T under one
registration; the output, the input gradient and every parameter gradient against an unsharded
torch reference (nn.LayerNorm / nn.RMSNorm, tanh GELU, nn.Linear) with SPEC §7's per-element
verdict. torch.compile (eager, aot_eager) against eager; finite differences; the errors; the
host path (at tp_size 1 the aten operations of torch.nn's same block, one GEMM for a fused fp32
weight gradient, the communicators resolved once per registration).

The reference runs in fp64 and rounds to the compute dtype where the module stores a tensor
(the norm's output, fc1's output, the activation, a GEMM's output, a gradient between layers),
and, where the module reduces partial results across ranks (row-parallel outputs, the
column-parallel input gradient), rounds each rank's partial first, as the reduction's inputs
are: the reference's model is the unsharded one, its weights are nn.Linear's, only the
rounding follows the operation (SPEC §7: "the reference quantizes exactly as the operation
does"). fp64 because fp32 sums in another order than the sim's GEMMs would differ by more than
fp32's rtol 1e-5 by themselves. A reduced result (out, and the sum over ranks of the
sequence-parallel LayerNorm gradients) may also differ by the partial-rounding slack: one ulp
of the compute dtype at the result, or the ulps of the summed partials (SPEC §7).
unittest style."""
import os
import sys
import threading
import unittest
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402
from tpflex.layers import LayerNormMLP, Linear, active_tokens  # noqa: E402

H, F, C = 32, 64, 48
TS = (16, 40, 8, 32, 24, 48)        # six microbatches, T changing (multiples of 8: P | T)
TOL = {torch.bfloat16: (0.02, 0.002), torch.float32: (1e-5, 1e-6)}
F64 = torch.float64
RS_DGRAD_CFG = {"fc1_dgrad": {"method": "pipeline", "coll": "rs"}}
COL_BWD = ({}, {"ub_bulk_dgrad": True}, {"ub_bulk_wgrad": True},
           {"ub_bulk_dgrad": True, "ub_bulk_wgrad": True}, {"ub_overlap_rs_dgrad": True})


# ---- the verdict -------------------------------------------------------------------------------

def ulp(t, dtype):
    mant = {torch.bfloat16: 7, torch.float32: 23}[dtype]
    _, e = torch.frexp(t.double().abs())
    return torch.ldexp(torch.ones_like(t, dtype=F64), (e - 1).clamp(min=-126) - mant)


def verdict(name, got, ref, dtype, slack=None):
    """SPEC §7: an element is wrong iff rel > rtol and abs > atol (rel = abs / max(|ref|,
    1e-5)), and beyond the slack where one is given. Returns a list of failure strings."""
    rtol, atol = TOL[dtype]
    if tuple(got.shape) != tuple(ref.shape):
        return [f"{name}: shape {list(got.shape)} vs reference {list(ref.shape)}"]
    g, r = got.detach().double(), ref.detach().double()
    if not torch.equal(torch.isfinite(g), torch.isfinite(r)):
        return [f"{name}: NaN/Inf disagree"]
    a = (g - r).abs()
    rel = a / r.abs().clamp(min=1e-5)
    bad = (rel > rtol) & (a > atol)
    if slack is not None:
        bad &= a > slack
    n = int(bad.sum())
    if n == 0:
        return []
    i = int(torch.argmax(torch.where(bad, rel, torch.zeros_like(rel))))
    return [f"{name}: {n}/{g.numel()} wrong, e.g. got {g.flatten()[i]:.6g} ref "
            f"{r.flatten()[i]:.6g} (rel {rel.flatten()[i]:.3g})"]


# ---- the rounding-faithful unsharded reference --------------------------------------------------

class _Q(torch.autograd.Function):
    """Rounds the value to `dt` (forward) and the gradient to `dt` (backward) when the flags say
    so: a tensor the module stores in the compute dtype."""

    @staticmethod
    def forward(ctx, x, dt, fwd, bwd):
        ctx.dt, ctx.bwd = dt, bwd
        return x.to(dt).to(F64) if fwd else x.clone()

    @staticmethod
    def backward(ctx, g):
        return (g.to(ctx.dt).to(F64) if ctx.bwd else g), None, None, None


def q(x, dt, fwd=True, bwd=True):
    return _Q.apply(x, dt, fwd, bwd)


def col_linear(lin, x, dt, P):
    """nn.Linear as P column-parallel ranks compute it: each rank's [T, N/P] block from the
    same x; the input gradient is the sum of the ranks' rounded partials."""
    N = lin.weight.shape[0]
    b = lin.bias
    parts = [Fn.linear(q(x, dt, fwd=False), lin.weight[r * N // P:(r + 1) * N // P],
                       None if b is None else b[r * N // P:(r + 1) * N // P])
             for r in range(P)]
    return q(torch.cat(parts, 1), dt)


def row_linear(lin, x, dt, P, bias=True, partials=None):
    """nn.Linear as P row-parallel ranks compute it: at P > 1 each rank's partial is rounded
    (the reduction's inputs), summed, + bias, rounded. `partials` collects them (for the
    slack)."""
    K = lin.weight.shape[1]
    parts = [q(Fn.linear(x[:, r * K // P:(r + 1) * K // P], lin.weight[:, r * K // P:
                                                                       (r + 1) * K // P]),
               dt, fwd=P > 1, bwd=False) for r in range(P)]
    if partials is not None:
        partials.extend(t.detach() for t in parts)
    y = sum(parts)
    if bias and lin.bias is not None:
        y = y + lin.bias
    return q(y, dt)


U32 = 2.0 ** -24


def sum_slack(n, mag):
    """fp32 summation slack of n terms whose absolute values sum to `mag` (the dot-product
    bound gamma_n = n u / (1 - n u), u = 2^-24): the module sums the token rows in fp32, in an
    order the reference cannot know."""
    return n * U32 / (1 - n * U32) * mag


def out_slack(out, partials, dt):
    """SPEC §7's partial-rounding slack of a reduced result: the ulps of the rounded partials
    and of the result (one more rounding where the bias is added after the reduction)."""
    s = ulp(out, dt)
    for t in partials:
        s = s + ulp(t, dt)
    return s


def full_params(seed, dtype, norm="LayerNorm", bias=True):
    """Unsharded parameters, rounded to the compute dtype (the module's values), as fp64."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    p = {"w1": r(F, H) / H ** 0.5, "w2": r(H, F) / F ** 0.5, "lnw": 1 + 0.2 * r(H)}
    if bias:
        p.update(b1=0.5 * r(F), b2=0.5 * r(H))
    if norm == "LayerNorm":
        p["lnb"] = 0.2 * r(H)
    return {k: v.to(dtype).to(F64) for k, v in p.items()}


def ref_mlp(p, x, dy, dt, P, norm, act, bias=True):
    """LayerNormMLP's reference: (out, dx, grads by module parameter name)."""
    ln_mod = (torch.nn.LayerNorm(H, eps=1e-5, dtype=F64) if norm == "LayerNorm" else
              torch.nn.RMSNorm(H, eps=1e-5, dtype=F64))
    fc1 = torch.nn.Linear(H, F, bias=bias, dtype=F64)
    fc2 = torch.nn.Linear(F, H, bias=bias, dtype=F64)
    with torch.no_grad():
        ln_mod.weight.copy_(p["lnw"])
        if norm == "LayerNorm":
            ln_mod.bias.copy_(p["lnb"])
        fc1.weight.copy_(p["w1"])
        fc2.weight.copy_(p["w2"])
        if bias:
            fc1.bias.copy_(p["b1"])
            fc2.bias.copy_(p["b2"])
    x = x.to(F64).requires_grad_(True)
    ln = q(ln_mod(x), dt)
    ln.retain_grad()
    h = col_linear(fc1, ln, dt, P)
    h.retain_grad()
    a = q(Fn.gelu(h, approximate="tanh") if act == "gelu" else Fn.relu(h), dt)
    partials = []
    out = row_linear(fc2, a, dt, P, partials=partials)
    dy = dy.to(F64)
    out.backward(dy)
    grads = {"layer_norm_weight": ln_mod.weight.grad, "fc1_weight": fc1.weight.grad,
             "fc2_weight": fc2.weight.grad}
    T = x.shape[0]
    with torch.no_grad():   # the token-row sums' magnitudes (sum_slack)
        xhat = (ln.detach() - (ln_mod.bias if norm == "LayerNorm" else 0)) / ln_mod.weight
        mags = {"layer_norm_weight": (ln.grad.abs() * xhat.abs()).sum(0),
                "fc1_weight": h.grad.abs().t() @ ln.detach().abs(),
                "fc2_weight": dy.abs().t() @ a.detach().abs(),
                "layer_norm_bias": ln.grad.abs().sum(0), "fc1_bias": h.grad.abs().sum(0),
                "fc2_bias": dy.abs().sum(0)}
        # A tensor the module stores in the compute dtype may sit one ulp from the reference's
        # where the exact value lies at a rounding boundary (fp32 vs fp64 arithmetic before
        # the rounding); first order, such a flip moves the sums that read it by ulp x the
        # other operand (flip[n]). In fp32 the storage rounding is below the GEMM's own fp32
        # accumulation error, up to K ulps of the result for K = H terms (gamma_K): k ulps.
        k = 1 if dt == torch.bfloat16 else H
        ua, uh, uln, ud = (k * ulp(t, dt) for t in (a, h.grad, ln, ln.grad))
        flip = {"fc2_weight": dy.abs().t() @ ua,
                "fc1_weight": uh.t() @ ln.detach().abs() + h.grad.abs().t() @ uln,
                "fc1_bias": uh.sum(0), "layer_norm_weight": (ud * xhat.abs()).sum(0),
                "layer_norm_bias": ud.sum(0), "fc2_bias": torch.zeros(H, dtype=F64)}
    slack = {n: sum_slack(T, m) + flip[n] for n, m in mags.items()}
    slack["out"] = out_slack(out.detach(), partials, dt) + ua @ fc2.weight.detach().abs().t()
    if norm == "LayerNorm":
        grads["layer_norm_bias"] = ln_mod.bias.grad
    if bias:
        grads.update(fc1_bias=fc1.bias.grad, fc2_bias=fc2.bias.grad)
    return out.detach(), x.grad, grads, slack


# ---- running a module on P simulator ranks ------------------------------------------------------

def shard(name, full, rank, P):
    """Rank's shard of an unsharded parameter, by TE's layout."""
    if name in ("fc1_weight", "fc1_bias", "col_weight", "col_bias"):
        n = full.shape[0] // P
        return full[rank * n:(rank + 1) * n]
    if name in ("fc2_weight", "row_weight"):
        n = full.shape[1] // P
        return full[:, rank * n:(rank + 1) * n]
    return full


def rows_of(t, rank, P):
    T = t.shape[0]
    return t[rank * T // P:(rank + 1) * T // P]


def cols_of(t, rank, P):
    n = t.shape[1]
    return t[:, rank * n // P:(rank + 1) * n // P]


def whole(t, rank, P):
    return t


def run_module(P, dtype, build, load, Ts, data, sl_x, sl_dy, fuse, cfgs=None):
    """Per rank: build the module, load its shards, run every microbatch (forward under
    active_tokens, backward with dy); returns per rank [(out, dx, {param: grad})] (main_grad
    accumulated over the microbatches with fuse: one dict at the end)."""
    def body(rank):
        torch.set_num_threads(1)
        tt.initialize_ub([C, H], P, dtype=dtype, ub_cfgs=cfgs)
        try:
            m = build(rank)
            load(m, rank)
            if fuse:
                for n, prm in m.named_parameters():
                    if n.endswith("weight") and "layer_norm" not in n:
                        prm.main_grad = torch.zeros(prm.shape, dtype=torch.float32)
            recs = []
            for T, (x, dy) in zip(Ts, data):
                xs, dys = sl_x(x, rank, P), sl_dy(dy, rank, P)
                xl = xs.to(dtype).clone().requires_grad_(True)
                with active_tokens(T):
                    out = m(xl)
                    out.backward(dys.to(dtype))
                grads = {n: prm.grad.clone() for n, prm in m.named_parameters()
                         if prm.grad is not None}
                m.zero_grad(set_to_none=True)
                recs.append((out.detach(), xl.grad, grads))
            mg = {n: prm.main_grad.clone() for n, prm in m.named_parameters()
                  if hasattr(prm, "main_grad")}
            return recs, mg
        finally:
            tt.destroy_ub()
    return sim.run(P, body, timeout_ms=20000)


def make_data(seed, Ts, dtype):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(T, H, generator=g).to(dtype), torch.randn(T, H, generator=g).to(dtype))
            for T in Ts]


def cat_ranks(res, i, key, dim):
    return torch.cat([r[0][i][key] for r in res], dim)


# ---- LayerNormMLP -------------------------------------------------------------------------------

MLP_FLAGS = [dict(ub_overlap_ag=ag, ub_overlap_rs=rs, **bwd)
             for ag in (False, True) for rs in (False, True) for bwd in COL_BWD]
NORM_ACT = [("LayerNorm", "gelu"), ("RMSNorm", "relu"), ("RMSNorm", "gelu"), ("LayerNorm", "relu")]


def check_mlp(P, dtype, flags, norm, act, fuse, seed=0, Ts=TS):
    p = full_params(seed, dtype, norm)
    data = make_data(seed + 1, Ts, dtype)
    cfgs = RS_DGRAD_CFG if flags.get("ub_overlap_rs_dgrad") else None

    def build(rank):
        return LayerNormMLP(H, F, normalization=norm, activation=act, tp_size=P,
                            sequence_parallel=P > 1, set_parallel_mode=True, params_dtype=dtype,
                            fuse_wgrad_accumulation=fuse, **flags)

    def load(m, rank):
        with torch.no_grad():
            m.layer_norm_weight.copy_(p["lnw"])
            if norm == "LayerNorm":
                m.layer_norm_bias.copy_(p["lnb"])
            for n, k in (("fc1_weight", "w1"), ("fc1_bias", "b1"), ("fc2_weight", "w2"),
                         ("fc2_bias", "b2")):
                getattr(m, n).copy_(shard(n, p[k], rank, P))

    res = run_module(P, dtype, build, load, Ts, data, rows_of, rows_of, fuse, cfgs)
    fails = []
    acc, acc_slack = {}, {}
    for i, (T, (x, dy)) in enumerate(zip(Ts, data)):
        out, dx, g, sl = ref_mlp(p, x, dy, dtype, P, norm, act)
        tag = f"mb{i} T={T}"
        fails += verdict(f"{tag} out", torch.cat([r[0][i][0] for r in res]), out, dtype,
                         slack=sl["out"])
        fails += verdict(f"{tag} dx", torch.cat([r[0][i][1] for r in res]), dx, dtype)
        for n, ref in g.items():
            acc[n] = acc.get(n, 0) + ref
            acc_slack[n] = acc_slack.get(n, 0) + sl[n] + U32 * acc[n].abs()
            if fuse and n in ("fc1_weight", "fc2_weight"):
                continue
            if n in ("layer_norm_weight", "layer_norm_bias", "fc2_bias"):
                # per-rank partial sums (the sequence_parallel parameters, SPEC §12)
                parts = [r[0][i][2][n] for r in res]
                fails += verdict(f"{tag} {n}", sum(t.double() for t in parts), ref, dtype,
                                 slack=sl[n] + sum(ulp(t, dtype) for t in parts))
            else:
                got = torch.cat([r[0][i][2][n] for r in res], 1 if n == "fc2_weight" else 0)
                fails += verdict(f"{tag} {n}", got, ref, dtype, slack=sl[n])
    if fuse:
        for n, dim in (("fc1_weight", 0), ("fc2_weight", 1)):
            got = torch.cat([r[1][n] for r in res], dim)
            fails += verdict(f"main_grad {n} over {len(Ts)} microbatches", got, acc[n], dtype,
                             slack=acc_slack[n])
    return fails


class MLP(unittest.TestCase):
    def _grid(self, P, dtype):
        """P = 2: every ub_* combination in both dtypes; P = 4: bf16 the even-numbered
        combinations, fp32 the odd ones (together every one); P = 1: TE turns ub_* off."""
        flags = list(enumerate(MLP_FLAGS)) if P > 1 else [(0, {}), (1, MLP_FLAGS[-1])]
        if P == 4:
            flags = flags[int(dtype == torch.float32)::2]
        for i, f in flags:
            norm, act = NORM_ACT[i % 4]
            fuse = i % 2 == 1
            with self.subTest(P=P, dtype=dtype, flags=f, norm=norm, act=act, fuse=fuse):
                self.assertEqual(check_mlp(P, dtype, f, norm, act, fuse, seed=i), [])

    def test_p1_bf16(self):
        self._grid(1, torch.bfloat16)

    def test_p1_fp32(self):
        self._grid(1, torch.float32)

    def test_p2_bf16(self):
        self._grid(2, torch.bfloat16)

    def test_p2_fp32(self):
        self._grid(2, torch.float32)

    def test_p4_bf16(self):
        self._grid(4, torch.bfloat16)

    def test_p4_fp32(self):
        self._grid(4, torch.float32)


# ---- Linear -------------------------------------------------------------------------------------

def check_linear(P, dtype, mode, sp, flags, fuse, seed=0, Ts=TS, bias=True):
    """A column-parallel Linear(H, F) (ub_name fc1) or a row-parallel Linear(F, H) (fc2)."""
    g = torch.Generator().manual_seed(seed)
    col = mode == "column" or mode is None
    N, K = (F, H) if col else (H, F)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).to(F64)
    b = (0.5 * torch.randn(N, generator=g)).to(dtype).to(F64)
    gd = torch.Generator().manual_seed(seed + 1)
    data = [(torch.randn(T, K, generator=gd).to(dtype), torch.randn(T, N, generator=gd).to(dtype))
            for T in Ts]
    cfgs = RS_DGRAD_CFG if flags.get("ub_overlap_rs_dgrad") else None
    key = "col" if col else "row"

    def build(rank):
        return Linear(K, N, bias=bias, parallel_mode=mode, sequence_parallel=sp, tp_size=P,
                      params_dtype=dtype, fuse_wgrad_accumulation=fuse,
                      ub_name="fc1" if col else "fc2", **flags)

    def load(m, rank):
        with torch.no_grad():
            m.weight.copy_(shard(f"{key}_weight", w, rank, P) if mode else w)
            if bias:
                m.bias.copy_(shard(f"{key}_bias", b, rank, P) if mode == "column" else b)

    if mode is None:
        sl_x = sl_dy = whole
    elif col:   # input: this rank's rows with SP, else all; output: this rank's columns
        sl_x, sl_dy = (rows_of if sp else whole), cols_of
    else:       # input: this rank's columns; output: this rank's rows with SP, else all
        sl_x, sl_dy = cols_of, (rows_of if sp else whole)
    res = run_module(P, dtype, build, load, Ts, data, sl_x, sl_dy, fuse, cfgs)
    fails = []
    acc = acc_slack = 0
    Pr = P if mode else 1
    for i, (T, (x, dy)) in enumerate(zip(Ts, data)):
        lin = torch.nn.Linear(K, N, bias=bias, dtype=F64)
        with torch.no_grad():
            lin.weight.copy_(w)
            if bias:
                lin.bias.copy_(b)
        xr = x.to(F64).requires_grad_(True)
        partials = []
        out = col_linear(lin, xr, dtype, Pr) if col else \
            row_linear(lin, xr, dtype, Pr, partials=partials)
        out.backward(dy.to(F64))
        rs_slack = None if col else out_slack(out.detach(), partials, dtype)
        w_slack = sum_slack(T, dy.double().abs().t() @ x.double().abs())
        b_slack = sum_slack(T, dy.double().abs().sum(0))
        tag = f"{mode} mb{i} T={T}"
        if col:   # output: full rows, this rank's columns; input: this rank's rows with SP
            got_out = torch.cat([r[0][i][0] for r in res], 1) if mode else res[0][0][i][0]
            got_dx = torch.cat([r[0][i][1] for r in res]) if sp else res[0][0][i][1]
        else:     # output: this rank's rows with SP; input: this rank's columns
            got_out = torch.cat([r[0][i][0] for r in res]) if sp else res[0][0][i][0]
            got_dx = torch.cat([r[0][i][1] for r in res], 1)
        fails += verdict(f"{tag} out", got_out, out, dtype, slack=rs_slack)
        fails += verdict(f"{tag} dx", got_dx, xr.grad, dtype)
        for r in range(P):
            if not sp and P > 1:  # replicated outputs / inputs: every rank must agree
                if col and mode:
                    fails += verdict(f"{tag} dx rank {r}", res[r][0][i][1], xr.grad, dtype)
                elif not col:
                    fails += verdict(f"{tag} out rank {r}", res[r][0][i][0], out, dtype,
                                     slack=rs_slack)
        acc = acc + lin.weight.grad
        acc_slack = acc_slack + w_slack + U32 * acc.abs()
        if not fuse:
            got_w = torch.cat([r[0][i][2]["weight"] for r in res], 0 if col else 1) if mode \
                else res[0][0][i][2]["weight"]
            fails += verdict(f"{tag} weight", got_w, lin.weight.grad, dtype, slack=w_slack)
        if bias:
            if col and mode:
                got_b = torch.cat([r[0][i][2]["bias"] for r in res])
                fails += verdict(f"{tag} bias", got_b, lin.bias.grad, dtype, slack=b_slack)
            elif sp and P > 1:   # row-parallel, sequence_parallel: per-rank partials (SPEC §12)
                parts = [r[0][i][2]["bias"] for r in res]
                fails += verdict(f"{tag} bias", sum(t.double() for t in parts), lin.bias.grad,
                                 dtype, slack=b_slack + sum(ulp(t, dtype) for t in parts))
            else:
                for r in range(P):
                    fails += verdict(f"{tag} bias rank {r}", res[r][0][i][2]["bias"],
                                     lin.bias.grad, dtype, slack=b_slack)
    if fuse:
        got = torch.cat([r[1]["weight"] for r in res], 0 if col else 1) if mode else \
            res[0][1]["weight"]
        fails += verdict("main_grad over the microbatches", got, acc, dtype, slack=acc_slack)
    return fails


class LinearTests(unittest.TestCase):
    def _col(self, P, dtype):
        grid = [dict(ub_overlap_ag=ag, **bwd) for ag in (False, True) for bwd in COL_BWD]
        for i, f in enumerate(grid if P > 1 else grid[:1]):
            with self.subTest(P=P, dtype=dtype, flags=f):
                self.assertEqual(check_linear(P, dtype, "column", True, f, i % 2 == 1, seed=i),
                                 [])

    def _row(self, P, dtype):
        grid = [dict(ub_overlap_rs=rs, ub_overlap_ag=ag) for rs in (False, True)
                for ag in (False, True)]
        for i, f in enumerate(grid if P > 1 else grid[:1]):
            with self.subTest(P=P, dtype=dtype, flags=f):
                self.assertEqual(check_linear(P, dtype, "row", True, f, i % 2 == 0, seed=i), [])

    def test_column(self):
        for P in (1, 2, 4):
            for dt in (torch.bfloat16, torch.float32):
                self._col(P, dt)

    def test_row(self):
        for P in (1, 2, 4):
            for dt in (torch.bfloat16, torch.float32):
                self._row(P, dt)

    def test_tensor_parallel_without_sequence_parallel(self):
        """Column: replicated input, dgrad all-reduced; row: output all-reduced (the plain path
        on the simulator's BULK communicators); parallel_mode None: no communication."""
        for dt in (torch.bfloat16, torch.float32):
            for mode in ("column", "row", None):
                with self.subTest(dtype=dt, mode=mode):
                    self.assertEqual(check_linear(2, dt, mode, False, {}, False, seed=3), [])

    def test_no_bias(self):
        self.assertEqual(check_linear(2, torch.float32, "column", True,
                                      {"ub_overlap_ag": True, "ub_bulk_dgrad": True,
                                       "ub_bulk_wgrad": True}, False, bias=False), [])
        self.assertEqual(check_linear(2, torch.float32, "row", True,
                                      {"ub_overlap_rs": True, "ub_overlap_ag": True}, False,
                                      bias=False), [])


# ---- return_bias, errors, active_tokens --------------------------------------------------------

def _on_ranks(P, fn, cfgs=None, dtype=torch.float32):
    def body(rank):
        tt.initialize_ub([C, H], P, dtype=dtype, ub_cfgs=cfgs)
        try:
            return fn(rank)
        finally:
            tt.destroy_ub()
    return sim.run(P, body, timeout_ms=20000)


class Behaviour(unittest.TestCase):
    def test_return_bias(self):
        """return_bias: (out without the bias, the bias parameter), out + bias equals the
        module that applies it (Linear row-parallel and LayerNormMLP)."""
        P = 2

        def f(rank):
            kw = dict(tp_size=P, sequence_parallel=True, params_dtype=torch.float32)
            mods = []
            for rb in (False, True):
                lin = Linear(F, H, parallel_mode="row", ub_overlap_rs=True, ub_name="fc2",
                             return_bias=rb, **kw)
                mlp = LayerNormMLP(H, F, set_parallel_mode=True, ub_overlap_ag=True,
                                   ub_overlap_rs=True, return_bias=rb, **kw)
                mods.append((lin, mlp))
            g = torch.Generator().manual_seed(7)   # the same values on every rank and module
            for m in mods[0]:
                with torch.no_grad():
                    for prm in m.parameters():
                        prm.copy_(torch.randn(prm.shape, generator=g))
            for m0, m1 in zip(*mods):
                m1.load_state_dict(m0.state_dict())
            x = torch.randn(16, F // 1, generator=torch.Generator().manual_seed(1))[:, :F // P]
            xm = torch.randn(8, H, generator=torch.Generator().manual_seed(2 + rank))
            out = []
            with active_tokens(16):
                a, (b, bb) = mods[0][0](x), mods[1][0](x)
                c, (d, db) = mods[0][1](xm), mods[1][1](xm)
            out.append(torch.allclose(a, b + bb, rtol=1e-5, atol=1e-5)
                       and bb is mods[1][0].bias and not torch.allclose(a, b))
            out.append(torch.allclose(c, d + db, rtol=1e-5, atol=1e-5)
                       and db is mods[1][1].fc2_bias and not torch.allclose(c, d))
            return out
        for r, ok in enumerate(_on_ranks(P, f)):
            self.assertEqual(ok, [True, True], f"rank {r}")

    def test_rows_disagree_with_active_shape(self):
        """A microbatch whose rows disagree with the active shape: TpflexShapeError naming both,
        raised before anything is communicated (every rank raises; no timeout)."""
        def f(rank):
            m = LayerNormMLP(H, F, tp_size=2, sequence_parallel=True, set_parallel_mode=True,
                             params_dtype=torch.float32, ub_overlap_ag=True, ub_overlap_rs=True)
            lin = Linear(F, H, parallel_mode="row", sequence_parallel=True, tp_size=2,
                         params_dtype=torch.float32, ub_overlap_rs=True, ub_name="fc2")
            msgs = []
            with active_tokens(16):
                for mod, x in ((m, torch.randn(12, H)), (lin, torch.randn(24, F // 2))):
                    try:
                        mod(x)
                        msgs.append(None)
                    except E.TpflexShapeError as e:
                        msgs.append(str(e))
            return msgs
        for msgs in _on_ranks(2, f):
            self.assertIn("12 rows x P = 24 tokens", msgs[0])
            self.assertIn("active shape is [16, 32]", msgs[0])
            self.assertIn("24 rows", msgs[1])
            self.assertIn("active shape is [16, 32]", msgs[1])

    def test_backward_after_shape_change(self):
        def f(rank):
            m = LayerNormMLP(H, F, tp_size=2, sequence_parallel=True, set_parallel_mode=True,
                             params_dtype=torch.float32, ub_overlap_ag=True, ub_overlap_rs=True)
            with active_tokens(16):
                y = m(torch.randn(8, H))
            tt.set_ub_active_shape([32, H])
            try:
                y.sum().backward()
            except E.TpflexShapeError as e:
                return str(e)
            return None
        for msg in _on_ranks(2, f):
            self.assertIn("T = 16 tokens", msg or "")
            self.assertIn("[32, 32]", msg or "")

    def test_active_tokens_restores(self):
        def f(rank):
            ub = tt.get_ub("fc1_fprop")
            tt.set_ub_active_shape([24, H])
            seen = []
            with active_tokens(8) as s:
                seen.append((s, ub.active_shape))
            seen.append(ub.active_shape)
            try:
                with active_tokens(16):
                    raise KeyError("inside")
            except KeyError:
                pass
            seen.append(ub.active_shape)
            try:
                with active_tokens(7):
                    pass
            except E.TpflexError as e:
                seen.append((type(e).__name__, ub.active_shape))
            return seen
        for seen in _on_ranks(2, f):
            self.assertEqual(seen[0], ((8, H), (8, H)))
            self.assertEqual(seen[1], (24, H))
            self.assertEqual(seen[2], (24, H))
            self.assertEqual(seen[3], ("TpflexDivisibleError", (24, H)))

    def test_construction_errors(self):
        def f(rank):
            out = []
            kw = dict(tp_size=2, sequence_parallel=True, params_dtype=torch.float32)
            cases = [
                lambda: Linear(H, F, parallel_mode="column", ub_overlap_ag=True, **kw),
                lambda: Linear(H, F, parallel_mode="column", ub_name="fc1",
                               ub_overlap_rs_dgrad=True, **kw),
                lambda: Linear(H, F, parallel_mode="diagonal", **kw),
                lambda: Linear(H, 31, parallel_mode="column", **kw),
                lambda: LayerNormMLP(H, F, **kw),
                lambda: LayerNormMLP(H, F, set_parallel_mode=True, normalization="BatchNorm",
                                     **kw),
                lambda: LayerNormMLP(H, F, set_parallel_mode=True, activation="swiglu", **kw),
            ]
            for c in cases:
                try:
                    c()
                    out.append(None)
                except E.TpflexError as e:
                    out.append((type(e).__name__, str(e)))
            m = Linear(H, F, parallel_mode="column", ub_name="fc1", ub_overlap_ag=True,
                       fuse_wgrad_accumulation=True, **kw)
            try:
                with active_tokens(16):
                    m(torch.randn(8, H))
                out.append(None)
            except E.TpflexError as e:
                out.append((type(e).__name__, str(e)))
            return out
        for out in _on_ranks(2, f):
            names = [o and o[0] for o in out]
            self.assertEqual(names, ["TpflexInvalidError", "TpflexInvalidError",
                                     "TpflexInvalidError", "TpflexDivisibleError",
                                     "TpflexUnsupportedError", "TpflexInvalidError",
                                     "TpflexUnsupportedError", "TpflexStateError"])
            self.assertIn("needs ub_name", out[0][1])
            self.assertIn("'fc1_dgrad' is registered as BULK AG", out[1][1])
            self.assertIn("out_features 31 does not divide among tp_size 2", out[3][1])
            self.assertIn("set_parallel_mode=True", out[4][1])
            self.assertIn("weight.main_grad", out[7][1])


# ---- torch.compile and finite differences -------------------------------------------------------

class Block(torch.nn.Module):
    """A block built from the modules: LayerNormMLP, then column Linear -> GELU -> row Linear,
    with residuals."""

    def __init__(self, P, dtype):
        super().__init__()
        kw = dict(tp_size=P, sequence_parallel=True, params_dtype=dtype)
        self.mlp = LayerNormMLP(H, F, set_parallel_mode=True, ub_overlap_ag=True,
                                ub_overlap_rs=True, ub_bulk_dgrad=True, ub_bulk_wgrad=True, **kw)
        self.up = Linear(H, F, parallel_mode="column", ub_name="qkv", ub_overlap_ag=True,
                         ub_bulk_dgrad=True, ub_bulk_wgrad=True, **kw)
        self.down = Linear(F, H, parallel_mode="row", ub_name="proj", ub_overlap_rs=True,
                           ub_overlap_ag=True, **kw)

    def forward(self, x):
        x = x + self.mlp(x)
        return x + self.down(Fn.gelu(self.up(x), approximate="tanh"))


class CompileAndGradcheck(unittest.TestCase):
    def test_compile_matches_eager(self):
        import torch._dynamo
        P = 2

        def f(rank, backend):
            blk = Block(P, torch.float32)
            compiled = torch.compile(blk, backend=backend)
            g = torch.Generator().manual_seed(9 + rank)
            fails = []
            for T in (16, 32):
                x = torch.randn(T // P, H, generator=g)
                dy = torch.randn(T // P, H, generator=g)
                res = []
                for fn in (blk, compiled):
                    xr = x.clone().requires_grad_(True)
                    with active_tokens(T):
                        y = fn(xr)
                        y.backward(dy)
                    res.append([y.detach(), xr.grad] + [p.grad.clone() for p in
                                                         blk.parameters()])
                    blk.zero_grad(set_to_none=True)
                for i, (e, c) in enumerate(zip(*res)):
                    if not torch.allclose(e, c, rtol=1e-5, atol=1e-6):
                        fails.append((T, i, float((e - c).abs().max())))
            return fails
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            for r, fails in enumerate(_on_ranks(P, lambda rank: f(rank, backend))):
                self.assertEqual(fails, [], f"{backend} rank {r}")

    def test_finite_differences(self):
        """The sim has no fp64: fp32 central differences of the scalar L = sum over ranks of
        <u_r, out_r> along random directions of the input and of every parameter shard (all
        ranks move together), against sum over ranks of <grad, direction> from backward.
        Stated tolerance: |FD - analytic| <= 2e-3 x (|analytic| + 1), eps = 1e-2 (the central
        difference's truncation is O(eps^4) with the 4-point stencil and fp32's rounding of L about
        1e-7 |L| / eps)."""
        P, T, eps = 2, 16, 1e-2

        def f(rank, flags):
            m = LayerNormMLP(H, F, tp_size=P, sequence_parallel=True, set_parallel_mode=True,
                             params_dtype=torch.float32, **flags)
            with torch.no_grad():   # replicated parameters equal on every rank
                for k, (n, prm) in enumerate(m.named_parameters()):
                    sh = 1000 * rank if n.startswith(("fc1_", "fc2_weight")) else 0
                    prm.normal_(1.0 if n == "layer_norm_weight" else 0.0, 0.3,
                                generator=torch.Generator().manual_seed(300 + k + sh))
            g = torch.Generator().manual_seed(4)
            x = torch.randn(T, H, generator=g)[rank * T // P:(rank + 1) * T // P]
            u = torch.randn(T, H, generator=g)[rank * T // P:(rank + 1) * T // P]
            # Sharded parameters move along each rank's own direction; replicated ones (the
            # norm's, fc2_bias) along one direction on every rank.
            dirs = [torch.randn(x.shape, generator=torch.Generator().manual_seed(100 + rank))]
            for k, (n, p) in enumerate(m.named_parameters()):
                seed = 200 + k + (1000 * rank if n.startswith(("fc1_", "fc2_weight")) else 0)
                dirs.append(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
            with active_tokens(T):
                xr = x.clone().requires_grad_(True)
                (m(xr) * u).sum().backward()
                analytic = [float((xr.grad * dirs[0]).sum())] + \
                    [float((p.grad * d).sum()) for p, d in zip(m.parameters(), dirs[1:])]
                fd = []
                with torch.no_grad():
                    for k in range(len(dirs)):
                        vals = []   # the 4-point central difference: O(eps^4)
                        for s in (2, 1, -1, -2):
                            if k == 0:
                                v = float((m(x + s * eps * dirs[0]) * u).sum())
                            else:
                                p = list(m.parameters())[k - 1]
                                p.add_(s * eps * dirs[k])
                                v = float((m(x) * u).sum())
                                p.sub_(s * eps * dirs[k])
                            vals.append(v)
                        fd.append((-vals[0] + 8 * vals[1] - 8 * vals[2] + vals[3]) / (12 * eps))
            return analytic, fd, [n for n, _ in m.named_parameters()]
        for flags in ({"ub_overlap_ag": True, "ub_overlap_rs": True, "ub_bulk_dgrad": True,
                       "ub_bulk_wgrad": True}, {}):
            res = _on_ranks(P, lambda rank: f(rank, flags))
            # every gradient is a per-rank part (shards, and the sequence_parallel parameters'
            # partial sums, fc2_bias's included: SPEC §12): the directional derivatives add up.
            names = ["input"] + res[0][2]
            an = [sum(r[0][k] for r in res) for k in range(len(names))]
            fd = [sum(r[1][k] for r in res) for k in range(len(res[0][1]))]
            for k, (a, d) in enumerate(zip(an, fd)):
                self.assertLessEqual(abs(a - d), 2e-3 * (abs(a) + 1),
                                     f"{flags} direction {k}: analytic {a} vs FD {d}")



# ---- the host path at tp_size 1 ----------------------------------------------------------------

class _AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten operations dispatched (forward and autograd's backward) by name."""

    def __init__(self):
        super().__init__()
        self.ops = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        n = func.overloadpacket.__name__
        self.ops[n] = self.ops.get(n, 0) + 1
        return func(*args, **(kwargs or {}))


class PlainTorchBlock(torch.nn.Module):
    """Block in torch.nn at tp_size 1: the same arithmetic on the same shapes."""

    def __init__(self, dtype):
        super().__init__()
        self.ln = torch.nn.LayerNorm(H, dtype=dtype)
        self.fc1, self.fc2 = torch.nn.Linear(H, F, dtype=dtype), torch.nn.Linear(F, H, dtype=dtype)
        self.up, self.down = torch.nn.Linear(H, F, dtype=dtype), torch.nn.Linear(F, H, dtype=dtype)

    def forward(self, x):
        x = x + self.fc2(Fn.gelu(self.fc1(self.ln(x)), approximate="tanh"))
        return x + self.down(Fn.gelu(self.up(x), approximate="tanh"))


class HostPathP1(unittest.TestCase):
    """tp_size 1 communicates nothing (TE turns sequence parallelism off), so the modules'
    forward + backward must dispatch exactly torch.nn's aten operations for the same block:
    plus 0 (the modules' autograd functions had added a contiguous copy of the output gradient,
    mm + add for addmm and 16 views per step of two blocks: examples/bench_thd_step.py --device
    cpu counts them). fp32 on the CPU runs the code path of CUDA (torch's kernels round as the
    operation does there); the values agree with torch.nn's on the same weights."""

    def _ops(self, model, x):
        model(x).sum().backward()            # gradients allocated: the counted step accumulates
        with _AtenOps() as c:
            model(x).sum().backward()
        return c.ops

    def test_aten_ops_equal_torch_nn(self):
        def f(rank):
            torch.manual_seed(5)
            ours = torch.nn.Sequential(Block(1, torch.float32), Block(1, torch.float32))
            plain = torch.nn.Sequential(PlainTorchBlock(torch.float32),
                                        PlainTorchBlock(torch.float32))
            pairs = []   # (name, the module's parameter, torch.nn's)
            for i, (b, p) in enumerate(zip(ours, plain)):
                pairs += [(f"{i}.mlp.{n}", getattr(b.mlp, n), getattr(getattr(p, m), k))
                          for n, m, k in (("layer_norm_weight", "ln", "weight"),
                                          ("layer_norm_bias", "ln", "bias"),
                                          ("fc1_weight", "fc1", "weight"),
                                          ("fc1_bias", "fc1", "bias"),
                                          ("fc2_weight", "fc2", "weight"),
                                          ("fc2_bias", "fc2", "bias"))]
                pairs += [(f"{i}.{m}.{k}", getattr(getattr(b, m), k), getattr(getattr(p, m), k))
                          for m in ("up", "down") for k in ("weight", "bias")]
            with torch.no_grad():
                for _, src, dst in pairs:
                    dst.copy_(src)
            out = []
            for T in (16, 40):
                x = torch.randn(T, H)
                with active_tokens(T):
                    xs = [x.clone().requires_grad_(True) for _ in range(2)]
                    out.append((T, self._ops(ours, xs[0]), self._ops(plain, xs[1]),
                                [("input", xs[0].grad, xs[1].grad)] +
                                [(n, a.grad, b.grad) for n, a, b in pairs]))
                ours.zero_grad(set_to_none=True)
                plain.zero_grad(set_to_none=True)
            return out
        for T, ours, plain, grads in _on_ranks(1, f)[0]:
            self.assertEqual(ours, plain, f"T={T}: aten ops per step (tpflex vs torch.nn)")
            self.assertEqual(len(grads), 21)
            for n, g, pg in grads:
                self.assertTrue(torch.allclose(g, pg, rtol=1e-5, atol=1e-5), f"T={T} {n}")

    def test_fused_wgrad_is_one_gemm_into_main_grad(self):
        """fuse_wgrad_accumulation in fp32: the weight gradient is one GEMM into main_grad,
        addmm_ (beta 1) when accumulating and mm(out=main_grad) on is_first_microbatch, not
        mm + add_ / copy_ of a temporary; main_grad holds dy^T x summed over the microbatches."""
        def f(rank):
            torch.manual_seed(8)
            out = []
            for mode in ("column", "row"):
                lin = Linear(H, F, bias=False, parallel_mode=mode, params_dtype=torch.float32,
                             fuse_wgrad_accumulation=True)   # (a bias' .grad accumulates: add_)
                lin.weight.main_grad = torch.full_like(lin.weight, 3.0)
                xs = [torch.randn(16, H) for _ in range(2)]
                dys = [torch.randn(16, F) for _ in range(2)]
                ops = []
                for i, (x, dy) in enumerate(zip(xs, dys)):
                    with _AtenOps() as c:
                        lin(x.requires_grad_(True), is_first_microbatch=i == 0).backward(dy)
                    ops.append(c.ops)
                ref = dys[0].t() @ xs[0] + dys[1].t() @ xs[1]
                out.append((mode, ops, bool(torch.allclose(lin.weight.main_grad, ref,
                                                           rtol=1e-5, atol=1e-5))))
            return out
        for mode, ops, ok in _on_ranks(1, f)[0]:
            self.assertTrue(ok, f"{mode}: main_grad")
            first, acc = ops
            for name, o in (("first", first), ("accumulating", acc)):
                self.assertEqual([o.get(k, 0) for k in ("add_", "copy_")], [0, 0],
                                 f"{mode} {name}: {o}")
            # forward mm (no bias), dgrad mm, and the wgrad GEMM
            self.assertEqual((first.get("mm", 0), first.get("addmm_", 0)), (3, 0),
                             f"{mode}: {first}")
            self.assertEqual((acc.get("mm", 0), acc.get("addmm_", 0)), (2, 1), f"{mode}: {acc}")

    def test_native_path_values(self):
        """The tp_size 1 path (torch's own ops) against the rounding-faithful reference in fp32:
        every norm and activation of LayerNormMLP, and Linear in each parallel mode, without
        fuse_wgrad_accumulation (the grids above take it for one combination each)."""
        for i, (norm, act) in enumerate(NORM_ACT):
            with self.subTest(norm=norm, act=act):
                self.assertEqual(check_mlp(1, torch.float32, MLP_FLAGS[-1], norm, act, False,
                                           seed=20 + i), [])
        for mode in ("column", "row", None):
            with self.subTest(mode=mode):
                self.assertEqual(check_linear(1, torch.float32, mode, True, {}, False, seed=30),
                                 [])

    def test_3d_input_and_return_bias(self):
        """[S, B, H] inputs keep their leading dimensions; return_bias returns the bias
        unapplied (the native path at tp_size 1 as the others)."""
        def f(rank):
            torch.manual_seed(6)
            m = LayerNormMLP(H, F, params_dtype=torch.float32, return_bias=True)
            lin = Linear(H, F, parallel_mode="column", params_dtype=torch.float32)
            x = torch.randn(4, 2, H)
            with torch.no_grad():
                m.fc2_bias.normal_()
            y, b = m(x)
            ref = Fn.linear(Fn.gelu(Fn.linear(Fn.layer_norm(x, (H,), m.layer_norm_weight,
                                                            m.layer_norm_bias), m.fc1_weight,
                                              m.fc1_bias), approximate="tanh"), m.fc2_weight)
            return (tuple(y.shape), b is m.fc2_bias, bool(torch.allclose(y, ref, atol=1e-6)),
                    tuple(lin(x).shape))
        self.assertEqual(_on_ranks(1, f)[0], ((4, 2, H), True, True, (4, 2, F)))


class Resolution(unittest.TestCase):
    def test_communicators_looked_up_once_per_registration(self):
        """A module resolves its sites' communicators once per registration (no get_ub per
        call: they were looked up by name on every forward), and sees a new registration after
        destroy_ub + initialize_ub: the same microbatch gives the same values on the new
        communicators."""
        from tpflex import _manager
        P, T = 2, 16
        counts = threading.local()
        orig = _manager.Manager.get

        def get(self, name):
            counts.n = getattr(counts, "n", 0) + 1
            return orig(self, name)

        def f(rank):
            g = torch.Generator().manual_seed(8 + rank)
            x = torch.randn(T // P, H, generator=g)
            outs, looked, mods = [], [], []
            for reg in range(2):
                tt.initialize_ub([C, H], P, dtype=torch.float32)
                try:
                    if not mods:   # built under the first registration, run under both
                        torch.manual_seed(7)
                        mods = [Block(P, torch.float32),   # plain: the bulk communicators
                                Linear(H, F, parallel_mode="column", tp_size=P,
                                       sequence_parallel=True, params_dtype=torch.float32)]
                    for step in range(3):
                        with active_tokens(T):
                            n0 = getattr(counts, "n", 0)
                            xr = x.clone().requires_grad_(True)
                            y, z = mods[0](xr), mods[1](xr)
                            (y.sum() + z.sum()).backward()
                            looked.append(getattr(counts, "n", 0) - n0)
                            outs.append((y.detach(), z.detach(), xr.grad))
                finally:
                    tt.destroy_ub()
            return looked, outs
        _manager.Manager.get = get
        try:
            res = sim.run(P, f, timeout_ms=20000)
        finally:
            _manager.Manager.get = orig
        for looked, outs in res:
            self.assertGreater(looked[0], 0)
            self.assertGreater(looked[3], 0)   # the new registration, resolved again
            self.assertEqual([looked[i] for i in (1, 2, 4, 5)], [0, 0, 0, 0])
            for o in outs[1:]:
                self.assertTrue(all(torch.equal(u, v) for u, v in zip(o, outs[0])))


if __name__ == "__main__":
    unittest.main()
