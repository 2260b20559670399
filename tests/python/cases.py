"""Test cases shared by the simulator (test_sim.py: ranks as threads of tpflex.sim.run) and the
CUDA backend (test_cuda.py: one process per rank under torchrun, sharing one GPU).

A case body runs on every rank as ``body(rank, env, *args)``; ``env`` says which backend and
device the rank uses and creates the communicators. The runner returns what each rank returned
or, for a rank that raised, an ``Err`` summary (picklable: the CUDA runner gathers results over
gloo). ``SharedCases`` holds the test methods; a subclass provides ``run_ranks`` and
``p_values``. Data is generated on the CPU from fixed seeds, identically on every rank, and
moved to the rank's device; references are computed in fp32 on the CPU."""
from __future__ import annotations

import itertools
import random
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex._te import current_manager  # noqa: E402
from tpflex import errors as E  # noqa: E402

H = 32
C = 64
# SPEC §7's tolerances (rtol, atol), the C oracle's (harness/reference.c).
TOL = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (0.02, 0.002), torch.float16: (0.01, 0.001)}
RING_RS = {"ring_rs": {"method": "ring", "coll": "rs"}}
N_AG, K_RS, M_B = 24, 16, 8  # ag_gemm N, gemm_rs K, bulk M (bulk K = 16, N = 24)


class Err:
    """What a rank raised, in a form that pickles (for the CUDA runner's gather)."""

    def __init__(self, e: BaseException) -> None:
        self.cls = type(e).__name__
        self.status_name = getattr(e, "status_name", None)
        self.status = getattr(e, "status", None)
        self.detail = getattr(e, "detail", "")
        self.text = str(e)

    def __repr__(self) -> str:
        return f"Err({self.cls}: {self.text})"


class Env:
    """One rank's backend: 'sim' (device cpu) or 'cuda' (device cuda:N)."""

    def __init__(self, backend: str, device: torch.device, tp_size: int,
                 timeout_ms: Optional[int] = None) -> None:
        self.backend = backend
        self.device = device
        self.tp_size = tp_size
        self.timeout_ms = timeout_ms
        # A device no communicator of this backend accepts (for the wrong-device checks).
        self.other_device = torch.device("meta") if backend == "sim" else torch.device("cpu")

    def init(self, shape: Sequence[int] = (C, H), dtype: torch.dtype = torch.bfloat16,
             ub_cfgs: Optional[Dict[str, Dict[str, Any]]] = None) -> tt.Manager:
        kw: Dict[str, Any] = {}
        if self.backend == "cuda" and self.timeout_ms is not None:
            kw["timeout_ms"] = self.timeout_ms
        return tt.initialize_ub(list(shape), self.tp_size, dtype=dtype, ub_cfgs=ub_cfgs,
                                backend=self.backend, **kw)

    def order_slack(self, a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> Any:
        """The fp32 accumulation-order slack of a · bᵀ on this backend: None on the simulator
        (it sums over k in order, as the reference does); on CUDA, whose cuBLASLt sums in its
        own order, the bound of any order, γ_K Σ_k |a_ik b_jk| (γ_K = K u / (1 - K u), u =
        2^-24), times `scale` (|alpha|, GELU's slope)."""
        if self.backend == "sim":
            return None
        u = 2.0 ** -24
        K = a.shape[1]
        g = K * u / (1 - K * u)
        return scale * g * (a.detach().double().cpu().abs() @ b.detach().double().cpu().abs().T)

    def put(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _tol(dtype: torch.dtype, floor: Optional[Any]) -> Any:
    rtol, atol = TOL[dtype]
    return (max(rtol, floor[0]), max(atol, floor[1])) if floor else (rtol, atol)


def gelu_floor(env: "Env", gelu: bool) -> Optional[Any]:
    """cuBLASLt's GELU epilogue uses a fast tanh: the C conformance suite allows it rtol 1e-3,
    atol 1e-4 at least; the simulator's GELU is exact and keeps the dtype's tolerance."""
    return (1e-3, 1e-4) if gelu and env.backend == "cuda" else None


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] times b [N, K] transposed, [M, N] in fp32 accumulated over k in order (SPEC §7's
    reference: fp32 accumulation over the inputs' values, as the C oracle and the simulator;
    torch's matmul sums in another order, which fp32's tolerance of 1e-5 / 1e-6 can tell)."""
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    acc = torch.zeros(a.shape[0], b.shape[0])
    for p in range(a.shape[1]):
        acc = acc + a[:, p:p + 1] * b[:, p].unsqueeze(0)
    return acc


def wrong_elements(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float,
                   slack: Optional[torch.Tensor] = None,
                   ulp_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """SPEC §7's verdict per element (as harness/reference.c): an element is wrong iff
    rel > rtol and abs > atol (rel = abs / max(|ref|, 1e-5)), or NaN/Inf disagree (two NaNs or
    equal infinities agree). With `slack`, an element that misses the tolerance is still right
    when abs <= slack + one ulp of ulp_dtype at ref. Returns the boolean mask of wrong elements."""
    g, r = got.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(g) & torch.isfinite(r)
    diff = torch.where(finite, (g - r).abs(), torch.zeros_like(g))
    rel = diff / r.abs().clamp(min=1e-5)
    bad = finite & (rel > rtol) & (diff > atol)
    if slack is not None:
        bad = bad & (diff > slack.double().cpu() + ulp(r, ulp_dtype or got.dtype).double())
    same_nonfinite = (torch.isnan(g) & torch.isnan(r)) | (g == r)
    return bad | (~finite & ~same_nonfinite)


def close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
          floor: Optional[Any] = None, slack: Optional[torch.Tensor] = None) -> bool:
    """SPEC §7: the shapes agree and no element is wrong (dtype: the operation's, for its
    tolerances). `slack`: Env.order_slack's (CUDA's accumulation order), else None."""
    rtol, atol = _tol(dtype, floor)
    return tuple(got.shape) == tuple(ref.shape) and \
        not bool(wrong_elements(got, ref, rtol, atol, slack).any())


_MANT = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
_MIN_EXP = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126}


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of dtype at |v| (subnormal spacing near zero)."""
    _, e = torch.frexp(v.detach().float().cpu().abs())
    e = torch.clamp(e - 1, min=_MIN_EXP[dtype])
    return torch.ldexp(torch.ones_like(v, dtype=torch.float32, device="cpu"),
                       e - _MANT[dtype])


def rs_reference(partials: Sequence[torch.Tensor], dtype: torch.dtype) -> Any:
    """A reduce-scatter's reference and slack (docs/SPEC.md §7): every partial passes through
    the buffer dtype before the fp32 sum, and one ulp per rounded partial is allowed (another
    accumulation order may round a partial to its neighbour)."""
    ps = [p.float() for p in partials]
    ref = sum(p.to(dtype).float() for p in ps)
    slack = sum(ulp(p, dtype) for p in ps)
    return ref, slack


def close_rs(got: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor, dtype: torch.dtype,
             out_dtype: Optional[torch.dtype] = None, floor: Optional[Any] = None,
             order: Optional[torch.Tensor] = None) -> bool:
    """close() per element, where an element outside the tolerance may still differ by its
    partials' slack plus one ulp of the result (SPEC §7's reduce-scatter rule); `order`:
    Env.order_slack's of the partials (CUDA), added to it."""
    rtol, atol = _tol(dtype, floor)
    if order is not None:
        slack = slack.double() + order
    if tuple(got.shape) != tuple(ref.shape):
        return False
    return not bool(wrong_elements(got, ref, rtol, atol, slack, out_dtype or got.dtype).any())


def epilogue(acc: torch.Tensor, alpha: float, beta: float, d0: Optional[torch.Tensor],
             bias: Optional[torch.Tensor], gelu: bool) -> torch.Tensor:
    """The reference of tpf_op_options: act(alpha acc + beta D + bias), in fp32."""
    y = alpha * acc.float()
    if beta != 0.0:
        y = y + beta * d0.float().cpu()
    if bias is not None:
        y = y + bias.float().cpu()
    return Fn.gelu(y, approximate="tanh") if gelu else y


def teardown(env: "Env", failed: bool) -> None:
    """env.sync() and destroy_ub(); after a failure, a teardown error must not hide the failure
    that caused it (it is chained instead)."""
    try:
        env.sync()
        tt.destroy_ub()
    except Exception:
        if not failed:
            raise


def with_ub(body: Callable[..., Any], dtype: torch.dtype = torch.bfloat16,
            ub_cfgs: Optional[Dict[str, Dict[str, Any]]] = None,
            shape: Sequence[int] = (C, H)) -> Callable[..., Any]:
    """body wrapped in initialize_ub/destroy_ub on every rank."""
    def wrapped(rank: int, env: Env, *args: Any) -> Any:
        env.init(shape, dtype, ub_cfgs)
        try:
            res = body(rank, env, *args)
        except BaseException as e:
            # The failed frames' locals (views among them) go before the teardown: on CUDA a
            # live view makes destroy_ub refuse (python/README.md, "A view keeps ...").
            traceback.clear_frames(e.__traceback__)
            teardown(env, True)
            raise
        teardown(env, False)
        return res
    wrapped.__name__ = getattr(body, "__name__", "body")
    return wrapped


# ---- operations vs torch ------------------------------------------------------------------------

def ops_vs_torch(rank: int, env: Env, dtype: torch.dtype, steps: int, seed: int) -> List[Any]:
    """The default operations (no options) on a random T sequence."""
    P = env.tp_size
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    mgr = env.init((C, H), dtype, RING_RS)
    fails: List[Any] = []
    failed = True
    try:
        for _ in range(steps):
            T = P * rng.randint(1, C // P)
            rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
            xs = [rnd(T // P, H) for _ in range(P)]
            w_ag = [rnd(N_AG, H) for _ in range(P)]
            x_rs = [rnd(T, K_RS) for _ in range(P)]
            w_rs = [rnd(H, K_RS) for _ in range(P)]
            a = [rnd(M_B, 16) for _ in range(P)]
            b = [rnd(N_AG, 16) for _ in range(P)]
            part = [rnd(T, H) for _ in range(P)]
            tt.set_ub_active_shape([T, H])
            rows = slice(rank * T // P, (rank + 1) * T // P)
            X = torch.cat(xs).float()
            ub = tt.get_ub("fc1_fprop")
            if ub.active_shape != (T, H) or ub.capacity_shape != (C, H):
                fails.append(("shapes", T, ub.active_shape, ub.capacity_shape))
            ub.local_chunk().copy_(env.put(xs[rank]))
            y = ub.ag_gemm(env.put(w_ag[rank]))
            osl = env.order_slack(X, w_ag[rank])
            if not close(y, mm(X, w_ag[rank]), dtype, slack=osl):
                fails.append(("ag_gemm", T))
            if not torch.equal(ub.buffer().float().cpu(), X):
                fails.append(("ag_gemm buffer", T))
            if dtype != torch.float32:
                y32 = torch.empty(T, N_AG, dtype=torch.float32, device=env.device)
                ub.local_chunk().copy_(env.put(xs[rank]))
                ub.ag_gemm(env.put(w_ag[rank]), out=y32)
                if not close(y32, mm(X, w_ag[rank]), dtype, slack=osl):
                    fails.append(("ag_gemm fp32 out", T))
            S, slack = rs_reference([mm(xr, wr) for xr, wr in zip(x_rs, w_rs)],
                                    dtype)
            osl = env.order_slack(x_rs[0], w_rs[0])
            if osl is not None:
                osl = sum(env.order_slack(xr, wr) for xr, wr in zip(x_rs, w_rs))[rows]
            for name in ("fc2_fprop", "ring_rs"):
                o = tt.get_ub(name).gemm_rs(env.put(x_rs[rank]), env.put(w_rs[rank]))
                if tuple(o.shape) != (T // P, H) or \
                        not close_rs(o, S[rows], slack[rows], dtype, order=osl):
                    fails.append((name, T))
            ub = tt.get_ub("fc1_dgrad")  # BULK AG: the buffer gathers, the GEMM runs beside it
            ub.local_chunk().copy_(env.put(xs[rank]))
            o = ub.bulk_overlap(env.put(a[rank]), env.put(b[rank]))
            if not close(o, mm(a[rank], b[rank]), dtype,
                         slack=env.order_slack(a[rank], b[rank])):
                fails.append(("bulk ag gemm", T))
            if not torch.equal(ub.buffer().float().cpu(), X):
                fails.append(("bulk ag buffer", T))
            ub = tt.get_ub("fc1_wgrad")  # BULK RS: partials reduced into the local chunk
            ub.buffer().copy_(env.put(part[rank]))
            ub.bulk_overlap(env.put(a[rank]), env.put(b[rank]))
            R, slack = rs_reference(part, dtype)
            if not close_rs(ub.local_chunk(), R[rows], slack[rows], dtype):
                fails.append(("bulk rs", T))
        env.sync()
        res = [fails, tt.get_ub("fc1_fprop").epoch, len(mgr)]
        failed = False
        return res
    finally:
        teardown(env, failed)


def _legal_ag_splits(P: int) -> List[int]:
    s = {0, P}
    s.add(P // 2 if P > 2 and P % 2 == 0 else 1)
    if P <= 2:
        s.add(1)
    return sorted(s)


def options_vs_torch(rank: int, env: Env, dtype: torch.dtype, seed: int) -> List[Any]:
    """Every option of every operation against torch: the full grid of transposes, beta, bias
    and GELU (alpha, output dtype and split count drawn per case), each at a random T."""
    P = env.tp_size
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    env.init((C, H), dtype, RING_RS)
    fails: List[Any] = []
    failed = True
    cases = 0
    out_dtypes = [dtype] if dtype == torch.float32 else [dtype, torch.float32]

    def new_T() -> int:
        T = 8 * rng.randint(1, C // 8)  # keeps every split count legal and aligned
        tt.set_ub_active_shape([T, H])
        return T

    try:
        # ag_gemm: trans_w x beta x bias x gelu; alpha, out dtype and num_splits drawn.
        for trans_w, beta, bias, gelu in itertools.product((False, True), (0.0, 0.75),
                                                           (False, True), (False, True)):
            T = new_T()
            alpha = rng.choice((1.0, 0.5, -2.0))
            od = rng.choice(out_dtypes)
            ns = rng.choice(_legal_ag_splits(P))
            xs = [rnd(T // P, H) for _ in range(P)]
            w = rnd(N_AG, H)                         # logical weight [N, H]
            stored = w.t().contiguous() if trans_w else w
            d0 = torch.randn(T, N_AG, generator=g).to(od)
            bvec = torch.randn(N_AG, generator=g).to(od) if bias else None
            ub = tt.get_ub("fc1_fprop")
            ub.local_chunk().copy_(env.put(xs[rank]))
            out = env.put(d0.clone())
            kw: Dict[str, Any] = dict(trans_w=trans_w, alpha=alpha, beta=beta, gelu=gelu,
                                      num_splits=ns)
            if bias:
                kw["bias"] = env.put(bvec)
            ub.ag_gemm(env.put(stored), out=out, **kw)
            X = torch.cat(xs).float()
            ref = epilogue(mm(X, w), alpha, beta, d0, bvec, gelu)
            cases += 1
            osl = env.order_slack(X, w, abs(alpha) * (1.2 if gelu else 1.0))
            if not close(out, ref, dtype, gelu_floor(env, gelu), slack=osl):
                fails.append(("ag_gemm", T, kw.keys(), trans_w, alpha, beta, bias, gelu, od, ns))
            if not torch.equal(ub.buffer().float().cpu(), X):
                fails.append(("ag_gemm buffer", T, trans_w, ns))
        # gemm_rs on PIPELINE (fc2_fprop) and RING (ring_rs): trans_a x trans_w x beta x bias x
        # gelu.
        for name in ("fc2_fprop", "ring_rs"):
            for trans_a, trans_w, beta, bias, gelu in itertools.product(
                    (False, True), (False, True), (0.0, 1.0), (False, True), (False, True)):
                T = new_T()
                rows = slice(rank * T // P, (rank + 1) * T // P)
                alpha = rng.choice((1.0, 0.25))
                od = rng.choice(out_dtypes)
                ns = rng.choice((0, 1, 2, 4, 8)) if name == "fc2_fprop" else rng.choice((0, P))
                xs = [rnd(T, K_RS) for _ in range(P)]
                ws = [rnd(H, K_RS) for _ in range(P)]
                d0 = torch.randn(T // P, H, generator=g).to(od)
                bvec = torch.randn(H, generator=g).to(od) if bias else None
                x_st = xs[rank].t().contiguous() if trans_a else xs[rank]
                w_st = ws[rank].t().contiguous() if trans_w else ws[rank]
                out = env.put(d0.clone())
                kw = dict(trans_a=trans_a, trans_w=trans_w, alpha=alpha, beta=beta, gelu=gelu,
                          splits=ns)
                if bias:
                    kw["bias"] = env.put(bvec)
                tt.get_ub(name).gemm_rs(env.put(x_st), env.put(w_st), out=out, **kw)
                S, slack = rs_reference([mm(x, w) for x, w in zip(xs, ws)],
                                        dtype)
                ref = epilogue(S[rows], alpha, beta, d0, bvec, gelu)
                cases += 1
                osl = None
                if env.backend != "sim":
                    osl = sum(env.order_slack(x, w, abs(alpha) * (1.2 if gelu else 1.0))
                              for x, w in zip(xs, ws))[rows]
                if not close_rs(out, ref, abs(alpha) * slack[rows], dtype,
                                floor=gelu_floor(env, gelu), order=osl):
                    fails.append((name, T, trans_a, trans_w, alpha, beta, bias, gelu, od, ns))
        # bulk_overlap on BULK AG (fc1_dgrad) and BULK RS (fc1_wgrad): the collective on the
        # buffer is unaffected by the GEMM's options.
        for name in ("fc1_dgrad", "fc1_wgrad"):
            for trans_a, trans_w, beta, bias, gelu in itertools.product(
                    (False, True), (False, True), (0.0, 1.0), (False, True), (False, True)):
                T = new_T()
                rows = slice(rank * T // P, (rank + 1) * T // P)
                alpha = rng.choice((1.0, 2.0))
                od = rng.choice(out_dtypes)
                a, b = rnd(M_B, 16), rnd(N_AG, 16)   # logical a [M, K], b [N, K]
                a_st = a.t().contiguous() if trans_a else a
                b_st = b.t().contiguous() if trans_w else b
                d0 = torch.randn(M_B, N_AG, generator=g).to(od)
                bvec = torch.randn(N_AG, generator=g).to(od) if bias else None
                ub = tt.get_ub(name)
                if name == "fc1_dgrad":
                    xs = [rnd(T // P, H) for _ in range(P)]
                    ub.local_chunk().copy_(env.put(xs[rank]))
                    want_buf, got_buf = torch.cat(xs).float(), ub.buffer
                else:
                    parts = [rnd(T, H) for _ in range(P)]
                    ub.buffer().copy_(env.put(parts[rank]))
                    R, slack = rs_reference(parts, dtype)
                    want_buf, got_buf = R[rows], ub.local_chunk
                out = env.put(d0.clone())
                kw = dict(trans_a=trans_a, trans_w=trans_w, alpha=alpha, beta=beta, gelu=gelu)
                if bias:
                    kw["bias"] = env.put(bvec)
                ub.bulk_overlap(env.put(a_st), env.put(b_st), out=out, **kw)
                ref = epilogue(mm(a, b), alpha, beta, d0, bvec, gelu)
                cases += 1
                osl = env.order_slack(a, b, abs(alpha) * (1.2 if gelu else 1.0))
                if not close(out, ref, dtype, gelu_floor(env, gelu), slack=osl):
                    fails.append((name, T, trans_a, trans_w, alpha, beta, bias, gelu, od))
                ok_buf = (torch.equal(got_buf().float().cpu(), want_buf) if name == "fc1_dgrad"
                          else close_rs(got_buf(), want_buf, slack[rows], dtype))
                if not ok_buf:
                    fails.append((name + " buffer", T, trans_a, trans_w))
        # wgrad accumulation over a random T sequence (TE's fuse_wgrad_accumulation): dW [N, H]
        # += dY^T X in fp32 with trans_a + trans_w, beta 0 on the first microbatch, then 1.
        ub = tt.get_ub("fc1_wgrad")
        acc = torch.empty(N_AG, H, dtype=torch.float32, device=env.device)
        ref = torch.zeros(N_AG, H)
        wsl: Any = None  # CUDA: each GEMM's order slack and one fp32 rounding of each sum
        for i in range(6):
            T = new_T()
            dy, x = rnd(T, N_AG), rnd(T, H)
            ub.buffer().zero_()
            ub.bulk_overlap(env.put(dy), env.put(x), out=acc, trans_a=True, trans_w=True,
                            beta=0.0 if i == 0 else 1.0)
            ref = mm(dy.t(), x.t()) + ref
            o = env.order_slack(dy.t(), x.t())
            if o is not None:
                wsl = (0 if wsl is None else wsl) + o + ref.abs().double() * 2.0 ** -24
            cases += 1
            if not close(acc, ref, dtype, slack=wsl):
                fails.append(("wgrad accumulation", i, T))
        env.sync()
        res = [fails, cases]
        failed = False
        return res
    finally:
        teardown(env, failed)


# ---- error paths: a body per path, run on every rank inside with_ub --------------------------

def _zeros(env: Env, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype, device=env.device)


def err_wrong_dtype(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H, dtype=torch.float32))


def err_wrong_device(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(torch.zeros(4, H, dtype=torch.bfloat16,
                                               device=env.other_device))


def err_wrong_shape(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc2_fprop").gemm_rs(_zeros(env, 8, 16), _zeros(env, H, 12))


def err_wrong_out_shape(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), out=_zeros(env, 6, 4))


def err_wrong_stride(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, H, 4).t())  # [4, H] column-major


def ok_padded_ld(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    base = torch.ones(4, H + 8, dtype=torch.bfloat16, device=env.device)
    ub = tt.get_ub("fc1_fprop")
    ub.local_chunk().fill_(1)
    y = ub.ag_gemm(base[:, :H])
    assert torch.all(y == H), y


def err_capacity(r: int, env: Env) -> None:
    tt.set_ub_active_shape([C + 2, H])


def err_divisible(r: int, env: Env) -> None:
    tt.set_ub_active_shape([7, H])


def ok_all_or_nothing(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    try:
        tt.set_ub_active_shape([C + 2, H])
    except E.TpflexCapacityError:
        pass
    assert tt.get_ub("fc1_fprop").active_shape == (8, H)
    assert tt.get_ub("fc1_fprop").epoch == 1


def err_mismatch_shapes(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8 if r == 1 else 4, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H))


def err_mismatch_options(r: int, env: Env) -> None:
    """Ranks that disagree on an operation's split count (part of the handshake's op key)."""
    P = env.tp_size
    tt.set_ub_active_shape([8 * P, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), num_splits=P if r == 0 else 1)


def err_timeout(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    if r == 0:
        tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H))


def err_unknown_name(r: int, env: Env) -> None:
    tt.get_ub("nope")


def err_bias_dtype(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), bias=_zeros(env, 4, dtype=torch.float32))


def err_bias_length(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc2_fprop").gemm_rs(_zeros(env, 8, 16), _zeros(env, H, 16), bias=_zeros(env, 5))


def err_bias_device(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_dgrad").bulk_overlap(_zeros(env, 8, 16), _zeros(env, 4, 16),
                                        bias=torch.zeros(4, dtype=torch.bfloat16,
                                                         device=env.other_device))


def err_beta_needs_out(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), beta=1.0)


def err_trans_w_shape(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), trans_w=True)  # stored [H, N] expected


def err_trans_a_x_shape(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc2_fprop").gemm_rs(_zeros(env, 8, 16), _zeros(env, 16, H), trans_a=True,
                                   trans_w=True)  # x stored [K, T] = [16, 8] expected


def err_ag_trans_a(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), trans_a=True)


def err_illegal_splits(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc2_fprop").gemm_rs(_zeros(env, 8, 16), _zeros(env, H, 16), num_splits=3)


def err_bulk_splits(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_dgrad").bulk_overlap(_zeros(env, 8, 16), _zeros(env, 4, 16), num_splits=2)


def err_blas_names(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), transb=True)


def err_gelu_out(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), gelu=True, gelu_out=_zeros(env, 8, 4))


def err_unknown_option(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), bogus=1)


def ok_default_options(r: int, env: Env) -> None:
    tt.set_ub_active_shape([8, H])
    tt.get_ub("fc1_fprop").ag_gemm(_zeros(env, 4, H), alpha=1.0, beta=0.0, bias=None,
                                   gelu=False, trans_a=False, trans_w=False, num_splits=None,
                                   splits=0, accumulate=False, gelu_out=None)


def init_config(rank: int, env: Env, which: str) -> Any:
    """initialize_ub with a configuration that differs on rank 1 (no communicator is left)."""
    shape, dtype, cfgs = [C, H], torch.bfloat16, None
    if rank == 1:
        if which == "num_splits":
            cfgs = {"fc2_fprop": {"num_splits": 2}}
        elif which == "capacity":
            shape = [C // 2, H]
        elif which == "dtype":
            dtype = torch.float32
    env.init(shape, dtype, cfgs)
    try:
        return len(current_manager())
    finally:
        tt.destroy_ub()


# ---- the tests ----------------------------------------------------------------------------------

class SharedCases:
    """Mixed into a unittest.TestCase by test_sim.py and test_cuda.py."""

    # run_ranks(P, body, *args, timeout_ms=...) -> per-rank results (Err for a rank that raised)
    def run_ranks(self, P: int, body: Callable[..., Any], *args: Any,
                  timeout_ms: int = 5000) -> List[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def p_values(self, wanted: Sequence[int]) -> List[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    P_ERR = 2  # P of the error-path tests (test_cuda: the world size)

    # -- helpers
    def need_ranks(self, n: int, why: str) -> None:
        """Skips (naming why) when this runner cannot give the case n ranks (test_cuda.py with
        fewer processes); the simulator always can."""

    def all_raise(self, results: List[Any], P: int, cls: type, *words: str) -> List[Err]:
        self.assertEqual(len(results), P, f"one result per rank: {results!r}")
        for r, e in enumerate(results):
            self.assertIsInstance(e, Err, f"rank {r} returned {e!r}, expected {cls.__name__}")
            self.assertEqual(e.cls, cls.__name__, f"rank {r}: {e!r}")
            for w in words:
                self.assertIn(w, e.text, f"rank {r}: {e!r}")
        return results

    def err(self, body: Callable[..., Any], cls: type, *words: str, **kw: Any) -> List[Err]:
        P = self.p_values([self.P_ERR])[0]
        return self.all_raise(self.run_ranks(P, with_ub(body), **kw), P, cls, *words)

    def ok(self, body: Callable[..., Any]) -> None:
        res = self.run_ranks(self.p_values([self.P_ERR])[0], with_ub(body))
        for r, e in enumerate(res):
            self.assertNotIsInstance(e, Err, f"rank {r}: {e!r}")

    # -- operations
    def _ops(self, P: int, dtype: torch.dtype, steps: int = 4) -> None:
        res = self.run_ranks(P, ops_vs_torch, dtype, steps, 1000 + P)
        for r, x in enumerate(res):
            self.assertNotIsInstance(x, Err, f"P={P} rank {r}: {x!r}")
            fails, epochs, n = x
            self.assertEqual(fails, [], f"P={P} {dtype} rank {r}")
            self.assertEqual(epochs, steps)
            self.assertEqual(n, len(tt.DEFAULT_UB_CFGS) + 1)

    def test_ops_fp32(self) -> None:
        for P in self.p_values([1, 2, 4]):
            self._ops(P, torch.float32)

    def test_ops_bf16(self) -> None:
        for P in self.p_values([2, 4]):
            self._ops(P, torch.bfloat16)

    def test_ops_fp16(self) -> None:
        for P in self.p_values([2]):
            self._ops(P, torch.float16, steps=2)

    def _options(self, P: int, dtype: torch.dtype) -> None:
        res = self.run_ranks(P, options_vs_torch, dtype, 77 + P, timeout_ms=20000)
        for r, x in enumerate(res):
            self.assertNotIsInstance(x, Err, f"P={P} rank {r}: {x!r}")
            fails, cases = x
            self.assertEqual(fails, [], f"P={P} {dtype} rank {r}: {len(fails)} of {cases} failed")
            self.assertEqual(cases, 16 + 2 * 32 + 2 * 32 + 6)

    def test_options_fp32(self) -> None:
        for P in self.p_values([1, 2, 4]):
            self._options(P, torch.float32)

    def test_options_bf16(self) -> None:
        for P in self.p_values([2, 4]):
            self._options(P, torch.bfloat16)

    # -- error paths
    def test_wrong_dtype(self) -> None:
        self.err(err_wrong_dtype, E.TpflexInvalidError, "weight", "fp32", "bf16",
                 "fc1_fprop")

    def test_wrong_device(self) -> None:
        self.err(err_wrong_device, E.TpflexInvalidError, "weight", "expected")

    def test_wrong_shape_names_both(self) -> None:
        self.err(err_wrong_shape, E.TpflexShapeError, "weight", "[32, 12]", "[32, 16]")

    def test_wrong_out_shape(self) -> None:
        self.err(err_wrong_out_shape, E.TpflexShapeError, "out", "[6, 4]", "[8, 4]")

    def test_wrong_stride(self) -> None:
        self.err(err_wrong_stride, E.TpflexShapeError, "weight", "strides", "trans_w")

    def test_padded_ld_is_accepted(self) -> None:
        self.ok(ok_padded_ld)

    def test_capacity(self) -> None:
        errs = self.err(err_capacity, E.TpflexCapacityError, str(C + 2), str(C))
        self.assertEqual(errs[0].status_name, "TPF_ECAPACITY")
        self.assertIn("exceed capacity", errs[0].detail)  # tpf_last_error() text
        self.assertEqual(errs[0].status, 3)

    def test_divisible(self) -> None:
        self.err(err_divisible, E.TpflexDivisibleError, "7")

    def test_all_or_nothing(self) -> None:
        self.ok(ok_all_or_nothing)

    def test_mismatch_every_rank(self) -> None:
        self.need_ranks(2, "ranks that disagree on the active shape")
        errs = self.err(err_mismatch_shapes, E.TpflexMismatchError)
        for e in errs:
            self.assertEqual(e.status_name, "TPF_EMISMATCH")
            self.assertIn("8", e.detail)
            self.assertIn("4", e.detail)

    def test_mismatch_options_every_rank(self) -> None:
        self.need_ranks(2, "ranks that disagree on the split count")
        errs = self.err(err_mismatch_options, E.TpflexMismatchError, "split")
        self.assertTrue(all(e.status_name == "TPF_EMISMATCH" for e in errs))

    def test_timeout(self) -> None:
        self.need_ranks(2, "a rank that waits for a peer that never comes")
        t0 = time.monotonic()
        res = self.run_ranks(self.p_values([self.P_ERR])[0], with_ub(err_timeout),
                             timeout_ms=400)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertIsInstance(res[0], Err, repr(res[0]))
        self.assertEqual(res[0].cls, "TpflexTimeoutError", repr(res[0]))
        self.assertTrue(res[0].detail, "timeout carries tpf_last_error() text")
        for r in range(1, len(res)):
            self.assertNotIsInstance(res[r], Err, f"rank {r}: {res[r]!r}")

    def test_unknown_name(self) -> None:
        self.err(err_unknown_name, E.TpflexInvalidError, "nope")

    def test_bias_dtype(self) -> None:
        self.err(err_bias_dtype, E.TpflexInvalidError, "bias", "float32", "bfloat16")

    def test_bias_length(self) -> None:
        self.err(err_bias_length, E.TpflexShapeError, "bias", "[5]", "[32]")

    def test_bias_device(self) -> None:
        self.err(err_bias_device, E.TpflexInvalidError, "bias", "expected")

    def test_beta_needs_out(self) -> None:
        self.err(err_beta_needs_out, E.TpflexInvalidError, "beta", "out=")

    def test_trans_w_shape(self) -> None:
        self.err(err_trans_w_shape, E.TpflexShapeError, "trans_w", "[4, 32]", "[32, 32]")

    def test_trans_a_shape(self) -> None:
        self.err(err_trans_a_x_shape, E.TpflexShapeError, "trans_a", "[8, 16]", "[8, 8]")

    def test_ag_gemm_trans_a_unsupported(self) -> None:
        self.err(err_ag_trans_a, E.TpflexUnsupportedError, "trans_a")

    def test_illegal_splits(self) -> None:
        self.err(err_illegal_splits, E.TpflexDivisibleError, "num_splits 3", "fc2_fprop")

    def test_bulk_splits_unsupported(self) -> None:
        self.err(err_bulk_splits, E.TpflexUnsupportedError, "splits")

    def test_blas_option_names(self) -> None:
        self.err(err_blas_names, E.TpflexInvalidError, "transb", "trans_w")

    def test_gelu_out_unsupported(self) -> None:
        self.err(err_gelu_out, E.TpflexUnsupportedError, "gelu_out")

    def test_unknown_option(self) -> None:
        self.err(err_unknown_option, E.TpflexInvalidError, "bogus", "trans_w")

    def test_default_options_accepted(self) -> None:
        self.ok(ok_default_options)

    def _config(self, which: str, *words: str) -> None:
        P = self.p_values([self.P_ERR])[0]
        self.need_ranks(2, "ranks whose configurations differ")
        res = self.run_ranks(P, init_config, which)
        self.all_raise(res, P, E.TpflexMismatchError, *words)

    def test_config_mismatch_num_splits(self) -> None:
        self._config("num_splits", "num_splits", "0", "2", "rank 1")

    def test_config_mismatch_capacity(self) -> None:
        self._config("capacity", "capacity" if self.backend == "sim" else "shape", str(C),
                     str(C // 2), "rank 1")

    def test_config_mismatch_dtype(self) -> None:
        self._config("dtype", "dtype", "rank 1")

    def test_config_agrees(self) -> None:
        P = self.p_values([self.P_ERR])[0]
        res = self.run_ranks(P, init_config, "none")
        self.assertEqual(res, [len(tt.DEFAULT_UB_CFGS)] * P)

    backend = "sim"
