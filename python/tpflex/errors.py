"""One exception class per tpf_status, all under TpflexError."""
from __future__ import annotations

from typing import Dict, Type


class TpflexError(RuntimeError):
    """A tpflex call failed. ``status`` is the tpf_status value, ``status_name`` its name
    ("TPF_ESHAPE"), ``detail`` the text of tpf_last_error() (or the Python-side check)."""

    status: int = -1
    status_name: str = "TPF_UNKNOWN"

    def __init__(self, detail: str = "", call: str = "") -> None:
        self.detail = detail
        self.call = call
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{self.status_name}: {detail}" if detail
                         else f"{where}{self.status_name}")


class TpflexInvalidError(TpflexError):
    status, status_name = 1, "TPF_EINVAL"


class TpflexShapeError(TpflexError):
    status, status_name = 2, "TPF_ESHAPE"


class TpflexCapacityError(TpflexError):
    status, status_name = 3, "TPF_ECAPACITY"


class TpflexDivisibleError(TpflexError):
    status, status_name = 4, "TPF_EDIVISIBLE"


class TpflexAlignError(TpflexError):
    status, status_name = 5, "TPF_EALIGN"


class TpflexUnsupportedError(TpflexError):
    status, status_name = 6, "TPF_EUNSUPPORTED"


class TpflexStateError(TpflexError):
    status, status_name = 7, "TPF_ESTATE"


class TpflexMismatchError(TpflexError):
    status, status_name = 8, "TPF_EMISMATCH"


class TpflexTimeoutError(TpflexError):
    status, status_name = 9, "TPF_ETIMEOUT"


class TpflexNoMemError(TpflexError):
    status, status_name = 10, "TPF_ENOMEM"


class TpflexOverflowError(TpflexError):
    status, status_name = 11, "TPF_EOVERFLOW"


class TpflexBackendError(TpflexError):
    status, status_name = 12, "TPF_EBACKEND"


class TpflexConfigWarning(UserWarning):
    """A configuration value tpflex accepts but does not act on (e.g. TE's ub_cfgs 'num_sm');
    the message names it."""


STATUS_CLASSES: Dict[int, Type[TpflexError]] = {
    c.status: c
    for c in (TpflexInvalidError, TpflexShapeError, TpflexCapacityError, TpflexDivisibleError,
              TpflexAlignError, TpflexUnsupportedError, TpflexStateError, TpflexMismatchError,
              TpflexTimeoutError, TpflexNoMemError, TpflexOverflowError, TpflexBackendError)
}


def error_for(status: int, detail: str, call: str = "") -> TpflexError:
    cls = STATUS_CLASSES.get(status)
    if cls is None:
        e = TpflexError(detail, call)
        e.status = status
        return e
    return cls(detail, call)
__all__ = [c.__name__ for c in STATUS_CLASSES.values()] + [
    "TpflexError", "TpflexConfigWarning", "error_for", "STATUS_CLASSES"]
