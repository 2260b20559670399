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
    """TPF_EINVAL: invalid argument: a NULL or destroyed handle, a bad enum value,
    overlapping operands."""

    status, status_name = 1, "TPF_EINVAL"


class TpflexShapeError(TpflexError):
    """TPF_ESHAPE: a shape is empty, its columns differ from the capacity's, or an operand
    has the wrong shape."""

    status, status_name = 2, "TPF_ESHAPE"


class TpflexCapacityError(TpflexError):
    """TPF_ECAPACITY: the active rows exceed the registered capacity."""

    status, status_name = 3, "TPF_ECAPACITY"


class TpflexDivisibleError(TpflexError):
    """TPF_EDIVISIBLE: rows not divisible by P (PIPELINE: columns by the split count)."""

    status, status_name = 4, "TPF_EDIVISIBLE"


class TpflexAlignError(TpflexError):
    """TPF_EALIGN: a chunk's size or offset misses the backend's 16-byte alignment."""

    status, status_name = 5, "TPF_EALIGN"


class TpflexUnsupportedError(TpflexError):
    """TPF_EUNSUPPORTED: not supported here; the detail names what and the alternative."""

    status, status_name = 6, "TPF_EUNSUPPORTED"


class TpflexStateError(TpflexError):
    """TPF_ESTATE: wrong state: a failed communicator, a second thread on one rank, a stale view."""

    status, status_name = 7, "TPF_ESTATE"


class TpflexMismatchError(TpflexError):
    """TPF_EMISMATCH: ranks disagree on the configuration, the active shape, the operation or
    its split count."""

    status, status_name = 8, "TPF_EMISMATCH"


class TpflexTimeoutError(TpflexError):
    """TPF_ETIMEOUT: a wait for a peer exceeded the timeout."""

    status, status_name = 9, "TPF_ETIMEOUT"


class TpflexNoMemError(TpflexError):
    """TPF_ENOMEM: out of memory."""

    status, status_name = 10, "TPF_ENOMEM"


class TpflexOverflowError(TpflexError):
    """TPF_EOVERFLOW: a size or offset (or a Python integer for a C one) does not fit."""

    status, status_name = 11, "TPF_EOVERFLOW"


class TpflexBackendError(TpflexError):
    """TPF_EBACKEND: CUDA, NCCL, cuBLASLt or pthreads failed; the detail has the native text."""

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
    """The exception for a tpf_status: its class from STATUS_CLASSES (a TpflexError carrying the
    number for a status this package does not know), with ``detail`` and the ``call`` that
    failed."""
    cls = STATUS_CLASSES.get(status)
    if cls is None:
        e = TpflexError(detail, call)
        e.status = status
        return e
    return cls(detail, call)
__all__ = [c.__name__ for c in STATUS_CLASSES.values()] + [
    "TpflexError", "TpflexConfigWarning", "error_for", "STATUS_CLASSES"]


from . import _help  # noqa: E402 (help() shows the annotations, not their source text)
_help.evaluate([TpflexError, error_for])
