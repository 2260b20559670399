"""Precision in the modules (docs/SPEC.md §14) on the simulator, P in {1, 2, 4}:

- initialize_ub's signature is TE's current one (a checked-in list, and TE's source where the
  mirror is present), with_cublasmp=True is refused naming cuBLASMp, ub_cfgs is a dict or a list
  of one dict per quantization mode, UserBufferQuantizationMode is exported where TE has it;
- torch.autocast: fp32 parameters, bf16 GEMMs and communicators, against a host reference that
  casts the same tensors (SPEC §7 per element), gradients in fp32, main_grad fp32, the weight
  cast cached per is_first_microbatch, a registration dtype that disagrees named with the fix;
- FP8 (tpflex.torch.autocast): the modules against a reference that quantizes the same tensors
  with the same scales (SPEC §7: then bf16's tolerances), the whole LayerNormMLP against the
  bf16 model within FP8's error, and DelayedScaling's amax history and scales over 6
  microbatches of changing T equal to a host model of the recipe; the other recipes refused."""
import ast
import inspect
import os
import subprocess
import sys
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from cases import close, close_rs, rs_reference  # noqa: E402
from tpflex import errors as E  # noqa: E402

H, C, F = 32, 64, 64
BF = torch.bfloat16
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
FMAX = {E4: 448.0, E5: 57344.0}
MIRROR = "/work/.mirror/NVIDIA+TransformerEngine/repo"

# TE's initialize_ub (transformer_engine/pytorch/module/base.py), in order, with defaults.
TE_INITIALIZE_UB = [("shape", None), ("tp_size", None), ("use_fp8", False),
                    ("quantization_modes", None), ("dtype", "torch.bfloat16"), ("ub_cfgs", None),
                    ("bootstrap_backend", None), ("with_cublasmp", False)]
# TE's autocast (transformer_engine/pytorch/quantization.py).
TE_AUTOCAST = [("enabled", True), ("calibrating", False), ("recipe", None),
               ("amax_reduction_group", None), ("_graph", False)]


def _te_source(path):
    """TE's file from the mirror (None where the mirror is absent)."""
    if not os.path.isdir(MIRROR):
        return None
    r = subprocess.run(["git", "--git-dir", MIRROR, "show", f"HEAD:{path}"],
                       capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _te_params(src, name, cls=False):
    """[(param, default source)] of def `name` (or class `name`'s __init__) in src."""
    for node in ast.walk(ast.parse(src)):
        if cls and isinstance(node, ast.ClassDef) and node.name == name:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    return _params_of(f, skip_self=True)
        if not cls and isinstance(node, ast.FunctionDef) and node.name == name:
            return _params_of(node)
    return None


def _params_of(f, skip_self=False):
    args = f.args.args[1:] if skip_self else f.args.args
    d = [None] * (len(args) - len(f.args.defaults)) + list(f.args.defaults)
    out = []
    for a, v in zip(args, d):
        dv = None if v is None else ast.literal_eval(v) if not isinstance(v, ast.Attribute) \
            else ast.unparse(v)
        out.append((a.arg, dv))
    return out


def _ours(fn, skip_self=False):
    ps = [p for p in inspect.signature(fn).parameters.values()
          if p.kind == p.POSITIONAL_OR_KEYWORD]
    out = []
    for p in ps:
        d = None if p.default is p.empty else p.default
        out.append((p.name, str(d) if isinstance(d, torch.dtype) else d))
    return out


def run(P, body, use_fp8=False, dtype=BF, **kw):
    def f(rank):
        te.initialize_ub([C, H], P, use_fp8=use_fp8, dtype=dtype, backend="sim", **kw)
        try:
            return body(P, rank)
        finally:
            te.destroy_ub()
    return sim.run(P, f)


def rnd(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1) * scale


# ---- a host model of per-tensor FP8 (independent of tpflex._quant) ---------------------------

def h_scale(amax, fmax, margin=0):
    """Current scaling's (and the delayed update's) scale for one amax, in fp32."""
    a = float(amax)
    if a == 0.0 or a != a or a == float("inf"):
        return 1.0
    return float(torch.tensor((fmax / a) / 2 ** margin, dtype=torch.float32))


def h_q(x, scale, dt):
    """Quantize x with scale: (values as the fp8 dtype, scale_inv)."""
    s = torch.tensor(scale, dtype=torch.float32)
    return (x.float() * s).clamp(-FMAX[dt], FMAX[dt]).to(dt), float(1.0 / s)


def h_mm(a, b, sa, sb):
    """(a @ b) * sa * sb, fp32 products of the exactly decoded fp8 values."""
    return (a.double() @ b.double()).float() * torch.tensor(sa * sb, dtype=torch.float32)


# ---- the tests -----------------------------------------------------------------------------

class Signature(unittest.TestCase):
    def test_initialize_ub_is_tes(self):
        self.assertEqual(_ours(te.initialize_ub), TE_INITIALIZE_UB)
        kw = [n for n, p in inspect.signature(te.initialize_ub).parameters.items()
              if p.kind == p.KEYWORD_ONLY]
        self.assertEqual(kw[:4], ["group", "backend", "device", "timeout_ms"])
        src = _te_source("transformer_engine/pytorch/module/base.py")
        if src is not None:  # the mirror: TE's source itself
            self.assertEqual(_te_params(src, "initialize_ub"), TE_INITIALIZE_UB)

    def test_autocast_is_tes(self):
        self.assertEqual(_ours(te.autocast.__init__)[1:], TE_AUTOCAST)
        src = _te_source("transformer_engine/pytorch/quantization.py")
        if src is not None:
            self.assertEqual(_te_params(src, "autocast", cls=True), TE_AUTOCAST)
            self.assertEqual([n for n, _ in _te_params(src, "fp8_autocast")],
                             [n for n, _ in _ours(te.fp8_autocast)])

    def test_recipes_have_tes_fields(self):
        import dataclasses
        from tpflex.common import recipe as R
        self.assertIs(te.DelayedScaling, R.DelayedScaling)
        d = R.DelayedScaling()
        self.assertEqual((d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo,
                          d.reduce_amax), (0, R.Format.HYBRID, 1024, "max", True))
        self.assertEqual(R.Format.HYBRID.value, (448, 57344))
        src = _te_source("transformer_engine/common/recipe/__init__.py")
        if src is None:
            return
        tree = ast.parse(src)
        for cname in ("DelayedScaling", "Float8CurrentScaling"):
            node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and
                        n.name == cname)
            theirs = {s.target.id if isinstance(s, ast.AnnAssign) else s.targets[0].id
                      for s in node.body if isinstance(s, (ast.AnnAssign, ast.Assign))}
            ours = {f.name for f in dataclasses.fields(getattr(R, cname))}
            self.assertEqual(theirs, ours, cname)

    def test_exports(self):
        from tpflex.torch.module import base
        self.assertIs(base.UserBufferQuantizationMode, te.UserBufferQuantizationMode)
        self.assertEqual([m.value for m in te.UserBufferQuantizationMode], ["none", "fp8"])
        from tpflex.torch import quantization, fp8  # noqa: F401 (TE's paths)
        self.assertIs(quantization.autocast, te.autocast)
        # TE's layer test spells them te.module.base.initialize_ub / ...UserBufferQuantizationMode.
        self.assertIs(te.module.base.initialize_ub, te.initialize_ub)
        self.assertIs(te.quantization.quantized_model_init, te.quantized_model_init)
        self.assertIs(fp8.DelayedScaling, te.DelayedScaling)


class InitializeUb(unittest.TestCase):
    def _err(self, **kw):
        def f(rank):
            try:
                te.initialize_ub([C, H], 1, backend="sim", **kw)
            except E.TpflexError as e:
                return e
            te.destroy_ub()
            return None
        return sim.run(1, f)[0]

    def test_with_cublasmp(self):
        e = self._err(with_cublasmp=True)
        self.assertIsInstance(e, E.TpflexUnsupportedError)
        self.assertIn("cuBLASMp", str(e))
        self.assertIn("with_cublasmp=False", str(e))
        self.assertIsNone(self._err(with_cublasmp=False))

    def test_modes_and_cfgs_per_mode(self):
        M = te.UserBufferQuantizationMode

        def body(P, r):
            a, b = te.get_ub("fc1_fprop", use_fp8=False), te.get_ub("fc1_fprop", use_fp8=True)
            rs = te.get_ub("fc2_fprop", use_fp8=True)
            return (a.dtype, b.dtype, a.algo, b.algo, rs.dtype, b.name, te.get_ub("fc1_fprop").name)
        cfgs = [{"fc1_fprop": {"method": "ring_exchange"}}, {"fc1_fprop": {"method": "bulk"}}]
        got = run(2, body, quantization_modes=[M.NONE, M.FP8], ub_cfgs=cfgs)[0]
        self.assertEqual(got, (BF, E4, "ring", "bulk", BF, "fc1_fprop.fp8", "fc1_fprop"))
        # One dict for every mode; FP8 alone: get_ub(use_fp8=False) names the fix.
        got = run(1, lambda P, r: te.get_ub("fc1_fprop", use_fp8=True).dtype,
                  quantization_modes=[M.FP8], ub_cfgs={"fc1_fprop": {"num_splits": 1}})[0]
        self.assertEqual(got, E4)

        def no_none(P, r):
            try:
                te.get_ub("fc1_fprop", use_fp8=False)
            except E.TpflexInvalidError as e:
                return str(e)
        self.assertIn("UserBufferQuantizationMode.NONE", run(1, no_none, use_fp8=True)[0])
        for kw, words in (({"quantization_modes": [M.NONE, M.FP8], "ub_cfgs": [{}]},
                           ("1 entries", "2")),
                          ({"quantization_modes": [M.FP8, M.FP8]}, ("twice",)),
                          ({"quantization_modes": M.FP8}, ("list",)),
                          ({"ub_cfgs": [{}, 3]}, ("ub_cfgs",))):
            e = self._err(**kw)
            self.assertIsInstance(e, E.TpflexInvalidError, kw)
            for w in words:
                self.assertIn(w, str(e), kw)


def _mlp(P, r, seed, **kw):
    m = te.LayerNormMLP(H, F, tp_size=P, sequence_parallel=P > 1, set_parallel_mode=True,
                        params_dtype=torch.float32, **kw)
    Fp = F // P
    with torch.no_grad():
        m.layer_norm_weight.copy_(1 + rnd(H, seed=seed, scale=0.2))
        m.layer_norm_bias.copy_(rnd(H, seed=seed + 1, scale=0.2))
        m.fc1_weight.copy_(rnd(F, H, seed=seed + 2, scale=0.3)[r * Fp:(r + 1) * Fp])
        m.fc1_bias.copy_(rnd(F, seed=seed + 3, scale=0.1)[r * Fp:(r + 1) * Fp])
        m.fc2_weight.copy_(rnd(H, F, seed=seed + 4, scale=0.3)[:, r * Fp:(r + 1) * Fp])
        m.fc2_bias.copy_(rnd(H, seed=seed + 5, scale=0.1))
    return m


UB_ALL = dict(ub_overlap_ag=True, ub_overlap_rs=True, ub_bulk_dgrad=True, ub_bulk_wgrad=True)


def _mlp_ref(seed, x, dy, cdt, P=1):
    """The unsharded LayerNormMLP on the host with fp32 parameters and GEMM inputs rounded to
    cdt (torch.autocast's arithmetic): fp32 accumulation, one rounding per GEMM output."""
    lw = (1 + rnd(H, seed=seed, scale=0.2)).requires_grad_()
    lb = rnd(H, seed=seed + 1, scale=0.2).requires_grad_()
    w1 = rnd(F, H, seed=seed + 2, scale=0.3).requires_grad_()
    b1 = rnd(F, seed=seed + 3, scale=0.1).requires_grad_()
    w2 = rnd(H, F, seed=seed + 4, scale=0.3).requires_grad_()
    b2 = rnd(H, seed=seed + 5, scale=0.1).requires_grad_()
    r = lambda t: t.to(cdt).float()  # noqa: E731
    ln = r(torch.nn.functional.layer_norm(r(x), (H,), lw, lb, 1e-5))
    y1 = r(ln @ r(w1).t() + r(b1))   # the bias in the compute dtype too (TE casts it)
    a = r(torch.nn.functional.gelu(y1, approximate="tanh"))
    y = r(a @ r(w2).t() + r(b2))
    y.backward(dy.float())
    # fc2's reduce-scatter: the P partials pass through cdt before their fp32 sum (SPEC §7).
    Fp = F // P
    with torch.no_grad():
        parts = [a[:, q * Fp:(q + 1) * Fp] @ r(w2)[:, q * Fp:(q + 1) * Fp].t() for q in range(P)]
        yrs, slack = rs_reference([p.to(cdt) for p in parts], cdt) if P > 1 else (y, None)
        yrs = yrs + r(b2) if P > 1 else y
    return yrs, slack, {"fc1_weight": w1.grad, "fc2_weight": w2.grad, "fc1_bias": b1.grad,
               "fc2_bias": b2.grad}


class TorchAutocast(unittest.TestCase):
    def test_bf16_autocast_over_fp32_parameters(self):
        """TE's pattern: fp32 parameters, torch.autocast(bf16) around the forward, bf16
        registration; output bf16, gradients fp32, close to the host model of the same
        arithmetic; T changes per microbatch."""
        seed = 11

        def body(P, r):
            m = _mlp(P, r, seed, **UB_ALL)
            out = []
            for T in (16, 48, 32):
                x, dy = rnd(T, H, seed=T), rnd(T, H, seed=T + 1, scale=0.5)
                n = T // P if P > 1 else T
                for p in m.parameters():
                    p.grad = None
                with te.active_tokens(T):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        y = m(x[r * n:(r + 1) * n])
                    y.backward(dy[r * n:(r + 1) * n].to(y.dtype))
                out.append((T, y.detach(), {k: p.grad.clone() for k, p in m.named_parameters()},
                            {k: p.dtype for k, p in m.named_parameters()}))
            return out
        for P in (1, 2, 4):
            res = run(P, body)
            for i, (T, _, _, _) in enumerate(res[0]):
                x, dy = rnd(T, H, seed=T), rnd(T, H, seed=T + 1, scale=0.5)
                yref, slack, gref = _mlp_ref(seed, x, dy.to(BF), BF, P)
                ys = torch.cat([res[r][i][1] for r in range(P)]) if P > 1 else res[0][i][1]
                self.assertEqual(ys.dtype, BF)
                self.assertTrue(close(ys, yref, BF) if P == 1 else
                                close_rs(ys, yref, slack, BF), (P, T))
                Fp = F // P
                for r in range(P):
                    g, dts = res[r][i][2], res[r][i][3]
                    self.assertTrue(all(d == torch.float32 for d in dts.values()))
                    self.assertEqual(g["fc1_weight"].dtype, torch.float32)
                    # Gradients: the host model's, bf16 GEMM inputs (bf16's tolerances).
                    self.assertTrue(close(g["fc1_weight"], gref["fc1_weight"][r * Fp:(r + 1) * Fp],
                                          BF), (P, T, r))
                    self.assertTrue(close(g["fc2_weight"],
                                          gref["fc2_weight"][:, r * Fp:(r + 1) * Fp], BF),
                                    (P, T, r))

    def test_registration_dtype_must_match(self):
        def body(P, r):
            m = te.Linear(H, F, tp_size=P, sequence_parallel=True, parallel_mode="column",
                          ub_name="fc1", ub_overlap_ag=True, params_dtype=torch.float32)
            with te.active_tokens(16):
                try:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        m(rnd(16 // P, H, seed=1))
                except E.TpflexInvalidError as e:
                    return str(e)
        msg = run(2, body, dtype=torch.float32)[0]
        for w in ("'fc1_fprop'", "torch.float32", "torch.bfloat16", "torch.autocast",
                  "initialize_ub(..., dtype=torch.bfloat16)"):
            self.assertIn(w, msg)

    def test_main_grad_and_weight_cache(self):
        """fuse_wgrad_accumulation: main_grad fp32 accumulates the bf16 GEMMs' fp32 sums;
        is_first_microbatch under FP8: True quantizes and caches, False reuses (a weight changed
        in between is not seen), None quantizes afresh; under torch.autocast alone the bf16
        cast is made every call (TE caches quantized weights only)."""
        def body(P, r):
            m = te.Linear(H, F, tp_size=P, sequence_parallel=True, parallel_mode="column",
                          ub_name="fc1", ub_overlap_ag=True, ub_bulk_dgrad=True,
                          ub_bulk_wgrad=True, fuse_wgrad_accumulation=True,
                          params_dtype=torch.float32)
            m.weight.main_grad = torch.zeros_like(m.weight)
            x = rnd(16, H, seed=3)[r * 8:(r + 1) * 8]
            dy = rnd(16, F // P, seed=4 + r).to(BF)
            ys = []
            with te.active_tokens(16):
                for first in (True, False):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        y = m(x, is_first_microbatch=first)
                    y.backward(dy)
                    ys.append(y.detach())
                mg = m.weight.main_grad.clone()
                w0 = m.weight.detach().clone()
                with torch.no_grad():
                    m.weight.mul_(2)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    amp = m(x, is_first_microbatch=False).detach()   # AMP: cast afresh
                fp8 = []
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    rec = te.Float8CurrentScaling()
                    for first in (True, False, None):
                        if first is False:
                            m.weight.mul_(0.5)
                        with te.autocast(recipe=rec):
                            fp8.append(m(x, is_first_microbatch=first))
            return ys, mg, m.weight.grad, amp, fp8, w0, x, dy
        M = te.UserBufferQuantizationMode
        for P in (2,):
            res = run(P, body, quantization_modes=[M.NONE, M.FP8])
            for r in range(P):
                ys, mg, g, amp, fp8, w0, x, dy = res[r]
                self.assertIsNone(g)
                self.assertEqual(mg.dtype, torch.float32)
                xt = torch.cat([res[q][6] for q in range(P)]).to(BF).float()
                ref = 2 * (dy.float().t() @ xt)
                self.assertTrue(close(mg, ref, BF), r)
                self.assertTrue(torch.equal(ys[0], ys[1]))
                self.assertTrue(close(amp, (xt @ (2 * w0).to(BF).float().t()).to(BF), BF))
                self.assertTrue(torch.equal(fp8[1], fp8[0]))    # the cached FP8 weight (2 w0)
                self.assertFalse(torch.equal(fp8[2], fp8[1]))   # None: w0 quantized afresh
                xq, xi = h_q(xt, h_scale(xt.abs().max(), 448.0), E4)
                wq, wi = h_q(w0, h_scale(w0.abs().max(), 448.0), E4)
                self.assertTrue(close(fp8[2], h_mm(xq, wq.t(), xi, wi), BF))


# ---- FP8 -------------------------------------------------------------------------------------

def _col_linear(P, r, seed, **kw):
    m = te.Linear(H, F, tp_size=P, sequence_parallel=P > 1, parallel_mode="column",
                  ub_name="fc1", params_dtype=torch.float32, **kw)
    Fp = F // P
    with torch.no_grad():
        m.weight.copy_(rnd(F, H, seed=seed, scale=0.3)[r * Fp:(r + 1) * Fp])
        m.bias.copy_(rnd(F, seed=seed + 1, scale=0.1)[r * Fp:(r + 1) * Fp])
    return m


def _row_linear(P, r, seed, **kw):
    m = te.Linear(F, H, tp_size=P, sequence_parallel=P > 1, parallel_mode="row",
                  ub_name="fc2", params_dtype=torch.float32, **kw)
    Fp = F // P
    with torch.no_grad():
        m.weight.copy_(rnd(H, F, seed=seed, scale=0.3)[:, r * Fp:(r + 1) * Fp])
        m.bias.copy_(rnd(H, seed=seed + 1, scale=0.1))
    return m


def _fp8_reg(ub):
    """The ub paths on TE's legacy use_fp8=True registration; the plain path on both modes (its
    simulator collectives take the NONE mode's bulk sites)."""
    M = te.UserBufferQuantizationMode
    return {"use_fp8": True} if ub else {"quantization_modes": [M.NONE, M.FP8]}


class Fp8(unittest.TestCase):
    def test_column_parallel_against_the_quantized_reference(self):
        """Current scaling, HYBRID: y = Q(x) Q(W)^T (FP8 RING AG of Q(x)), dX = RS(Q(dy) Q(W)),
        dW = Q(dy)^T AG(Q(x)) (FP8 BULK AG beside the dgrad GEMM), each against the host model
        quantizing the same tensors with the same scales."""
        seed, T = 21, 32
        recipe = te.Float8CurrentScaling()

        def body(P, r, ub):
            m = _col_linear(P, r, seed, **(dict(ub_overlap_ag=True, ub_bulk_dgrad=True,
                                                ub_bulk_wgrad=True) if ub else {}))
            n = T // P
            x = rnd(T, H, seed=5)[r * n:(r + 1) * n].to(BF).requires_grad_()
            with te.active_tokens(T):
                with torch.autocast("cpu", dtype=BF), te.autocast(recipe=recipe):
                    y = m(x)
                y.backward(rnd(T, F, seed=6 + r, scale=0.01)[:, :F // P].to(BF))
            return y.detach(), x.grad, m.weight.grad, m.bias.grad
        for P in (1, 2, 4):
            for ub in ((False, True) if P > 1 else (False,)):
                res = run(P, lambda P, r: body(P, r, ub), **_fp8_reg(ub))
                x = rnd(T, H, seed=5).to(BF)
                sx = h_scale(x.float().abs().max(), 448.0)
                xq, xi = h_q(x, sx, E4)
                Fp, n = F // P, T // P
                W = rnd(F, H, seed=seed, scale=0.3)
                b = rnd(F, seed=seed + 1, scale=0.1)
                parts = []
                for r in range(P):
                    y, dx, dw, db = res[r]
                    w = W[r * Fp:(r + 1) * Fp]
                    sw = h_scale(w.abs().max(), 448.0)
                    wq, wi = h_q(w, sw, E4)
                    ref = h_mm(xq, wq.t(), xi, wi) + b[r * Fp:(r + 1) * Fp].to(BF).float()
                    self.assertTrue(close(y, ref, BF), (P, ub, r, "y"))
                    dy = rnd(T, F, seed=6 + r, scale=0.01)[:, :Fp].to(BF)
                    sdy = h_scale(dy.float().abs().max(), 57344.0)
                    dyq, dyi = h_q(dy, sdy, E5)
                    self.assertTrue(close(dw, h_mm(dyq.t(), xq, dyi, xi), BF), (P, ub, r, "dw"))
                    self.assertTrue(close(db, dy.float().sum(0), BF), (P, ub, r, "db"))
                    parts.append(h_mm(dyq, wq, dyi, wi).to(BF))
                ref, slack = rs_reference(parts, BF)
                for r in range(P):
                    self.assertTrue(close_rs(res[r][1], ref[r * n:(r + 1) * n],
                                             slack[r * n:(r + 1) * n], BF), (P, ub, r, "dx"))

    def test_row_parallel_against_the_quantized_reference(self):
        """Current scaling: y = RS(Q(x_r) Q(W_r)^T) + b (GEMM + RS in bf16 from FP8 operands),
        dY gathered in FP8 (E5M2, one scale from the TP-reduced amax), dX = AG(Q(dY)) Q(W_r),
        dW = AG(Q(dY))^T Q(x_r)."""
        seed, T = 31, 32
        recipe = te.Float8CurrentScaling()

        def body(P, r, ub):
            m = _row_linear(P, r, seed, **(dict(ub_overlap_rs=True, ub_overlap_ag=True)
                                           if ub else {}))
            Fp, n = F // P, T // P
            x = rnd(T, F, seed=7)[:, r * Fp:(r + 1) * Fp].to(BF).requires_grad_()
            with te.active_tokens(T):
                with torch.autocast("cpu", dtype=BF), te.autocast(recipe=recipe):
                    y = m(x)
                y.backward(rnd(T, H, seed=8, scale=0.01)[r * n:(r + 1) * n].to(BF))
            return y.detach(), x.grad, m.weight.grad
        for P in (1, 2, 4):
            for ub in ((False, True) if P > 1 else (False,)):
                res = run(P, lambda P, r: body(P, r, ub), **_fp8_reg(ub))
                Fp, n = F // P, T // P
                X = rnd(T, F, seed=7).to(BF)
                W = rnd(H, F, seed=seed, scale=0.3)
                b = rnd(H, seed=seed + 1, scale=0.1).to(BF).float()
                dY = rnd(T, H, seed=8, scale=0.01).to(BF)
                sdy = h_scale(dY.float().abs().max(), 57344.0)
                dyq, dyi = h_q(dY, sdy, E5)
                parts = []
                for r in range(P):
                    x, w = X[:, r * Fp:(r + 1) * Fp], W[:, r * Fp:(r + 1) * Fp]
                    xq, xi = h_q(x, h_scale(x.float().abs().max(), 448.0), E4)
                    wq, wi = h_q(w, h_scale(w.abs().max(), 448.0), E4)
                    parts.append(h_mm(xq, wq.t(), xi, wi))
                    _, dx, dw = res[r]
                    self.assertTrue(close(dx, h_mm(dyq, wq, dyi, wi), BF), (P, ub, r, "dx"))
                    self.assertTrue(close(dw, h_mm(dyq.t(), xq, dyi, xi), BF), (P, ub, r, "dw"))
                if P == 1:
                    self.assertTrue(close(res[0][0], parts[0] + b, BF), "y")
                    continue
                ref, slack = rs_reference([p.to(BF) for p in parts], BF)
                for r in range(P):
                    self.assertTrue(close_rs(res[r][0], ref[r * n:(r + 1) * n] + b,
                                             slack[r * n:(r + 1) * n], BF), (P, ub, r, "y"))

    def test_layernorm_mlp_against_bf16_within_fp8_error(self):
        """The whole LayerNormMLP in FP8 (every ub overlap, FP8 registrations) against the same
        model under torch.autocast(bf16): normwise relative error within the formats' unit
        roundoffs (E4M3 2^-4 per operand forward, E5M2 2^-3 for the gradient)."""
        seed = 41

        def body(P, r, fp8):
            m = _mlp(P, r, seed, **UB_ALL)
            T = 48
            n = T // P if P > 1 else T
            x = rnd(T, H, seed=9)[r * n:(r + 1) * n].to(BF)
            dy = rnd(T, H, seed=10, scale=0.1)[r * n:(r + 1) * n].to(BF)
            with te.active_tokens(T):
                ctx = te.autocast(recipe=te.DelayedScaling(amax_history_len=4)) if fp8 else \
                    torch.autocast("cpu", dtype=torch.bfloat16)
                outs = []
                for step in range(3):   # delayed scaling: the scales settle after a step
                    for p in m.parameters():
                        p.grad = None
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        with ctx if fp8 else torch.autocast("cpu", dtype=torch.bfloat16):
                            y = m(x)
                    y.backward(dy)
                    outs.append((y.detach(), m.fc1_weight.grad.clone(),
                                 m.fc2_weight.grad.clone()))
                    if fp8:
                        ctx = te.autocast(recipe=ctx._recipe)
            return outs[-1]
        rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
        for P in (1, 2, 4):
            ref = run(P, lambda P, r: body(P, r, False))
            got = run(P, lambda P, r: body(P, r, True), use_fp8=True)
            for r in range(P):
                self.assertLess(rel(got[r][0], ref[r][0]), 2 * 2 ** -4, (P, r, "y"))
                for i in (1, 2):
                    self.assertLess(rel(got[r][i], ref[r][i]), 2 ** -4 + 2 ** -3, (P, r, i))
                self.assertGreater(rel(got[r][0], ref[r][0]), 0.0)   # FP8 did run

    def test_delayed_scaling_history_matches_a_host_model(self):
        """6 microbatches of changing T through a column-parallel Linear (FP8 RING AG, BULK
        dgrad/wgrad), one autocast each: the amax history and the scales after every step, and
        the output computed with the host model's scale."""
        Ts = (16, 48, 32, 64, 8, 40)
        for algo in ("max", "most_recent"):
            recipe = te.DelayedScaling(margin=1, amax_history_len=3, amax_compute_algo=algo)

            def body(P, r):
                m = _col_linear(P, r, 51, ub_overlap_ag=True, ub_bulk_dgrad=True,
                                ub_bulk_wgrad=True)
                log = []
                for i, T in enumerate(Ts):
                    n = T // P
                    x = rnd(T, H, seed=100 + i, scale=1 + i)[r * n:(r + 1) * n].to(BF)
                    w = m.weight.detach().clone()   # this step's weight (the input of its cast)
                    with te.active_tokens(T):
                        with torch.autocast("cpu", dtype=BF), te.autocast(recipe=recipe):
                            y = m(x)
                        y.backward(rnd(T, F, seed=200 + i + r, scale=0.5 / (1 + i))
                                   [:, :F // P].to(BF))
                    with torch.no_grad():
                        m.weight.sub_(0.5 * m.weight.grad)   # the weight's amax changes too
                    m.weight.grad = None
                    _, fwd, bwd = m._site._fp8_metas
                    log.append((y.detach(), fwd.amax_history.clone(), fwd.scale.clone(),
                                bwd.amax_history.clone(), bwd.scale.clone(), w))
                return log
            for P in (2, 4):
                res = run(P, body, use_fp8=True)
                L, Fp = 3, F // P
                hist_f = [[0.0, 0.0] for _ in range(L)]
                hist_b = [[0.0] for _ in range(L)]
                scale_f, scale_b = [1.0, 1.0], [1.0]

                def update(hist, scale, fmax):
                    n = len(scale)
                    amax = [max(h[j] for h in hist) if algo == "max" else hist[0][j]
                            for j in range(n)]
                    hist[:] = hist[1:] + hist[:1]
                    hist[0] = [0.0] * n
                    for j in range(n):
                        if amax[j] > 0:
                            scale[j] = h_scale(amax[j], fmax, margin=1)
                for i, T in enumerate(Ts):
                    x = rnd(T, H, seed=100 + i, scale=1 + i).to(BF)
                    Ws = [res[q][i][5] for q in range(P)]
                    # The output of step i is computed with the scales of before step i.
                    xq, xi = h_q(x, scale_f[0], E4)
                    for q in range(P):
                        wq, wi = h_q(Ws[q], scale_f[1], E4)
                        ref = h_mm(xq, wq.t(), xi, wi) + \
                            rnd(F, seed=52, scale=0.1)[q * Fp:(q + 1) * Fp].to(BF).float()
                        self.assertTrue(close(res[q][i][0], ref, BF), (algo, P, i, q))
                    # Amaxes are reduced over the world (the simulator's, TE's default group).
                    hist_f[0] = [max(hist_f[0][0], float(x.float().abs().max())),
                                 max(hist_f[0][1], max(float(w.abs().max()) for w in Ws))]
                    update(hist_f, scale_f, 448.0)
                    dys = [rnd(T, F, seed=200 + i + q, scale=0.5 / (1 + i))[:, :Fp].to(BF)
                           for q in range(P)]
                    hist_b[0] = [max(hist_b[0][0], max(float(d.float().abs().max())
                                                       for d in dys))]
                    update(hist_b, scale_b, 57344.0)
                    for q in range(P):
                        _, hf, sf, hb, sb, _ = res[q][i]
                        self.assertEqual(hf.tolist(), [[float(torch.tensor(v, dtype=torch.float32))
                                                        for v in row] for row in hist_f],
                                         (algo, P, i, q))
                        self.assertEqual(sf.tolist(), scale_f, (algo, P, i, q))
                        self.assertEqual(hb.tolist(), [[float(torch.tensor(v, dtype=torch.float32))
                                                        for v in row] for row in hist_b])
                        self.assertEqual(sb.tolist(), scale_b, (algo, P, i, q))

    def test_both_modes_pick_the_registration(self):
        """quantization_modes=[FP8, NONE] (TE's first/last layers in bf16): a module inside
        autocast runs on the FP8 registrations, one under a nested autocast(enabled=False) on
        the NONE ones: each equal to the run on a registration of that mode alone."""
        M = te.UserBufferQuantizationMode

        def body(P, r, which):
            m = _col_linear(P, r, 71, ub_overlap_ag=True, ub_bulk_dgrad=True, ub_bulk_wgrad=True)
            x = rnd(32, H, seed=12)[r * 16:(r + 1) * 16]
            out = {}
            with te.active_tokens(32), torch.autocast("cpu", dtype=BF):
                with te.autocast(recipe=te.Float8CurrentScaling()):
                    if which in ("both", "fp8"):
                        out["fp8"] = m(x).detach()
                    if which in ("both", "none"):
                        with te.autocast(enabled=False):
                            out["none"] = m(x).detach()
            return out
        both = run(2, lambda P, r: body(P, r, "both"), quantization_modes=[M.FP8, M.NONE])
        fp8 = run(2, lambda P, r: body(P, r, "fp8"), quantization_modes=[M.FP8])
        none = run(2, lambda P, r: body(P, r, "none"), quantization_modes=[M.NONE])
        for r in range(2):
            self.assertTrue(torch.equal(both[r]["fp8"], fp8[r]["fp8"]), r)
            self.assertTrue(torch.equal(both[r]["none"], none[r]["none"]), r)
            self.assertFalse(torch.equal(both[r]["fp8"], both[r]["none"]), r)

    def test_current_scaling_rules(self):
        """TE's compute_scale_from_amax: fp8_max / amax; 1 for 0, inf and NaN; amax_epsilon
        raises a small amax; power_2_scale keeps the exponent only; fp32's max on overflow."""
        from tpflex import _quant
        a = torch.tensor([3.0, 0.0, float("inf"), float("nan"), 1e-3, 1e-45])
        got = _quant.scale_from_amax(a, 448.0).tolist()
        self.assertEqual(got[:4], [h_scale(3.0, 448.0), 1.0, 1.0, 1.0])
        self.assertEqual(got[4], h_scale(float(torch.tensor(1e-3)), 448.0))
        self.assertEqual(got[5], float(torch.finfo(torch.float32).max))
        self.assertEqual(_quant.scale_from_amax(a[:1], 448.0, pow2=True).tolist(), [128.0])
        self.assertEqual(_quant.scale_from_amax(torch.tensor([1e-3]), 448.0,
                                                epsilon=0.5).tolist(), [896.0])

    def test_delayed_scaling_callables(self):
        """amax_compute_algo and scaling_factor_compute_algo as callables (TE's unfused update):
        the scale is what they return, from the history before it rolls."""
        seen = []

        def amax_algo(h):
            seen.append(h.clone())
            return h.max(0).values * 2

        def sf_algo(amax, scale, fp8_max, recipe):
            return fp8_max / amax / 4

        recipe = te.DelayedScaling(amax_history_len=2, amax_compute_algo=amax_algo,
                                   scaling_factor_compute_algo=sf_algo)
        m = te.Linear(H, F, params_dtype=torch.float32)
        x = rnd(8, H, seed=13, scale=2.0)
        with te.autocast(recipe=recipe):
            m(x)
        _, fwd, _ = m._site._fp8_metas
        amax = torch.tensor([float(x.abs().max()), float(m.weight.abs().max())])
        self.assertEqual(seen[0][0].tolist(), amax.tolist())     # the newest row, before the roll
        self.assertEqual(fwd.amax_history[-1].tolist(), amax.tolist())
        self.assertEqual(fwd.scale.tolist(), (448.0 / (2 * amax) / 4).tolist())

    def test_packed_update_equals_each_site_alone(self):
        """reduce_and_update packs a buffer's metas into one history: its update equals each
        meta's own update, a meta joining later keeps its values when the buffer is packed
        again, and the metas' scale / history are views of the packed tensors afterwards."""
        from tpflex import _quant as Q
        torch.manual_seed(5)
        rec = te.DelayedScaling(margin=1, amax_history_len=3)

        def metas(n):
            ms = [Q._DelayedMeta(rec, k, torch.device("cpu")) for k in (2, 1, 2)[:n]]
            for m in ms:
                m.amax_history.copy_(torch.rand(m.amax_history.shape) * 9)
                m.amax_history[0, 0] = 0.0   # a zero amax keeps the scale
                m.scale.copy_(torch.rand(m.scale.shape) + .5)
            return ms
        q = Q._qstate()
        saved = dict(q.buffers), dict(q.packed)
        try:
            for joins in (False, True):
                packed, alone = metas(3), metas(3)
                for a, b in zip(alone, packed):   # the same values in both
                    a.amax_history.copy_(b.amax_history), a.scale.copy_(b.scale)
                key = (True, "test-packing", 0)
                q.buffers[key] = (rec, None, packed[:2] if joins else packed)
                q.packed.pop(key, None)
                Q.reduce_and_update(True)
                for m in (alone[:2] if joins else alone):
                    m.update(448.0)
                if joins:   # a third site joins: packed again with the first two's new values
                    q.buffers[key][2].append(packed[2])
                    Q.reduce_and_update(True)
                    for m in alone:
                        m.update(448.0)
                for a, b in zip(packed, alone):
                    self.assertEqual(a.amax_history.tolist(), b.amax_history.tolist())
                    self.assertEqual(a.scale.tolist(), b.scale.tolist())
                base = packed[0].amax_history.untyped_storage().data_ptr()
                self.assertTrue(all(m.amax_history.untyped_storage().data_ptr() == base
                                    for m in packed))
                packed[2].record(0, torch.tensor([1e9]))   # a view: the packed row sees it
                self.assertEqual(q.packed[key][1][0][0, 3].item(), 1e9)
                del q.buffers[key]
        finally:
            q.buffers.clear(), q.buffers.update(saved[0])
            q.packed.clear(), q.packed.update(saved[1])

    def test_refusals(self):
        with self.assertRaises(E.TpflexUnsupportedError):
            te.autocast(calibrating=True)
        a = te.autocast()
        with a:
            with self.assertRaises(E.TpflexInvalidError):
                a.__enter__()
        with self.assertRaises(E.TpflexUnsupportedError):
            with te.quantized_model_init(enabled=True):
                pass

        def body(P, r):
            m = _col_linear(P, r, 91)
            try:
                with te.active_tokens(16), te.autocast(recipe=te.DelayedScaling(
                        reduce_amax=False)):
                    m(rnd(8, H, seed=1))
            except E.TpflexUnsupportedError as e:
                return str(e)
        self.assertIn("reduce_amax=False", run(2, body, use_fp8=True)[0])

    def test_other_recipes_refused(self):
        from tpflex.common import recipe as R
        for rec in (R.MXFP8BlockScaling(), R.Float8BlockScaling(), R.NVFP4BlockScaling(),
                    R.CustomRecipe()):
            with self.assertRaises(E.TpflexUnsupportedError) as cm:
                te.autocast(recipe=rec)
            self.assertIn(type(rec).__name__, str(cm.exception))
        with self.assertRaises(E.TpflexInvalidError):
            te.DelayedScaling(fp8_format=R.Format.E5M2)

    def test_fp8_needs_fp8_registrations(self):
        """FP8 autocast over a bf16 registration, and a bf16 step over an FP8-only one: each
        refused naming the site, both dtypes and the fix (no more 'weight has dtype ...')."""
        def body(P, r, fp8):
            m = _col_linear(P, r, 61, ub_overlap_ag=True)
            with te.active_tokens(16):
                try:
                    if fp8:
                        with te.autocast(recipe=te.Float8CurrentScaling()):
                            m(rnd(8, H, seed=1))
                    else:
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            m(rnd(8, H, seed=1))
                except E.TpflexInvalidError as e:
                    return str(e)
        msg = run(2, lambda P, r: body(P, r, True))[0]
        for w in ("'fc1_fprop'", "torch.bfloat16", "torch.float8_e4m3fn", "use_fp8=True"):
            self.assertIn(w, msg)
        msg = run(2, lambda P, r: body(P, r, False), use_fp8=True)[0]
        for w in ("'fc1_fprop'", "torch.float8_e4m3fn", "torch.bfloat16", "tpflex.torch.autocast"):
            self.assertIn(w, msg)


if __name__ == "__main__":
    unittest.main()
