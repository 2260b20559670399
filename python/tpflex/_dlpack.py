"""Zero-copy torch views of memory tpflex owns, through DLPack (the same code for host and device
memory).

A view made with an ``owner`` keeps that owner alive: the DLPack capsule's manager_ctx holds a
strong reference to it, and the deleter (called by torch when the last tensor sharing the
storage dies, on whatever thread) calls ``owner.release_view()`` and drops the reference. The
communicator's registration object is such an owner: while a view of it exists, the memory stays
registered (see _manager.py: the C destroy is deferred until the last view dies)."""
from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional

import torch

from ._args import U64_MAX, int_arg
from .errors import TpflexInvalidError

I64_MAX = (1 << 63) - 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLBlock(ctypes.Structure):
    """One malloc'd block: the managed tensor and its shape/strides."""
    _fields_ = [("m", DLManagedTensor), ("shape", ctypes.c_int64 * 2),
                ("strides", ctypes.c_int64 * 2)]


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]
_FREE: int = ctypes.cast(_libc.free, ctypes.c_void_p).value  # type: ignore[assignment]
_CAPSULE_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes = [ctypes.py_object]
_incref.restype = None
_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = [ctypes.c_void_p]
_decref.restype = None
# (kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12; bits), as torch's
# own to_dlpack writes them
DL_DTYPE = {torch.bfloat16: (4, 16), torch.float16: (2, 16), torch.float32: (2, 32),
            torch.float8_e4m3fn: (10, 8), torch.float8_e5m2: (12, 8)}
DL_CPU, DL_CUDA = 1, 2

_DELETER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _owned_deleter(p: int) -> None:
    """Runs when torch frees the storage: releases the owner's view, then its reference."""
    try:
        ctx = _DLBlock.from_address(p).m.manager_ctx
        if ctx:
            owner = ctypes.cast(ctx, ctypes.py_object).value
            try:
                owner.release_view()
            finally:
                _decref(ctx)
    except BaseException as e:  # never let an exception cross the C frame
        if not sys.is_finalizing():
            print(f"tpflex: releasing a view failed: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        _libc.free(p)


_OWNED_DELETER = _DELETER_FN(_owned_deleter)  # module-lifetime: torch may call it at any time
_OWNED_DELETER_PTR: int = ctypes.cast(_OWNED_DELETER, ctypes.c_void_p).value  # type: ignore


def dlpack_view(ptr: int, rows: int, cols: int, ld: int, dtype: torch.dtype,
                device: torch.device, owner: Optional[Any] = None) -> torch.Tensor:
    """A torch tensor [rows, cols] with strides (ld, 1) over memory at `ptr` (host memory for
    device 'cpu', device memory for 'cuda:N'); no copy. Without `owner` the memory is borrowed
    (the caller keeps it alive); with one, owner.retain_view() is called now and
    owner.release_view() when torch frees the tensor's storage, and the owner object is kept
    alive until then."""
    where = "dlpack_view"
    ptr = int_arg(where, "ptr", ptr, 0, U64_MAX)
    rows = int_arg(where, "rows", rows, 0, I64_MAX, ctype="int64_t")
    cols = int_arg(where, "cols", cols, 0, I64_MAX, ctype="int64_t")
    ld = int_arg(where, "ld", ld, cols, I64_MAX, ctype="int64_t")
    if dtype not in DL_DTYPE:
        raise TpflexInvalidError(f"dtype={dtype!r}: {', '.join(str(d) for d in DL_DTYPE)}", where)
    if not isinstance(device, torch.device) or device.type not in ("cpu", "cuda"):
        raise TpflexInvalidError(f"device={device!r} must be a torch.device of type cpu or cuda",
                                 where)
    if rows == 0:
        return torch.empty((0, cols), dtype=dtype, device=device)
    p = _libc.malloc(ctypes.sizeof(_DLBlock))
    if not p:
        raise MemoryError("tpflex: cannot allocate a DLPack header")
    b = _DLBlock.from_address(p)
    b.shape[0], b.shape[1] = rows, cols
    b.strides[0], b.strides[1] = ld, 1
    t = b.m.dl_tensor
    t.data = ptr
    if device.type == "cuda":
        t.device = DLDevice(DL_CUDA, device.index or 0)
    else:
        t.device = DLDevice(DL_CPU, 0)
    t.ndim = 2
    code, bits = DL_DTYPE[dtype]
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(p + _DLBlock.shape.offset, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(p + _DLBlock.strides.offset, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    if owner is None:
        b.m.manager_ctx = None
        b.m.deleter = _FREE  # libc free: torch releases it without calling back into Python
    else:
        owner.retain_view()
        _incref(owner)
        b.m.manager_ctx = id(owner)
        b.m.deleter = _OWNED_DELETER_PTR
    try:
        return torch.utils.dlpack.from_dlpack(_capsule_new(p, _CAPSULE_NAME, None))
    except BaseException:
        if owner is not None:
            _owned_deleter(p)
        else:
            _libc.free(p)
        raise
