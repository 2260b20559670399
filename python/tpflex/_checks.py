"""Checks shared by the methods, the custom ops and their fake implementations.

Arguments: every value that reaches a C integer goes through _args.int_arg (no silent wrap or
truncation); shapes through as_shape. Operands: the rules on their shapes and dtypes are the C
library's (tpf_check_operands, core/operands.c: the rulebook the operations themselves run);
this module checks only what C cannot see of a torch tensor (its type, device, rank, strides, a
dtype tpflex carries, the fp8 scale tensors, the bias), turns each operand into the C descriptor
(a Matrix with no pointer) and asks the rulebook, so the eager path, the custom ops and their
fake implementations raise the same status and message. Verdicts are kept per descriptor (one C
call per new signature). Under torch.compile a dimension may be symbolic: it is never int()-ed
(that would specialise it); the rulebook sees its hint, and output shapes stay symbolic."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch

from ._lib import Matrix, Operands, Shape, last_error, lib
from ._types import FP8_DTYPES, TORCH_TO_TPF
from ._args import (I32_MAX, U32_MAX, U64_MAX, bool_arg, int_arg,  # noqa: F401 (re-exported)
                    shape_str)
from .errors import TpflexInvalidError, TpflexShapeError, error_for


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


def check_mat(where: str, what: str, t: Any, device: torch.device) -> Any:
    """What C cannot see of a matrix operand: a 2-D torch.Tensor on `device`, of a dtype tpflex
    carries, with contiguous rows; returns its leading dimension. Its shape and dtype against the
    operation are the rulebook's (rules())."""
    need_tensor(where, what, t)
    if t.device != device:
        raise TpflexInvalidError(f"{what} is on {t.device}, expected {device}", where)
    dt = t.dtype
    if dt not in TORCH_TO_TPF:
        raise TpflexInvalidError(
            f"{what} has dtype {dt}, expected one of "
            f"{', '.join(str(d) for d in TORCH_TO_TPF)}", where)
    ts = t.shape
    if len(ts) != 2:
        raise TpflexShapeError(f"{what} has shape {shape_str(ts)}, expected 2-D", where)
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


def default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of an output allocated for the caller: the operands', bf16 for fp8 ones."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype


# ---- the rulebook (C) ---------------------------------------------------------------------------

OP_AG_GEMM, OP_GEMM_RS, OP_BULK = 1, 2, 3  # tpf_op_kind
_VERDICTS: Dict[Tuple[Any, ...], bool] = {}  # descriptors the rulebook passed
_VERDICTS_MAX = 4096


def _hint(v: Any) -> Optional[int]:
    """A dimension as a C integer without specialising it: a plain int, or a symbolic one's hint
    (None when it has none: the check is left to the operation)."""
    if isinstance(v, int):
        return v
    node = getattr(v, "node", None)
    h = getattr(node, "hint", None) if node is not None else None
    return int(h) if isinstance(h, int) else None


def _desc(t: Optional[torch.Tensor], ld: Any) -> Optional[Tuple[int, int, int, int]]:
    if t is None:
        return None
    r, c, l = _hint(t.shape[0]), _hint(t.shape[1]), _hint(ld)
    if r is None or c is None or l is None:
        raise LookupError  # unbacked symbolic size
    return (r, c, l, TORCH_TO_TPF[t.dtype])


def rules(where: str, op: int, buffer_dtype: Optional[torch.dtype], T: Any, H: Any, P: int,
          trans_a: bool, trans_w: bool, a_scale: Any, w_scale: Any,
          a: Optional[Tuple[str, torch.Tensor, Any]], w: Tuple[str, torch.Tensor, Any],
          d: Optional[Tuple[str, torch.Tensor, Any]]) -> None:
    """Asks the C rulebook (tpf_check_operands) about an operation's operands, given as
    (name, tensor, ld) after check_mat; raises its status and detail as the TpflexError of
    `where`. One C call per new descriptor; a passed one is remembered."""
    try:
        t, h = _hint(T), _hint(H)
        if t is None or h is None:
            raise LookupError
        key = (op, -1 if buffer_dtype is None else TORCH_TO_TPF[buffer_dtype], t,
               h, P, bool(trans_a), bool(trans_w), a_scale is not None,
               w_scale is not None, None if a is None else (a[0],) + _desc(a[1], a[2]),
               (w[0],) + _desc(w[1], w[2]),  # type: ignore[operator]
               None if d is None else (d[0],) + _desc(d[1], d[2]))  # type: ignore[operator]
    except LookupError:
        return
    if key in _VERDICTS:
        return
    mats = [None if x is None else Matrix(None, *x[1:]) for x in key[9:12]]
    refs = [None if m is None else ctypes.pointer(m) for m in mats]
    names = [None if x is None else x[0].encode() for x in key[9:12]]
    desc = Operands(ctypes.sizeof(Operands), op, max(key[1], 0), Shape(t, h),
                    P, key[5], key[6], key[7], key[8], refs[0], refs[1], refs[2], *names)
    rc = lib.tpf_check_operands(ctypes.byref(desc), None)
    if rc:
        raise error_for(rc, last_error(), where)
    if len(_VERDICTS) >= _VERDICTS_MAX:
        _VERDICTS.clear()
    _VERDICTS[key] = True


def check_scales(where: str, a_what: str, a_dtype: torch.dtype, w_what: str,
                 w_dtype: torch.dtype, a_scale: Any, w_scale: Any, device: torch.device) -> None:
    """The scale tensors (SPEC §11), what C cannot see of them: an fp8 operand has its scale_inv
    (TE's contract; C would take NULL as 1), a one-element float32 tensor on `device`. A scale on
    an operand that is not fp8 is the rulebook's."""
    for what, dt, s, sname in ((a_what, a_dtype, a_scale, "a_scale_inv"),
                               (w_what, w_dtype, w_scale, "w_scale_inv")):
        if dt not in FP8_DTYPES:
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


def check_bias(where: str, b: Optional[torch.Tensor], n: Any, out_dtype: torch.dtype,
               device: torch.device) -> None:
    """The bias tensor (C sees only its address): N elements of the output's dtype on
    `device`, contiguous."""
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


# ---- the three operations: tensor facts, the rulebook, scales, bias -----------------------------

class AgPlan(NamedTuple):
    n: Any                # N: the output's columns
    ld_w: Any
    ld_d: Optional[Any]   # None: no out given


class RsPlan(NamedTuple):
    rows: Any             # T/P: the output's rows
    ld_x: Any
    ld_w: Any
    ld_d: Optional[Any]


class BulkPlan(NamedTuple):
    m: Any
    n: Any
    ld_a: Any
    ld_b: Any
    ld_d: Optional[Any]


def plan_ag_gemm(where: str, device: torch.device, dtype: torch.dtype, T: Any, H: Any,
                 weight: Any, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 trans_w: bool, a_scale: Any = None, w_scale: Any = None,
                 trans_a: bool = False) -> AgPlan:
    """ag_gemm's checks against the active shape [T, H] (trans_a: refused by the rulebook, as
    the C operation does)."""
    wn = "weight (trans_w: [H, N])" if trans_w else "weight"
    ld_w = check_mat(where, wn, weight, device)
    ld_d = None if out is None else check_mat(where, "out", out, device)
    rules(where, OP_AG_GEMM, dtype, T, H, 1, trans_a, trans_w, a_scale, w_scale, None,
          (wn, weight, ld_w), None if out is None else ("out", out, ld_d))
    check_scales(where, "the buffer", dtype, "weight", weight.dtype, a_scale, w_scale, device)
    N = weight.shape[1] if trans_w else weight.shape[0]
    check_bias(where, bias, N, default_out_dtype(dtype) if out is None else out.dtype, device)
    return AgPlan(N, ld_w, ld_d)


def plan_gemm_rs(where: str, device: torch.device, dtype: torch.dtype, T: Any, H: Any, P: int,
                 x: Any, weight: Any, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 trans_a: bool, trans_w: bool, a_scale: Any = None,
                 w_scale: Any = None) -> RsPlan:
    """gemm_rs's checks. x and weight may be fp8 on a bf16/fp16/fp32 communicator (its partials;
    SPEC §11)."""
    xn = "x (trans_a: [K, T])" if trans_a else "x"
    wn = "weight (trans_w: [K, H])" if trans_w else "weight"
    ld_x = check_mat(where, xn, x, device)
    ld_w = check_mat(where, wn, weight, device)
    ld_d = None if out is None else check_mat(where, "out", out, device)
    rules(where, OP_GEMM_RS, dtype, T, H, P, trans_a, trans_w, a_scale, w_scale, (xn, x, ld_x),
          (wn, weight, ld_w), None if out is None else ("out", out, ld_d))
    check_scales(where, "x", x.dtype, "weight", weight.dtype, a_scale, w_scale, device)
    check_bias(where, bias, H, dtype if out is None else out.dtype, device)
    return RsPlan(T // P, ld_x, ld_w, ld_d)


def plan_bulk(where: str, device: torch.device, a: Any, b: Any, out: Optional[torch.Tensor],
              bias: Optional[torch.Tensor], trans_a: bool, trans_w: bool, a_scale: Any = None,
              w_scale: Any = None) -> BulkPlan:
    """bulk_overlap's checks."""
    an = "a (trans_a: [K, M])" if trans_a else "a"
    bn = "b (trans_w: [K, N])" if trans_w else "b"
    ld_a = check_mat(where, an, a, device)
    ld_b = check_mat(where, bn, b, device)
    ld_d = None if out is None else check_mat(where, "out", out, device)
    rules(where, OP_BULK, None, 0, 0, 1, trans_a, trans_w, a_scale, w_scale, (an, a, ld_a),
          (bn, b, ld_b), None if out is None else ("out", out, ld_d))
    check_scales(where, "a", a.dtype, "b", b.dtype, a_scale, w_scale, device)
    M = a.shape[1] if trans_a else a.shape[0]
    N = b.shape[1] if trans_w else b.shape[0]
    check_bias(where, bias, N, default_out_dtype(a.dtype) if out is None else out.dtype, device)
    return BulkPlan(M, N, ld_a, ld_b, ld_d)
