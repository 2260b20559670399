"""One forward call's settings (_Call) and the autograd functions: column- and row-parallel GEMMs
scheduled as TE schedules them on tpflex's operations."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as Fn

from .._quant import QTensor, fp8_mm
from ..errors import TpflexShapeError
from ._sites import (_Plain, _add_bias, _autocast_off, _bias_grad, _block_shape,
                     _fp8_wgrad_into, _gather_q, _linear, _mm, _wgrad_into)


# ---- one call's settings -----------------------------------------------------------------------

class _Call:
    """What one forward call resolved (no tensors that autograd tracks): the flags in effect,
    the communicators, the plain collectives, the token count T."""
    __slots__ = ("where", "P", "sp", "ag", "rs", "ag_dgrad", "rs_dgrad", "bulk_dgrad",
                 "bulk_wgrad", "fprop", "dgrad", "wgrad", "plain", "fuse_wgrad", "main_grad",
                 "accumulate", "gelu", "reduce", "tokens", "shape_comm", "cdt", "q", "wc",
                 "tp_reduce")

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
        # Precision (_sites._precision): the GEMMs' dtype, the FP8 quantization (None: none),
        # the weight as the GEMMs take it (cdt, or a QTensor), the TP amax reducer.
        self.cdt: Optional[torch.dtype] = None
        self.q: Any = None
        self.wc: Any = None
        self.tp_reduce: Any = None

    def weight(self, weight: torch.Tensor) -> Any:
        """The weight in compute form (the parameter itself where nothing set one)."""
        return weight if self.wc is None else self.wc

    def check_backward(self) -> None:
        """The microbatch's shape must still be active when its backward runs."""
        c = self.shape_comm
        if c is not None and (_block_shape(c) or c.active_shape)[0] != self.tokens:
            raise TpflexShapeError(
                f"backward of a microbatch of T = {self.tokens} tokens, but '{c.name}' is now "
                f"active at {list(c.active_shape)} (keep the microbatch's shape active until its "
                f"backward has run)", self.where)


def _check_tokens(call: _Call, comm: Any, tokens: int, rows: int, what: str) -> int:
    """Checks the microbatch's tokens against comm's active shape [T, H] (the one the
    active_tokens block around the call set, else comm's as the C library has it); returns H."""
    T, H = _block_shape(comm) or comm.active_shape
    if tokens != T:
        _tokens_hint(call, T, H, tokens, rows, what)
        per = f"{rows} rows x P = {tokens} tokens" if tokens != rows else f"{rows} rows"
        raise TpflexShapeError(
            f"{what} has {per}, but the active shape is [{T}, {H}] ('{comm.name}'): call "
            f"set_ub_active_shape([{tokens}, {H}]) or use tpflex.torch.active_tokens({tokens}) "
            f"for this microbatch", call.where)
    call.tokens, call.shape_comm = tokens, comm
    return H


def _tokens_hint(call: _Call, T: int, H: int, tokens: int, rows: int, what: str) -> None:
    """The errors whose fix is not another active shape: an empty microbatch, and all T rows
    given to a sequence-parallel input (which takes this rank's T/P), inside graphed or not."""
    if rows == 0:
        raise TpflexShapeError(
            f"{what} is an empty microbatch (0 rows): no active shape has T = 0; skip the "
            f"module's call for it", call.where)
    if tokens != rows and rows == T:
        from .._state import state
        g = state().get("graphed")
        P = tokens // rows
        if g is not None and not g.sequence_parallel:
            raise TpflexShapeError(
                f"{what} has {rows} rows inside {g._where}, which took them as the whole "
                f"microbatch (T = {rows}, active [{T}, {H}]); a sequence-parallel module takes "
                f"this rank's T/P rows: pass those to a callable made with "
                f"tpflex.torch.graphed(fn, sequence_parallel=True)", call.where)
        raise TpflexShapeError(
            f"{what} has {rows} rows, the whole microbatch (the active shape is [{T}, {H}]); "
            f"a sequence-parallel module takes this rank's T/P = {T // P} rows: pass rows "
            f"[rank * {T // P}, (rank + 1) * {T // P}) (or build the module with "
            f"sequence_parallel=False)", call.where)


# ---- autograd functions ------------------------------------------------------------------------

class _ColumnParallel(torch.autograd.Function):
    """y = X W^T + b for a column-parallel weight [N/P, K]; X is this rank's rows [T/P, K] with
    sequence parallelism (gathered here), else the full [T, K]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                call: _Call) -> torch.Tensor:
        with _autocast_off(x):
            x, b = _in_cdt(x, bias, call)
            ctx.bias_dtype = None if bias is None else bias.dtype
            if call.q is not None:
                y = _column_fp8_fwd(ctx, x, b, call)
            else:
                w = call.weight(weight)
                if call.ag:  # RING AG + GEMM, the bias (and, without grad, the GELU) in the
                    # epilogue
                    call.fprop.local_chunk().copy_(x)
                    kw = {} if b is None else {"bias": b}
                    if call.gelu:
                        kw["gelu"] = True
                    y = call.fprop.ag_gemm(w, **kw)
                else:
                    xt = call.plain.ag(x) if call.sp else x
                    y = _linear(xt, w, b)
                    if call.gelu:
                        y = Fn.gelu(y, approximate="tanh")
        ctx.save_for_backward(x, weight)
        ctx.call = call
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Tuple[Any, ...]:
        with _autocast_off(dy):
            return _ColumnParallel._backward(ctx, dy)

    @staticmethod
    def _backward(ctx: Any, dy: torch.Tensor) -> Tuple[Any, ...]:
        x, param = ctx.saved_tensors
        c: _Call = ctx.call
        c.check_backward()
        dy = dy.contiguous()
        if c.q is not None:
            return _column_fp8_bwd(ctx, x, param, dy, c)
        weight = c.weight(param)
        need_dx = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or c.fuse_wgrad
        dt = x.dtype     # the compute dtype (torch.autocast's, else the parameters')
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
                        mg = c.main_grad   # not row-major (column-major): through a copy
                        out = mg if mg.is_contiguous() else mg.contiguous()
                        c.wgrad.bulk_overlap(dy, xt, out=out, trans_a=True,
                                             trans_w=True, beta=1.0 if c.accumulate else 0.0)
                        if out is not mg:
                            mg.copy_(out)
                    else:  # written in the parameter's dtype (fp32 under torch.autocast)
                        dw = c.wgrad.bulk_overlap(dy, xt, trans_a=True, trans_w=True,
                                                  out=torch.empty(param.shape, dtype=param.dtype,
                                                                  device=dy.device))
                    dx = c.wgrad.local_chunk().clone()
                    need_w = False
                elif need_dx:
                    dx = c.plain.rs(part)
            if need_w:
                dw = _wgrad_into(dy, xt, param, c)
        else:
            if need_dx:
                dx = _mm(dy, weight, dt)
                if c.P > 1 and c.reduce:  # tensor parallel without sequence parallelism
                    dx = c.plain.ar(dx)
            if need_w:
                dw = _wgrad_into(dy, x, param, c)
        db = _bias_grad(dy, ctx.bias_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx if need_dx else None, dw, db, None


class _RowParallel(torch.autograd.Function):
    """y = X W^T + b for a row-parallel weight [N, K/P]; X [T, K/P]; y is this rank's rows
    [T/P, N] with sequence parallelism (reduce-scattered), else [T, N] all-reduced."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                call: _Call) -> torch.Tensor:
        with _autocast_off(x):
            x, b = _in_cdt(x, bias, call)
            ctx.bias_dtype = None if bias is None else bias.dtype
            w = call.weight(weight)
            q = call.q
            if q is not None:  # the input in FP8 (not gathered: this rank's columns)
                xq = ctx.xq = q.quantize(x, "input")
            if call.rs:  # GEMM + RS, the bias once on the reduced rows
                kw = {} if b is None else {"bias": b}
                if q is not None:
                    kw.update(a_scale_inv=xq.scale_inv, w_scale_inv=w.scale_inv)
                y = call.fprop.gemm_rs(xq.data if q is not None else x,
                                       w.data if q is not None else w, **kw)
            elif call.P > 1 and call.reduce:
                part = fp8_mm(xq, w, x.dtype, trans_b=True) if q is not None else \
                    _linear(x, w, None)
                y = call.plain.rs(part) if call.sp else call.plain.ar(part)
                if b is not None:
                    y = _add_bias(y, b)
            else:
                y = fp8_mm(xq, w, x.dtype, trans_b=True, bias=b) if q is not None else \
                    _linear(x, w, b)
        ctx.save_for_backward(x, weight)
        ctx.call = call
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Tuple[Any, ...]:
        with _autocast_off(dy):
            return _RowParallel._backward(ctx, dy)

    @staticmethod
    def _backward(ctx: Any, dy: torch.Tensor) -> Tuple[Any, ...]:
        x, param = ctx.saved_tensors
        c: _Call = ctx.call
        c.check_backward()
        dy = dy.contiguous()
        if c.q is not None:
            return _row_fp8_bwd(ctx, x, param, dy, c)
        weight = c.weight(param)
        dt = x.dtype     # the compute dtype (torch.autocast's, else the parameters')
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
        dw = _wgrad_into(dyt, x, param, c) if need_w else None
        # The bias grad sums this rank's rows of dY (SPEC §12: with sequence parallelism the
        # bias is marked sequence_parallel and holds a partial sum that the TP all-reduce
        # completes, as TE's FP8 path computes it; without it dy is the full dY).
        db = _bias_grad(dy, ctx.bias_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


# ---- precision helpers (SPEC §14) --------------------------------------------------------------

def _in_cdt(x: torch.Tensor, bias: Optional[torch.Tensor],
            call: _Call) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The input and the bias in the GEMMs' dtype (torch.autocast's, else the parameters'); the
    gradients go back in the tensors' own dtypes (autograd casts them)."""
    cdt = call.cdt
    if cdt is None:
        return x, bias
    if x.dtype != cdt:
        x = x.to(cdt)
    if bias is not None and bias.dtype != cdt:
        bias = bias.detach().to(cdt)
    return x, bias


def _column_fp8_fwd(ctx: Any, x: torch.Tensor, b: Optional[torch.Tensor], call: _Call) -> Any:
    """Column-parallel forward in FP8: the input quantized (one scale across the TP group when it
    is gathered), gathered in FP8, one FP8 GEMM with both scale inverses."""
    q, w = call.q, call.wc
    xq = ctx.xq = q.quantize(x, "input", call.tp_reduce)
    if call.ag:  # FP8 RING AG + GEMM on the FP8 registration
        call.fprop.local_chunk().copy_(xq.data)
        kw: dict = {"a_scale_inv": xq.scale_inv, "w_scale_inv": w.scale_inv}
        if b is not None:
            kw["bias"] = b
        if call.gelu:
            kw["gelu"] = True
        T = call.tokens  # checked against the active shape (_check_tokens)
        out = torch.empty((T, w.data.shape[0]), dtype=x.dtype, device=x.device)
        return call.fprop.ag_gemm(w.data, out=out, **kw)
    xt = _gather_q(call.plain, xq) if call.sp else xq
    y = fp8_mm(xt, w, x.dtype, trans_b=True, bias=b)
    return Fn.gelu(y, approximate="tanh") if call.gelu else y


def _column_fp8_bwd(ctx: Any, x: torch.Tensor, param: torch.Tensor, dy: torch.Tensor,
                    c: _Call) -> Tuple[Any, ...]:
    q, w, xq = c.q, c.wc, ctx.xq
    need_dx = ctx.needs_input_grad[0]
    need_w = ctx.needs_input_grad[1] or c.fuse_wgrad
    dt = x.dtype
    dyq = q.quantize(dy, "grad")        # this rank's output columns, all T rows: not gathered
    dx = dw = None
    if c.sp:
        bulk_dgrad = c.bulk_dgrad and need_w
        bulk_wgrad = c.bulk_wgrad and need_w
        xt = part = None
        if c.rs_dgrad:
            if need_w:
                xt = _gather_q(c.plain, xq)
            if need_dx:  # FP8 dgrad GEMM + RS (in the compute dtype) on '{ub}_dgrad'
                dx = c.dgrad.gemm_rs(dyq.data, w.t_data(), a_scale_inv=dyq.scale_inv,
                                     w_scale_inv=w.scale_inv)
        else:
            if bulk_dgrad:  # BULK AG of the FP8 input beside the FP8 dgrad GEMM
                c.dgrad.local_chunk().copy_(xq.data)
                dst = c.wgrad.buffer() if bulk_wgrad else \
                    torch.empty((dy.shape[0], w.data.shape[1]), dtype=dt, device=dy.device)
                part = c.dgrad.bulk_overlap(dyq.data, w.t_data(), out=dst,
                                            a_scale_inv=dyq.scale_inv, w_scale_inv=w.scale_inv)
                xt = QTensor(c.dgrad.buffer(), xq.scale_inv)
            else:
                if need_w:
                    xt = _gather_q(c.plain, xq)
                if need_dx or bulk_wgrad:
                    part = fp8_mm(dyq, w, dt)
            if bulk_wgrad:  # BULK RS of dgrad beside the FP8 wgrad GEMM
                buf = c.wgrad.buffer()
                if part is not buf:
                    buf.copy_(part)
                out = c.main_grad if c.fuse_wgrad else \
                    torch.empty(param.shape, dtype=param.dtype, device=dy.device)
                c.wgrad.bulk_overlap(dyq.t_data(), xt.t_data(), out=out,
                                     beta=1.0 if c.fuse_wgrad and c.accumulate else 0.0,
                                     a_scale_inv=dyq.scale_inv, w_scale_inv=xt.scale_inv)
                dw = None if c.fuse_wgrad else out
                dx = c.wgrad.local_chunk().clone()
                need_w = False
            elif need_dx:
                dx = c.plain.rs(part)
        if need_w:
            dw = _fp8_wgrad_into(dyq, xt, param, c)
    else:
        if need_dx:
            dx = fp8_mm(dyq, w, dt)
            if c.P > 1 and c.reduce:
                dx = c.plain.ar(dx)
        if need_w:
            dw = _fp8_wgrad_into(dyq, xq, param, c)
    db = _bias_grad(dy, ctx.bias_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    q.end_of_backward()
    return dx if need_dx else None, dw, db, None


def _row_fp8_bwd(ctx: Any, x: torch.Tensor, param: torch.Tensor, dy: torch.Tensor,
                 c: _Call) -> Tuple[Any, ...]:
    q, w, xq = c.q, c.wc, ctx.xq
    dt = x.dtype
    need_w = ctx.needs_input_grad[1] or c.fuse_wgrad
    dyq = q.quantize(dy, "grad", c.tp_reduce)   # gathered with sequence parallelism: one scale
    dx = None
    if c.ag_dgrad:  # FP8 RING AG of dY + GEMM; the wgrad reads the gathered FP8 dY there
        c.dgrad.local_chunk().copy_(dyq.data)
        T = c.tokens  # checked against the active shape (_check_tokens)
        dx = c.dgrad.ag_gemm(w.t_data(), a_scale_inv=dyq.scale_inv,
                             w_scale_inv=w.scale_inv,
                             out=torch.empty((T, w.data.shape[1]), dtype=dt, device=dy.device))
        dytq = QTensor(c.dgrad.buffer(), dyq.scale_inv)
        dyt = None
    else:
        dyt = c.plain.ag(dy) if c.sp else dy
        dytq = _gather_q(c.plain, dyq) if c.sp else dyq
        if ctx.needs_input_grad[0]:
            dx = fp8_mm(dytq, w, dt)
    dw = _fp8_wgrad_into(dytq, xq, param, c) if need_w else None
    # This rank's rows of dY in high precision, as the bf16 path (SPEC §12's gradient contract:
    # a partial sum under sequence parallelism, completed by the TP all-reduce).
    db = _bias_grad(dy, ctx.bias_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    q.end_of_backward()
    return dx, dw, db, None
