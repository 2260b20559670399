"""Python arguments -> C values, with no silent wrap or truncation: a float, a bool or a value
outside the C type's range is a TpflexError subclass naming the argument and its value. No torch
here (tpflex.sim uses it)."""
from __future__ import annotations

import operator
from typing import Any, Sequence, Type

from .errors import TpflexError, TpflexInvalidError, TpflexOverflowError

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
I32_MAX = (1 << 31) - 1


def shape_str(s: Sequence[Any]) -> str:
    return "[" + ", ".join(x if isinstance(x, str) else _num_str(x) for x in s) + "]"


def _num_str(x: Any) -> str:
    try:
        return str(operator.index(x))
    except TypeError:
        return repr(x)


def int_arg(where: str, name: str, v: Any, lo: int = 0, hi: int = U64_MAX,
            low_cls: Type[TpflexError] = TpflexInvalidError, ctype: str = "uint64_t") -> int:
    """`v` as a Python int in [lo, hi] (hi: the C type's largest value). A bool, a float (even
    48.0) or any non-integral value is TpflexInvalidError; below lo is `low_cls`; above hi is
    TpflexOverflowError (it does not fit `ctype`). Integral objects (numpy, 0-d integer tensors)
    are accepted through operator.index."""
    if isinstance(v, bool):
        raise TpflexInvalidError(f"{name}={v!r} must be an int, not a bool", where)
    try:
        i = operator.index(v)
    except TypeError:
        raise TpflexInvalidError(f"{name}={v!r} must be an int, got {type(v).__name__}",
                                 where) from None
    if i < lo:
        raise low_cls(f"{name}={i} is below {lo}", where)
    if i > hi:
        raise TpflexOverflowError(f"{name}={i} does not fit {ctype} (at most {hi})", where)
    return i


def bool_arg(where: str, name: str, v: Any) -> bool:
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise TpflexInvalidError(f"{name}={v!r} must be a bool", where)
