"""TransformerEngine-style API over tpflex, on torch tensors.

    mgr = initialize_ub([max_tokens, hidden], tp_size, dtype=torch.bfloat16, backend="sim")
    set_ub_active_shape([T, hidden])          # per microbatch, all-or-nothing
    ub = get_ub("fc1_fprop"); ub.local_chunk().copy_(x_local); y = ub.ag_gemm(w)
    destroy_ub()

With backend="sim" the calling thread must be a simulator rank (inside tpflex.sim.run); module
state is then per rank. Tensors are checked (device, dtype, shape, strides) before any C call;
buffer()/local_chunk() are zero-copy views of the registration."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _lib, sim
from ._lib import CommConfig, Matrix, Shape, check, lib
from .errors import (TpflexError, TpflexInvalidError, TpflexShapeError, TpflexStateError,
                     TpflexUnsupportedError, error_for)

_TORCH_TO_TPF = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
_TPF_TO_TORCH = {v: k for k, v in _TORCH_TO_TPF.items()}
_ALGO = {"bulk": 0, "pipeline": 1, "ring": 2}
_COLL = {"ag": 0, "rs": 1}

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

# Per-operation options of API v1. Not in the C API yet: the single mapping point below accepts
# them and refuses any non-default value; wiring them later means filling _map_options.
_OPTION_DEFAULTS: Dict[str, Any] = {
    "transa": False, "transb": False, "alpha": 1.0, "beta": 0.0, "bias": None, "gelu": False,
    "gelu_out": None, "accumulate": False, "num_splits": None, "splits": None, "stream": None,
}


def _map_options(op: str, options: Dict[str, Any]) -> None:
    for k, v in options.items():
        if k not in _OPTION_DEFAULTS:
            raise TpflexInvalidError(f"unknown option '{k}' (known: {sorted(_OPTION_DEFAULTS)})", op)
        d = _OPTION_DEFAULTS[k]
        if k == "stream" and v is None or k in ("num_splits", "splits") and v in (None, 0):
            continue
        is_default = (v is None and d is None) or (d is not None and v is not None and
                                                   type(v) in (bool, int, float) and v == d)
        if not is_default:
            raise TpflexUnsupportedError(
                f"option {k}={v!r} is not supported by this libtpflex yet (only the default "
                f"{k}={d!r}); per-operation options are being added to the C API", op)


class _Global:
    manager: Optional["Manager"] = None


_global = _Global()
_thread_state = threading.local()


def _state() -> Dict[str, Any]:
    ctx = sim.current()
    if ctx is not None:
        return ctx.state
    st = getattr(_thread_state, "d", None)
    if st is None:
        st = _thread_state.d = {}
    return st


def _shape_str(s: Sequence[int]) -> str:
    return "[" + ", ".join(str(x) if isinstance(x, str) else str(int(x)) for x in s) + "]"


def _as_shape(shape: Sequence[int], what: str) -> Shape:
    if len(shape) != 2:
        raise TpflexShapeError(f"{what} must be 2-D [tokens, hidden], got {_shape_str(shape)}",
                               what)
    return Shape(int(shape[0]), int(shape[1]))


def _view(m: Matrix) -> torch.Tensor:
    """Zero-copy torch view of a tpf_matrix in host memory (the simulator's arena)."""
    dt = _TPF_TO_TORCH[m.dtype]
    esize = torch.empty((), dtype=dt).element_size()
    if m.rows == 0:
        return torch.empty((0, m.cols), dtype=dt)
    n = int((m.rows - 1) * m.ld + m.cols)
    buf = (ctypes.c_char * (n * esize)).from_address(m.ptr)
    flat = torch.frombuffer(buf, dtype=dt, count=n)
    return flat.as_strided((int(m.rows), int(m.cols)), (int(m.ld), 1))


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
        out = ctypes.c_uint64()
        check(lib.tpf_comm_legal_rows(self._handle(), rows, ctypes.byref(out)), self.name)
        return int(out.value)

    def set_active_shape(self, shape: Sequence[int]) -> None:
        check(lib.tpf_comm_set_active_shape(self._handle(), _as_shape(shape, "shape")), self.name)

    def buffer(self) -> torch.Tensor:
        """The active buffer [T, H] (RING RS: all 2P-1 slots) as a zero-copy tensor view."""
        m = Matrix()
        check(lib.tpf_comm_buffer(self._handle(), ctypes.byref(m)), f"{self.name}.buffer")
        return self._mgr._view(m)

    def local_chunk(self) -> torch.Tensor:
        """This rank's [T/P, H] shard of the buffer as a zero-copy tensor view."""
        m = Matrix()
        check(lib.tpf_comm_local_chunk(self._handle(), ctypes.byref(m)), f"{self.name}.local_chunk")
        return self._mgr._view(m)

    # ---- validation ----
    def _mat(self, op: str, what: str, t: Any, shape: Tuple[Optional[int], Optional[int]],
             dtypes: Tuple[torch.dtype, ...]) -> Matrix:
        where = f"{op} on '{self.name}'"
        if not isinstance(t, torch.Tensor):
            raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(t).__name__}", where)
        if t.device != self._mgr.device:
            raise TpflexInvalidError(f"{what} is on {t.device}, expected {self._mgr.device}", where)
        if t.dtype not in dtypes:
            raise TpflexInvalidError(
                f"{what} has dtype {t.dtype}, expected {' or '.join(str(d) for d in dtypes)}", where)
        want = _shape_str([s if s is not None else "*" for s in shape])
        if t.dim() != 2 or any(s is not None and s != g for s, g in zip(shape, t.shape)):
            raise TpflexShapeError(f"{what} has shape {_shape_str(t.shape)}, expected {want}", where)
        rows, cols = int(t.shape[0]), int(t.shape[1])
        s0, s1 = t.stride()
        if cols > 1 and s1 != 1 or rows > 1 and s0 < cols:
            raise TpflexShapeError(
                f"{what} has strides {tuple(t.stride())} for shape {_shape_str(t.shape)}, expected "
                f"contiguous rows (stride 1) and a leading dimension >= {cols}", where)
        ld = s0 if rows > 1 else cols
        return Matrix(t.data_ptr(), rows, cols, max(ld, cols), _TORCH_TO_TPF[t.dtype])

    def _out(self, out: Optional[torch.Tensor], shape: Tuple[int, int]) -> torch.Tensor:
        if out is None:
            return torch.empty(shape, dtype=self.dtype, device=self._mgr.device)
        return out

    def _io_dtypes(self) -> Tuple[Tuple[torch.dtype, ...], Tuple[torch.dtype, ...]]:
        return (self.dtype,), tuple(dict.fromkeys((self.dtype, torch.float32)))

    # ---- operations ----
    def ag_gemm(self, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING AG: the local shard is already in local_chunk(); returns AG(X) @ weight.T [T, N]
        (weight [N, H]); afterwards buffer() holds AG(X)."""
        _map_options("ag_gemm", options)
        T, H = self.active_shape
        ins, outs = self._io_dtypes()
        w = self._mat("ag_gemm", "weight", weight, (None, H), ins)
        out = self._out(out, (T, int(weight.shape[0])))
        d = self._mat("ag_gemm", "out", out, (T, int(weight.shape[0])), outs)
        check(lib.tpf_ag_gemm(self._handle(), ctypes.byref(w), ctypes.byref(d), None),
              f"ag_gemm on '{self.name}'")
        return out

    def gemm_rs(self, x: torch.Tensor, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING/PIPELINE RS: x [T, K], weight [H, K]; returns rows [r*T/P, (r+1)*T/P) of the sum
        over ranks of x @ weight.T, [T/P, H]."""
        _map_options("gemm_rs", options)
        T, H = self.active_shape
        ins, outs = self._io_dtypes()
        xm = self._mat("gemm_rs", "x", x, (T, None), ins)
        K = int(x.shape[1])
        w = self._mat("gemm_rs", "weight", weight, (H, K), ins)
        rows = T // self.tp_size if T % self.tp_size == 0 else T
        out = self._out(out, (rows, H))
        d = self._mat("gemm_rs", "out", out, (rows, H), outs)
        check(lib.tpf_gemm_rs(self._handle(), ctypes.byref(xm), ctypes.byref(w), ctypes.byref(d),
                              None), f"gemm_rs on '{self.name}'")
        return out

    def bulk_overlap(self, a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None,
                     **options: Any) -> torch.Tensor:
        """BULK: the collective runs on the buffer in place (AG: local chunk in, [T, H] out; RS:
        [T, H] partials in, local_chunk() reduced) while out = a @ b.T (a [M, K], b [N, K])."""
        _map_options("bulk_overlap", options)
        ins, outs = self._io_dtypes()
        am = self._mat("bulk_overlap", "a", a, (None, None), ins)
        M, K = int(a.shape[0]), int(a.shape[1])
        bm = self._mat("bulk_overlap", "b", b, (None, K), ins)
        N = int(b.shape[0])
        out = self._out(out, (M, N))
        d = self._mat("bulk_overlap", "out", out, (M, N), outs)
        check(lib.tpf_bulk_overlap(self._handle(), ctypes.byref(am), ctypes.byref(bm),
                                   ctypes.byref(d), None), f"bulk_overlap on '{self.name}'")
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
                f"{self.tp_size} active {list(self.active_shape)} capacity "
                f"{list(self.capacity_shape)} epoch {self.epoch}>")


class Manager:
    """A tpf_manager holding TE's communicators; returned by initialize_ub."""

    def __init__(self, backend_handle: int, tp_size: int, rank: int, device: torch.device) -> None:
        h = ctypes.c_void_p()
        check(lib.tpf_manager_create(backend_handle, ctypes.byref(h)), "tpf_manager_create")
        self._h: Optional[int] = h.value
        self.tp_size = tp_size
        self.rank = rank
        self.device = device
        self._comms: Dict[str, Communicator] = {}

    def _view(self, m: Matrix) -> torch.Tensor:
        if self.device.type != "cpu":
            raise TpflexUnsupportedError("device buffer views need the CUDA binding", "buffer")
        return _view(m)

    def add(self, name: str, method: str, coll: str, dtype: torch.dtype, capacity: Shape,
            external: bool = False, num_splits: int = 0, aggregate: bool = False) -> Communicator:
        if self._h is None:
            raise TpflexStateError("manager destroyed", "add")
        cfg = CommConfig(size=ctypes.sizeof(CommConfig), name=name.encode(), algo=_ALGO[method], coll=_COLL[coll],
                         dtype=_TORCH_TO_TPF[dtype], capacity=capacity, num_splits=num_splits,
                         aggregate=aggregate, external=external)
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
        if name not in self._comms:
            raise TpflexInvalidError(f"no communicator named '{name}' (have: "
                                     f"{', '.join(self._comms)})", "get_ub")
        return self._comms[name]

    @property
    def names(self) -> List[str]:
        return list(self._comms)

    def __len__(self) -> int:
        return 0 if self._h is None else int(lib.tpf_manager_count(self._h))

    def destroy(self) -> None:
        if self._h is not None:
            h, self._h = self._h, None
            check(lib.tpf_manager_destroy(h), "destroy_ub")


def initialize_ub(shape: Sequence[int], tp_size: int, dtype: torch.dtype = torch.bfloat16,
                  ub_cfgs: Optional[Dict[str, Dict[str, Any]]] = None, group: Any = None,
                  backend: str = "sim") -> Manager:
    """Registers TE's default communicators (DEFAULT_UB_CFGS, updated by ub_cfgs) at capacity
    `shape` = [max_tokens, hidden], once. Returns the manager (also the module's current one)."""
    if dtype not in _TORCH_TO_TPF:
        raise TpflexInvalidError(f"dtype {dtype} not supported (bf16, fp16, fp32)", "initialize_ub")
    cap = _as_shape(shape, "shape")
    st = _state()
    if st.get("manager") is not None:
        raise TpflexStateError("initialize_ub called twice without destroy_ub", "initialize_ub")
    if backend == "sim":
        ctx = sim.current()
        if ctx is None:
            raise TpflexStateError("backend='sim' must be called from a rank of tpflex.sim.run",
                                   "initialize_ub")
        if ctx.tp_size != tp_size:
            raise TpflexInvalidError(f"tp_size {tp_size} but the simulator world has "
                                     f"{ctx.tp_size} ranks", "initialize_ub")
        mgr = Manager(ctx.backend, tp_size, ctx.rank, torch.device("cpu"))
    elif backend == "cuda":
        why = ("the loaded libtpflex has no CUDA backend" if not _lib.HAVE_CUDA else
               "the CUDA backend is not bound in Python yet (bootstrap over torch.distributed)")
        raise TpflexUnsupportedError(why, "initialize_ub")
    else:
        raise TpflexInvalidError(f"unknown backend '{backend}' (sim or cuda)", "initialize_ub")
    cfgs = {k: dict(v) for k, v in DEFAULT_UB_CFGS.items()}
    for k, v in (ub_cfgs or {}).items():
        cfgs.setdefault(k, {}).update(v)
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


def _manager() -> Manager:
    m = _state().get("manager")
    if m is None:
        raise TpflexStateError("initialize_ub has not been called on this rank", "tpflex.torch")
    return m


def set_ub_active_shape(shape: Sequence[int]) -> None:
    """Applies [T, H] to every eligible communicator, all-or-nothing."""
    _manager().set_active_shape(shape)


def get_ub(name: str) -> Communicator:
    return _manager().get(name)


def destroy_ub() -> None:
    st = _state()
    m = st.pop("manager", None)
    if m is not None:
        m.destroy()


__all__ = ["initialize_ub", "set_ub_active_shape", "get_ub", "destroy_ub", "Manager",
           "Communicator", "DEFAULT_UB_CFGS"]
