"""Per-operation keyword options -> tpf_op_options: the single mapping point.

    trans_w=True     the weight is stored [K, N] and used as is (dgrad: dY W)
    trans_a=True     gemm_rs x / bulk_overlap a stored [K, M] and used transposed (wgrad: dY^T X)
    alpha, beta      D = alpha op(a) op(w) + beta D (beta != 0 reads ``out``); accumulate=True
                     is beta=1 (TE's name)
    bias             1-D tensor of N elements, D's dtype, on the communicator's device
    gelu=True        D = gelu_tanh(...) after the bias
    num_splits       this operation's split count (alias ``splits``; 0/None = the communicator's)
    a_scale_inv      fp8 a (ag_gemm: the buffer; gemm_rs: x; bulk_overlap: a): a one-element
                     float32 tensor on the operands' device, TE's Float8Tensor scale_inv (SPEC §11)
    w_scale_inv      the same for an fp8 weight (bulk_overlap: b)
    stream           CUDA stream (torch.cuda.Stream or a cudaStream_t int); sim: must be None
"""
from __future__ import annotations

import ctypes
import math
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch

from ._checks import I32_MAX, bool_arg, int_arg
from ._lib import OpOptions
from .errors import TpflexInvalidError, TpflexUnsupportedError

OPTION_NAMES = ("trans_a", "trans_w", "alpha", "beta", "accumulate", "bias", "gelu", "num_splits",
                "splits", "stream", "a_scale_inv", "w_scale_inv")
_TRANS = ("tpflex names the transposes by operand: trans_a (gemm_rs x / bulk_overlap a stored "
          "[K, M]) and trans_w (the weight stored [K, N]); BLAS-style transa/transb would be "
          "ambiguous (the default already uses the weight transposed)")
RENAMED: Dict[str, str] = {
    "transa": _TRANS,
    "transb": _TRANS,
    "gelu_out": "the pre-activation output (TE's gelu_out) is not produced by the C library: run "
                "with gelu=False and apply torch.nn.functional.gelu(approximate='tanh') to keep it",
}
FLOAT_MAX = 3.4028234663852886e38  # the largest finite float (alpha and beta are C floats)


class Opts:
    """Parsed options of one call (plain attributes, cheap to build)."""
    __slots__ = ("trans_a", "trans_w", "alpha", "beta", "bias", "gelu", "num_splits", "stream",
                 "a_scale_inv", "w_scale_inv")

    def __init__(self) -> None:
        self.trans_a = False
        self.trans_w = False
        self.alpha = 1.0
        self.beta = 0.0
        self.bias: Optional[torch.Tensor] = None
        self.gelu = False
        self.num_splits = 0
        self.stream: Any = None
        self.a_scale_inv: Optional[torch.Tensor] = None
        self.w_scale_inv: Optional[torch.Tensor] = None

    def struct(self, bias_ptr: Optional[int]) -> OpOptions:
        sa, sw = self.a_scale_inv, self.w_scale_inv
        return OpOptions(size=ctypes.sizeof(OpOptions), trans_a=self.trans_a,
                         trans_w=self.trans_w, alpha=self.alpha, beta=self.beta, bias=bias_ptr,
                         gelu=self.gelu, num_splits=self.num_splits,
                         a_scale_inv=None if sa is None else sa.data_ptr(),
                         w_scale_inv=None if sw is None else sw.data_ptr())

    @property
    def is_default(self) -> bool:
        return (not self.trans_a and not self.trans_w and self.alpha == 1.0 and self.beta == 0.0
                and self.bias is None and not self.gelu and self.num_splits == 0
                and self.a_scale_inv is None and self.w_scale_inv is None)


DEFAULT_OPTS = Opts()


def _number(where: str, k: str, v: Any) -> float:
    if isinstance(v, bool):
        raise TpflexInvalidError(f"option {k}={v!r} must be a number, not a bool", where)
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        raise TpflexInvalidError(f"option {k}={v!r} must be a number", where) from None
    if not math.isfinite(f) or abs(f) > FLOAT_MAX:
        raise TpflexInvalidError(f"option {k}={v!r} must be a finite float32 value "
                                 f"(|{k}| <= {FLOAT_MAX:.6g})", where)
    return f


def _splits(where: str, k: str, v: Any) -> int:
    if v is None:
        return 0
    return int_arg(where, f"option {k}", v, 0, I32_MAX, ctype="int")


def make_opts(trans_a: bool, trans_w: bool, alpha: float, beta: float,
              bias: Optional[torch.Tensor], gelu: bool, num_splits: int,
              a_scale_inv: Optional[torch.Tensor] = None,
              w_scale_inv: Optional[torch.Tensor] = None) -> Opts:
    """Opts from the custom ops' arguments (already typed by their schema)."""
    o = Opts()
    o.trans_a, o.trans_w, o.alpha, o.beta = bool(trans_a), bool(trans_w), float(alpha), float(beta)
    o.bias, o.gelu, o.num_splits = bias, bool(gelu), int(num_splits)
    o.a_scale_inv, o.w_scale_inv = a_scale_inv, w_scale_inv
    return o


# ---- the eager fast path (tpflex._comm): the same values, found with fewer steps -----------------

class FastOpts(NamedTuple):
    """The options of a plain eager call, as fast_options found them."""
    trans_a: bool
    trans_w: bool
    alpha: float
    beta: float
    bias: Optional[torch.Tensor]
    gelu: bool
    num_splits: int
    a_scale_inv: Optional[torch.Tensor]
    w_scale_inv: Optional[torch.Tensor]


DEFAULT_FAST = FastOpts(False, False, 1.0, 0.0, None, False, 0, None, None)
# FastOpts(...) through tuple.__new__: the NamedTuple's own __new__ costs about 0.4 us a call
# on this path (measured with timeit), the fields are the same.
_new_fast = tuple.__new__
_Tensor = torch.Tensor


def fast_options(options: Dict[str, Any]) -> Optional[FastOpts]:
    """The options as a FastOpts when parse_options would accept them and give exactly
    these values with nothing to convert (bools that are bools, finite floats or ints within
    float32's range, split counts that are ints in range, plain tensors or None, stream None);
    otherwise None, and the caller takes parse_options (its checks and messages). Conservative
    by design: anything unusual goes the long way. tests/python/test_direct.py compares the two
    over every option and kind of value."""
    ta = tw = gelu = False
    alpha, beta, ns = 1.0, 0.0, 0
    bias = sa = sw = None
    acc = None
    for k, v in options.items():
        t = type(v)
        if t is bool:
            if k == "trans_w":
                tw = v
            elif k == "trans_a":
                ta = v
            elif k == "gelu":
                gelu = v
            elif k == "accumulate":
                acc = v
            else:
                return None
        elif t is float or t is int:
            if k == "alpha" or k == "beta":
                if not -FLOAT_MAX <= v <= FLOAT_MAX:  # also NaN
                    return None
                if k == "alpha":
                    alpha = float(v)
                else:
                    beta = float(v)
            elif (k == "num_splits" or k == "splits") and t is int and 0 <= v <= I32_MAX:
                if "num_splits" in options and "splits" in options:
                    return None
                ns = v
            else:
                return None
        elif t is _Tensor:
            if k == "bias":
                bias = v
            elif k == "a_scale_inv":
                sa = v
            elif k == "w_scale_inv":
                sw = v
            else:
                return None
        elif v is None:
            if k == "num_splits" or k == "splits":
                if "num_splits" in options and "splits" in options:
                    return None
                ns = 0
            elif k not in ("bias", "a_scale_inv", "w_scale_inv", "stream", "gelu_out"):
                return None
        else:
            return None
    if acc is not None:
        if "beta" in options:
            return None
        if acc:
            beta = 1.0
    return _new_fast(FastOpts, (ta, tw, alpha, beta, bias, gelu, ns, sa, sw))


_STRUCTS: Dict[Tuple[Any, ...], OpOptions] = {}
_STRUCTS_MAX = 256


def opts_struct(f: FastOpts) -> Optional[OpOptions]:
    """The tpf_op_options of `f`, or None when every field is the default (the plain C call).
    Structs are kept per value (pointers as ints, no tensor held), at most _STRUCTS_MAX; the C
    library only reads them."""
    ta, tw, alpha, beta, bias, gelu, ns, sa, sw = f
    key = (ta, tw, alpha if alpha else repr(alpha), beta, None if bias is None else bias.data_ptr(),
           gelu, ns, None if sa is None else sa.data_ptr(), None if sw is None else sw.data_ptr())
    s = _STRUCTS.get(key)
    if s is None:
        if key == _DEFAULT_KEY:
            return None
        s = OpOptions(size=ctypes.sizeof(OpOptions), trans_a=ta, trans_w=tw, alpha=alpha,
                      beta=beta, bias=key[4], gelu=gelu, num_splits=ns, a_scale_inv=key[7],
                      w_scale_inv=key[8])
        if len(_STRUCTS) >= _STRUCTS_MAX:
            _STRUCTS.clear()
        _STRUCTS[key] = s
    return s


_DEFAULT_KEY = (False, False, 1.0, 0.0, None, False, 0, None, None)


def parse_options(where: str, options: Dict[str, Any]) -> Opts:
    """The single mapping point from keyword options to tpf_op_options fields."""
    o = Opts()
    accumulate = None
    splits = None
    for k, v in options.items():
        if k in RENAMED:
            if k == "gelu_out" and v is None:
                continue
            raise (TpflexUnsupportedError if k == "gelu_out" else TpflexInvalidError)(
                f"option '{k}': {RENAMED[k]}", where)
        if k == "trans_a":
            o.trans_a = bool_arg(where, f"option {k}", v)
        elif k == "trans_w":
            o.trans_w = bool_arg(where, f"option {k}", v)
        elif k == "alpha":
            o.alpha = _number(where, k, v)
        elif k == "beta":
            o.beta = _number(where, k, v)
        elif k == "accumulate":
            accumulate = bool_arg(where, f"option {k}", v)
        elif k == "bias":
            if v is not None and not isinstance(v, torch.Tensor):
                raise TpflexInvalidError(f"bias must be a torch.Tensor or None, got "
                                         f"{type(v).__name__}", where)
            o.bias = v
        elif k == "gelu":
            o.gelu = bool_arg(where, f"option {k}", v)
        elif k in ("num_splits", "splits"):
            n = _splits(where, k, v)
            if splits is not None and n != splits:
                raise TpflexInvalidError(f"num_splits and splits disagree ({splits} and {n})",
                                         where)
            splits = n
        elif k == "stream":
            o.stream = v
        elif k in ("a_scale_inv", "w_scale_inv"):
            if v is not None and not isinstance(v, torch.Tensor):
                raise TpflexInvalidError(f"{k} must be a one-element float32 torch.Tensor or "
                                         f"None, got {type(v).__name__}", where)
            setattr(o, k, v)
        else:
            raise TpflexInvalidError(f"unknown option '{k}' (known: {', '.join(OPTION_NAMES)})",
                                     where)
    if accumulate is not None:
        if "beta" in options and (o.beta != 0.0) != accumulate:
            raise TpflexInvalidError(f"accumulate={accumulate} and beta={o.beta} disagree", where)
        if accumulate and "beta" not in options:
            o.beta = 1.0
    if splits is not None:
        o.num_splits = splits
    return o
