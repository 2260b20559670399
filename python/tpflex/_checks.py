"""Checks shared by the methods, the custom ops and their fake implementations.

Arguments: every value that reaches a C integer goes through _args.int_arg (no silent wrap or
truncation); shapes through as_shape. Tensors: pure functions of tensor metadata (no data_ptr, no C
call), so the fake implementations run the same checks with the same messages; shapes are
compared, never int()-ed (under torch.compile a dimension may be symbolic, and int() would
specialise it)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._lib import Matrix, Shape
from ._types import FP8_DTYPES, FP8_PAIRS, GEMM_DTYPES, TORCH_TO_TPF
from ._args import (I32_MAX, U32_MAX, U64_MAX, bool_arg, int_arg,  # noqa: F401 (re-exported)
                    shape_str)
from .errors import TpflexInvalidError, TpflexShapeError, TpflexUnsupportedError


def as_shape(where: str, what: str, shape: Any) -> Shape:
    """A [rows, cols] sequence as tpf_shape. Negative dimensions are TpflexShapeError, ones over
    2**64 - 1 TpflexOverflowError; 0 is left to the C library (TPF_ESHAPE with its rule)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
        raise TpflexShapeError(f"{what}={shape!r} must be a [tokens, hidden] sequence", where)
    if len(shape) != 2:
        raise TpflexShapeError(f"{what} must be 2-D [tokens, hidden], got {shape_str(shape)}",
                               where)
    rows = int_arg(where, f"{what}[0] (tokens)", shape[0], low_cls=TpflexShapeError)
    cols = int_arg(where, f"{what}[1] (hidden)", shape[1], low_cls=TpflexShapeError)
    return Shape(rows, cols)


# ---- tensors ------------------------------------------------------------------------------------

def need_tensor(where: str, what: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(t).__name__}", where)


def dims(where: str, what: str, t: Any) -> Tuple[Any, Any]:
    need_tensor(where, what, t)
    if t.dim() != 2:
        raise TpflexShapeError(f"{what} has shape {shape_str(t.shape)}, expected 2-D", where)
    return t.shape[0], t.shape[1]


def check_mat(where: str, what: str, t: Any, shape: Tuple[Any, Any],
              dtypes: Tuple[torch.dtype, ...], device: torch.device) -> Any:
    """Device, dtype, shape ([rows, cols], None = any) and strides of a matrix operand; returns
    its leading dimension."""
    need_tensor(where, what, t)
    if t.device != device:
        raise TpflexInvalidError(f"{what} is on {t.device}, expected {device}", where)
    dt = t.dtype
    if dt not in dtypes:
        raise TpflexInvalidError(
            f"{what} has dtype {dt}, expected {' or '.join(str(d) for d in dtypes)}", where)
    ts = t.shape
    want_r, want_c = shape
    if len(ts) != 2 or (want_r is not None and ts[0] != want_r) or \
            (want_c is not None and ts[1] != want_c):
        want = shape_str([s if s is not None else "*" for s in shape])
        raise TpflexShapeError(f"{what} has shape {shape_str(ts)}, expected {want}", where)
    rows, cols = ts
    s0, s1 = t.stride()
    if cols > 1 and s1 != 1 or rows > 1 and s0 < cols:
        hint = (" (a transposed view: pass the stored tensor and set trans_w/trans_a)"
                if s0 == 1 and rows > 1 else "")
        raise TpflexShapeError(
            f"{what} has strides {tuple(t.stride())} for shape {shape_str(ts)}, expected "
            f"contiguous rows (stride 1) and a leading dimension >= {cols}{hint}", where)
    return s0 if rows > 1 and s0 > cols else cols


def matrix(t: torch.Tensor, ld: int) -> Matrix:
    return Matrix(t.data_ptr(), int(t.shape[0]), int(t.shape[1]), int(ld), TORCH_TO_TPF[t.dtype])


def out_dtypes(dtype: torch.dtype) -> Tuple[torch.dtype, ...]:
    if dtype in FP8_DTYPES:  # an fp8 GEMM writes bf16, fp16 or fp32 (SPEC §11)
        return GEMM_DTYPES
    return (dtype, torch.float32) if dtype != torch.float32 else (dtype,)


def default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of an output allocated for the caller: the operands', bf16 for fp8 ones."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype


def check_fp8(where: str, a_what: str, a_dtype: torch.dtype, w_what: str, w_dtype: torch.dtype,
              a_scale: Any, w_scale: Any, device: torch.device) -> None:
    """The fp8 rules (SPEC §11) for a GEMM's operands a and w: both fp8 in a pair the library
    runs (no e5m2 x e5m2), each with its scale_inv (a one-element float32 tensor on `device`);
    scales on operands that are not fp8 are refused. Messages name the tensor."""
    a8, w8 = a_dtype in FP8_DTYPES, w_dtype in FP8_DTYPES
    for what, dt, is8, s, sname in ((a_what, a_dtype, a8, a_scale, "a_scale_inv"),
                                    (w_what, w_dtype, w8, w_scale, "w_scale_inv")):
        if not is8:
            if s is not None:
                raise TpflexInvalidError(f"{sname} is given but {what} has dtype {dt}; scales "
                                         f"apply to fp8 operands only", where)
            continue
        if s is None:
            raise TpflexInvalidError(f"{what} has dtype {dt} and needs its scale: pass {sname}= "
                                     f"(a one-element float32 tensor, TE's scale_inv)", where)
        need_tensor(where, sname, s)
        if s.dtype != torch.float32 or s.numel() != 1:
            raise TpflexInvalidError(f"{sname} (the scale of {what}) has dtype {s.dtype} and shape "
                                     f"{shape_str(s.shape)}, expected one float32 element", where)
        if s.device != device:
            raise TpflexInvalidError(f"{sname} (the scale of {what}) is on {s.device}, expected "
                                     f"{device}", where)
    if a8 != w8:
        raise TpflexInvalidError(f"{a_what if a8 else w_what} has dtype "
                                 f"{a_dtype if a8 else w_dtype} but {w_what if a8 else a_what} "
                                 f"has {w_dtype if a8 else a_dtype}: an fp8 GEMM takes two fp8 "
                                 f"operands (float8_e4m3fn or float8_e5m2)", where)
    if a8 and (a_dtype, w_dtype) not in FP8_PAIRS:
        raise TpflexUnsupportedError(f"{a_what} and {w_what} are both {a_dtype}: fp8 GEMMs take "
                                     f"e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3", where)


def check_bias(where: str, b: Optional[torch.Tensor], n: Any, out_dtype: torch.dtype,
               device: torch.device) -> None:
    if b is None:
        return
    need_tensor(where, "bias", b)
    if b.device != device:
        raise TpflexInvalidError(f"bias is on {b.device}, expected {device}", where)
    if b.dtype != out_dtype:
        raise TpflexInvalidError(f"bias has dtype {b.dtype}, expected {out_dtype} (the "
                                 f"output's dtype)", where)
    if b.dim() != 1 or b.shape[0] != n:
        raise TpflexShapeError(f"bias has shape {shape_str(b.shape)}, expected [{n}] (N, "
                               f"the output's columns)", where)
    if n > 1 and b.stride(0) != 1:
        raise TpflexShapeError(f"bias has stride {b.stride(0)}, expected 1 (contiguous)", where)


def beta_needs_out(where: str, beta: float, shape: Tuple[Any, Any]) -> TpflexInvalidError:
    return TpflexInvalidError(f"beta={beta} reads D before writing it: pass out= (a "
                              f"{shape_str(shape)} tensor)", where)


def plan_ag_gemm(where: str, device: torch.device, dtype: torch.dtype, T: Any, H: Any,
                 weight: Any, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 trans_w: bool, a_scale: Any = None, w_scale: Any = None) -> Tuple[Any, Any, Any]:
    """ag_gemm's checks against the active shape [T, H]: (N, ld of weight, ld of out or None)."""
    wr, wc = dims(where, "weight", weight)
    N = wc if trans_w else wr
    ld_w = check_mat(where, "weight (trans_w: [H, N])" if trans_w else "weight", weight,
                     (H, None) if trans_w else (None, H),
                     FP8_DTYPES if dtype in FP8_DTYPES else (dtype,), device)
    check_fp8(where, "the buffer", dtype, "weight", weight.dtype, a_scale, w_scale, device)
    ld_d = None if out is None else check_mat(where, "out", out, (T, N), out_dtypes(dtype),
                                              device)
    check_bias(where, bias, N, default_out_dtype(dtype) if out is None else out.dtype, device)
    return N, ld_w, ld_d


def plan_gemm_rs(where: str, device: torch.device, dtype: torch.dtype, T: Any, H: Any, P: int,
                 x: Any, weight: Any, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 trans_a: bool, trans_w: bool, a_scale: Any = None,
                 w_scale: Any = None) -> Tuple[Any, Any, Any, Any]:
    """gemm_rs's checks: (output rows T/P, ld of x, ld of weight, ld of out or None). x and
    weight may be fp8 on a bf16/fp16/fp32 communicator (its partials; SPEC §11)."""
    xr, xc = dims(where, "x", x)
    K = xr if trans_a else xc
    ops = (dtype,) + FP8_DTYPES
    ld_x = check_mat(where, "x (trans_a: [K, T])" if trans_a else "x", x,
                     (None, T) if trans_a else (T, None), ops, device)
    ld_w = check_mat(where, "weight (trans_w: [K, H])" if trans_w else "weight", weight,
                     (K, H) if trans_w else (H, K), ops, device)
    if x.dtype in FP8_DTYPES or weight.dtype in FP8_DTYPES or a_scale is not None or \
            w_scale is not None:
        check_fp8(where, "x", x.dtype, "weight", weight.dtype, a_scale, w_scale, device)
    elif x.dtype != weight.dtype:
        raise TpflexInvalidError(f"weight has dtype {weight.dtype}, expected {x.dtype} (x's)",
                                 where)
    rows = T // P
    ld_d = None if out is None else check_mat(where, "out", out, (rows, H), out_dtypes(dtype),
                                              device)
    check_bias(where, bias, H, dtype if out is None else out.dtype, device)
    return rows, ld_x, ld_w, ld_d


def plan_bulk(where: str, device: torch.device, a: Any, b: Any, out: Optional[torch.Tensor],
              bias: Optional[torch.Tensor], trans_a: bool, trans_w: bool, a_scale: Any = None,
              w_scale: Any = None) -> Tuple[Any, Any, Any, Any, Any]:
    """bulk_overlap's checks: (M, N, ld of a, ld of b, ld of out or None)."""
    ar, ac = dims(where, "a", a)
    M, K = (ac, ar) if trans_a else (ar, ac)
    ld_a = check_mat(where, "a (trans_a: [K, M])" if trans_a else "a", a, (None, None),
                     GEMM_DTYPES + FP8_DTYPES, device)
    br, bc = dims(where, "b", b)
    N = bc if trans_w else br
    f8 = a.dtype in FP8_DTYPES
    ld_b = check_mat(where, "b (trans_w: [K, N])" if trans_w else "b", b,
                     (K, None) if trans_w else (None, K), FP8_DTYPES if f8 else (a.dtype,), device)
    check_fp8(where, "a", a.dtype, "b", b.dtype, a_scale, w_scale, device)
    ld_d = None if out is None else check_mat(where, "out", out, (M, N), out_dtypes(a.dtype),
                                              device)
    check_bias(where, bias, N, default_out_dtype(a.dtype) if out is None else out.dtype, device)
    return M, N, ld_a, ld_b, ld_d
