"""TransformerEngine-style API over tpflex, on torch tensors.

    initialize_ub([max_tokens, hidden], tp_size, dtype=torch.bfloat16)   # once, at capacity
    set_ub_active_shape([T, hidden])          # per microbatch, all-or-nothing, no allocation
    ub = get_ub("fc1_fprop"); ub.local_chunk().copy_(x_local); y = ub.ag_gemm(w1, bias=b1)
    destroy_ub()

Backends. ``backend="sim"``: the calling thread must be a simulator rank (inside
tpflex.sim.run); module state is then per rank and tensors are CPU tensors. ``backend="cuda"``:
one process per rank (torchrun), bootstrapped over a gloo process group of torch.distributed,
so several processes may share one GPU; operations are enqueued on
torch.cuda.current_stream() (or ``stream=``). The default (None) picks "sim" inside
tpflex.sim.run and "cuda" otherwise.

Every operation checks device, dtype, shape and strides of its tensors before anything is
enqueued (TpflexInvalidError / TpflexShapeError naming the tensor and both shapes); every
tpf_status of the C library is raised as its exception class with tpf_last_error()'s text.
buffer() and local_chunk() are zero-copy views of the registration (DLPack), valid until the
next set_ub_active_shape.

torch.compile: the operations are torch.library custom ops, torch.ops.tpflex.ag_gemm /
gemm_rs / bulk_overlap (out=None: they return the output) and *_out (they write `out`), with
fake implementations; the methods call them. The communicator is passed as (name, key), the
active buffer as the mutated `buffer` argument. set_ub_active_shape and the other calls into C
stay outside the compiled region. python/README.md ("torch.compile") has the details and the
limits (no autograd formula: wrap the methods in a torch.autograd.Function).

Operation options (tpf_op_options; the same on every rank of a collective call):
    trans_w=True     the weight is stored [K, N] and used as is (dgrad: dY W)
    trans_a=True     gemm_rs x / bulk_overlap a stored [K, M] and used transposed (wgrad: dY^T X)
    alpha, beta      D = alpha op(a) op(w) + beta D (beta != 0 reads ``out``); accumulate=True
                     is beta=1 (TE's name)
    bias             1-D tensor of N elements, D's dtype, on the communicator's device
    gelu=True        D = gelu_tanh(...) after the bias
    num_splits       this operation's split count (alias ``splits``; 0/None = the communicator's)
    stream           CUDA stream (torch.cuda.Stream or a cudaStream_t int); sim: must be None
"""
from __future__ import annotations

import ctypes
import itertools
import math
import os
import pickle
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _lib, sim
from ._lib import (Bootstrap, BOOT_ALLGATHER_FN, BOOT_BARRIER_FN, CommConfig, Matrix, OpOptions,
                   Shape, check, lib)
from .errors import (TpflexError, TpflexInvalidError, TpflexMismatchError, TpflexShapeError,
                     TpflexStateError, TpflexTimeoutError, TpflexUnsupportedError, error_for)

_TORCH_TO_TPF = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
_TPF_TO_TORCH = {v: k for k, v in _TORCH_TO_TPF.items()}
_GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ALGO = {"bulk": 0, "pipeline": 1, "ring": 2}
_COLL = {"ag": 0, "rs": 1}
TPF_EBACKEND, TPF_ETIMEOUT = 12, 9

# TE's default configuration: the same table as `tpflex demo` (tools/cmd_demo.c kSites), in
# registration order: name -> (algo, coll, external).
DEFAULT_UB_CFGS: Dict[str, Dict[str, Any]] = {
    "qkv_fprop": {"method": "ring", "coll": "ag"},
    "proj_fprop": {"method": "pipeline", "coll": "rs"},
    "fc1_fprop": {"method": "ring", "coll": "ag"},
    "fc2_fprop": {"method": "pipeline", "coll": "rs"},
    "qkv_dgrad": {"method": "bulk", "coll": "ag"},
    "qkv_wgrad": {"method": "bulk", "coll": "rs"},
    "fc1_dgrad": {"method": "bulk", "coll": "ag"},
    "fc1_wgrad": {"method": "bulk", "coll": "rs"},
    "proj_dgrad": {"method": "ring", "coll": "ag"},
    "fc2_dgrad": {"method": "ring", "coll": "ag"},
    "proj_wgrad": {"method": "bulk", "coll": "ag", "external": True},
    "fc2_wgrad": {"method": "bulk", "coll": "ag", "external": True},
}
_CFG_KEYS = ("method", "coll", "external", "num_splits", "aggregate")

# ---- per-operation options -> tpf_op_options ---------------------------------------------------

OPTION_NAMES = ("trans_a", "trans_w", "alpha", "beta", "accumulate", "bias", "gelu", "num_splits",
                "splits", "stream")
_RENAMED = {
    "transa": "tpflex names the transposes by operand: trans_a (gemm_rs x / bulk_overlap a stored "
              "[K, M]) and trans_w (the weight stored [K, N]); BLAS-style transa/transb would be "
              "ambiguous (the default already uses the weight transposed)",
    "transb": None,
    "gelu_out": "the pre-activation output (TE's gelu_out) is not produced by the C library: run "
                "with gelu=False and apply torch.nn.functional.gelu(approximate='tanh') to keep it",
}
_RENAMED["transb"] = _RENAMED["transa"]


class _Opts:
    """Parsed options of one call (plain attributes, cheap to build)."""
    __slots__ = ("trans_a", "trans_w", "alpha", "beta", "bias", "gelu", "num_splits", "stream")

    def __init__(self) -> None:
        self.trans_a = False
        self.trans_w = False
        self.alpha = 1.0
        self.beta = 0.0
        self.bias: Optional[torch.Tensor] = None
        self.gelu = False
        self.num_splits = 0
        self.stream: Any = None

    def struct(self, bias_ptr: Optional[int]) -> OpOptions:
        return OpOptions(size=ctypes.sizeof(OpOptions), trans_a=self.trans_a,
                         trans_w=self.trans_w, alpha=self.alpha, beta=self.beta, bias=bias_ptr,
                         gelu=self.gelu, num_splits=self.num_splits)

    @property
    def is_default(self) -> bool:
        return (not self.trans_a and not self.trans_w and self.alpha == 1.0 and self.beta == 0.0
                and self.bias is None and not self.gelu and self.num_splits == 0)


_DEFAULT_OPTS = _Opts()


def _flag(where: str, k: str, v: Any) -> bool:
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise TpflexInvalidError(f"option {k}={v!r} must be a bool", where)


def _number(where: str, k: str, v: Any) -> float:
    if isinstance(v, bool):
        raise TpflexInvalidError(f"option {k}={v!r} must be a number, not a bool", where)
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TpflexInvalidError(f"option {k}={v!r} must be a number", where) from None
    if not math.isfinite(f):
        raise TpflexInvalidError(f"option {k}={v!r} must be finite", where)
    return f


def _splits(where: str, k: str, v: Any) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TpflexInvalidError(f"option {k}={v!r} must be a non-negative int or None", where)
    return v


def _parse_options(where: str, options: Dict[str, Any]) -> _Opts:
    """The single mapping point from keyword options to tpf_op_options fields."""
    o = _Opts()
    accumulate = None
    splits = None
    for k, v in options.items():
        if k in _RENAMED:
            if k == "gelu_out" and v is None:
                continue
            raise (TpflexUnsupportedError if k == "gelu_out" else TpflexInvalidError)(
                f"option '{k}': {_RENAMED[k]}", where)
        if k == "trans_a":
            o.trans_a = _flag(where, k, v)
        elif k == "trans_w":
            o.trans_w = _flag(where, k, v)
        elif k == "alpha":
            o.alpha = _number(where, k, v)
        elif k == "beta":
            o.beta = _number(where, k, v)
        elif k == "accumulate":
            accumulate = _flag(where, k, v)
        elif k == "bias":
            if v is not None and not isinstance(v, torch.Tensor):
                raise TpflexInvalidError(f"bias must be a torch.Tensor or None, got "
                                         f"{type(v).__name__}", where)
            o.bias = v
        elif k == "gelu":
            o.gelu = _flag(where, k, v)
        elif k in ("num_splits", "splits"):
            n = _splits(where, k, v)
            if splits is not None and n != splits:
                raise TpflexInvalidError(f"num_splits and splits disagree ({splits} and {n})",
                                         where)
            splits = n
        elif k == "stream":
            o.stream = v
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


# ---- module state ------------------------------------------------------------------------------

# Outside the simulator the state is the process's (TE's get_ub is module-global, and autograd
# runs CUDA backward on a thread of its own); inside tpflex.sim.run it is the rank's.
_process_state: Dict[str, Any] = {}


def _state() -> Dict[str, Any]:
    ctx = sim.current()
    if ctx is not None:
        return ctx.state
    return _process_state


def _shape_str(s: Sequence[Any]) -> str:
    return "[" + ", ".join(str(x) if isinstance(x, str) else str(int(x)) for x in s) + "]"


def _as_shape(shape: Sequence[int], what: str) -> Shape:
    if len(shape) != 2:
        raise TpflexShapeError(f"{what} must be 2-D [tokens, hidden], got {_shape_str(shape)}",
                               what)
    return Shape(int(shape[0]), int(shape[1]))


# ---- zero-copy views (DLPack: the same code for host and device memory) -------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLBlock(ctypes.Structure):
    """One malloc'd block: the managed tensor and its shape/strides. Its deleter is libc free,
    so torch releases it without calling back into Python."""
    _fields_ = [("m", _DLManagedTensor), ("shape", ctypes.c_int64 * 2),
                ("strides", ctypes.c_int64 * 2)]


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value
_CAPSULE_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# (kDLFloat = 2, kDLBfloat = 4; bits)
_DL_DTYPE = {torch.bfloat16: (4, 16), torch.float16: (2, 16), torch.float32: (2, 32)}
_DL_CPU, _DL_CUDA = 1, 2


def dlpack_view(ptr: int, rows: int, cols: int, ld: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """A torch tensor [rows, cols] with strides (ld, 1) over memory tpflex owns at `ptr` (host
    memory for device 'cpu', device memory for 'cuda:N'); no copy, no ownership."""
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
        t.device = _DLDevice(_DL_CUDA, device.index or 0)
    else:
        t.device = _DLDevice(_DL_CPU, 0)
    t.ndim = 2
    code, bits = _DL_DTYPE[dtype]
    t.dtype = _DLDataType(code, bits, 1)
    t.shape = ctypes.cast(p + _DLBlock.shape.offset, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(p + _DLBlock.strides.offset, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    b.m.manager_ctx = None
    b.m.deleter = _FREE
    return torch.utils.dlpack.from_dlpack(_capsule_new(p, _CAPSULE_NAME, None))


# ---- validation: shared by the methods, the custom ops and their fake implementations ----------
# Pure functions of tensor metadata (no data_ptr, no C call), so the fake implementations run the
# same checks with the same messages; shapes are compared, never int()-ed (under torch.compile a
# dimension may be symbolic, and int() would specialise it).

def _need_tensor(where: str, what: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(t).__name__}", where)


def _dims(where: str, what: str, t: Any) -> Tuple[Any, Any]:
    _need_tensor(where, what, t)
    if t.dim() != 2:
        raise TpflexShapeError(f"{what} has shape {_shape_str(t.shape)}, expected 2-D", where)
    return t.shape[0], t.shape[1]


def _check_mat(where: str, what: str, t: Any, shape: Tuple[Any, Any],
               dtypes: Tuple[torch.dtype, ...], device: torch.device) -> Any:
    """Device, dtype, shape ([rows, cols], None = any) and strides of a matrix operand; returns
    its leading dimension."""
    _need_tensor(where, what, t)
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
        want = _shape_str([s if s is not None else "*" for s in shape])
        raise TpflexShapeError(f"{what} has shape {_shape_str(ts)}, expected {want}", where)
    rows, cols = ts
    s0, s1 = t.stride()
    if cols > 1 and s1 != 1 or rows > 1 and s0 < cols:
        hint = (" (a transposed view: pass the stored tensor and set trans_w/trans_a)"
                if s0 == 1 and rows > 1 else "")
        raise TpflexShapeError(
            f"{what} has strides {tuple(t.stride())} for shape {_shape_str(ts)}, expected "
            f"contiguous rows (stride 1) and a leading dimension >= {cols}{hint}", where)
    return s0 if rows > 1 and s0 > cols else cols


def _matrix(t: torch.Tensor, ld: int) -> Matrix:
    return Matrix(t.data_ptr(), int(t.shape[0]), int(t.shape[1]), int(ld), _TORCH_TO_TPF[t.dtype])


def _out_dtypes(dtype: torch.dtype) -> Tuple[torch.dtype, ...]:
    return (dtype, torch.float32) if dtype != torch.float32 else (dtype,)


def _check_bias(where: str, b: Optional[torch.Tensor], n: Any, out_dtype: torch.dtype,
                device: torch.device) -> None:
    if b is None:
        return
    _need_tensor(where, "bias", b)
    if b.device != device:
        raise TpflexInvalidError(f"bias is on {b.device}, expected {device}", where)
    if b.dtype != out_dtype:
        raise TpflexInvalidError(f"bias has dtype {b.dtype}, expected {out_dtype} (the "
                                 f"output's dtype)", where)
    if b.dim() != 1 or b.shape[0] != n:
        raise TpflexShapeError(f"bias has shape {_shape_str(b.shape)}, expected [{n}] (N, "
                               f"the output's columns)", where)
    if n > 1 and b.stride(0) != 1:
        raise TpflexShapeError(f"bias has stride {b.stride(0)}, expected 1 (contiguous)", where)


def _beta_needs_out(where: str, beta: float, shape: Tuple[Any, Any]) -> TpflexInvalidError:
    return TpflexInvalidError(f"beta={beta} reads D before writing it: pass out= (a "
                              f"{_shape_str(shape)} tensor)", where)


def _plan_ag_gemm(where: str, device: torch.device, dtype: torch.dtype, T: Any, H: Any,
                  weight: Any, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  trans_w: bool) -> Tuple[Any, Any, Any]:
    """ag_gemm's checks against the active shape [T, H]: (N, ld of weight, ld of out or None)."""
    wr, wc = _dims(where, "weight", weight)
    N = wc if trans_w else wr
    ld_w = _check_mat(where, "weight (trans_w: [H, N])" if trans_w else "weight", weight,
                      (H, None) if trans_w else (None, H), (dtype,), device)
    ld_d = None if out is None else _check_mat(where, "out", out, (T, N), _out_dtypes(dtype),
                                               device)
    _check_bias(where, bias, N, dtype if out is None else out.dtype, device)
    return N, ld_w, ld_d


def _plan_gemm_rs(where: str, device: torch.device, dtype: torch.dtype, T: Any, H: Any, P: int,
                  x: Any, weight: Any, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  trans_a: bool, trans_w: bool) -> Tuple[Any, Any, Any, Any]:
    """gemm_rs's checks: (output rows T/P, ld of x, ld of weight, ld of out or None)."""
    xr, xc = _dims(where, "x", x)
    K = xr if trans_a else xc
    ld_x = _check_mat(where, "x (trans_a: [K, T])" if trans_a else "x", x,
                      (None, T) if trans_a else (T, None), (dtype,), device)
    ld_w = _check_mat(where, "weight (trans_w: [K, H])" if trans_w else "weight", weight,
                      (K, H) if trans_w else (H, K), (dtype,), device)
    rows = T // P
    ld_d = None if out is None else _check_mat(where, "out", out, (rows, H), _out_dtypes(dtype),
                                               device)
    _check_bias(where, bias, H, dtype if out is None else out.dtype, device)
    return rows, ld_x, ld_w, ld_d


def _plan_bulk(where: str, device: torch.device, a: Any, b: Any, out: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], trans_a: bool,
               trans_w: bool) -> Tuple[Any, Any, Any, Any, Any]:
    """bulk_overlap's checks: (M, N, ld of a, ld of b, ld of out or None)."""
    ar, ac = _dims(where, "a", a)
    M, K = (ac, ar) if trans_a else (ar, ac)
    ld_a = _check_mat(where, "a (trans_a: [K, M])" if trans_a else "a", a, (None, None),
                      _GEMM_DTYPES, device)
    br, bc = _dims(where, "b", b)
    N = bc if trans_w else br
    ld_b = _check_mat(where, "b (trans_w: [K, N])" if trans_w else "b", b,
                      (K, None) if trans_w else (None, K), (a.dtype,), device)
    ld_d = None if out is None else _check_mat(where, "out", out, (M, N), _out_dtypes(a.dtype),
                                               device)
    _check_bias(where, bias, N, a.dtype if out is None else out.dtype, device)
    return M, N, ld_a, ld_b, ld_d


# ---- communicators -----------------------------------------------------------------------------

# Every Communicator gets a key, unique in the process and never reused; the custom ops take
# (name, key) and resolve it in the registry of the calling thread's binding (_state(): the
# simulator rank's, else the process's), so a simulator rank only ever reaches its own
# communicators.
_KEYS = itertools.count(1)


def _resolve(name: str, key: int, where: str) -> "Communicator":
    reg = _state().get("comms")
    c = reg.get(int(key)) if reg is not None else None
    if c is None or c.name != name:
        ctx = sim.current()
        who = f"simulator rank {ctx.rank}" if ctx is not None else "this process"
        raise TpflexStateError(
            f"no communicator '{name}' with key {key} on {who}: a communicator resolves only on "
            f"the simulator rank (thread) or process that created it, until it is collected",
            where)
    return c


class Communicator:
    """One registered site (tpf_comm). Its operations are the custom ops torch.ops.tpflex.*
    (usable under torch.compile); the methods parse the options and call them."""

    def __init__(self, manager: "Manager", handle: int, name: str) -> None:
        self._mgr = manager
        self._h = handle
        self.name = name
        self.key = next(_KEYS)
        cfg = lib.tpf_comm_config_of(handle).contents
        self.algo = {v: k for k, v in _ALGO.items()}[cfg.algo]
        self.coll = {v: k for k, v in _COLL.items()}[cfg.coll]
        self.external = bool(cfg.external)
        self.dtype: torch.dtype = _TPF_TO_TORCH[cfg.dtype]
        self.tp_size = manager.tp_size
        self.rank = manager.rank
        self.device: torch.device = manager.device
        # The views of the current shape epoch are as_strided views of one tensor over the whole
        # registration (one storage: torch sees that local_chunk() and buffer() alias), cached
        # eagerly and re-taken by every set_active_shape made through this package. Code under
        # torch.compile builds them in the graph from that tensor and their geometry (Python
        # ints), so the graph has one input per registration and calls no C.
        self._vepoch = -1
        self._vbuf: Optional[torch.Tensor] = None
        self._vchunk: Optional[torch.Tensor] = None
        self._reg: Optional[torch.Tensor] = None
        self._reg_ptr = 0
        self._gbuf: Tuple[int, int, int, int] = (0, 0, 0, 0)  # rows, cols, ld, offset (elements)
        self._gchunk: Tuple[int, int, int, int] = (0, 0, 0, 0)
        if _lib.HAVE_BACKEND_CAPS:
            self.backend_caps: Optional[int] = int(lib.tpf_comm_backend_caps(handle))
            self.backend_name: str = (lib.tpf_comm_backend_name(handle) or b"?").decode()
        else:  # an older libtpflex: caps unknown
            self.backend_caps, self.backend_name = None, manager.backend
        if self.backend_caps is not None:
            host = bool(self.backend_caps & _lib.CAP_HOST_MEMORY)
            if host != (self.device.type == "cpu"):
                raise TpflexInvalidError(
                    f"'{name}': backend '{self.backend_name}' registrations are "
                    f"{'host' if host else 'device'} memory but tensors are on {self.device}",
                    "initialize_ub")
        _state().setdefault("comms", weakref.WeakValueDictionary())[self.key] = self
        self._refresh_views()

    @property
    def supports_options(self) -> Optional[bool]:
        """Whether the backend honours transposes and epilogues (TPF_BE_CAP_OPTIONS); without
        them the C library refuses those options with TpflexUnsupportedError. None when the
        library cannot tell."""
        return None if self.backend_caps is None else bool(self.backend_caps & _lib.CAP_OPTIONS)

    def _handle(self) -> int:
        if self._mgr._h is None:
            raise TpflexStateError(f"communicator '{self.name}' used after destroy_ub()", self.name)
        return self._h

    @property
    def active_shape(self) -> Tuple[int, int]:
        s = lib.tpf_comm_active_shape(self._handle())
        return (int(s.rows), int(s.cols))

    @property
    def capacity_shape(self) -> Tuple[int, int]:
        s = lib.tpf_comm_capacity_shape(self._handle())
        return (int(s.rows), int(s.cols))

    @property
    def epoch(self) -> int:
        return int(lib.tpf_comm_epoch(self._handle()))

    def legal_rows(self, rows: int) -> int:
        """The smallest legal active row count >= rows (pad a microbatch to it)."""
        out = ctypes.c_uint64()
        check(lib.tpf_comm_legal_rows(self._handle(), rows, ctypes.byref(out)), self.name)
        return int(out.value)

    def registration(self) -> Tuple[int, int]:
        """(address, bytes) of the whole registration: fixed from creation to destroy."""
        base, n = ctypes.c_void_p(), ctypes.c_uint64()
        check(lib.tpf_comm_registration(self._handle(), ctypes.byref(base), ctypes.byref(n)),
              f"{self.name}.registration")
        return int(base.value or 0), int(n.value)

    def set_active_shape(self, shape: Sequence[int]) -> None:
        check(lib.tpf_comm_set_active_shape(self._handle(), _as_shape(shape, "shape")), self.name)
        self._refresh_views()

    # ---- zero-copy views ----
    def _geometry(self, m: Matrix) -> Tuple[int, int, int, int]:
        if self._reg is None:
            base, nbytes = self.registration()
            esz = torch.empty((), dtype=self.dtype).element_size()
            self._reg = dlpack_view(base, 1, nbytes // esz, nbytes // esz, self.dtype,
                                    self.device)[0]
            self._reg_ptr = base
        esz = self._reg.element_size()
        off = int(m.ptr or 0) - self._reg_ptr
        if _TPF_TO_TORCH[m.dtype] != self.dtype or off < 0 or off % esz:
            raise TpflexStateError(f"'{self.name}': a view at offset {off} bytes of dtype "
                                   f"{_TPF_TO_TORCH[m.dtype]} is not an element of the "
                                   f"registration ({self.dtype})", self.name)
        return int(m.rows), int(m.cols), int(m.ld), off // esz

    def _refresh_views(self) -> None:
        """Takes the views again when the shape epoch changed (one C call when it did not)."""
        h = self._handle()
        epoch = int(lib.tpf_comm_epoch(h))
        if epoch == self._vepoch:
            return
        mb, mc = Matrix(), Matrix()
        check(lib.tpf_comm_buffer(h, ctypes.byref(mb)), f"{self.name}.buffer")
        check(lib.tpf_comm_local_chunk(h, ctypes.byref(mc)), f"{self.name}.local_chunk")
        self._gbuf, self._gchunk = self._geometry(mb), self._geometry(mc)
        self._vbuf = self._vchunk = None  # made on first use (set_ub_active_shape stays cheap)
        self._vepoch = epoch

    def _strided(self, g: Tuple[int, int, int, int]) -> torch.Tensor:
        rows, cols, ld, off = g
        return self._reg.as_strided((rows, cols), (ld, 1), off)  # type: ignore[union-attr]

    def _views(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():
            # Traced: views of the registration tensor, from the geometry of the last
            # set_active_shape (a C call cannot be traced; the ops check the buffer they get
            # against the live one when they run).
            return self._strided(self._gbuf), self._strided(self._gchunk)
        self._refresh_views()
        if self._vbuf is None:
            self._vbuf, self._vchunk = self._strided(self._gbuf), self._strided(self._gchunk)
        return self._vbuf, self._vchunk  # type: ignore[return-value]

    def buffer(self) -> torch.Tensor:
        """The active buffer [T, H] (RING RS: all 2P-1 slots) as a zero-copy tensor view."""
        return self._views()[0]

    def local_chunk(self) -> torch.Tensor:
        """This rank's [T/P, H] shard of the buffer as a zero-copy tensor view."""
        return self._views()[1]

    # ---- what the ops' real implementations use ----
    def _registration_arg(self, where: str, buffer: torch.Tensor) -> Optional[torch.Tensor]:
        """The ops take the active buffer as their mutated argument. Eagerly it is the live view
        (None is returned: nothing to copy); under torch.compile's functionalisation it may be
        a copy holding the buffer's value, and the live view is returned so that the op copies
        that value in before the C call and the result out after it."""
        live = self._views()[0]
        if buffer is live:
            return None
        if buffer.dtype != live.dtype or buffer.device != live.device or \
                tuple(buffer.shape) != tuple(live.shape):
            raise TpflexStateError(
                f"the registration buffer passed is {_shape_str(buffer.shape)} {buffer.dtype} on "
                f"{buffer.device}; the active buffer is {_shape_str(live.shape)} {live.dtype} "
                f"on {live.device} (a view from before set_ub_active_shape? take buffer() again)",
                where)
        if buffer.data_ptr() == live.data_ptr() and buffer.stride() == live.stride():
            return None
        return live

    def _stream_arg(self, where: str, o: _Opts) -> Optional[int]:
        """The stream option as the ops' `stream` argument: None (the current stream when the
        op runs) or a cudaStream_t."""
        s = o.stream
        if s is None or (isinstance(s, int) and not isinstance(s, bool)):
            return s
        if hasattr(s, "cuda_stream"):
            if self.device.type == "cuda" and getattr(s, "device", self.device) != self.device:
                raise TpflexInvalidError(f"stream is on {s.device}, expected {self.device}", where)
            return int(s.cuda_stream)
        if self.device.type != "cuda":
            raise TpflexInvalidError("the simulator completes operations before returning: "
                                     "stream must be None", where)
        raise TpflexInvalidError(f"stream must be a torch.cuda.Stream, an int or None, got "
                                 f"{type(s).__name__}", where)

    def _stream_ptr(self, where: str, stream: Optional[int]) -> Optional[int]:
        if self.device.type != "cuda":
            if stream is not None:
                raise TpflexInvalidError("the simulator completes operations before returning: "
                                         "stream must be None", where)
            return None
        if stream is None:
            return torch.cuda.current_stream(self.device).cuda_stream
        return stream

    def _call(self, where: str, fn_plain: Any, fn_ex: Any, mats: Tuple[Matrix, ...], o: _Opts,
              bias: Optional[torch.Tensor], stream: Optional[int],
              buffer: torch.Tensor, live: Optional[torch.Tensor]) -> None:
        """The C operation: every tpf_status raised with tpf_last_error(). `live` (from
        _registration_arg): copy the buffer argument's value in first and the result out."""
        s = self._stream_ptr(where, stream)
        refs = [ctypes.byref(m) for m in mats]
        if live is not None:
            live.copy_(buffer)
        if o.is_default:
            rc = fn_plain(self._handle(), *refs, s)
        else:
            opt = o.struct(None if bias is None else bias.data_ptr())
            rc = fn_ex(self._handle(), *refs, ctypes.byref(opt), s)
        check(rc, where)
        if live is not None:
            buffer.copy_(live)

    # ---- operations: parse the options, call torch.ops.tpflex.* ----
    def ag_gemm(self, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING AG: the local shard is already in local_chunk(); returns
        act(alpha AG(X) op(weight) + beta out + bias) [T, N], op(weight) = weight.T for weight
        [N, H], or weight itself with trans_w=True (weight [H, N]). Afterwards buffer() holds
        AG(X). torch.ops.tpflex.ag_gemm (out=None) / ag_gemm_out."""
        where = f"ag_gemm on '{self.name}'"
        o = _parse_options(where, options) if options else _DEFAULT_OPTS
        if o.trans_a:
            raise TpflexUnsupportedError("ag_gemm's activation is the gathered buffer [T, H]; "
                                         "trans_a is not available (trans_w is)", where)
        stream = self._stream_arg(where, o) if o.stream is not None else None
        buf = self._views()[0]
        if out is None:
            if o.beta != 0.0:
                T, H = buf.shape
                N = _plan_ag_gemm(where, self.device, self.dtype, T, H, weight, None, None,
                                  o.trans_w)[0]
                raise _beta_needs_out(where, o.beta, (T, N))
            _dims(where, "weight", weight)
            return _op_ag_gemm(self.name, self.key, buf, weight, o.bias, o.trans_w, o.alpha,
                               o.gelu, o.num_splits, stream)
        _dims(where, "weight", weight)
        _need_tensor(where, "out", out)
        _op_ag_gemm_out(self.name, self.key, buf, weight, out, o.bias, o.trans_w, o.alpha,
                        o.beta, o.gelu, o.num_splits, stream)
        return out

    def gemm_rs(self, x: torch.Tensor, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING/PIPELINE RS: returns rows [r*T/P, (r+1)*T/P) of
        act(alpha sum_ranks op(x) op(weight) + beta out + bias), [T/P, H]. op(x) = x [T, K] (x
        [K, T] with trans_a); op(weight) = weight.T for weight [H, K] (weight [K, H] with
        trans_w). torch.ops.tpflex.gemm_rs (out=None) / gemm_rs_out."""
        where = f"gemm_rs on '{self.name}'"
        o = _parse_options(where, options) if options else _DEFAULT_OPTS
        stream = self._stream_arg(where, o) if o.stream is not None else None
        buf, chunk = self._views()
        _dims(where, "x", x)
        _need_tensor(where, "weight", weight)
        if out is None:
            if o.beta != 0.0:
                T, H = chunk.shape[0] * self.tp_size, chunk.shape[1]
                rows = _plan_gemm_rs(where, self.device, self.dtype, T, H, self.tp_size, x,
                                     weight, None, None, o.trans_a, o.trans_w)[0]
                raise _beta_needs_out(where, o.beta, (rows, H))
            return _op_gemm_rs(self.name, self.key, self.tp_size, buf, x, weight, o.bias,
                               o.trans_a, o.trans_w, o.alpha, o.gelu, o.num_splits, stream)
        _need_tensor(where, "out", out)
        _op_gemm_rs_out(self.name, self.key, self.tp_size, buf, x, weight, out, o.bias,
                        o.trans_a, o.trans_w, o.alpha, o.beta, o.gelu, o.num_splits, stream)
        return out

    def bulk_overlap(self, a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None,
                     **options: Any) -> torch.Tensor:
        """BULK: the collective runs on the buffer in place (AG: local chunk in, [T, H] out; RS:
        [T, H] partials in, local_chunk() reduced) while out = act(alpha op(a) op(b) + beta out
        + bias) runs beside it. op(a) = a [M, K] (a [K, M] with trans_a); op(b) = b.T for b
        [N, K] (b [K, N] with trans_w). a, b, out must not alias this communicator's buffer.
        torch.ops.tpflex.bulk_overlap (out=None) / bulk_overlap_out."""
        where = f"bulk_overlap on '{self.name}'"
        o = _parse_options(where, options) if options else _DEFAULT_OPTS
        stream = self._stream_arg(where, o) if o.stream is not None else None
        buf = self._views()[0]
        _dims(where, "a", a)
        _dims(where, "b", b)
        if out is None:
            if o.beta != 0.0:
                M, N = _plan_bulk(where, self.device, a, b, None, None, o.trans_a, o.trans_w)[:2]
                raise _beta_needs_out(where, o.beta, (M, N))
            return _op_bulk_overlap(self.name, self.key, buf, a, b, o.bias, o.trans_a, o.trans_w,
                                    o.alpha, o.gelu, o.num_splits, stream)
        _need_tensor(where, "out", out)
        _op_bulk_overlap_out(self.name, self.key, buf, a, b, out, o.bias, o.trans_a, o.trans_w,
                             o.alpha, o.beta, o.gelu, o.num_splits, stream)
        return out

    # Bound only when the loaded libtpflex has them (tpf_comm_sync / _async_error / _abort).
    if _lib.HAVE_COMM_SYNC:
        def sync(self) -> None:
            """Waits for this communicator's enqueued operations; raises their deferred failure."""
            check(lib.tpf_comm_sync(self._handle()), f"sync on '{self.name}'")

    if _lib.HAVE_COMM_ASYNC_ERROR:
        def async_error(self) -> Optional[TpflexError]:
            """The deferred failure of the operations enqueued so far (not raised), or None."""
            st = ctypes.c_int(0)
            check(lib.tpf_comm_async_error(self._handle(), ctypes.byref(st)),
                  f"async_error on '{self.name}'")
            return None if st.value == 0 else error_for(st.value, _lib.last_error(),
                                                         f"async_error on '{self.name}'")

    if _lib.HAVE_COMM_ABORT:
        def abort(self) -> None:
            """Unblocks waits on this communicator; afterwards its calls raise TpflexStateError.
            Thread-safe (usable from a watchdog thread)."""
            check(lib.tpf_comm_abort(self._handle()), f"abort on '{self.name}'")

    def __repr__(self) -> str:
        return (f"<tpflex.Communicator '{self.name}' {self.algo} {self.coll} rank {self.rank}/"
                f"{self.tp_size} on {self.device} active {list(self.active_shape)} capacity "
                f"{list(self.capacity_shape)} epoch {self.epoch}>")


# ---- the custom ops (torch.library): what torch.compile traces ----------------------------------
# Each operation is two ops: the functional one allocates and returns its output (beta is 0: there
# is no D to read); the _out one writes `out` and returns nothing (beta != 0 reads it: a mutated
# argument is read and written). Both declare `buffer` (the communicator's active buffer view,
# the registration the collective writes) mutated. The communicator is (comm, key), resolved on
# the calling thread (_resolve). The fake implementations compute the output from the tensors'
# metadata alone, with the same checks and messages, and never call the C library.

_OP_NAMES = ("ag_gemm", "ag_gemm_out", "gemm_rs", "gemm_rs_out", "bulk_overlap",
             "bulk_overlap_out")


def _opts(trans_a: bool, trans_w: bool, alpha: float, beta: float,
          bias: Optional[torch.Tensor], gelu: bool, num_splits: int) -> _Opts:
    o = _Opts()
    o.trans_a, o.trans_w, o.alpha, o.beta = bool(trans_a), bool(trans_w), float(alpha), float(beta)
    o.bias, o.gelu, o.num_splits = bias, bool(gelu), int(num_splits)
    return o


def _ag_gemm_impl(comm: str, key: int, buffer: torch.Tensor, weight: torch.Tensor,
                  out: Optional[torch.Tensor], bias: Optional[torch.Tensor], trans_w: bool,
                  alpha: float, beta: float, gelu: bool, num_splits: int,
                  stream: Optional[int]) -> torch.Tensor:
    where = f"ag_gemm on '{comm}'"
    c = _resolve(comm, key, where)
    o = _opts(False, trans_w, alpha, beta, bias, gelu, num_splits)
    T, H = c.active_shape
    live = c._registration_arg(where, buffer)
    N, ld_w, ld_d = _plan_ag_gemm(where, c.device, c.dtype, T, H, weight, out, bias, trans_w)
    if out is None:
        out, ld_d = torch.empty((T, N), dtype=c.dtype, device=c.device), N
    c._call(where, lib.tpf_ag_gemm, lib.tpf_ag_gemm_ex, (_matrix(weight, ld_w), _matrix(out, ld_d)),
            o, bias, stream, buffer, live)
    return out


def _gemm_rs_impl(comm: str, key: int, tp_size: int, buffer: torch.Tensor, x: torch.Tensor,
                  weight: torch.Tensor, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  trans_a: bool, trans_w: bool, alpha: float, beta: float, gelu: bool,
                  num_splits: int, stream: Optional[int]) -> torch.Tensor:
    where = f"gemm_rs on '{comm}'"
    c = _resolve(comm, key, where)
    o = _opts(trans_a, trans_w, alpha, beta, bias, gelu, num_splits)
    T, H = c.active_shape
    live = c._registration_arg(where, buffer)
    rows, ld_x, ld_w, ld_d = _plan_gemm_rs(where, c.device, c.dtype, T, H, c.tp_size, x, weight,
                                           out, bias, trans_a, trans_w)
    if out is None:
        out, ld_d = torch.empty((rows, H), dtype=c.dtype, device=c.device), H
    c._call(where, lib.tpf_gemm_rs, lib.tpf_gemm_rs_ex,
            (_matrix(x, ld_x), _matrix(weight, ld_w), _matrix(out, ld_d)), o, bias, stream,
            buffer, live)
    return out


def _bulk_impl(comm: str, key: int, buffer: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               out: Optional[torch.Tensor], bias: Optional[torch.Tensor], trans_a: bool,
               trans_w: bool, alpha: float, beta: float, gelu: bool, num_splits: int,
               stream: Optional[int]) -> torch.Tensor:
    where = f"bulk_overlap on '{comm}'"
    c = _resolve(comm, key, where)
    o = _opts(trans_a, trans_w, alpha, beta, bias, gelu, num_splits)
    live = c._registration_arg(where, buffer)
    M, N, ld_a, ld_b, ld_d = _plan_bulk(where, c.device, a, b, out, bias, trans_a, trans_w)
    if out is None:
        out, ld_d = torch.empty((M, N), dtype=a.dtype, device=c.device), N
    c._call(where, lib.tpf_bulk_overlap, lib.tpf_bulk_overlap_ex,
            (_matrix(a, ld_a), _matrix(b, ld_b), _matrix(out, ld_d)), o, bias, stream, buffer,
            live)
    return out


def _fake_buffer(where: str, buffer: torch.Tensor) -> Tuple[Any, Any]:
    _dims(where, "buffer", buffer)
    return buffer.shape[0], buffer.shape[1]


def _register_ops() -> None:
    if hasattr(torch.ops.tpflex, "ag_gemm"):  # another copy of this module registered them
        return
    lib_def = torch.library.custom_op

    @lib_def("tpflex::ag_gemm", mutates_args=("buffer",))
    def ag_gemm(comm: str, key: int, buffer: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor], trans_w: bool, alpha: float, gelu: bool,
                num_splits: int, stream: Optional[int]) -> torch.Tensor:
        return _ag_gemm_impl(comm, key, buffer, weight, None, bias, trans_w, alpha, 0.0, gelu,
                             num_splits, stream)

    @ag_gemm.register_fake
    def _(comm, key, buffer, weight, bias, trans_w, alpha, gelu, num_splits, stream):
        where = f"ag_gemm on '{comm}'"
        T, H = _fake_buffer(where, buffer)
        N = _plan_ag_gemm(where, buffer.device, buffer.dtype, T, H, weight, None, bias,
                          trans_w)[0]
        return buffer.new_empty((T, N))

    @lib_def("tpflex::ag_gemm_out", mutates_args=("buffer", "out"))
    def ag_gemm_out(comm: str, key: int, buffer: torch.Tensor, weight: torch.Tensor,
                    out: torch.Tensor, bias: Optional[torch.Tensor], trans_w: bool, alpha: float,
                    beta: float, gelu: bool, num_splits: int, stream: Optional[int]) -> None:
        _ag_gemm_impl(comm, key, buffer, weight, out, bias, trans_w, alpha, beta, gelu,
                      num_splits, stream)

    @ag_gemm_out.register_fake
    def _(comm, key, buffer, weight, out, bias, trans_w, alpha, beta, gelu, num_splits, stream):
        where = f"ag_gemm on '{comm}'"
        T, H = _fake_buffer(where, buffer)
        _plan_ag_gemm(where, buffer.device, buffer.dtype, T, H, weight, out, bias, trans_w)

    @lib_def("tpflex::gemm_rs", mutates_args=("buffer",))
    def gemm_rs(comm: str, key: int, tp_size: int, buffer: torch.Tensor, x: torch.Tensor,
                weight: torch.Tensor, bias: Optional[torch.Tensor], trans_a: bool, trans_w: bool,
                alpha: float, gelu: bool, num_splits: int,
                stream: Optional[int]) -> torch.Tensor:
        return _gemm_rs_impl(comm, key, tp_size, buffer, x, weight, None, bias, trans_a, trans_w,
                             alpha, 0.0, gelu, num_splits, stream)

    def _rs_fake(comm, tp_size, buffer, x, weight, out, bias, trans_a, trans_w):
        where = f"gemm_rs on '{comm}'"
        H = _fake_buffer(where, buffer)[1]
        xr, xc = _dims(where, "x", x)
        return _plan_gemm_rs(where, buffer.device, buffer.dtype, xc if trans_a else xr, H,
                             tp_size, x, weight, out, bias, trans_a, trans_w)[0], H

    @gemm_rs.register_fake
    def _(comm, key, tp_size, buffer, x, weight, bias, trans_a, trans_w, alpha, gelu, num_splits,
          stream):
        return buffer.new_empty(_rs_fake(comm, tp_size, buffer, x, weight, None, bias, trans_a,
                                         trans_w))

    @lib_def("tpflex::gemm_rs_out", mutates_args=("buffer", "out"))
    def gemm_rs_out(comm: str, key: int, tp_size: int, buffer: torch.Tensor, x: torch.Tensor,
                    weight: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor],
                    trans_a: bool, trans_w: bool, alpha: float, beta: float, gelu: bool,
                    num_splits: int, stream: Optional[int]) -> None:
        _gemm_rs_impl(comm, key, tp_size, buffer, x, weight, out, bias, trans_a, trans_w, alpha,
                      beta, gelu, num_splits, stream)

    @gemm_rs_out.register_fake
    def _(comm, key, tp_size, buffer, x, weight, out, bias, trans_a, trans_w, alpha, beta, gelu,
          num_splits, stream):
        _rs_fake(comm, tp_size, buffer, x, weight, out, bias, trans_a, trans_w)

    @lib_def("tpflex::bulk_overlap", mutates_args=("buffer",))
    def bulk_overlap(comm: str, key: int, buffer: torch.Tensor, a: torch.Tensor,
                     b: torch.Tensor, bias: Optional[torch.Tensor], trans_a: bool, trans_w: bool,
                     alpha: float, gelu: bool, num_splits: int,
                     stream: Optional[int]) -> torch.Tensor:
        return _bulk_impl(comm, key, buffer, a, b, None, bias, trans_a, trans_w, alpha, 0.0, gelu,
                          num_splits, stream)

    @bulk_overlap.register_fake
    def _(comm, key, buffer, a, b, bias, trans_a, trans_w, alpha, gelu, num_splits, stream):
        where = f"bulk_overlap on '{comm}'"
        _fake_buffer(where, buffer)
        M, N = _plan_bulk(where, buffer.device, a, b, None, bias, trans_a, trans_w)[:2]
        return a.new_empty((M, N))

    @lib_def("tpflex::bulk_overlap_out", mutates_args=("buffer", "out"))
    def bulk_overlap_out(comm: str, key: int, buffer: torch.Tensor, a: torch.Tensor,
                         b: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor],
                         trans_a: bool, trans_w: bool, alpha: float, beta: float, gelu: bool,
                         num_splits: int, stream: Optional[int]) -> None:
        _bulk_impl(comm, key, buffer, a, b, out, bias, trans_a, trans_w, alpha, beta, gelu,
                   num_splits, stream)

    @bulk_overlap_out.register_fake
    def _(comm, key, buffer, a, b, out, bias, trans_a, trans_w, alpha, beta, gelu, num_splits,
          stream):
        where = f"bulk_overlap on '{comm}'"
        _fake_buffer(where, buffer)
        _plan_bulk(where, buffer.device, a, b, out, bias, trans_a, trans_w)


_register_ops()
_op_ag_gemm = torch.ops.tpflex.ag_gemm.default
_op_ag_gemm_out = torch.ops.tpflex.ag_gemm_out.default
_op_gemm_rs = torch.ops.tpflex.gemm_rs.default
_op_gemm_rs_out = torch.ops.tpflex.gemm_rs_out.default
_op_bulk_overlap = torch.ops.tpflex.bulk_overlap.default
_op_bulk_overlap_out = torch.ops.tpflex.bulk_overlap_out.default


# ---- the CUDA backend's bootstrap over torch.distributed ----------------------------------------

def _boot_timeout_ms() -> int:
    try:
        return max(1, int(os.environ.get("TPF_CUDA_BOOT_TIMEOUT_MS", "120000")))
    except ValueError:
        return 120000


def _gloo_group(group: Any) -> Any:
    """A process group over the same ranks that moves CPU tensors with gloo: `group` itself
    when its backend has gloo (gloo, or the default "cpu:gloo,cuda:nccl"), else a twin created
    once per group (every member calls initialize_ub, so the creation is collective)."""
    import torch.distributed as dist
    g = group if group is not None else dist.group.WORLD
    if "gloo" in str(dist.get_backend(g)):
        return g
    cache = _process_state.setdefault("gloo_twins", {})
    key = id(g)
    if key not in cache:
        import datetime
        timeout = datetime.timedelta(milliseconds=_boot_timeout_ms())
        if group is None or g == dist.group.WORLD:
            cache[key] = dist.new_group(backend="gloo", timeout=timeout)
        else:
            cache[key] = dist.new_group(ranks=dist.get_process_group_ranks(g), backend="gloo",
                                        timeout=timeout, use_local_synchronization=True)
    return cache[key]


class GlooBootstrap:
    """tpf_bootstrap's allgather and barrier as ctypes callbacks over a gloo process group (CPU
    tensors), each bounded by TPF_CUDA_BOOT_TIMEOUT_MS (default 120 s). C calls them on the
    thread that called into tpflex (backend and communicator creation, destroy); a failure
    returns TPF_ETIMEOUT / TPF_EBACKEND with the detail in tpf_last_error()."""

    def __init__(self, group: Any, timeout_ms: Optional[int] = None) -> None:
        import torch.distributed as dist
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.timeout_ms = timeout_ms or _boot_timeout_ms()
        self.calls = 0
        self._ag = BOOT_ALLGATHER_FN(self._allgather_cb)
        self._bar = BOOT_BARRIER_FN(self._barrier_cb)

    def struct(self, device: int) -> Bootstrap:
        return Bootstrap(tp_size=self.size, rank=self.rank, device=device, allgather=self._ag,
                         barrier=self._bar, ctx=None)

    def allgather(self, data: bytes) -> List[bytes]:
        """Every rank contributes len(data) bytes (the same on every rank); rank order."""
        import datetime
        n = len(data)
        self.calls += 1
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8) if n else \
            torch.empty(0, dtype=torch.uint8)
        outs = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
        work = self._dist.all_gather(outs, src, group=self.group, async_op=True)
        try:
            done = work.wait(timeout=datetime.timedelta(milliseconds=self.timeout_ms))
        except RuntimeError as e:
            raise TpflexTimeoutError(
                f"bootstrap allgather of {n} bytes over gloo (rank {self.rank} of {self.size}) "
                f"did not complete within {self.timeout_ms} ms (TPF_CUDA_BOOT_TIMEOUT_MS): {e}",
                "bootstrap") from None
        if done is False:
            raise TpflexTimeoutError(f"bootstrap allgather of {n} bytes did not complete within "
                                     f"{self.timeout_ms} ms", "bootstrap")
        return [ctypes.string_at(t.data_ptr(), n) if n else b"" for t in outs]

    def allgather_varlen(self, data: bytes) -> List[bytes]:
        lens = self.allgather(len(data).to_bytes(8, "little"))
        width = max(int.from_bytes(x, "little") for x in lens)
        parts = self.allgather(data.ljust(width, b"\0"))
        return [p[:int.from_bytes(n, "little")] for p, n in zip(parts, lens)]

    def allgather_object(self, obj: Any) -> List[Any]:
        """Every rank's picklable `obj`, in rank order (no numpy needed, unlike
        torch.distributed.all_gather_object)."""
        return [pickle.loads(b) for b in self.allgather_varlen(pickle.dumps(obj))]

    def _allgather_cb(self, _ctx: Any, send: int, recv: int, nbytes: int) -> int:
        try:
            parts = self.allgather(ctypes.string_at(send, nbytes) if nbytes else b"")
            for q, part in enumerate(parts):
                if len(part) != nbytes:
                    return _lib.set_error(TPF_EBACKEND, f"bootstrap allgather: rank {q} sent "
                                          f"{len(part)} bytes, expected {nbytes}")
                ctypes.memmove(recv + q * nbytes, part, nbytes)
            return 0
        except TpflexTimeoutError as e:
            return _lib.set_error(TPF_ETIMEOUT, e.detail)
        except BaseException as e:  # never let an exception cross the C frame
            return _lib.set_error(TPF_EBACKEND, f"bootstrap allgather over gloo failed on rank "
                                  f"{self.rank}: {type(e).__name__}: {e}")

    def _barrier_cb(self, _ctx: Any) -> int:
        try:
            self.allgather(b"\1")
            return 0
        except TpflexTimeoutError as e:
            return _lib.set_error(TPF_ETIMEOUT, e.detail.replace("allgather of 1 bytes",
                                                                 "barrier"))
        except BaseException as e:
            return _lib.set_error(TPF_EBACKEND, f"bootstrap barrier over gloo failed on rank "
                                  f"{self.rank}: {type(e).__name__}: {e}")


class _CudaBackend:
    """A tpf_backend of the CUDA backend with the bootstrap it keeps calling (alive until
    destroy)."""

    def __init__(self, boot: GlooBootstrap, device: torch.device,
                 timeout_ms: Optional[int]) -> None:
        self.boot = boot
        self.device = device
        self._boot_struct = boot.struct(int(device.index))
        h = ctypes.c_void_p()
        check(lib.tpf_cuda_backend_create(ctypes.byref(self._boot_struct), ctypes.byref(h)),
              "tpf_cuda_backend_create")
        self.handle: Optional[int] = h.value
        if timeout_ms is not None:
            try:
                check(lib.tpf_cuda_backend_set_timeout(self.handle, int(timeout_ms)),
                      "tpf_cuda_backend_set_timeout")
            except BaseException:
                self.destroy()
                raise

    def destroy(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            check(lib.tpf_cuda_backend_destroy(h), "tpf_cuda_backend_destroy")


def _agree(boot: GlooBootstrap, desc: List[Tuple[str, Any]]) -> None:
    """Compares this rank's initialize_ub arguments with every rank's over the bootstrap group
    before anything is registered: TpflexMismatchError on every rank naming the first differing
    field and both values (the C library's creation fingerprint, for backends that lack it)."""
    alls = boot.allgather_object(desc)
    base = alls[0]
    for q, other in enumerate(alls[1:], 1):
        if other == base:
            continue
        for (k0, v0), (k1, v1) in zip(base, other):
            if k0 != k1 or v0 != v1:
                field = k0 if k0 == k1 else f"{k0} / {k1}"
                raise TpflexMismatchError(
                    f"configuration differs between ranks: {field} is {v0!r} on rank 0, {v1!r} "
                    f"on rank {q} (initialize_ub; nothing was registered)", "initialize_ub")
        raise TpflexMismatchError(
            f"configuration differs between ranks: {len(base)} fields on rank 0, {len(other)} on "
            f"rank {q} (initialize_ub; nothing was registered)", "initialize_ub")


# ---- manager and the TE-style module functions --------------------------------------------------

class Manager:
    """A tpf_manager holding TE's communicators; returned by initialize_ub."""

    def __init__(self, backend_handle: int, tp_size: int, rank: int, device: torch.device,
                 owner: Optional[_CudaBackend] = None) -> None:
        h = ctypes.c_void_p()
        check(lib.tpf_manager_create(backend_handle, ctypes.byref(h)), "tpf_manager_create")
        self._h: Optional[int] = h.value
        self.tp_size = tp_size
        self.rank = rank
        self.device = device
        self.backend = "cuda" if owner is not None else "sim"
        self._owner = owner
        self._comms: Dict[str, Communicator] = {}

    def add(self, name: str, method: str, coll: str, dtype: torch.dtype, capacity: Shape,
            external: bool = False, num_splits: int = 0, aggregate: bool = False) -> Communicator:
        if self._h is None:
            raise TpflexStateError("manager destroyed", "add")
        if method not in _ALGO or coll not in _COLL:
            raise TpflexInvalidError(f"'{name}': method '{method}' / coll '{coll}' (methods: "
                                     f"{', '.join(_ALGO)}; colls: {', '.join(_COLL)})", "add")
        cfg = CommConfig(size=ctypes.sizeof(CommConfig), name=name.encode(), algo=_ALGO[method],
                         coll=_COLL[coll], dtype=_TORCH_TO_TPF[dtype], capacity=capacity,
                         num_splits=num_splits, aggregate=aggregate, external=external)
        c = ctypes.c_void_p()
        check(lib.tpf_manager_add(self._h, ctypes.byref(cfg), ctypes.byref(c)), f"add '{name}'")
        comm = Communicator(self, c.value, name)
        self._comms[name] = comm
        return comm

    def set_active_shape(self, shape: Sequence[int]) -> None:
        if self._h is None:
            raise TpflexStateError("manager destroyed", "set_ub_active_shape")
        check(lib.tpf_manager_set_active_shape(self._h, _as_shape(shape, "shape")),
              "set_ub_active_shape")
        for c in self._comms.values():  # the views code under torch.compile reads
            c._refresh_views()

    def get(self, name: str) -> Communicator:
        if self._h is None:
            raise TpflexStateError("manager destroyed", "get_ub")
        c = self._comms.get(name)
        if c is None:
            raise TpflexInvalidError(f"no communicator named '{name}' (have: "
                                     f"{', '.join(self._comms)})", "get_ub")
        return c

    @property
    def names(self) -> List[str]:
        return list(self._comms)

    def __len__(self) -> int:
        return 0 if self._h is None else int(lib.tpf_manager_count(self._h))

    def destroy(self) -> None:
        """Collective: destroys every communicator, then (CUDA) the backend."""
        try:
            if self._h is not None:
                h, self._h = self._h, None
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
                check(lib.tpf_manager_destroy(h), "destroy_ub")
        finally:
            if self._owner is not None:
                owner, self._owner = self._owner, None
                owner.destroy()


def _resolve_cfgs(ub_cfgs: Optional[Dict[str, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    cfgs = {k: dict(v) for k, v in DEFAULT_UB_CFGS.items()}
    for k, v in (ub_cfgs or {}).items():
        unknown = set(v) - set(_CFG_KEYS)
        if unknown:
            raise TpflexInvalidError(f"ub_cfgs['{k}']: unknown keys {sorted(unknown)} (known: "
                                     f"{', '.join(_CFG_KEYS)})", "initialize_ub")
        cfgs.setdefault(k, {}).update(v)
    return cfgs


def initialize_ub(shape: Sequence[int], tp_size: int, dtype: torch.dtype = torch.bfloat16,
                  ub_cfgs: Optional[Dict[str, Dict[str, Any]]] = None, group: Any = None,
                  backend: Optional[str] = None, *, device: Any = None,
                  timeout_ms: Optional[int] = None) -> Manager:
    """Registers TE's default communicators (DEFAULT_UB_CFGS, updated by ub_cfgs: method, coll,
    external, num_splits, aggregate) at capacity `shape` = [max_tokens, hidden], once. Collective
    over the tp group. Returns the manager (also the module's current one).

    backend: "sim" (inside tpflex.sim.run), "cuda" (torch.distributed initialised; `group` is
    the tp group, default the world; `device` default torch.cuda.current_device(); timeout_ms
    bounds every device-side wait, default 30 s or TPF_CUDA_TIMEOUT_MS), or None for "sim"
    inside tpflex.sim.run and "cuda" otherwise."""
    if dtype not in _TORCH_TO_TPF:
        raise TpflexInvalidError(f"dtype {dtype} not supported (bf16, fp16, fp32)", "initialize_ub")
    cap = _as_shape(shape, "shape")
    st = _state()
    if st.get("manager") is not None:
        raise TpflexStateError("initialize_ub called twice without destroy_ub", "initialize_ub")
    if backend is None:
        backend = "sim" if sim.current() is not None else "cuda"
    cfgs = _resolve_cfgs(ub_cfgs)
    if backend == "sim":
        ctx = sim.current()
        if ctx is None:
            raise TpflexStateError("backend='sim' must be called from a rank of tpflex.sim.run",
                                   "initialize_ub")
        if ctx.tp_size != tp_size:
            raise TpflexInvalidError(f"tp_size {tp_size} but the simulator world has "
                                     f"{ctx.tp_size} ranks", "initialize_ub")
        if group is not None or device is not None or timeout_ms is not None:
            raise TpflexInvalidError("group, device and timeout_ms are CUDA-backend arguments "
                                     "(the simulator world has its own timeout)", "initialize_ub")
        mgr = Manager(ctx.backend, tp_size, ctx.rank, torch.device("cpu"))
    elif backend == "cuda":
        mgr = _cuda_manager(cap, tp_size, dtype, cfgs, group, device, timeout_ms)
    else:
        raise TpflexInvalidError(f"unknown backend '{backend}' (sim or cuda)", "initialize_ub")
    try:
        for name, c in cfgs.items():
            mgr.add(name, c.get("method", "ring"), c.get("coll", "ag"), dtype, cap,
                    external=bool(c.get("external", False)), num_splits=int(c.get("num_splits", 0)),
                    aggregate=bool(c.get("aggregate", False)))
    except BaseException:
        mgr.destroy()
        raise
    st["manager"] = mgr
    return mgr


def _cuda_manager(cap: Shape, tp_size: int, dtype: torch.dtype, cfgs: Dict[str, Dict[str, Any]],
                  group: Any, device: Any, timeout_ms: Optional[int]) -> Manager:
    where = "initialize_ub"
    if not _lib.HAVE_CUDA:
        raise TpflexUnsupportedError(f"the loaded libtpflex ({_lib.LIBRARY_PATH}) has no CUDA "
                                     "backend: build with -DTPF_WITH_CUDA=ON", where)
    if not torch.cuda.is_available():
        raise TpflexUnsupportedError("backend='cuda' needs torch with CUDA and a GPU "
                                     "(torch.cuda.is_available() is False)", where)
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise TpflexStateError("backend='cuda' bootstraps over torch.distributed: call "
                               "torch.distributed.init_process_group first (torchrun sets its "
                               "environment); on one GPU shared by several processes use gloo",
                               where)
    g = group if group is not None else dist.group.WORLD
    size = dist.get_world_size(g)
    if size != tp_size:
        raise TpflexInvalidError(f"tp_size {tp_size} but the process group has {size} ranks "
                                 "(pass the tp group as group=)", where)
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else \
        torch.device(device)
    if dev.type != "cuda":
        raise TpflexInvalidError(f"device {dev} is not a CUDA device", where)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    torch.cuda.init()
    boot = GlooBootstrap(_gloo_group(group))
    # Every rank's arguments agree before the backend or any registration exists.
    desc: List[Tuple[str, Any]] = [("tp_size", tp_size), ("shape", [int(cap.rows), int(cap.cols)]),
                                   ("dtype", str(dtype)), ("communicators", list(cfgs))]
    for name, c in cfgs.items():
        for k in _CFG_KEYS:
            desc.append((f"{name}.{k}", c.get(k, {"method": "ring", "coll": "ag", "external": False,
                                                 "num_splits": 0, "aggregate": False}[k])))
    _agree(boot, desc)
    be = _CudaBackend(boot, dev, timeout_ms)
    try:
        return Manager(be.handle, tp_size, boot.rank, dev, owner=be)
    except BaseException:
        be.destroy()
        raise


def _manager() -> Manager:
    m = _state().get("manager")
    if m is None:
        raise TpflexStateError("initialize_ub has not been called on this rank", "tpflex.torch")
    return m


def set_ub_active_shape(shape: Sequence[int]) -> None:
    """Applies [T, H] to every eligible communicator, all-or-nothing (local: no communication)."""
    _manager().set_active_shape(shape)


def get_ub(name: str) -> Communicator:
    return _manager().get(name)


def destroy_ub() -> None:
    """Collective: destroys the communicators (and the CUDA backend)."""
    st = _state()
    m = st.pop("manager", None)
    if m is not None:
        m.destroy()


__all__ = ["initialize_ub", "set_ub_active_shape", "get_ub", "destroy_ub", "Manager",
           "Communicator", "GlooBootstrap", "DEFAULT_UB_CFGS", "OPTION_NAMES", "dlpack_view"]
