"""Drop-in layers in TransformerEngine's signatures: tpflex.torch.Linear, LayerNormMLP and the
context helper active_tokens(T) (SPEC §12).

    te.initialize_ub([C, H], P, dtype=torch.bfloat16)             # once, at capacity
    mlp = tpflex.torch.LayerNormMLP(H, F, tp_size=P, sequence_parallel=True,
                                    set_parallel_mode=True, ub_overlap_ag=True,
                                    ub_overlap_rs=True, ub_bulk_dgrad=True, ub_bulk_wgrad=True)
    for x_local in microbatches:                                 # T changes per microbatch
        with tpflex.torch.active_tokens(x_local.shape[0] * P):
            mlp(x_local).backward(dy_local)

Parameters, their names and shapes are TE's: Linear ``weight`` ([out/P, in] column-parallel,
[out, in/P] row-parallel) and ``bias`` ([out/P] column, [out] row); LayerNormMLP
``layer_norm_weight``, ``layer_norm_bias``, ``fc1_weight`` [F/P, H], ``fc1_bias`` [F/P],
``fc2_weight`` [H, F/P], ``fc2_bias`` [H]. With sequence_parallel a column-parallel input and a
row-parallel output are this rank's rows [T/P, ...] of the packed microbatch.

The schedule is TE's (module/linear.py, module/layernorm_mlp.py), on tpflex's operations:
  column-parallel fprop   ub_overlap_ag: RING AG + GEMM on '{ub_name}_fprop' (bias epilogue)
  row-parallel fprop      ub_overlap_rs: GEMM + RS on '{ub_name}_fprop' (bias applied once, to
                          the reduced rows)
  row-parallel dgrad      ub_overlap_ag: RING AG of dY + GEMM on '{ub_name}_dgrad'; the wgrad
                          GEMM reads the gathered dY from that buffer (TE's '_wgrad' of a
                          row-parallel site is external: no communication of its own)
  column-parallel bwd     ub_bulk_dgrad: BULK AG of the input on '{ub_name}_dgrad' beside the
                          dgrad GEMM (written into '{ub_name}_wgrad''s buffer with ub_bulk_wgrad);
                          ub_bulk_wgrad: BULK RS of dgrad on '{ub_name}_wgrad' beside the wgrad
                          GEMM; ub_overlap_rs_dgrad: dgrad GEMM + RS on '{ub_name}_dgrad' (a RING
                          or PIPELINE RS registration; it turns the bulk flags off, as in TE)
  fuse_wgrad_accumulation weight gradients accumulate into param.main_grad (fp32, beta = 1;
                          forward(..., is_first_microbatch=True) overwrites it, as TE)
LayerNormMLP uses the sites 'fc1' and 'fc2': ub_overlap_ag covers fc1's fprop and fc2's dgrad.
The GELU of LayerNormMLP runs in the fc1 GEMM's epilogue only when no gradient is needed (the
C epilogue does not keep the pre-activation that the backward needs); in training it is torch's
tanh GELU on the fc1 output. Normalisation: torch, in fp32, rounded once to the compute dtype.

Without a ub flag the plain path runs: torch.distributed collectives over tp_group when one is
given (or the default group when torch.distributed is initialised), no communication at
tp_size 1. The simulator has no collective outside the communicators, so on it (tpflex.sim.run)
the plain path at tp_size > 1 uses the BULK AG / BULK RS communicators that initialize_ub
registered ('{ub_name}_dgrad' / '{ub_name}_wgrad' first, then TE's other bulk sites) with an
empty GEMM beside.

T changes per call under one registration: a module reads the active shape the manager holds
(set_ub_active_shape, or active_tokens(T)); a microbatch whose rows disagree with it raises
TpflexShapeError naming both, before anything is communicated. The gradients of the
sequence-parallel LayerNorm parameters (and of a row-parallel bias without sequence
parallelism) are this rank's partial sums, as in TE: those parameters carry
``sequence_parallel = True`` and the caller all-reduces them over the TP group (Megatron does).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as Fn

from . import sim
from .errors import (TpflexDivisibleError, TpflexError, TpflexInvalidError, TpflexShapeError,
                     TpflexStateError, TpflexUnsupportedError)

# TE's site names, in initialize_ub's registration order (the fallback list when tpflex.torch
# does not publish DEFAULT_UB_CFGS).
_TE_NAMES = ("qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad",
             "fc1_dgrad", "fc1_wgrad", "proj_dgrad", "fc2_dgrad", "proj_wgrad", "fc2_wgrad")


def _tt() -> Any:
    """tpflex.torch, imported lazily (it imports this module)."""
    from . import torch as tt
    return tt


def _site_names() -> List[str]:
    return list(getattr(_tt(), "DEFAULT_UB_CFGS", None) or _TE_NAMES)


def _get(name: str) -> Any:
    return _tt().get_ub(name)


def _find(prefer: Sequence[str], algo: Optional[str], coll: str) -> Any:
    """The first registered, non-external communicator of kind (algo, coll) among `prefer`, then
    TE's sites; None when there is none."""
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
        if c.coll == coll and (algo is None or c.algo == algo):
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


# ---- GEMMs and collectives of the plain path ----------------------------------------------------

def _mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b with fp32 accumulation, rounded once to out_dtype."""
    if a.device.type == "cuda":
        if out_dtype == a.dtype:
            return a @ b
        try:
            return torch.mm(a, b, out_dtype=out_dtype)
        except (RuntimeError, TypeError):
            pass
    return (a.float() @ b.float()).to(out_dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """x w^T (+ b): fp32 accumulation, the bias added before the one rounding (as the C
    epilogue)."""
    if x.device.type == "cuda":
        return Fn.linear(x, w, b)
    y = x.float() @ w.float().t()
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


def _wgrad_into(dy: torch.Tensor, xt: torch.Tensor, w: torch.Tensor, call: "_Call") -> Any:
    """dW = dy^T xt: into w.main_grad (fp32, accumulated) with fuse_wgrad_accumulation (returns
    None), else returned in w's dtype."""
    if call.fuse_wgrad:
        g = _mm(dy.t(), xt, torch.float32)
        mg = call.main_grad
        if call.accumulate:
            mg.add_(g)
        else:
            mg.copy_(g)
        return None
    return _mm(dy.t(), xt, w.dtype)


class _Plain:
    """AG / RS / AR along the rows of the plain (ub-flag-less) path: torch.distributed over the
    group, or on the simulator the BULK communicators with an empty GEMM beside."""

    def __init__(self, where: str, P: int, group: Any, prefer_ag: Sequence[str],
                 prefer_rs: Sequence[str]) -> None:
        self.where, self.P, self.group = where, P, group
        self.prefer_ag, self.prefer_rs = tuple(prefer_ag), tuple(prefer_rs)
        self.on_sim = sim.current() is not None and group is None
        if P > 1 and not self.on_sim:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                raise TpflexStateError(
                    f"tp_size {P} without a ub flag communicates over torch.distributed: "
                    f"initialise it and pass tp_group (or run on the simulator)", where)

    def _comm(self, coll: str) -> Any:
        c = _find(self.prefer_ag if coll == "ag" else self.prefer_rs, "bulk", coll)
        if c is None:
            raise TpflexStateError(
                f"the plain path at tp_size {self.P} on the simulator needs a registered BULK "
                f"{coll.upper()} communicator (initialize_ub registers TE's; none found)",
                self.where)
        return c

    @staticmethod
    def _empty_gemm(c: Any) -> None:
        z = torch.zeros(1, 1, dtype=c.dtype, device=c.device)
        c.bulk_overlap(z, z)

    def _check(self, c: Any, rows: int, cols: int, what: str) -> None:
        T, H = c.active_shape
        if rows != T or cols != H:
            raise TpflexShapeError(
                f"{what} is [{rows}, {cols}] in tokens, but '{c.name}' (the plain path's "
                f"{c.coll.upper()}) is active at [{T}, {H}]", self.where)

    def ag(self, x: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return x
        if self.on_sim:
            c = self._comm("ag")
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


# ---- one call's settings -----------------------------------------------------------------------

class _Call:
    """What one forward call resolved (no tensors that autograd tracks): the flags in effect,
    the communicators, the plain collectives, the token count T."""
    __slots__ = ("where", "P", "sp", "ag", "rs", "ag_dgrad", "rs_dgrad", "bulk_dgrad",
                 "bulk_wgrad", "fprop", "dgrad", "wgrad", "plain", "fuse_wgrad", "main_grad",
                 "accumulate", "gelu", "reduce", "tokens", "shape_comm")

    def __init__(self, where: str) -> None:
        self.where = where
        self.P = 1
        self.sp = False
        self.ag = self.rs = self.ag_dgrad = self.rs_dgrad = False
        self.bulk_dgrad = self.bulk_wgrad = False
        self.fprop = self.dgrad = self.wgrad = None
        self.plain: Optional[_Plain] = None
        self.fuse_wgrad = False
        self.main_grad: Optional[torch.Tensor] = None
        self.accumulate = True
        self.gelu = False
        self.reduce = True
        self.tokens = 0
        self.shape_comm: Any = None

    def check_backward(self) -> None:
        """The microbatch's shape must still be active when its backward runs."""
        c = self.shape_comm
        if c is not None and c.active_shape[0] != self.tokens:
            raise TpflexShapeError(
                f"backward of a microbatch of T = {self.tokens} tokens, but '{c.name}' is now "
                f"active at {list(c.active_shape)} (keep the microbatch's shape active until its "
                f"backward has run)", self.where)


def _check_tokens(call: _Call, comm: Any, tokens: int, rows: int, what: str) -> None:
    T, H = comm.active_shape
    if tokens != T:
        per = f"{rows} rows x P = {tokens} tokens" if tokens != rows else f"{rows} rows"
        raise TpflexShapeError(
            f"{what} has {per}, but the active shape is [{T}, {H}] ('{comm.name}'): call "
            f"set_ub_active_shape([{tokens}, {H}]) or use tpflex.torch.active_tokens({tokens}) "
            f"for this microbatch", call.where)
    call.tokens, call.shape_comm = tokens, comm


# ---- autograd functions ------------------------------------------------------------------------

class _ColumnParallel(torch.autograd.Function):
    """y = X W^T + b for a column-parallel weight [N/P, K]; X is this rank's rows [T/P, K] with
    sequence parallelism (gathered here), else the full [T, K]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                call: _Call) -> torch.Tensor:
        if call.ag:  # RING AG + GEMM, the bias (and, without grad, the GELU) in the epilogue
            call.fprop.local_chunk().copy_(x)
            kw = {} if bias is None else {"bias": bias}
            if call.gelu:
                kw["gelu"] = True
            y = call.fprop.ag_gemm(weight, **kw)
        else:
            xt = call.plain.ag(x) if call.sp else x
            y = _linear(xt, weight, bias)
            if call.gelu:
                y = Fn.gelu(y, approximate="tanh")
        ctx.save_for_backward(x, weight)
        ctx.call = call
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        c: _Call = ctx.call
        c.check_backward()
        dy = dy.contiguous()
        need_dx = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or c.fuse_wgrad
        dt = weight.dtype
        dx = dw = None
        if c.sp:
            bulk_dgrad = c.bulk_dgrad and need_w   # TE: the bulk overlaps need the wgrad
            bulk_wgrad = c.bulk_wgrad and need_w
            xt = part = None
            if c.rs_dgrad:
                if need_w:
                    xt = c.plain.ag(x)
                if need_dx:  # dgrad GEMM + RS on '{ub}_dgrad': dx = RS(dy W)
                    dx = c.dgrad.gemm_rs(dy, weight, trans_w=True)
            else:
                if bulk_dgrad:  # BULK AG of x on '{ub}_dgrad' beside dy W
                    c.dgrad.local_chunk().copy_(x)
                    dst = c.wgrad.buffer() if bulk_wgrad else None
                    part = c.dgrad.bulk_overlap(dy, weight, out=dst, trans_w=True)
                    xt = c.dgrad.buffer()
                else:
                    if need_w:
                        xt = c.plain.ag(x)
                    if need_dx or bulk_wgrad:
                        part = _mm(dy, weight, dt)
                if bulk_wgrad:  # BULK RS of dgrad on '{ub}_wgrad' beside the wgrad GEMM
                    buf = c.wgrad.buffer()
                    if part is not buf:
                        buf.copy_(part)
                    if c.fuse_wgrad:
                        c.wgrad.bulk_overlap(dy, xt, out=c.main_grad, trans_a=True,
                                             trans_w=True, beta=1.0 if c.accumulate else 0.0)
                    else:
                        dw = c.wgrad.bulk_overlap(dy, xt, trans_a=True, trans_w=True)
                    dx = c.wgrad.local_chunk().clone()
                    need_w = False
                elif need_dx:
                    dx = c.plain.rs(part)
            if need_w:
                dw = _wgrad_into(dy, xt, weight, c)
        else:
            if need_dx:
                dx = _mm(dy, weight, dt)
                if c.P > 1 and c.reduce:  # tensor parallel without sequence parallelism
                    dx = c.plain.ar(dx)
            if need_w:
                dw = _wgrad_into(dy, x, weight, c)
        db = dy.float().sum(0).to(dt) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx if need_dx else None, dw, db, None


class _RowParallel(torch.autograd.Function):
    """y = X W^T + b for a row-parallel weight [N, K/P]; X [T, K/P]; y is this rank's rows
    [T/P, N] with sequence parallelism (reduce-scattered), else [T, N] all-reduced."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                call: _Call) -> torch.Tensor:
        if call.rs:  # GEMM + RS, the bias once on the reduced rows
            y = call.fprop.gemm_rs(x, weight, **({} if bias is None else {"bias": bias}))
        elif call.P > 1 and call.reduce:
            part = _linear(x, weight, None)
            y = call.plain.rs(part) if call.sp else call.plain.ar(part)
            if bias is not None:
                y = (y.float() + bias.float()).to(y.dtype)
        else:
            y = _linear(x, weight, bias)
        ctx.save_for_backward(x, weight)
        ctx.call = call
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        c: _Call = ctx.call
        c.check_backward()
        dy = dy.contiguous()
        dt = weight.dtype
        need_w = ctx.needs_input_grad[1] or c.fuse_wgrad
        dx = None
        if c.ag_dgrad:  # RING AG of dy + GEMM on '{ub}_dgrad'; the wgrad reads AG(dy) there
            c.dgrad.local_chunk().copy_(dy)
            dx = c.dgrad.ag_gemm(weight, trans_w=True)
            dyt = c.dgrad.buffer()
        else:
            dyt = c.plain.ag(dy) if c.sp else dy
            if ctx.needs_input_grad[0]:
                dx = _mm(dyt, weight, dt)
        dw = _wgrad_into(dyt, x, weight, c) if need_w else None
        db = dyt.float().sum(0).to(dt) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


# ---- modules -----------------------------------------------------------------------------------

def _flag(where: str, name: str, v: Any) -> bool:
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise TpflexInvalidError(f"{name}={v!r} must be a bool", where)


def _tp_size(where: str, tp_group: Any, tp_size: Any) -> int:
    if tp_group is not None:
        import torch.distributed as dist
        return int(dist.get_world_size(tp_group))
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TpflexInvalidError(f"tp_size={tp_size!r} must be an int >= 1", where)
    return tp_size


def _divide(where: str, what: str, n: int, P: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TpflexInvalidError(f"{what}={n!r} must be an int >= 1", where)
    if n % P:
        raise TpflexDivisibleError(f"{what} {n} does not divide among tp_size {P} ranks", where)
    return n // P


def _device(device: Any) -> torch.device:
    if device is not None:
        return torch.device(device)
    if sim.current() is not None or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _default_init(w: torch.Tensor) -> None:
    torch.nn.init.normal_(w, mean=0.0, std=0.023)  # TE's get_default_init_method


def _main_grad(where: str, p: torch.nn.Parameter, pname: str) -> torch.Tensor:
    mg = getattr(p, "main_grad", None)
    if not isinstance(mg, torch.Tensor):
        raise TpflexStateError(f"fuse_wgrad_accumulation=True: set {pname}.main_grad (an fp32 "
                               f"tensor of shape {list(p.shape)}) before the forward", where)
    if mg.dtype != torch.float32 or tuple(mg.shape) != tuple(p.shape) or mg.device != p.device:
        raise TpflexInvalidError(f"{pname}.main_grad is {mg.dtype} {list(mg.shape)} on "
                                 f"{mg.device}; expected torch.float32 {list(p.shape)} on "
                                 f"{p.device}", where)
    return mg


def _2d(where: str, inp: Any, K: int, what: str) -> torch.Tensor:
    if not isinstance(inp, torch.Tensor):
        raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(inp).__name__}", where)
    if inp.dim() < 1 or inp.shape[-1] != K:
        raise TpflexShapeError(f"{what} has shape {list(inp.shape)}; its last dimension must be "
                               f"{K}", where)
    return inp.reshape(-1, K)


class _Site:
    """One GEMM site's parallel mode, flags in effect (TE's rules) and communicators."""

    def __init__(self, where: str, mode: Optional[str], P: int, sp: bool, ub_name: Optional[str],
                 group: Any, ag: bool, rs: bool, rs_dgrad: bool, bulk_dgrad: bool,
                 bulk_wgrad: bool) -> None:
        self.where, self.mode, self.P, self.sp, self.ub_name, self.group = \
            where, mode, P, sp, ub_name, group
        col, row = mode == "column" and sp, mode == "row" and sp
        self.ag = col and ag                 # fprop RING AG + GEMM
        self.rs_dgrad = col and rs_dgrad
        self.bulk_dgrad = col and bulk_dgrad and not self.rs_dgrad
        self.bulk_wgrad = col and bulk_wgrad and not self.rs_dgrad
        self.rs = row and rs                 # fprop GEMM + RS
        self.ag_dgrad = row and ag           # dgrad RING AG + GEMM
        if self.any_ub:
            if not ub_name:
                raise TpflexInvalidError("a ub_* overlap needs ub_name (the sites "
                                         "'{ub_name}_fprop/_dgrad/_wgrad')", where)
            n = ub_name
            if self.ag:
                _need(where, f"{n}_fprop", "ub_overlap_ag", ("ring",), "ag")
            if self.rs:
                _need(where, f"{n}_fprop", "ub_overlap_rs", ("ring", "pipeline"), "rs")
            if self.ag_dgrad:
                _need(where, f"{n}_dgrad", "ub_overlap_ag (dgrad)", ("ring",), "ag")
            if self.rs_dgrad:
                _need(where, f"{n}_dgrad", "ub_overlap_rs_dgrad", ("ring", "pipeline"), "rs")
            if self.bulk_dgrad:
                _need(where, f"{n}_dgrad", "ub_bulk_dgrad", ("bulk",), "ag")
            if self.bulk_wgrad:
                _need(where, f"{n}_wgrad", "ub_bulk_wgrad", ("bulk",), "rs")

    @property
    def any_ub(self) -> bool:
        return self.ag or self.rs or self.ag_dgrad or self.rs_dgrad or self.bulk_dgrad or \
            self.bulk_wgrad

    def call(self, rows: int, cols: int, weight: torch.nn.Parameter, fuse_wgrad: bool,
             accumulate: bool, reduce: bool = True) -> _Call:
        """Resolves this call's communicators and checks the rows against the active shape.
        rows, cols: the input's (column) or the output's (row) row count and width."""
        c = _Call(self.where)
        c.P, c.sp, c.reduce = self.P, self.sp, reduce
        c.ag, c.rs, c.ag_dgrad, c.rs_dgrad = self.ag, self.rs, self.ag_dgrad, self.rs_dgrad
        c.bulk_dgrad, c.bulk_wgrad = self.bulk_dgrad, self.bulk_wgrad
        n = self.ub_name
        if self.ag or self.rs:
            c.fprop = _get(f"{n}_fprop")
        if self.ag_dgrad or self.rs_dgrad or self.bulk_dgrad:
            c.dgrad = _get(f"{n}_dgrad")
        if self.bulk_wgrad:
            c.wgrad = _get(f"{n}_wgrad")
        if self.P > 1 and reduce:
            pre = (f"{n}_dgrad", f"{n}_wgrad") if n else ()
            c.plain = _Plain(self.where, self.P, self.group, pre, pre)
        tokens = rows * self.P if self.mode == "column" and self.sp else rows
        ref = c.fprop or c.dgrad or c.wgrad
        if ref is None and c.plain is not None and c.plain.on_sim:
            ref = c.plain._comm("ag" if self.sp and self.mode == "column" else "rs")
        if ref is not None:
            what = ("the input" if self.mode == "column" else "the input (row-parallel)")
            _check_tokens(c, ref, tokens, rows, what)
            H = ref.active_shape[1]
            if cols != H:
                side = "input's width (in_features)" if self.mode == "column" else \
                    "output's width (out_features)"
                raise TpflexShapeError(f"the {side} is {cols}, but the registered hidden size is "
                                       f"{H} ('{ref.name}')", self.where)
        c.fuse_wgrad = fuse_wgrad
        if fuse_wgrad and torch.is_grad_enabled() and weight.requires_grad:
            c.main_grad = _main_grad(self.where, weight, "weight")
        elif fuse_wgrad:
            c.fuse_wgrad = False
        c.accumulate = accumulate
        return c


class Linear(torch.nn.Module):
    """TransformerEngine's Linear (SPEC §12): parallel_mode None, "column" or "row"."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group: Any = None, tp_size: int = 1,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 return_bias: bool = False, params_dtype: Optional[torch.dtype] = None,
                 parallel_mode: Optional[str] = None, device: Any = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, ub_name: Optional[str] = None) -> None:
        super().__init__()
        where = f"Linear({in_features}, {out_features})"
        if parallel_mode not in (None, "column", "row"):
            raise TpflexInvalidError(f"parallel_mode={parallel_mode!r} (None, 'column' or 'row')",
                                     where)
        P = _tp_size(where, tp_group, tp_size)
        self.in_features, self.out_features = in_features, out_features
        self.tp_size, self.tp_group, self.parallel_mode = P, tp_group, parallel_mode
        self.use_bias = _flag(where, "bias", bias)
        self.return_bias = _flag(where, "return_bias", return_bias)
        self.apply_bias = self.use_bias and not self.return_bias
        self.fuse_wgrad_accumulation = _flag(where, "fuse_wgrad_accumulation",
                                             fuse_wgrad_accumulation)
        self.sequence_parallel = P > 1 and _flag(where, "sequence_parallel", sequence_parallel)
        self.ub_name = ub_name
        n_out = _divide(where, "out_features", out_features, P) if parallel_mode == "column" \
            else out_features
        n_in = _divide(where, "in_features", in_features, P) if parallel_mode == "row" \
            else in_features
        self._site = _Site(where, parallel_mode, P, self.sequence_parallel, ub_name, tp_group,
                           _flag(where, "ub_overlap_ag", ub_overlap_ag),
                           _flag(where, "ub_overlap_rs", ub_overlap_rs),
                           _flag(where, "ub_overlap_rs_dgrad", ub_overlap_rs_dgrad),
                           _flag(where, "ub_bulk_dgrad", ub_bulk_dgrad),
                           _flag(where, "ub_bulk_wgrad", ub_bulk_wgrad))
        self._where = where
        dt = params_dtype or torch.get_default_dtype()
        dev = _device(device)
        self.weight = torch.nn.Parameter(torch.empty(n_out, n_in, dtype=dt, device=dev))
        (init_method or _default_init)(self.weight.data)
        if parallel_mode is not None:
            self.weight.tensor_model_parallel = True
            self.weight.partition_dim = 0 if parallel_mode == "column" else 1
        if self.use_bias:
            self.bias = torch.nn.Parameter(torch.zeros(n_out, dtype=dt, device=dev))
            if parallel_mode == "row":
                self.bias.sequence_parallel = self.sequence_parallel
            elif parallel_mode == "column":
                self.bias.tensor_model_parallel = True
                self.bias.partition_dim = 0
        else:
            self.register_parameter("bias", None)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None) -> Any:
        K = self.weight.shape[1]
        x = _2d(self._where, inp, K, "the input")
        if x.dtype != self.weight.dtype:
            x = x.to(self.weight.dtype)
        mode, P = self.parallel_mode, self.tp_size
        reduce = mode is not None
        if mode == "row":
            call = self._site.call(x.shape[0], self.weight.shape[0], self.weight,
                                   self.fuse_wgrad_accumulation, not is_first_microbatch, reduce)
            fn = _RowParallel
        else:
            call = self._site.call(x.shape[0], K, self.weight, self.fuse_wgrad_accumulation,
                                   not is_first_microbatch, reduce and P > 1)
            fn = _ColumnParallel
        if mode is None:
            call.P, call.sp, call.plain = 1, False, None
        b = self.bias if self.apply_bias else None
        y = fn.apply(x, self.weight, b, call)
        y = y.view(-1, *inp.shape[1:-1], y.shape[-1])
        if self.return_bias:
            return y, self.bias
        return y

    def extra_repr(self) -> str:
        s = self._site
        flags = [k for k in ("ag", "rs", "ag_dgrad", "rs_dgrad", "bulk_dgrad", "bulk_wgrad")
                 if getattr(s, k)]
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, parallel_mode={self.parallel_mode}, tp_size={self.tp_size}"
                f", sequence_parallel={self.sequence_parallel}, ub_name={self.ub_name}, "
                f"ub={flags}")


_NORMS = ("LayerNorm", "RMSNorm")
_ACTS = ("gelu", "relu")


class LayerNormMLP(torch.nn.Module):
    """TransformerEngine's LayerNormMLP (SPEC §12): norm -> fc1 (column-parallel) -> activation
    -> fc2 (row-parallel), on the sites 'fc1' and 'fc2'."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5,
                 bias: bool = True, *, normalization: str = "LayerNorm",
                 activation: str = "gelu", sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 output_layer_init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 return_bias: bool = False, params_dtype: Optional[torch.dtype] = None,
                 set_parallel_mode: bool = False, device: Any = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False) -> None:
        super().__init__()
        where = f"LayerNormMLP({hidden_size}, {ffn_hidden_size})"
        if normalization not in _NORMS:
            raise TpflexInvalidError(f"normalization={normalization!r} ({' or '.join(_NORMS)})",
                                     where)
        if activation not in _ACTS:
            raise TpflexUnsupportedError(f"activation={activation!r} (tpflex offers "
                                         f"{' and '.join(_ACTS)}; gelu is the tanh form)", where)
        P = _tp_size(where, tp_group, tp_size)
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.eps = float(eps)
        self.normalization, self.activation = normalization, activation
        self.tp_size, self.tp_group = P, tp_group
        self.use_bias = _flag(where, "bias", bias)
        self.return_bias = _flag(where, "return_bias", return_bias)
        self.apply_bias = self.use_bias and not self.return_bias
        self.fuse_wgrad_accumulation = _flag(where, "fuse_wgrad_accumulation",
                                             fuse_wgrad_accumulation)
        self.sequence_parallel = P > 1 and _flag(where, "sequence_parallel", sequence_parallel)
        self.set_parallel_mode = _flag(where, "set_parallel_mode", set_parallel_mode)
        if P > 1 and not self.set_parallel_mode:
            raise TpflexUnsupportedError(
                f"tp_size {P} needs set_parallel_mode=True (without it TE leaves fc2's reduction "
                f"and fc1's input gradient to its caller; tpflex does not offer that mode)", where)
        Fp = _divide(where, "ffn_hidden_size", ffn_hidden_size, P)
        _divide(where, "hidden_size", hidden_size, 1)
        flags = [_flag(where, k, v) for k, v in (
            ("ub_overlap_ag", ub_overlap_ag), ("ub_overlap_rs", ub_overlap_rs),
            ("ub_overlap_rs_dgrad", ub_overlap_rs_dgrad), ("ub_bulk_dgrad", ub_bulk_dgrad),
            ("ub_bulk_wgrad", ub_bulk_wgrad))]
        ag, rs, rs_dgrad, bulk_dgrad, bulk_wgrad = flags
        sp = self.sequence_parallel
        self._fc1 = _Site(where, "column", P, sp, "fc1", tp_group, ag, False, rs_dgrad,
                          bulk_dgrad, bulk_wgrad)
        self._fc2 = _Site(where, "row", P, sp, "fc2", tp_group, ag, rs, False, False, False)
        self._where = where
        dt = params_dtype or torch.get_default_dtype()
        dev = _device(device)
        H = hidden_size
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(H, dtype=dt, device=dev))
        self.layer_norm_weight.sequence_parallel = sp
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(H, dtype=dt, device=dev))
            self.layer_norm_bias.sequence_parallel = sp
        else:
            self.register_parameter("layer_norm_bias", None)
        self.fc1_weight = torch.nn.Parameter(torch.empty(Fp, H, dtype=dt, device=dev))
        (init_method or _default_init)(self.fc1_weight.data)
        self.fc2_weight = torch.nn.Parameter(torch.empty(H, Fp, dtype=dt, device=dev))
        (output_layer_init_method or _default_init)(self.fc2_weight.data)
        self.fc1_weight.tensor_model_parallel, self.fc1_weight.partition_dim = True, 0
        self.fc2_weight.tensor_model_parallel, self.fc2_weight.partition_dim = True, 1
        if self.use_bias:
            self.fc1_bias = torch.nn.Parameter(torch.zeros(Fp, dtype=dt, device=dev))
            self.fc1_bias.tensor_model_parallel, self.fc1_bias.partition_dim = True, 0
            self.fc2_bias = torch.nn.Parameter(torch.zeros(H, dtype=dt, device=dev))
            self.fc2_bias.sequence_parallel = sp
        else:
            self.register_parameter("fc1_bias", None)
            self.register_parameter("fc2_bias", None)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """The normalisation in fp32, rounded once to the compute dtype (TE's kernels)."""
        w = self.layer_norm_weight
        if self.normalization == "LayerNorm":
            y = Fn.layer_norm(x.float(), (x.shape[1],), w.float(), self.layer_norm_bias.float(),
                              self.eps)
        else:
            y = Fn.rms_norm(x.float(), (x.shape[1],), w.float(), self.eps)
        return y.to(x.dtype)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None) -> Any:
        H = self.hidden_size
        x = _2d(self._where, inp, H, "the input")
        if x.dtype != self.fc1_weight.dtype:
            x = x.to(self.fc1_weight.dtype)
        acc = not is_first_microbatch
        fuse = self.fuse_wgrad_accumulation
        c1 = self._fc1.call(x.shape[0], H, self.fc1_weight, fuse, acc)
        ln = self._norm(x)
        # The GELU in fc1's epilogue only when nothing needs the pre-activation.
        c1.gelu = (self.activation == "gelu" and c1.ag and not torch.is_grad_enabled())
        y1 = _ColumnParallel.apply(ln, self.fc1_weight, self.fc1_bias, c1)
        if not c1.gelu:
            y1 = Fn.gelu(y1, approximate="tanh") if self.activation == "gelu" else Fn.relu(y1)
        c2 = self._fc2.call(y1.shape[0], H, self.fc2_weight, fuse, acc)
        b2 = self.fc2_bias if self.apply_bias else None
        y = _RowParallel.apply(y1, self.fc2_weight, b2, c2)
        y = y.view(-1, *inp.shape[1:-1], H)
        if self.return_bias:
            return y, self.fc2_bias
        return y

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"normalization={self.normalization}, activation={self.activation}, "
                f"tp_size={self.tp_size}, sequence_parallel={self.sequence_parallel}")


def _shape_comm() -> Any:
    """A registered communicator that takes the manager's active shape (not external)."""
    for n in _site_names():
        try:
            c = _get(n)
        except TpflexStateError:
            raise
        except TpflexError:
            continue
        if not getattr(c, "external", False):
            return c
    raise TpflexStateError("active_tokens: no registered communicator takes an active shape",
                           "active_tokens")


@contextlib.contextmanager
def active_tokens(tokens: int) -> Iterator[Tuple[int, int]]:
    """Sets the manager's active shape to [tokens, H] (H: the registration's hidden size) for
    the block, and restores the shape that was active before on exit. Yields (tokens, H)."""
    tt = _tt()
    c = _shape_comm()
    prev = tuple(c.active_shape)
    H = c.capacity_shape[1]
    tt.set_ub_active_shape([tokens, H])
    try:
        yield (int(tokens), int(H))
    finally:
        tt.set_ub_active_shape(list(prev))


__all__ = ["Linear", "LayerNormMLP", "active_tokens"]
