"""The manager: a tpf_manager holding one rank's named communicators, which share one active
shape (set all-or-nothing), and legal_rows over all of them."""
from __future__ import annotations

import ctypes
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import _observe
from ._bootstrap import CudaBackend
from ._checks import U64_MAX, as_shape, int_arg
from ._comm import Communicator
from ._lib import CommConfig, Shape, SiteGeometry, check, lib
from ._types import ALGO, COLL, TORCH_TO_TPF
from .errors import (TpflexAlignError, TpflexDivisibleError, TpflexError, TpflexInvalidError,
                     TpflexStateError)


class Lifetime:
    """The C objects of one manager: the tpf_manager with its communicators' registrations and,
    on the simulator, a hold on the world's memory. Every torch view of a registration counts
    (the DLPack capsule's deleter context is this object: _dlpack.dlpack_view), and the C destroy
    runs when the manager is closed AND no view is left: at close, or later, when torch frees the
    last view (whatever thread that is on). So a view read after destroy_ub, or after the
    simulator world closed, reads memory that is still registered, and a later initialize_ub
    cannot be given the same memory while an old view exists.

    Deferring is safe on the simulator, whose destroy is local to the rank. The CUDA backend's is
    collective (barriers over the bootstrap), so there Manager.destroy refuses instead while a
    view exists on any rank (agreed over the bootstrap first)."""

    def __init__(self, handle: int, release_world: Optional[Callable[[], None]]) -> None:
        self.h: Optional[int] = handle
        self.views = 0
        self.closed = False
        self.deferred = False
        self._release_world = release_world
        self._lock = threading.Lock()

    def retain_view(self) -> None:
        with self._lock:
            self.views += 1

    def release_view(self) -> None:
        with self._lock:
            self.views -= 1
            ready = self.closed and self.views == 0
        if ready:
            self._destroy()

    def close(self) -> bool:
        """Marks the manager closed; destroys now (True) unless views remain (False)."""
        with self._lock:
            self.closed = True
            ready = self.views == 0
            self.deferred = not ready
        if ready:
            self._destroy()
        return ready

    def _destroy(self) -> None:
        with self._lock:
            h, self.h = self.h, None
            release, self._release_world = self._release_world, None
        try:
            if h is not None:
                check(lib.tpf_manager_destroy(h), "destroy_ub")
        finally:
            if release is not None:
                release()


class Manager:
    """A tpf_manager holding TE's communicators; returned by initialize_ub."""

    def __init__(self, backend_handle: int, tp_size: int, rank: int, device: torch.device,
                 owner: Optional[CudaBackend] = None,
                 keep_world: Optional[Callable[[], Callable[[], None]]] = None) -> None:
        h = ctypes.c_void_p()
        check(lib.tpf_manager_create(backend_handle, ctypes.byref(h)), "tpf_manager_create")
        release_world = None
        try:
            release_world = keep_world() if keep_world is not None else None
        except BaseException:
            lib.tpf_manager_destroy(h.value)
            raise
        self._h: Optional[int] = h.value
        self._life = Lifetime(h.value, release_world)  # type: ignore[arg-type]
        self.tp_size = tp_size
        self.rank = rank
        self.device = device
        self.backend = getattr(owner, "kind", "cuda") if owner is not None else "sim"
        self._owner = owner
        self._comms: Dict[str, Communicator] = {}
        # tpf_manager_geometry's records (reused; grown with the communicators) and the
        # communicators by handle, to hand each its record.
        self._geo: Optional[ctypes.Array] = None
        self._by_handle: Dict[int, Communicator] = {}
        # Shape changes made through this manager (set_active_shape, a Communicator's): an
        # active_tokens context that recorded the count still describes the active shape.
        self._serial = 0
        # The shape active_tokens owes on exit, applied by the next call that uses the shape
        # (Communicator._handle, the operations) or superseded by the next set_active_shape.
        self._pending: Optional[Tuple[int, int]] = None

    def add(self, name: str, method: str, coll: str, dtype: torch.dtype, capacity: Shape,
            external: bool = False, num_splits: int = 0, aggregate: bool = False) -> Communicator:
        """Registers one communicator at `capacity` (collective: every rank adds the same ones
        in the same order). method: "bulk", "pipeline" or "ring"; coll: "ag" or "rs"."""
        if self._h is None:
            raise TpflexStateError("manager destroyed", "add")
        if not isinstance(name, str) or not name or "\0" in name:
            raise TpflexInvalidError(f"name={name!r} must be a non-empty str without NUL", "add")
        if method not in ALGO or coll not in COLL:
            raise TpflexInvalidError(f"'{name}': method '{method}' / coll '{coll}' (methods: "
                                     f"{', '.join(ALGO)}; colls: {', '.join(COLL)})", "add")
        if dtype not in TORCH_TO_TPF:
            raise TpflexInvalidError(f"'{name}': dtype {dtype} not supported (bf16, fp16, fp32, "
                                     f"float8_e4m3fn, float8_e5m2)", "add")
        cfg = CommConfig(size=ctypes.sizeof(CommConfig), name=name.encode(), algo=ALGO[method],
                         coll=COLL[coll], dtype=TORCH_TO_TPF[dtype], capacity=capacity,
                         num_splits=num_splits, aggregate=aggregate, external=external)
        c = ctypes.c_void_p()
        check(lib.tpf_manager_add(self._h, ctypes.byref(cfg), ctypes.byref(c)), f"add '{name}'")
        comm = Communicator(self, c.value, name)  # type: ignore[arg-type]
        self._comms[name] = comm
        self._by_handle[comm._h] = comm
        return comm

    def _read_geometry(self, new: Optional[Communicator] = None) -> None:
        """Every site's geometry for the active shapes in one C call (tpf_manager_geometry),
        handed to each communicator (Communicator._apply_geometry). new: a communicator being
        added, not yet in _comms."""
        n = len(self._comms) + 1
        geo = self._geo
        if geo is None or len(geo) < n:
            geo = self._geo = (SiteGeometry * (2 * n))()
            geo[0].size = ctypes.sizeof(SiteGeometry)
        got = ctypes.c_int(0)
        check(lib.tpf_manager_geometry(self._h, geo, len(geo), ctypes.byref(got)),
              "set_ub_active_shape")
        by_h = self._by_handle
        for i in range(got.value):
            g = geo[i]
            c = by_h.get(g.comm)
            if c is None and new is not None and g.comm == new._h:
                c = new
            if c is not None:
                c._apply_geometry(g)

    def _eligible(self) -> List[Communicator]:
        """The communicators set_active_shape changes (the others stay at capacity)."""
        return [c for c in self._comms.values() if not c.external]

    def legal_rows(self, tokens: int) -> int:
        """The smallest T >= tokens that every communicator the active shape applies to accepts
        (pad a microbatch to it): a fixpoint over the communicators' legal_rows, each of which
        only grows T, bounded by the capacity (beyond it: TpflexCapacityError)."""
        where = "legal_rows"
        if self._h is None:
            raise TpflexStateError("manager destroyed", where)
        t = int_arg(where, "tokens", tokens, 0, U64_MAX)
        comms = self._eligible()
        stable = False
        while not stable:
            stable = True
            for c in comms:
                t2 = c.legal_rows(t)
                if t2 != t:
                    t, stable = t2, False
        return t

    def set_active_shape(self, shape: Sequence[int]) -> None:
        """tpf_manager_set_active_shape: every communicator of the manager to [T, H],
        all-or-nothing, no allocation (a refused T names the communicator and the T to pad to)."""
        if _observe.ON:  # profiler ranges or a trace (SPEC §16)
            return _observe.shape_change(self, shape, Manager._set_active_shape)
        self._set_active_shape(shape)

    def _set_active_shape(self, shape: Sequence[int]) -> None:
        where = "set_ub_active_shape"
        if self._h is None:
            raise TpflexStateError("manager destroyed", where)
        s = as_shape(where, "shape", shape)
        # A restore active_tokens still owes is superseded by this shape, or applied (the
        # _handle of _shape_hint's legal_rows) when this one is refused.
        pending, self._pending = self._pending, None
        try:
            check(lib.tpf_manager_set_active_shape(self._h, s), where)
        except TpflexError as e:
            self._pending = pending
            if isinstance(e, (TpflexDivisibleError, TpflexAlignError)):
                raise self._shape_hint(e, s) from None
            raise
        self._serial += 1
        # Every site's views from the C library's records (one call); the eager views are
        # taken on first use.
        self._read_geometry()

    def _settle(self) -> None:
        """Applies the shape active_tokens restored on exit (see _pending)."""
        shape, self._pending = self._pending, None
        if shape is not None and self._h is not None:
            self.set_active_shape(shape)

    def _shape_hint(self, e: TpflexError, s: Shape) -> TpflexError:
        """The refusal of a row count, naming the communicator that refused it and the row count
        to pad to (legal_rows)."""
        T = int(s.rows)
        refusing = None
        for c in self._eligible():
            try:
                if c.legal_rows(T) != T:
                    refusing = c
                    break
            except TpflexError:
                continue
        try:
            hint = (f"pad to legal_rows({T}) = {self.legal_rows(T)}, the smallest T >= {T} every "
                    f"communicator accepts")
        except TpflexError as e2:
            hint = f"no T >= {T} is legal for every communicator ({e2.detail})"
        detail = e.detail
        if refusing is not None and f"'{refusing.name}'" not in detail:
            detail = (f"'{refusing.name}' ({refusing.algo} {refusing.coll}) refuses {T} rows: "
                      f"{detail}")
        return type(e)(f"{detail}; {hint}", e.call)

    def get(self, name: str) -> Communicator:
        """The communicator registered as ``name`` (an unknown name lists the known ones)."""
        if self._h is None:
            raise TpflexStateError("manager destroyed", "get_ub")
        c = self._comms.get(name) if isinstance(name, str) else None
        if c is None:
            raise TpflexInvalidError(f"no communicator named {name!r} (have: "
                                     f"{', '.join(self._comms)})", "get_ub")
        return c

    @property
    def names(self) -> List[str]:
        """The registered communicators' names, in registration order."""
        return list(self._comms)

    def __len__(self) -> int:
        return 0 if self._h is None else int(lib.tpf_manager_count(self._h))

    def destroy(self) -> None:
        """Collective: destroys every communicator, then (CUDA) the backend. Afterwards the
        communicators refuse every call (TpflexStateError). Simulator: while a torch view of a
        registration is alive, its memory stays registered and the C destroy waits for the last
        view (Lifetime). CUDA: refused (TpflexStateError on every rank, nothing destroyed) while
        any rank holds a view; del the views and call again."""
        if self._h is None:
            return
        self._pending = None
        for c in self._comms.values():
            c._drop_views()
        if self._owner is not None:
            self._refuse_with_views()
        self._h = None
        try:
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            self._life.close()
        finally:
            if self._owner is not None:
                owner, self._owner = self._owner, None
                owner.destroy()

    def _refuse_with_views(self) -> None:
        """CUDA: every rank learns which ranks still hold views before anyone destroys."""
        assert self._owner is not None
        views = self._owner.boot.allgather_object(self._life.views)
        holders = [f"rank {q} ({n})" for q, n in enumerate(views) if n]
        if holders:
            raise TpflexStateError(
                f"torch views of the registrations are still alive on {', '.join(holders)} "
                f"(registrations with live views); the CUDA backend's destroy is collective, "
                f"so nothing was destroyed: del the buffer()/local_chunk() views and call "
                f"destroy_ub again", "destroy_ub")

    def __repr__(self) -> str:
        state = "destroyed" if self._h is None else f"{len(self._comms)} communicators"
        return (f"<tpflex.Manager {self.backend} rank {self.rank}/{self.tp_size} on "
                f"{self.device}: {state}>")

