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
import math
import os
import pickle
import threading
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


# ---- communicators -----------------------------------------------------------------------------

class Communicator:
    """One registered site (tpf_comm). Operations validate before calling C."""

    def __init__(self, manager: "Manager", handle: int, name: str) -> None:
        self._mgr = manager
        self._h = handle
        self.name = name
        cfg = lib.tpf_comm_config_of(handle).contents
        self.algo = {v: k for k, v in _ALGO.items()}[cfg.algo]
        self.coll = {v: k for k, v in _COLL.items()}[cfg.coll]
        self.external = bool(cfg.external)
        self.dtype: torch.dtype = _TPF_TO_TORCH[cfg.dtype]
        self.tp_size = manager.tp_size
        self.rank = manager.rank
        self.device: torch.device = manager.device
        self._views: Dict[str, Tuple[int, torch.Tensor]] = {}
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

    def _view_of(self, kind: str) -> torch.Tensor:
        h = self._handle()
        epoch = int(lib.tpf_comm_epoch(h))
        hit = self._views.get(kind)
        if hit is not None and hit[0] == epoch:
            return hit[1]
        m = Matrix()
        fn = lib.tpf_comm_buffer if kind == "buffer" else lib.tpf_comm_local_chunk
        check(fn(h, ctypes.byref(m)), f"{self.name}.{kind}")
        v = dlpack_view(m.ptr, int(m.rows), int(m.cols), int(m.ld), _TPF_TO_TORCH[m.dtype],
                        self.device)
        self._views[kind] = (epoch, v)
        return v

    def buffer(self) -> torch.Tensor:
        """The active buffer [T, H] (RING RS: all 2P-1 slots) as a zero-copy tensor view."""
        return self._view_of("buffer")

    def local_chunk(self) -> torch.Tensor:
        """This rank's [T/P, H] shard of the buffer as a zero-copy tensor view."""
        return self._view_of("local_chunk")

    # ---- validation ----
    def _mat(self, where: str, what: str, t: Any, shape: Tuple[Optional[int], Optional[int]],
             dtypes: Tuple[torch.dtype, ...]) -> Matrix:
        if not isinstance(t, torch.Tensor):
            raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(t).__name__}", where)
        if t.device != self.device:
            raise TpflexInvalidError(f"{what} is on {t.device}, expected {self.device}", where)
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
        return Matrix(t.data_ptr(), rows, cols, s0 if rows > 1 and s0 > cols else cols,
                      _TORCH_TO_TPF[dt])

    def _dims(self, where: str, what: str, t: Any) -> Tuple[int, int]:
        if not isinstance(t, torch.Tensor):
            raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(t).__name__}", where)
        if t.dim() != 2:
            raise TpflexShapeError(f"{what} has shape {_shape_str(t.shape)}, expected 2-D", where)
        return int(t.shape[0]), int(t.shape[1])

    def _out(self, where: str, out: Optional[torch.Tensor], shape: Tuple[int, int],
             dtype: torch.dtype, dtypes: Tuple[torch.dtype, ...],
             o: _Opts) -> Tuple[torch.Tensor, Matrix]:
        if out is None:
            if o.beta != 0.0:
                raise TpflexInvalidError(f"beta={o.beta} reads D before writing it: pass out= "
                                         f"(a {_shape_str(shape)} tensor)", where)
            out = torch.empty(shape, dtype=dtype, device=self.device)
        return out, self._mat(where, "out", out, shape, dtypes)

    def _bias(self, where: str, o: _Opts, n: int, out: torch.Tensor) -> Optional[int]:
        b = o.bias
        if b is None:
            return None
        if b.device != self.device:
            raise TpflexInvalidError(f"bias is on {b.device}, expected {self.device}", where)
        if b.dtype != out.dtype:
            raise TpflexInvalidError(f"bias has dtype {b.dtype}, expected {out.dtype} (the "
                                     f"output's dtype)", where)
        if b.dim() != 1 or int(b.shape[0]) != n:
            raise TpflexShapeError(f"bias has shape {_shape_str(b.shape)}, expected [{n}] (N, "
                                   f"the output's columns)", where)
        if n > 1 and b.stride(0) != 1:
            raise TpflexShapeError(f"bias has stride {b.stride(0)}, expected 1 (contiguous)",
                                   where)
        return b.data_ptr()

    def _stream(self, where: str, o: _Opts) -> Optional[int]:
        s = o.stream
        if self.device.type != "cuda":
            if s is not None:
                raise TpflexInvalidError("the simulator completes operations before returning: "
                                         "stream must be None", where)
            return None
        if s is None:
            return torch.cuda.current_stream(self.device).cuda_stream
        if isinstance(s, int):
            return s
        if hasattr(s, "cuda_stream"):
            if getattr(s, "device", self.device) != self.device:
                raise TpflexInvalidError(f"stream is on {s.device}, expected {self.device}", where)
            return s.cuda_stream
        raise TpflexInvalidError(f"stream must be a torch.cuda.Stream, an int or None, got "
                                 f"{type(s).__name__}", where)

    def _call(self, where: str, fn_plain: Any, fn_ex: Any, mats: Tuple[Matrix, ...], o: _Opts,
              bias_ptr: Optional[int]) -> None:
        stream = self._stream(where, o)
        refs = [ctypes.byref(m) for m in mats]
        if o.is_default:
            rc = fn_plain(self._handle(), *refs, stream)
        else:
            opt = o.struct(bias_ptr)
            rc = fn_ex(self._handle(), *refs, ctypes.byref(opt), stream)
        check(rc, where)

    # ---- operations ----
    def ag_gemm(self, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING AG: the local shard is already in local_chunk(); returns
        act(alpha AG(X) op(weight) + beta out + bias) [T, N], op(weight) = weight.T for weight
        [N, H], or weight itself with trans_w=True (weight [H, N]). Afterwards buffer() holds
        AG(X)."""
        where = f"ag_gemm on '{self.name}'"
        o = _parse_options(where, options) if options else _DEFAULT_OPTS
        if o.trans_a:
            raise TpflexUnsupportedError("ag_gemm's activation is the gathered buffer [T, H]; "
                                         "trans_a is not available (trans_w is)", where)
        T, H = self.active_shape
        wr, wc = self._dims(where, "weight", weight)
        N = wc if o.trans_w else wr
        w = self._mat(where, "weight (trans_w: [H, N])" if o.trans_w else "weight", weight,
                      (H, None) if o.trans_w else (None, H), (self.dtype,))
        outs = (self.dtype, torch.float32) if self.dtype != torch.float32 else (self.dtype,)
        out, d = self._out(where, out, (T, N), self.dtype, outs, o)
        self._call(where, lib.tpf_ag_gemm, lib.tpf_ag_gemm_ex, (w, d), o,
                   self._bias(where, o, N, out))
        return out

    def gemm_rs(self, x: torch.Tensor, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING/PIPELINE RS: returns rows [r*T/P, (r+1)*T/P) of
        act(alpha sum_ranks op(x) op(weight) + beta out + bias), [T/P, H]. op(x) = x [T, K] (x
        [K, T] with trans_a); op(weight) = weight.T for weight [H, K] (weight [K, H] with
        trans_w)."""
        where = f"gemm_rs on '{self.name}'"
        o = _parse_options(where, options) if options else _DEFAULT_OPTS
        T, H = self.active_shape
        xr, xc = self._dims(where, "x", x)
        K = xr if o.trans_a else xc
        ins = (self.dtype,)
        xm = self._mat(where, "x (trans_a: [K, T])" if o.trans_a else "x", x,
                       (None, T) if o.trans_a else (T, None), ins)
        w = self._mat(where, "weight (trans_w: [K, H])" if o.trans_w else "weight", weight,
                      (K, H) if o.trans_w else (H, K), ins)
        rows = T // self.tp_size
        outs = (self.dtype, torch.float32) if self.dtype != torch.float32 else (self.dtype,)
        out, d = self._out(where, out, (rows, H), self.dtype, outs, o)
        self._call(where, lib.tpf_gemm_rs, lib.tpf_gemm_rs_ex, (xm, w, d), o,
                   self._bias(where, o, H, out))
        return out

    def bulk_overlap(self, a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None,
                     **options: Any) -> torch.Tensor:
        """BULK: the collective runs on the buffer in place (AG: local chunk in, [T, H] out; RS:
        [T, H] partials in, local_chunk() reduced) while out = act(alpha op(a) op(b) + beta out
        + bias) runs beside it. op(a) = a [M, K] (a [K, M] with trans_a); op(b) = b.T for b
        [N, K] (b [K, N] with trans_w). a, b, out must not alias this communicator's buffer."""
        where = f"bulk_overlap on '{self.name}'"
        o = _parse_options(where, options) if options else _DEFAULT_OPTS
        ar, ac = self._dims(where, "a", a)
        M, K = (ac, ar) if o.trans_a else (ar, ac)
        am = self._mat(where, "a (trans_a: [K, M])" if o.trans_a else "a", a, (None, None),
                       _GEMM_DTYPES)
        br, bc = self._dims(where, "b", b)
        N = bc if o.trans_w else br
        bm = self._mat(where, "b (trans_w: [K, N])" if o.trans_w else "b", b,
                       (K, None) if o.trans_w else (None, K), (a.dtype,))
        outs = (a.dtype, torch.float32) if a.dtype != torch.float32 else (a.dtype,)
        out, d = self._out(where, out, (M, N), a.dtype, outs, o)
        self._call(where, lib.tpf_bulk_overlap, lib.tpf_bulk_overlap_ex, (am, bm, d), o,
                   self._bias(where, o, N, out))
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
