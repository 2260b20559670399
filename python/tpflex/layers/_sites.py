"""Communicators by site name, their checks, and the GEMMs and collectives of the plain path."""
from __future__ import annotations

import contextvars
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as Fn

from .. import _quant, _te, sim
from ..errors import (TpflexDivisibleError, TpflexError, TpflexInvalidError, TpflexShapeError,
                      TpflexStateError, TpflexUnsupportedError)

def _tt() -> Any:
    """initialize_ub's module (get_ub, set_ub_active_shape, DEFAULT_UB_CFGS): tpflex._te, not the
    tpflex.torch facade, which imports this package (scripts/check_rooms.py: no circle)."""
    return _te


def _site_names() -> List[str]:
    """TE's site names, in initialize_ub's registration order."""
    return list(_te.DEFAULT_UB_CFGS)


def _get(name: str, fp8: bool = False) -> Any:
    """Site `name`'s communicator; with fp8 the FP8 mode's where initialize_ub registered both
    modes (else the site's only registration: its dtype is checked by _precision)."""
    if fp8 and len(_te.state().get("ub_modes") or ()) > 1:
        name += _te.FP8_SUFFIX
    return _tt().get_ub(name)


_FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2")
                    if hasattr(torch, n))


def _find(prefer: Sequence[str], algo: Optional[str], coll: str, skip_fp8: bool = False) -> Any:
    """The first registered, non-external communicator of kind (algo, coll) among `prefer`, then
    TE's sites (with skip_fp8, none registered in FP8); None when there is none."""
    seen = set()
    for n in list(prefer) + _site_names():
        if n in seen:
            continue
        seen.add(n)
        try:
            c = _get(n)
        except TpflexStateError:
            raise
        except TpflexError:
            continue
        if getattr(c, "external", False):
            continue
        if c.coll == coll and (algo is None or c.algo == algo) and \
                not (skip_fp8 and c.dtype in _FP8_DTYPES):
            return c
    return None


def _kind(c: Any) -> str:
    return f"{c.algo.upper()} {c.coll.upper()}{' (external)' if getattr(c, 'external', False) else ''}"


def _need(where: str, name: str, flag: str, algos: Tuple[str, ...], coll: str) -> None:
    """Checks that communicator `name` exists and has a kind the flag's operation runs on."""
    tt = _tt()
    try:
        c = tt.get_ub(name)
    except TpflexStateError as e:
        raise TpflexStateError(f"{flag} needs initialize_ub() before the layer is built "
                               f"({e.detail})", where) from None
    except TpflexError as e:
        raise TpflexInvalidError(f"{flag} needs the communicator '{name}' ({e.detail})",
                                 where) from None
    if c.coll != coll or c.algo not in algos or getattr(c, "external", False):
        want = " or ".join(f"{a.upper()} {coll.upper()}" for a in algos)
        raise TpflexInvalidError(f"{flag} runs on '{name}' as {want}, but '{name}' is registered "
                                 f"as {_kind(c)} (change it with initialize_ub's ub_cfgs)", where)


# ---- precision: torch.autocast and FP8 autocast (SPEC §14) --------------------------------------

def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the GEMMs run in: torch.autocast's for t's device type when it is on (as TE),
    else t's (the parameters')."""
    dev = t.device.type
    if _autocast_on(dev):
        try:
            return torch.get_autocast_dtype(dev)
        except (AttributeError, TypeError):   # torch < 2.4: per-device functions
            return torch.get_autocast_cpu_dtype() if dev == "cpu" else \
                torch.get_autocast_gpu_dtype()
    return t.dtype


def _autocast_on(dev: str) -> bool:
    """Whether torch.autocast is on for device type `dev` (torch < 2.4 had no argument)."""
    try:
        return torch.is_autocast_enabled(dev)
    except TypeError:
        return torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled()


def _autocast_off(t: torch.Tensor) -> Any:
    """A context with torch.autocast off for t's device type: the GEMMs below pick their dtypes
    themselves (torch.autocast would re-cast their fp32 accumulation)."""
    return torch.autocast(t.device.type, enabled=False)


def _weight_cast(owner: Any, weight: torch.Tensor, cdt: torch.dtype, q: Any,
                 first_microbatch: Optional[bool]) -> Any:
    """The weight as the GEMMs take it: cast to cdt (every call, as TE's AMP cast), or quantized
    (q) and then cached on `owner` as TE caches its FP8 weight: is_first_microbatch True
    quantizes and caches, False reuses the cache (quantizing when there is none), None neither
    reads nor writes it."""
    if q is None:
        w = weight.detach()
        return w if w.dtype == cdt else w.to(cdt)
    key = (weight, weight.dtype, cdt, (q.fwd, repr(q.recipe)))
    if first_microbatch is False:
        hit = getattr(owner, "_wcache", None)
        if hit is not None and hit[0][0] is weight and hit[0][1:] == key[1:]:
            return hit[1]
    w = q.quantize(weight.detach(), "weight")
    if first_microbatch is not None:
        owner._wcache = (key, w)
    return w


def _tp_reducer(group: Any) -> Any:
    """A callable max-reducing a one-element amax over the TP group (the simulator world in
    tpflex.sim.run's threads)."""
    return lambda t: _quant.amax_allreduce(t, group)


def _precision(owner: Any, call: Any, weight: torch.Tensor, first_microbatch: Optional[bool],
               group: Any) -> None:
    """Sets call.cdt, call.q, call.wc (the weight in compute form) and call.tp_reduce, and checks
    every communicator the call uses against the dtype it will carry there."""
    cdt = _compute_dtype(weight)
    q = _quant.site_quant(owner, weight.device)
    call.cdt, call.q = cdt, q
    sp = call.sp and call.P > 1 and getattr(owner, "mode", None) is not None   # gathers rows
    if q is not None and q.delayed and sp and not q.recipe.reduce_amax:
        raise TpflexUnsupportedError(
            "DelayedScaling(reduce_amax=False) gives every rank its own scales, but this "
            "sequence-parallel site gathers FP8 shards that must share one scale: keep "
            "reduce_amax=True (with amax_reduction_group covering the TP group)", call.where)
    call.tp_reduce = _tp_reducer(group) if q is not None and sp else None
    why = "torch.autocast's dtype" if cdt != weight.dtype else "the parameters' dtype"
    for comm, kind in ((call.fprop, "fprop"), (call.dgrad, "dgrad"), (call.wgrad, "wgrad")):
        if comm is None:
            continue
        gathers_grad = kind == "dgrad" and call.ag_dgrad
        if q is not None and comm.coll == "ag":
            want = q.bwd if gathers_grad else q.fwd
            if comm.dtype != want:
                raise TpflexInvalidError(
                    f"'{comm.name}' is registered in {comm.dtype}, but FP8 autocast "
                    f"({type(q.recipe).__name__}, {q.recipe.fp8_format.name}) gathers "
                    f"{want} there: register the FP8 sites with initialize_ub(..., "
                    f"use_fp8=True) or quantization_modes=[UserBufferQuantizationMode.FP8]"
                    + (" and use Format.HYBRID (its E5M2 gradients are the dgrad sites' format)"
                       if gathers_grad and comm.dtype == torch.float8_e5m2 else ""),
                    call.where)
        elif comm.dtype != cdt:
            fix = (f"run under torch.autocast(dtype={comm.dtype}) or" if comm.dtype not in
                   (torch.float8_e4m3fn, torch.float8_e5m2) else
                   "wrap the step in tpflex.torch.autocast(recipe=...) (FP8) or")
            raise TpflexInvalidError(
                f"'{comm.name}' is registered in {comm.dtype}, but this GEMM runs in {cdt} "
                f"({why}): {fix} register with initialize_ub(..., dtype={cdt})"
                + (" and the NONE quantization mode" if comm.dtype in
                   (torch.float8_e4m3fn, torch.float8_e5m2) else ""), call.where)
    call.wc = _weight_cast(owner, weight, cdt, q, first_microbatch)


def _fp8_wgrad_into(dyq: Any, xq: Any, w: torch.Tensor, call: Any) -> Any:
    """dW = dy^T x of two quantized tensors: into w.main_grad (fp32) with
    fuse_wgrad_accumulation (returns None), else returned in w's dtype."""
    if call.fuse_wgrad:
        _quant.fp8_mm(dyq, xq, torch.float32, trans_a=True, out=call.main_grad,
                      beta=1.0 if call.accumulate else 0.0)
        return None
    return _quant.fp8_mm(dyq, xq, w.dtype, trans_a=True)


def _gather_q(plain: "_Plain", xq: Any) -> Any:
    """The plain path's all-gather of a quantized shard (every rank's shard has the one scale):
    its fp8 bytes over torch.distributed, or on the simulator through the plain AG
    communicator's dtype when that holds the fp8 values exactly (the same fp8 dtype, or
    bf16/fp16/fp32, which hold every e4m3 and e5m2 value)."""
    data = xq.data
    if plain.P == 1:
        return xq
    if plain.on_sim:
        c = plain._comm("ag")
        if c.dtype != data.dtype and c.dtype not in (torch.bfloat16, torch.float16,
                                                      torch.float32):
            raise TpflexInvalidError(
                f"the plain path gathers {data.dtype} shards through '{c.name}', registered in "
                f"{c.dtype}, which does not hold them: give the site a ub flag or register "
                f"the NONE quantization mode too", plain.where)
        g = plain.ag(data if c.dtype == data.dtype else data.to(c.dtype)).to(data.dtype)
    else:
        g = plain.ag(data.view(torch.uint8)).view(data.dtype)
    return _quant.QTensor(g, xq.scale_inv)


# ---- GEMMs and collectives of the plain path ----------------------------------------------------

def _native(t: torch.Tensor) -> bool:
    """torch's own kernels round as the C epilogue does (fp32 accumulation, the bias added
    before the one rounding) on CUDA in every dtype, and anywhere in fp32. CPU 16-bit kernels
    are not relied on: that path computes in fp32 explicitly and rounds once."""
    return t.is_cuda or t.dtype == torch.float32


def _mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b with fp32 accumulation, rounded once to out_dtype."""
    if out_dtype == a.dtype and _native(a):
        return a @ b
    if a.is_cuda:
        try:
            return torch.mm(a, b, out_dtype=out_dtype)
        except (RuntimeError, TypeError):
            pass
    return (a.float() @ b.float()).to(out_dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """x w^T (+ b): fp32 accumulation, the bias added before the one rounding (as the C
    epilogue)."""
    if _native(x):
        return Fn.linear(x, w, b)
    y = x.float() @ w.float().t()
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


def _add_bias(y: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y + b in fp32, rounded once (torch's elementwise kernel on CUDA and in fp32)."""
    if _native(y):
        return y + b
    return (y.float() + b.float()).to(y.dtype)


def _bias_grad(dy: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """The column sums of dy in fp32, rounded once to dt (torch's reduction accumulates 16-bit
    inputs in fp32 on CUDA: one kernel, no fp32 copy)."""
    if dy.dtype == dt and _native(dy):
        return dy.sum(0)
    return dy.sum(0, dtype=torch.float32).to(dt)


def _wgrad_into(dy: torch.Tensor, xt: torch.Tensor, w: torch.Tensor, call: "_Call") -> Any:
    """dW = dy^T xt: into w.main_grad (fp32, accumulated) with fuse_wgrad_accumulation (returns
    None), else returned in w's dtype."""
    if call.fuse_wgrad:
        mg = call.main_grad
        if dy.dtype == torch.float32:   # one GEMM into main_grad (beta 1, or 0 to overwrite)
            if call.accumulate:
                mg.addmm_(dy.t(), xt)
            else:
                torch.mm(dy.t(), xt, out=mg)
            return None
        g = _mm(dy.t(), xt, torch.float32)
        if call.accumulate:
            mg.add_(g)
        else:
            mg.copy_(g)
        return None
    return _mm(dy.t(), xt, w.dtype)


class _Plain:
    """AG / RS / AR along the rows of the plain (ub-flag-less) path: torch.distributed over the
    group, as on GPU also for the simulator with ranks as processes (torchrun, gloo: SPEC §15);
    only inside tpflex.sim.run (ranks as threads, no process group) the BULK communicators with
    an empty GEMM beside."""

    def __init__(self, where: str, P: int, group: Any, prefer_ag: Sequence[str],
                 prefer_rs: Sequence[str]) -> None:
        self.where, self.P, self.group = where, P, group
        self.prefer_ag, self.prefer_rs = tuple(prefer_ag), tuple(prefer_rs)
        self.on_sim = sim.current() is not None and group is None
        self._comms: dict = {}   # coll -> its communicator (this object lives per registration)
        if P > 1 and not self.on_sim:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                raise TpflexStateError(
                    f"tp_size {P} without a ub flag communicates over torch.distributed: "
                    f"initialise it and pass tp_group (or run on the simulator)", where)

    def _comm(self, coll: str) -> Any:
        c = self._comms.get(coll)
        if c is not None:
            return c
        c = _find(self.prefer_ag if coll == "ag" else self.prefer_rs, "bulk", coll)
        if c is None:
            kinds = []
            for n in _site_names():
                try:
                    kinds.append(f"{n} {_kind(_get(n))}")
                except TpflexStateError:
                    raise
                except TpflexError:
                    continue
            dflt = ("qkv_dgrad and fc1_dgrad" if coll == "ag" else "qkv_wgrad and fc1_wgrad")
            raise TpflexStateError(
                f"the plain path at tp_size {self.P} on the simulator needs a registered BULK "
                f"{coll.upper()} communicator, and this registration has none (registered: "
                f"{', '.join(kinds) or 'nothing'}): TE's default ub_cfgs make {dflt} BULK "
                f"{coll.upper()}; keep one of them so in initialize_ub's ub_cfgs (a method "
                f"other than 'bulk' for qkv_dgrad / fc1_dgrad makes it an RS site and drops its "
                f"wgrad site)", self.where)
        self._comms[coll] = c
        return c

    @staticmethod
    def _empty_gemm(c: Any) -> None:
        z = torch.zeros(1, 1, dtype=c.dtype, device=c.device)
        if c.dtype in _FP8_DTYPES:   # an FP8 GEMM takes its scales (unit: nothing is scaled)
            one = torch.ones(1, dtype=torch.float32, device=c.device)
            c.bulk_overlap(z, z, a_scale_inv=one, w_scale_inv=one)
        else:
            c.bulk_overlap(z, z)

    def _same_dtype(self, c: Any, x: torch.Tensor) -> None:
        """High-precision rows through an FP8 registration would round silently: refused."""
        if c.dtype in _FP8_DTYPES and x.dtype != c.dtype:
            raise TpflexInvalidError(
                f"the plain path (no ub flag) on the simulator moves {x.dtype} rows through "
                f"'{c.name}', registered in {c.dtype} (an FP8 quantization mode): register the "
                f"NONE mode too (initialize_ub(..., quantization_modes=[UserBufferQuantizationMode"
                f".FP8, UserBufferQuantizationMode.NONE])), or run the step under "
                f"tpflex.torch.autocast(recipe=...)", self.where)

    def _check(self, c: Any, rows: int, cols: int, what: str) -> None:
        T, H = _block_shape(c) or c.active_shape
        if rows != T or cols != H:
            raise TpflexShapeError(
                f"{what} is [{rows}, {cols}] in tokens, but '{c.name}' (the plain path's "
                f"{c.coll.upper()}) is active at [{T}, {H}]", self.where)

    def ag(self, x: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return x
        if self.on_sim:
            c = self._comm("ag")
            self._same_dtype(c, x)
            self._check(c, x.shape[0] * self.P, x.shape[1], "the all-gathered tensor")
            c.local_chunk().copy_(x)
            self._empty_gemm(c)
            return c.buffer().clone()
        import torch.distributed as dist
        out = torch.empty((x.shape[0] * self.P, x.shape[1]), dtype=x.dtype, device=x.device)
        try:
            dist.all_gather_into_tensor(out, x.contiguous(), group=self.group)
        except (RuntimeError, AttributeError, NotImplementedError):
            parts = [torch.empty_like(x) for _ in range(self.P)]
            dist.all_gather(parts, x.contiguous(), group=self.group)
            out = torch.cat(parts)
        return out

    def rs(self, y: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return y
        if y.shape[0] % self.P:
            raise TpflexDivisibleError(f"{y.shape[0]} rows do not divide among {self.P} ranks",
                                       self.where)
        if self.on_sim:
            c = self._comm("rs")
            self._same_dtype(c, y)
            self._check(c, y.shape[0], y.shape[1], "the reduce-scattered tensor")
            c.buffer().copy_(y)
            self._empty_gemm(c)
            return c.local_chunk().clone()
        import torch.distributed as dist
        n = y.shape[0] // self.P
        out = torch.empty((n, y.shape[1]), dtype=y.dtype, device=y.device)
        try:
            dist.reduce_scatter_tensor(out, y.contiguous(), group=self.group)
        except (RuntimeError, AttributeError, NotImplementedError):
            t = y.contiguous().clone()
            dist.all_reduce(t, group=self.group)
            r = dist.get_rank(self.group)
            out = t[r * n:(r + 1) * n].clone()
        return out

    def ar(self, y: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return y
        if self.on_sim:
            return self.ag(self.rs(y))
        import torch.distributed as dist
        t = y.contiguous().clone()
        dist.all_reduce(t, group=self.group)
        return t


# The shape the innermost active_tokens block set: (manager, its shape-change count then, T, H).
# While no other shape change went through that manager it is the active shape, so the layers
# take T from it instead of reading it back from C.
_TOKENS: contextvars.ContextVar[Optional[Tuple[Any, int, int, int]]] = \
    contextvars.ContextVar("tpflex_active_tokens", default=None)


def _block_shape(comm: Any) -> Optional[Tuple[int, int]]:
    """The active shape [T, H] of comm as the active_tokens block around the call set it, or
    None (no block, another manager, a shape change since, or an external site)."""
    ctx = _TOKENS.get()
    if ctx is None or getattr(comm, "external", True):
        return None
    m = comm._mgr
    return (ctx[2], ctx[3]) if ctx[0] is m and m._serial == ctx[1] else None
