"""A communicator: one registered site (tpf_comm) of a manager, with its zero-copy views and its
operations (the custom ops of _ops.py)."""
from __future__ import annotations

import ctypes
import sys
import weakref
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from . import _lib, _observe, _ops
from ._checks import (U64_MAX, as_shape, beta_needs_out, default_out_dtype, dims, int_arg,
                      need_tensor, plan_ag_gemm, plan_bulk, plan_gemm_rs, shape_str)
from ._dlpack import dlpack_view
from ._lib import Matrix, check, lib
from ._options import (DEFAULT_FAST, DEFAULT_OPTS, FastOpts, Opts, fast_options, opts_struct,
                       parse_options)
from ._state import register_comm, state
from ._types import ALGO_NAME, COLL_NAME, TORCH_TO_TPF, TPF_TO_TORCH
from .errors import (TpflexAlignError, TpflexDivisibleError, TpflexError, TpflexInvalidError,
                     TpflexStateError, TpflexUnsupportedError, error_for)

if TYPE_CHECKING:
    from ._manager import Manager


# A TpflexError out of an operation is raised from the method's own frame (`raise
# e.with_traceback(None)` in ag_gemm, gemm_rs, bulk_overlap): the frames below it hold views of the
# registration in their locals, which would keep it alive while the caller handles the error (on
# CUDA destroy_ub refuses while a view lives). Under tracing dynamo's own error handling applies.


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# No __torch_function__ / __torch_dispatch__ of their own:
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether an operation may call its implementation directly instead of through its
    torch.library custom op (the op's dispatch costs tens of µs per call): in
    eager mode only, with no dispatch mode active (fake tensors, tracing), plain tensors (or
    nn.Parameters: a layer's weight), and no input that autograd would need to see (the op then
    raises its 'no autograd formula' on backward, as before). Under torch.compile the op is what
    gets traced."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() != 0:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


def _meta(t: Optional[torch.Tensor]) -> Any:
    """What the checks of _checks.py read of a tensor (they are pure functions of it)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _metas(out: Any, bias: Any, sa: Any, sw: Any) -> Any:
    """_meta of an operation's optional tensors, in one call (out alone: its _meta)."""
    m = None if out is None else (out.shape, out.stride(), out.dtype, out.device)
    if bias is None and sa is None and sw is None:
        return m
    return (m, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            None if sa is None else (sa.shape, sa.stride(), sa.dtype, sa.device),
            None if sw is None else (sw.shape, sw.stride(), sw.dtype, sw.device))


_MEMO_MAX = 512  # checked signatures kept per communicator (cleared when full)


# What the checks computed for a remembered signature: the output's geometry, each operand's
# leading dimension and tpf_dtype, the dtype of an output allocated for the caller.
class _AgMemo(NamedTuple):
    n: int
    ld_w: int
    ld_d: int
    w_dtype: int
    out_dtype: torch.dtype
    d_dtype: int


class _RsMemo(NamedTuple):
    rows: int
    ld_x: int
    ld_w: int
    ld_d: int
    x_dtype: int
    w_dtype: int
    out_dtype: torch.dtype
    d_dtype: int


class _BulkMemo(NamedTuple):
    m: int
    n: int
    ld_a: int
    ld_b: int
    ld_d: int
    a_dtype: int
    b_dtype: int
    out_dtype: torch.dtype
    d_dtype: int

# Stale views (issue 41): a buffer() / local_chunk() view a caller still held when the active
# shape changed, by id: (weakref to the view, weakref to its communicator, which view, its
# geometry, the active shape it was taken at). Recorded when the communicator drops the view
# from its cache (one refcount test per view per shape change: nothing on the operations' path
# while no such view lives); an operation given one whose geometry is no longer the active one
# refuses it. A copy_ into such a view cannot be intercepted (it is a plain torch tensor).
_STALE: Dict[int, Tuple[Any, Any, str, Tuple[int, int, int, int], Tuple[int, int]]] = {}


def _forget(key: int) -> Any:
    return lambda _ref: _STALE.pop(key, None)


def _check_views(where: str, *named: Tuple[str, Any]) -> None:
    """Refuses an operation argument that is a view of a registration taken before the active
    shape moved it (TpflexStateError naming the view and the shapes)."""
    for arg, t in named:
        hit = _STALE.get(id(t)) if t is not None else None
        if hit is None or hit[0]() is not t:
            continue
        comm = hit[1]()
        if comm is None or comm._mgr._h is None:
            continue
        comm._refresh_views()
        now = comm._gbuf if hit[2] == "buffer" else comm._gchunk
        if now != hit[3]:
            raise TpflexStateError(
                f"{arg} is a {hit[2]}() view of '{comm.name}' taken while the active shape was "
                f"{list(hit[4])}; it is now {list(comm._active)}, so the view covers other rows: "
                f"take {hit[2]}() again after set_ub_active_shape / active_tokens", where)


class Communicator:
    """One registered site (tpf_comm). Its operations are the custom ops torch.ops.tpflex.*
    (usable under torch.compile); each method has one path (_ag_gemm, ...): a call whose
    signature passed the checks before is the C function alone, any other parses the options
    and calls the op, or, eagerly, its implementation directly (_direct)."""

    def __init__(self, manager: "Manager", handle: int, name: str) -> None:
        self._mgr = manager
        self._h = handle
        self.name = name
        cfg = lib.tpf_comm_config_of(handle).contents
        self.algo = ALGO_NAME[cfg.algo]
        self.coll = COLL_NAME[cfg.coll]
        self.external = bool(cfg.external)
        self._cols = int(cfg.capacity.cols)
        self.dtype: torch.dtype = TPF_TO_TORCH[cfg.dtype]
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
        # The remembered path of the operations (_ag_gemm, ...): the `where` of each one, the
        # binding (state dict) the key resolves in, the active shape of the views' epoch, and
        # the signatures (tensor metadata and flags) that passed every check, with what the
        # checks computed (leading dimensions, output shape and dtype).
        self._w_ag = f"ag_gemm on '{name}'"
        self._w_rs = f"gemm_rs on '{name}'"
        self._w_bulk = f"bulk_overlap on '{name}'"
        self._active: Tuple[int, int] = (0, 0)
        self._memo: Dict[Any, Tuple[Any, ...]] = {}
        self._cuda = self.device.type == "cuda"
        self.key = register_comm(self)
        self._home = state()
        self._refresh_views()

    @property
    def supports_options(self) -> Optional[bool]:
        """Whether the backend honours transposes and epilogues (TPF_BE_CAP_OPTIONS); without
        them the C library refuses those options with TpflexUnsupportedError. None when the
        library cannot tell."""
        return None if self.backend_caps is None else bool(self.backend_caps & _lib.CAP_OPTIONS)

    def _drop_views(self) -> None:
        """Forgets this communicator's own references to its views (destroy_ub)."""
        self._vbuf = self._vchunk = self._reg = None
        self._vepoch = -1

    def _handle(self) -> int:
        m = self._mgr
        if m._h is None:
            raise TpflexStateError(f"communicator '{self.name}' used after destroy_ub()", self.name)
        if m._pending is not None:  # active_tokens' restore, applied before the shape is used
            m._settle()
        return self._h

    @property
    def active_shape(self) -> Tuple[int, int]:
        """(T, H): the manager's active shape as this communicator runs it (an external one
        stays at its capacity)."""
        s = lib.tpf_comm_active_shape(self._handle())
        return (int(s.rows), int(s.cols))

    @property
    def capacity_shape(self) -> Tuple[int, int]:
        """(C, H): the shape registered once, at capacity."""
        s = lib.tpf_comm_capacity_shape(self._handle())
        return (int(s.rows), int(s.cols))

    @property
    def epoch(self) -> int:
        """The shape epoch: it changes with every active shape change (views are cached per
        epoch)."""
        return int(lib.tpf_comm_epoch(self._handle()))

    def legal_rows(self, rows: int) -> int:
        """The smallest legal active row count >= rows for this communicator alone (pad a
        microbatch to the manager's legal_rows, which every communicator accepts)."""
        where = f"legal_rows on '{self.name}'"
        n = int_arg(where, "rows", rows, 0, U64_MAX)
        out = ctypes.c_uint64()
        check(lib.tpf_comm_legal_rows(self._handle(), n, ctypes.byref(out)), where)
        return int(out.value)

    def registration(self) -> Tuple[int, int]:
        """(address, bytes) of the whole registration: fixed from creation to destroy."""
        base, n = ctypes.c_void_p(), ctypes.c_uint64()
        check(lib.tpf_comm_registration(self._handle(), ctypes.byref(base), ctypes.byref(n)),
              f"{self.name}.registration")
        return int(base.value or 0), int(n.value)

    def set_active_shape(self, shape: Sequence[int]) -> None:
        """This communicator alone (the manager's set_ub_active_shape sets every one). A row
        count it refuses names the row count to pad to."""
        if _observe.ON:  # profiler ranges or a trace (SPEC §16)
            return _observe.shape_change(self, shape, Communicator._set_active_shape)
        self._set_active_shape(shape)

    def _set_active_shape(self, shape: Sequence[int]) -> None:
        s = as_shape(self.name, "shape", shape)
        try:
            check(lib.tpf_comm_set_active_shape(self._handle(), s), self.name)
        except (TpflexDivisibleError, TpflexAlignError) as e:
            T = int(s.rows)
            try:
                hint = f"pad to legal_rows({T}) = {self.legal_rows(T)}"
            except TpflexError as e2:
                hint = f"no T >= {T} is legal here ({e2.detail})"
            raise type(e)(f"{e.detail}; {hint}", e.call) from None
        self._mgr._serial += 1  # an active_tokens context no longer describes every site
        self._refresh_views()

    # ---- zero-copy views ----
    def _refresh_views(self) -> None:
        """Takes the views again when the shape epoch changed (one C call when it did not):
        the manager reads every site's geometry in one call (_apply_geometry)."""
        if int(lib.tpf_comm_epoch(self._handle())) != self._vepoch:
            self._mgr._read_geometry(self)

    def _apply_geometry(self, g: Any) -> None:
        """This site's record of tpf_manager_geometry (a _lib.SiteGeometry): the geometry the
        views and the code under torch.compile read, as the C library computes it (RING RS: the
        buffer is every 2P-1 slot and the local shard is slot P-1: core/layout.c). The eager
        views are taken on first use. Nothing to do when the epoch is the one applied."""
        epoch = int(g.epoch)
        if epoch == self._vepoch:
            return
        self._retire_views()
        if self._reg is None:
            # The views keep the registration alive: the capsule holds the manager's lifetime
            # (see _manager.Lifetime), so the C destroy waits for the last view.
            base, nbytes = int(g.base or 0), int(g.registered_bytes)
            esz = torch.empty((), dtype=self.dtype).element_size()
            self._reg = dlpack_view(base, 1, nbytes // esz, nbytes // esz, self.dtype,
                                    self.device, owner=self._mgr._life)[0]
        esz = self._reg.element_size()
        ld, boff, coff = int(g.ld), int(g.buffer_off_bytes), int(g.chunk_off_bytes)
        if TPF_TO_TORCH[g.dtype] != self.dtype or boff % esz or coff % esz:
            raise TpflexStateError(f"'{self.name}': views at byte offsets {boff}, {coff} of "
                                   f"dtype {TPF_TO_TORCH[g.dtype]} are not elements of the "
                                   f"registration ({self.dtype})", self.name)
        self._gbuf = (int(g.buffer_rows), ld, ld, boff // esz)
        self._gchunk = (int(g.chunk_rows), ld, ld, coff // esz)
        self._active = (int(g.active.rows), int(g.active.cols))
        self._vbuf = self._vchunk = None  # made on first use (set_ub_active_shape stays cheap)
        self._vepoch = epoch

    def _retire_views(self) -> None:
        """The cached views are about to be dropped: one that a caller still holds is recorded
        in _STALE with the geometry it covers."""
        b, c = self._vbuf, self._vchunk
        if b is None and c is None:   # no view taken since the last change: nothing to do
            return
        # references: the attribute, the local, getrefcount's argument; more: a caller's
        if b is not None and sys.getrefcount(b) > 3:
            self._stale(b, self._gbuf, "buffer")
        if c is not None and sys.getrefcount(c) > 3:
            self._stale(c, self._gchunk, "local_chunk")

    def _stale(self, v: torch.Tensor, g: Tuple[int, int, int, int], kind: str) -> None:
        if id(v) not in _STALE:
            _STALE[id(v)] = (weakref.ref(v, _forget(id(v))), weakref.ref(self), kind, g,
                             self._active)

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
                f"the registration buffer passed is {shape_str(buffer.shape)} {buffer.dtype} on "
                f"{buffer.device}; the active buffer is {shape_str(live.shape)} {live.dtype} "
                f"on {live.device} (a view from before set_ub_active_shape? take buffer() again)",
                where)
        if buffer.data_ptr() == live.data_ptr() and buffer.stride() == live.stride():
            return None
        return live

    def _stream_arg(self, where: str, o: Opts) -> Optional[int]:
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
            # The raw handle of the current stream, without building a torch.cuda.Stream
            # (several µs per call); the public call where the private one is missing.
            if _RAW_STREAM is not None:
                i = self.device.index
                return _RAW_STREAM(torch.cuda.current_device() if i is None else i)
            return torch.cuda.current_stream(self.device).cuda_stream
        return stream

    def _call(self, where: str, fn_plain: Any, fn_ex: Any, mats: Tuple[Matrix, ...], o: Opts,
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

    # ---- operations ----
    # One path per operation (_ag_gemm, _gemm_rs, _bulk_overlap). A plain eager call (options,
    # tensors and binding of the plain case, _eligible) whose signature (the metadata every
    # check reads, and the flags) passed every check before is one C call with what the checks
    # computed (an _AgMemo, ...). Anything else, and the first call of a signature, takes every
    # check (_checks.py: the tensor facts, then the C rulebook) and then the custom op or its
    # implementation; a plain signature that passed is remembered. The checks are pure
    # functions of that signature, so a remembered one passes them again.

    def _remember(self, key: Any, value: Tuple[Any, ...]) -> None:
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[key] = value

    def _cur_stream(self) -> Optional[int]:
        return self._stream_ptr("", None)

    def _eligible(self, options: Dict[str, Any], t1: Any, t2: Any,
                  t3: Any = None) -> Optional[FastOpts]:
        """The options of a call that may take the remembered path (a live manager with no
        shape change owed, plain tensors t1.. and bias, this thread's binding), else None."""
        f = fast_options(options) if options else DEFAULT_FAST
        if f is None or self._mgr._h is None or self._mgr._pending is not None:
            return None
        buf = self._vbuf
        if buf is None or lib.tpf_comm_epoch(self._h) != self._vepoch:
            buf = self._views()[0]
        if not _direct(buf, t1, t2, t3, f.bias) or state() is not self._home:
            return None
        return f

    def ag_gemm(self, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING AG: the local shard is already in local_chunk(); returns
        act(alpha AG(X) op(weight) + beta out + bias) [T, N], op(weight) = weight.T for weight
        [N, H], or weight itself with trans_w=True (weight [H, N]). Afterwards buffer() holds
        AG(X). torch.ops.tpflex.ag_gemm (out=None) / ag_gemm_out."""
        if torch.compiler.is_compiling():
            return self._ag_gemm(weight, out, options, True)
        if _STALE:
            _check_views(self._w_ag, ("weight", weight), ("out", out))
        try:
            if _observe.ON:  # profiler ranges or a trace (SPEC §16)
                return _observe.op(self, "ag_gemm", self._ag_gemm, weight, out, options)
            return self._ag_gemm(weight, out, options)
        except TpflexError as e:  # raised from this frame (see above)
            raise e.with_traceback(None)

    def _ag_gemm(self, weight: Any, out: Optional[torch.Tensor], options: Dict[str, Any],
                 traced: bool = False) -> torch.Tensor:
        key = f = None
        if not traced and weight is not None:
            f = self._eligible(options, weight, out)
        if f is not None:
            key = (self._active, f.trans_a, f.trans_w, f.beta != 0.0, weight.shape,
                   weight.stride(), weight.dtype, weight.device,
                   _metas(out, f.bias, f.a_scale_inv, f.w_scale_inv))
            m = self._memo.get(key)
            if m is not None:  # remembered: one C call
                n, ld_w, ld_d, w_dtype, out_dtype, d_dtype = m
                T = self._active[0]
                if out is None:
                    out = torch.empty((T, n), dtype=out_dtype, device=self.device)
                st = opts_struct(f) if options else None
                s = self._cur_stream() if self._cuda else None
                h, ws = self._h, weight.shape
                mw = Matrix(weight.data_ptr(), ws[0], ws[1], ld_w, w_dtype)
                md = Matrix(out.data_ptr(), T, n, ld_d, d_dtype)
                rc = (lib.tpf_ag_gemm(h, mw, md, s) if st is None
                      else lib.tpf_ag_gemm_ex(h, mw, md, st, s))
                if rc:
                    check(rc, self._w_ag)
                return out
        where = self._w_ag
        o = parse_options(where, options) if options else DEFAULT_OPTS
        stream = self._stream_arg(where, o) if o.stream is not None else None
        buf = self._views()[0]
        T, H = buf.shape
        if o.trans_a or (out is None and o.beta != 0.0):  # the rulebook names what is wrong
            n = plan_ag_gemm(where, self.device, self.dtype, T, H, weight, out, None, o.trans_w,
                             o.a_scale_inv, o.w_scale_inv, o.trans_a).n
            raise beta_needs_out(where, o.beta, (T, n))
        dims(where, "weight", weight)
        if out is not None:
            need_tensor(where, "out", out)
        if _direct(buf, weight, out, o.bias):
            res = _ops._ag_gemm_impl(self.name, self.key, buf, weight, out, o.bias, o.trans_w,
                                     o.alpha, o.beta, o.gelu, o.num_splits, stream,
                                     o.a_scale_inv, o.w_scale_inv)
        elif out is None:
            res = _ops.op_ag_gemm(self.name, self.key, buf, weight, o.bias, o.trans_w, o.alpha,
                                  o.gelu, o.num_splits, stream, o.a_scale_inv, o.w_scale_inv)
        else:
            _ops.op_ag_gemm_out(self.name, self.key, buf, weight, out, o.bias, o.trans_w,
                                o.alpha, o.beta, o.gelu, o.num_splits, stream, o.a_scale_inv,
                                o.w_scale_inv)
            res = out
        if key is not None and f is not None:  # passed: remember what the checks computed
            p = plan_ag_gemm(where, self.device, self.dtype, T, H, weight, out, f.bias,
                             f.trans_w, f.a_scale_inv, f.w_scale_inv)
            od = default_out_dtype(self.dtype) if out is None else out.dtype
            self._remember(key, _AgMemo(p.n, p.ld_w, p.n if out is None else p.ld_d,
                                        TORCH_TO_TPF[weight.dtype], od, TORCH_TO_TPF[od]))
        return res

    def gemm_rs(self, x: torch.Tensor, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                **options: Any) -> torch.Tensor:
        """RING/PIPELINE RS: returns rows [r*T/P, (r+1)*T/P) of
        act(alpha sum_ranks op(x) op(weight) + beta out + bias), [T/P, H]. op(x) = x [T, K] (x
        [K, T] with trans_a); op(weight) = weight.T for weight [H, K] (weight [K, H] with
        trans_w). torch.ops.tpflex.gemm_rs (out=None) / gemm_rs_out."""
        if torch.compiler.is_compiling():
            return self._gemm_rs(x, weight, out, options, True)
        if _STALE:
            _check_views(self._w_rs, ("x", x), ("weight", weight), ("out", out))
        try:
            if _observe.ON:  # profiler ranges or a trace (SPEC §16)
                return _observe.op(self, "gemm_rs", self._gemm_rs, x, weight, out, options)
            return self._gemm_rs(x, weight, out, options)
        except TpflexError as e:  # raised from this frame (see above)
            raise e.with_traceback(None)

    def _gemm_rs(self, x: Any, weight: Any, out: Optional[torch.Tensor],
                 options: Dict[str, Any], traced: bool = False) -> torch.Tensor:
        key = f = None
        if not traced and x is not None and weight is not None:
            f = self._eligible(options, x, weight, out)
        if f is not None:
            key = (self._active, f.trans_a, f.trans_w, f.beta != 0.0, x.shape, x.stride(),
                   x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
                   _metas(out, f.bias, f.a_scale_inv, f.w_scale_inv))
            m = self._memo.get(key)
            if m is not None:  # remembered: one C call
                rows, ld_x, ld_w, ld_d, x_dtype, w_dtype, out_dtype, d_dtype = m
                H = self._active[1]
                if out is None:
                    out = torch.empty((rows, H), dtype=out_dtype, device=self.device)
                st = opts_struct(f) if options else None
                s = self._cur_stream() if self._cuda else None
                h, xs, ws = self._h, x.shape, weight.shape
                mx = Matrix(x.data_ptr(), xs[0], xs[1], ld_x, x_dtype)
                mw = Matrix(weight.data_ptr(), ws[0], ws[1], ld_w, w_dtype)
                md = Matrix(out.data_ptr(), rows, H, ld_d, d_dtype)
                rc = (lib.tpf_gemm_rs(h, mx, mw, md, s) if st is None
                      else lib.tpf_gemm_rs_ex(h, mx, mw, md, st, s))
                if rc:
                    check(rc, self._w_rs)
                return out
        where = self._w_rs
        o = parse_options(where, options) if options else DEFAULT_OPTS
        stream = self._stream_arg(where, o) if o.stream is not None else None
        buf, chunk = self._views()
        T, H = chunk.shape[0] * self.tp_size, chunk.shape[1]
        dims(where, "x", x)
        need_tensor(where, "weight", weight)
        if out is None and o.beta != 0.0:
            rows = plan_gemm_rs(where, self.device, self.dtype, T, H, self.tp_size, x, weight,
                                None, None, o.trans_a, o.trans_w, o.a_scale_inv,
                                o.w_scale_inv).rows
            raise beta_needs_out(where, o.beta, (rows, H))
        if out is not None:
            need_tensor(where, "out", out)
        if _direct(buf, x, weight, out, o.bias):
            res = _ops._gemm_rs_impl(self.name, self.key, self.tp_size, buf, x, weight, out,
                                     o.bias, o.trans_a, o.trans_w, o.alpha, o.beta, o.gelu,
                                     o.num_splits, stream, o.a_scale_inv, o.w_scale_inv)
        elif out is None:
            res = _ops.op_gemm_rs(self.name, self.key, self.tp_size, buf, x, weight, o.bias,
                                  o.trans_a, o.trans_w, o.alpha, o.gelu, o.num_splits, stream,
                                  o.a_scale_inv, o.w_scale_inv)
        else:
            _ops.op_gemm_rs_out(self.name, self.key, self.tp_size, buf, x, weight, out, o.bias,
                                o.trans_a, o.trans_w, o.alpha, o.beta, o.gelu, o.num_splits,
                                stream, o.a_scale_inv, o.w_scale_inv)
            res = out
        if key is not None and f is not None:  # passed: remember what the checks computed
            T, H = self._active
            p = plan_gemm_rs(where, self.device, self.dtype, T, H, self.tp_size, x, weight, out,
                             f.bias, f.trans_a, f.trans_w, f.a_scale_inv, f.w_scale_inv)
            od = self.dtype if out is None else out.dtype
            self._remember(key, _RsMemo(p.rows, p.ld_x, p.ld_w, H if out is None else p.ld_d,
                                        TORCH_TO_TPF[x.dtype], TORCH_TO_TPF[weight.dtype], od,
                                        TORCH_TO_TPF[od]))
        return res

    def bulk_overlap(self, a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None,
                     **options: Any) -> torch.Tensor:
        """BULK: the collective runs on the buffer in place (AG: local chunk in, [T, H] out; RS:
        [T, H] partials in, local_chunk() reduced) while out = act(alpha op(a) op(b) + beta out
        + bias) runs beside it. op(a) = a [M, K] (a [K, M] with trans_a); op(b) = b.T for b
        [N, K] (b [K, N] with trans_w). a, b, out must not alias this communicator's buffer.
        torch.ops.tpflex.bulk_overlap (out=None) / bulk_overlap_out."""
        if torch.compiler.is_compiling():
            return self._bulk_overlap(a, b, out, options, True)
        if _STALE:
            _check_views(self._w_bulk, ("a", a), ("b", b), ("out", out))
        try:
            if _observe.ON:  # profiler ranges or a trace (SPEC §16)
                return _observe.op(self, "bulk_overlap", self._bulk_overlap, a, b, out, options)
            return self._bulk_overlap(a, b, out, options)
        except TpflexError as e:  # raised from this frame (see above)
            raise e.with_traceback(None)

    def _bulk_overlap(self, a: Any, b: Any, out: Optional[torch.Tensor],
                      options: Dict[str, Any], traced: bool = False) -> torch.Tensor:
        key = f = None
        if not traced and a is not None and b is not None:
            f = self._eligible(options, a, b, out)
        if f is not None:
            key = (f.trans_a, f.trans_w, f.beta != 0.0, a.shape, a.stride(), a.dtype, a.device,
                   b.shape, b.stride(), b.dtype, b.device,
                   _metas(out, f.bias, f.a_scale_inv, f.w_scale_inv))
            m = self._memo.get(key)
            if m is not None:  # remembered: one C call
                M, N, ld_a, ld_b, ld_d, a_dtype, b_dtype, out_dtype, d_dtype = m
                if out is None:
                    out = torch.empty((M, N), dtype=out_dtype, device=self.device)
                st = opts_struct(f) if options else None
                s = self._cur_stream() if self._cuda else None
                h, as_, bs = self._h, a.shape, b.shape
                ma = Matrix(a.data_ptr(), as_[0], as_[1], ld_a, a_dtype)
                mb = Matrix(b.data_ptr(), bs[0], bs[1], ld_b, b_dtype)
                md = Matrix(out.data_ptr(), M, N, ld_d, d_dtype)
                rc = (lib.tpf_bulk_overlap(h, ma, mb, md, s) if st is None
                      else lib.tpf_bulk_overlap_ex(h, ma, mb, md, st, s))
                if rc:
                    check(rc, self._w_bulk)
                return out
        where = self._w_bulk
        o = parse_options(where, options) if options else DEFAULT_OPTS
        stream = self._stream_arg(where, o) if o.stream is not None else None
        buf = self._views()[0]
        dims(where, "a", a)
        dims(where, "b", b)
        if out is None and o.beta != 0.0:
            p = plan_bulk(where, self.device, a, b, None, None, o.trans_a, o.trans_w,
                          o.a_scale_inv, o.w_scale_inv)
            raise beta_needs_out(where, o.beta, (p.m, p.n))
        if out is not None:
            need_tensor(where, "out", out)
        if _direct(buf, a, b, out, o.bias):
            res = _ops._bulk_impl(self.name, self.key, buf, a, b, out, o.bias, o.trans_a,
                                  o.trans_w, o.alpha, o.beta, o.gelu, o.num_splits, stream,
                                  o.a_scale_inv, o.w_scale_inv)
        elif out is None:
            res = _ops.op_bulk_overlap(self.name, self.key, buf, a, b, o.bias, o.trans_a,
                                       o.trans_w, o.alpha, o.gelu, o.num_splits, stream,
                                       o.a_scale_inv, o.w_scale_inv)
        else:
            _ops.op_bulk_overlap_out(self.name, self.key, buf, a, b, out, o.bias, o.trans_a,
                                     o.trans_w, o.alpha, o.beta, o.gelu, o.num_splits, stream,
                                     o.a_scale_inv, o.w_scale_inv)
            res = out
        if key is not None and f is not None:  # passed: remember what the checks computed
            p = plan_bulk(where, self.device, a, b, out, f.bias, f.trans_a, f.trans_w,
                          f.a_scale_inv, f.w_scale_inv)
            od = default_out_dtype(a.dtype) if out is None else out.dtype
            self._remember(key, _BulkMemo(p.m, p.n, p.ld_a, p.ld_b, p.n if out is None else p.ld_d,
                                          TORCH_TO_TPF[a.dtype], TORCH_TO_TPF[b.dtype], od,
                                          TORCH_TO_TPF[od]))
        return res

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
