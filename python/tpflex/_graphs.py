"""CUDA graphs with dynamic T: ``graphed(fn, buckets=None)`` (docs/SPEC.md §10).

    g = tpflex.torch.graphed(step)          # after initialize_ub (the ladder needs the manager)
    for x, mask in microbatches:            # x: [T, H] packed tokens, T changing
        y = g(x, mask)                      # pads to a bucket B >= T, replays B's graph, y: [T, ...]
    print(g.stats())                        # captures, replays, padded rows, per bucket

A call finds T, the leading dimension of its tensor arguments (all of them must agree), takes
the smallest bucket B >= T, copies each tensor argument into that bucket's static input buffer
(rows T..B-1 are zeros), and, on the bucket's first use, warms ``fn`` up (``warmup`` eager runs on
a side stream, as torch.cuda.make_graphed_callables does) and captures it into a
torch.cuda.CUDAGraph; every call (the first one too) then replays the graph and returns the
static outputs sliced back to T rows. Before the capture and before each replay the manager's
active shape is set to [B, H]: a captured tpflex operation runs at the T of its capture, and the
views and the eager operations that follow must agree with it (tpflex.h, "CUDA graphs"); the
shape stays [B, H] after the call.

What the caller must know (the rules of CUDA graphs, made explicit):

* Where the padding goes: at P = 1 (or without a manager) after the T rows. At P > 1 after each
  rank's rows: a sequence-parallel argument (T/P rows) is padded to B/P rows at its end, and a
  full argument (T rows, sequence_parallel=False) is padded chunk by chunk, each rank's T/P rows
  to B/P, which is the layout that a gather of padded local chunks produces and that a
  reduce-scatter splits into each rank's padded chunk. Outputs are cut the same way: B/P rows
  to T/P, B rows to T (at P > 1 each chunk's first T/P rows, a copy unless T = B). So at P > 1
  T must be a multiple of P (TpflexDivisibleError otherwise; legal_rows(T) is).
* fn must be row-independent: padding rows are zeros, and a real output row must not depend on
  them. True for linear layers, LayerNorm, activations and tpflex's operations on THD-packed
  tokens (each token is a row); not for a reduction over rows (a loss sums the padding rows' f(0)
  too: pass a mask as a tensor argument, it is zero-padded like the rest) nor for attention
  unless the padding is its own sequence.
* Tensor arguments are copied into static buffers: fn sees the buffers, never the caller's
  tensors, and autograd does not cross the boundary (for a training step, run the backward
  inside fn). fn must not write into its tensor arguments (the padding rows must stay zero).
  Tensors that fn reads but that are not per-token (weights, a scale) belong to fn (a module's
  parameters, a closure): the graph reads them at their address, so update them in place.
* Every other argument (ints, floats, strings, None, ...) is baked into the graphs: its value at
  the first call is what every replay uses. A later call with another value raises
  TpflexInvalidError naming the argument and both values; make a new graphed callable (or pass
  the value as a tensor) instead.
* Outputs are the graphs' static output buffers: a tensor output whose leading dimension is the
  bucket's row count comes back sliced to the call's rows, any other output (a scalar loss) as
  captured. They are overwritten by the next call of the same callable (with ``share_pool``,
  the default, by a call at any bucket: the buckets' graphs share one memory pool, and a
  replay may reuse another bucket's output memory for its intermediates): clone what must
  outlive it. Non-tensor outputs are the capture's values.
* One stream: call it on one stream (the static inputs are shared by the buckets and ordered
  by that stream), one capture at a time per process (CUDA's rule).
* Every rank must call with the same bucket sequence (the ranks' Ts must pad to the same bucket;
  they do when every rank's microbatch has the same T, as tensor parallelism requires). A rank
  replaying another bucket than its peers is TPF_EMISMATCH from the operations (SPEC §10).
* Warmup runs fn eagerly ``warmup`` times per bucket; the capture runs fn's Python once and its
  device work not at all. What a backward inside fn accumulates during the warmup (the .grad,
  and the .main_grad of fuse_wgrad_accumulation, of every leaf its graph reaches) is restored
  before the capture (LeafGuard), so a bucket's first call leaves the gradients of one eager
  call, as later calls do (torch.cuda.make_graphed_callables' contract); a .grad that was None
  is the warmup's tensor, zeroed, so the capture accumulates into it and every replay adds its
  gradient as an eager call does (between steps zero it in place: zero_grad(set_to_none=False);
  a None .grad would leave the graph writing a tensor nobody sees). Other side effects of fn (an
  optimizer step, running statistics, a Python counter) happen at each warmup run: keep them
  outside fn.

Buckets. ``buckets=None`` gives the default ladder (geometric_ladder): geometric with ratio
DEFAULT_RATIO from the manager's capacity down to capacity / DEFAULT_SPAN, each rung rounded up
to the manager's legal_rows, the capacity on top (it must be a legal T; else give buckets=). An explicit
``buckets`` list is checked: every bucket must be a legal active row count (legal_rows(b) == b)
within the capacity. With ``sequence_parallel=True`` the tensor arguments hold this rank's T/P
rows (TE's sequence-parallel inputs) and a bucket B means B/P rows per rank.

Why ratio 1.125 and span 64 (measured by examples/graphed_buckets.py, a CPU computation over
20000 microbatches per distribution with a P = 8 simulator manager's legal_rows, capacity
C = 16384; distributions: THD packing of log-normal documents up to C, T uniform in [1, C], T
log-uniform in [C/64, C]). Padded rows in % of real rows, graphs in the ladder, and the sum of the
buckets over C (the static outputs' memory, in full-capacity outputs: each bucket keeps its own;
the static inputs are one buffer at the largest bucket, shared):

    ratio  graphs  outputs  packed  uniform  log-uniform
    2.0        7     2.0    10.5%    33.5%    38.9%
    1.5       12     3.0     8.7%    20.1%    21.6%
    1.25      20     4.9     6.4%    11.1%    11.6%
    1.125     37     8.9     4.2%     5.8%     5.9%
    1.0625    70    16.8     2.5%     3.0%     2.9%

Padding costs compute on every microbatch for the whole run (the target: a graphed step within 5%
of plain torch's), while a graph costs once: its warmup and capture at first use (a few step times),
and its memory (graphed()'s buckets share one pool; what each keeps is its static outputs and
the graph itself). Each halving of the waste costs about 1.8 times the graphs, with no knee, so
the ratio is the coarsest that keeps the waste near 5% on every distribution: 1.125 (4-6%, 37
graphs, outputs 9 times one full-capacity output: at T = 16384, H = 8192, bf16, 2.4 GB per [T,
H] output kept, 1.7% of an H200). 1.25 halves graphs and memory at twice the waste (6-12%); pass
ratio=1.25 (or buckets=) where memory is tight. Span 64: a microbatch below C/64 is padded to
C/64, at most 1/64 of a full microbatch's compute, and the rungs below it (12 more at span
256) would serve microbatches that cost almost nothing; span 16 raises the log-uniform waste
to 9.7% at ratio 1.125 for 12 fewer graphs.

Mechanisms. On the CUDA backend (inputs on a CUDA device) the graphs are torch.cuda.CUDAGraph
(CudaGraphRunner). On the simulator (CPU tensors) there is no graph capture: EagerRerun stands
in with the same static-buffer semantics (inputs copied into static buffers, outputs are static
buffers, the same warmup), and its "replay" re-runs fn eagerly on the static buffers and copies
the results into the static outputs, so the wrapper's logic (buckets, padding, slicing, the
shape changes, stats, errors) runs in make test-sim. stats()["mechanism"] says which ran.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree

from ._capture import CUDA_GRAPH, EAGER_RERUN  # noqa: F401  (re-exported: tests, examples)
from ._capture import MECHANISM_TEXT, CudaGraphRunner, EagerRerun, warm_up
from ._checks import U64_MAX
from ._state import state
from .errors import (TpflexCapacityError, TpflexDivisibleError, TpflexInvalidError,
                     TpflexShapeError, TpflexStateError)

DEFAULT_RATIO = 1.125  # the default ladder's ratio between rungs (module docstring: why)
DEFAULT_SPAN = 64      # the default ladder's smallest rung: capacity / DEFAULT_SPAN
DEFAULT_WARMUP = 3     # eager runs before a capture (torch.cuda.make_graphed_callables' default)

IN_GRAPHED = "graphed"  # state() key: the GraphedCallable whose fn is running (else None)


# ---- the ladder ---------------------------------------------------------------------------------

def geometric_ladder(capacity: int, legal: Callable[[int], int], ratio: float = DEFAULT_RATIO,
                     span: float = DEFAULT_SPAN) -> List[int]:
    """Buckets from `capacity` down by `ratio` to capacity / span, each rounded up by `legal`
    (a legal_rows function: the smallest legal T >= its argument), ascending, no duplicates.
    `capacity` itself must be legal. Pure: examples/graphed_buckets.py measures it."""
    if not (isinstance(ratio, (int, float)) and ratio > 1 and math.isfinite(ratio)):
        raise TpflexInvalidError(f"ratio={ratio!r} must be a finite number > 1", "graphed")
    if not (isinstance(span, (int, float)) and span >= 1 and math.isfinite(span)):
        raise TpflexInvalidError(f"span={span!r} must be a finite number >= 1", "graphed")
    floor = max(1, math.ceil(capacity / span))
    out = {capacity}
    x = float(capacity)
    while True:
        x /= ratio
        b = legal(max(floor, math.ceil(x)))
        if b >= capacity:
            break
        out.add(b)
        if x <= floor:
            break
    return sorted(out)


def pad_stats(ts: Sequence[int], buckets: Sequence[int]) -> Tuple[int, int, int]:
    """(rows, padded rows, buckets used) when each T of `ts` is padded to the smallest bucket
    >= T (every T must fit the largest bucket)."""
    import bisect
    rows = padded = 0
    used = set()
    for t in ts:
        b = buckets[bisect.bisect_left(buckets, t)]
        rows += t
        padded += b - t
        used.add(b)
    return rows, padded, len(used)


# ---- the graphed callable -----------------------------------------------------------------------

_KEEP, _LOCAL, _FULL = 0, 1, 2


class _Bucket:
    """One bucket: its runner, static inputs, static outputs and counters."""

    def __init__(self, rows: int, tokens: int) -> None:
        self.rows = rows            # rows of the tensor arguments (tokens / P with SP)
        self.tokens = tokens        # the bucket's T
        self.runner: Optional[Any] = None
        self.inputs: List[torch.Tensor] = []   # [:rows] views of the callable's input buffers
        self.out_leaves: List[Any] = []
        self.out_spec: Any = None
        self.out_kind: List[int] = []   # per output: _KEEP, _LOCAL (B/P rows) or _FULL (B rows)
        self.out_form = 0
        self.captures = self.replays = self.real = self.padded = 0


class GraphedCallable:
    """What graphed() returns: call it like fn; stats(), buckets, reset()."""

    def __init__(self, fn: Callable[..., Any], buckets: Optional[Sequence[int]], *,
                 sequence_parallel: bool, warmup: int, share_pool: bool, ratio: float,
                 span: float, capture_error_mode: str) -> None:
        if not callable(fn):
            raise TpflexInvalidError(f"fn={fn!r} is not callable", "graphed")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self._where = f"graphed({self.__name__})"
        if isinstance(sequence_parallel, bool) is False:
            raise TpflexInvalidError(f"sequence_parallel={sequence_parallel!r} must be a bool",
                                     self._where)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise TpflexInvalidError(f"warmup={warmup!r} must be an int >= 0 (the CUDA "
                                     "mechanism needs >= 1)", self._where)
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise TpflexInvalidError(f"capture_error_mode={capture_error_mode!r}: 'global', "
                                     "'thread_local' or 'relaxed' (torch.cuda.graph's)",
                                     self._where)
        self.sequence_parallel = sequence_parallel
        self.warmup = warmup
        self.share_pool = bool(share_pool)
        self.ratio, self.span = ratio, span
        self.capture_error_mode = capture_error_mode
        self._user_buckets = None if buckets is None else self._check_list(buckets)
        if buckets is None:  # the ladder's parameters are checked now, not at the first call
            geometric_ladder(1, lambda t: t, ratio, span)
        self._buckets: Optional[List[int]] = None
        self._mgr: Any = None
        self._bound = False
        self._H = 0
        self._P = 1
        self._shape_comm: Any = None
        self._table: Dict[int, _Bucket] = {}
        self._sig: Optional[Tuple[Any, ...]] = None   # the first call's argument signature
        self._pool: Any = None
        self._stream: Any = None
        # The static inputs: one buffer per tensor argument at the largest bucket's rows, shared
        # by every bucket (a bucket's are [:rows] views; calls are ordered on the stream), and
        # the rows that may hold data (every row from _filled on is zero).
        self._inputs: List[torch.Tensor] = []
        self._filled = 0
        self._mechanism: Optional[str] = None
        self.calls = 0

    # -- buckets --

    def _check_list(self, buckets: Any) -> List[int]:
        if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__"):
            raise TpflexInvalidError(f"buckets={buckets!r} must be a sequence of ints (token "
                                     "counts T) or None for the default ladder", self._where)
        out = []
        for b in buckets:
            if isinstance(b, bool) or not isinstance(b, int) or b < 1 or b > U64_MAX:
                raise TpflexInvalidError(f"bucket {b!r} in buckets={list(buckets)!r} must be an "
                                         "int >= 1 (a token count T)", self._where)
            out.append(int(b))
        if not out:
            raise TpflexInvalidError("buckets=[] holds no bucket (None: the default ladder)",
                                     self._where)
        return sorted(set(out))

    @property
    def buckets(self) -> Optional[List[int]]:
        """The bucket ladder (token counts T, ascending); None until the first call resolves
        the default one."""
        return list(self._buckets) if self._buckets is not None else (
            list(self._user_buckets) if self._user_buckets is not None else None)

    def _bind(self) -> None:
        """At the first call: the manager (if any), H, P, the ladder, checked."""
        mgr = state().get("manager")
        P, H, shape_comm = 1, 0, None
        if mgr is not None:
            comms = mgr._eligible()
            if not comms:
                raise TpflexStateError("the manager has no communicator that takes an active "
                                       "shape (all external)", self._where)
            shape_comm = comms[0]
            cap, H = comms[0].capacity_shape
            P = mgr.tp_size
            if self._user_buckets is None:
                top = cap if mgr.legal_rows(cap) == cap else None
                if top is None:
                    raise TpflexStateError(f"the capacity {cap} is not a legal T "
                                           f"(legal_rows({cap}) = {mgr.legal_rows(cap)}): give "
                                           "buckets= explicitly", self._where)
                buckets = geometric_ladder(cap, mgr.legal_rows, self.ratio, self.span)
            else:
                for b in self._user_buckets:
                    if b > cap:
                        raise TpflexCapacityError(f"bucket {b} is above the capacity {cap} "
                                                  f"(buckets {self._user_buckets})", self._where)
                    legal = mgr.legal_rows(b)
                    if legal != b:
                        raise TpflexInvalidError(
                            f"bucket {b} is not a legal active row count: legal_rows({b}) = "
                            f"{legal} (every bucket must be a T the manager accepts; buckets "
                            f"{self._user_buckets})", self._where)
                buckets = list(self._user_buckets)
        else:
            if self._user_buckets is None:
                raise TpflexStateError("no manager on this rank (initialize_ub not called) and "
                                       "no buckets=: the default ladder needs the manager's "
                                       "capacity and legal_rows", self._where)
            if self.sequence_parallel:
                raise TpflexStateError("sequence_parallel=True needs the manager's tp_size "
                                       "(initialize_ub not called)", self._where)
            buckets = list(self._user_buckets)
        if P > 1:
            for b in buckets:
                if b % P:
                    raise TpflexDivisibleError(f"bucket {b} does not divide among tp_size {P} "
                                               "ranks (each rank's rows are padded to B/P)",
                                               self._where)
        # bound only once everything is checked: a refused first call changes nothing
        self._mgr, self._P, self._H, self._shape_comm = mgr, P, H, shape_comm
        self._buckets = buckets
        self._bound = True

    # -- arguments --

    def _flatten(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[List[Any], Any]:
        if not kwargs and not any(isinstance(a, (list, tuple, dict)) for a in args):
            return list(args), len(args)          # the fast path: flat positional arguments
        return pytree.tree_flatten((args, kwargs))

    def _unflatten(self, leaves: List[Any], spec: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        if isinstance(spec, int):
            return tuple(leaves), {}
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return tuple(args), dict(kwargs)

    def _signature(self, leaves: List[Any], spec: Any) -> Tuple[Any, ...]:
        sig = []
        for v in leaves:
            if isinstance(v, torch.Tensor):
                sig.append((torch.Tensor, v.dtype, v.get_device(), v.shape[1:], v.device))
            else:
                sig.append((None, v))
        return (spec, tuple(sig))

    def _check_args(self, leaves: List[Any], spec: Any) -> int:
        """The call's rows (checked against the first call's signature)."""
        rows = -1
        first = -1
        for i, v in enumerate(leaves):
            if isinstance(v, torch.Tensor):
                if v.dim() < 1:
                    raise TpflexShapeError(f"tensor argument {i} is 0-dimensional: every tensor "
                                           "argument is per-token (leading dimension T); pass "
                                           "other tensors through fn (a closure or a module)",
                                           self._where)
                n = int(v.shape[0])
                if rows < 0:
                    rows, first = n, i
                elif n != rows:
                    raise TpflexShapeError(f"tensor argument {i} has {n} rows but argument "
                                           f"{first} has {rows}: every tensor argument is "
                                           "per-token and must have the same leading dimension",
                                           self._where)
        if rows < 0:
            raise TpflexInvalidError("no tensor argument: the microbatch's T is the leading "
                                     "dimension of fn's tensor arguments", self._where)
        if self._sig is None:
            return rows
        cap_spec, cap_sig = self._sig
        if spec != cap_spec or len(leaves) != len(cap_sig):
            raise TpflexInvalidError(f"the arguments' structure changed since the first call "
                                     f"({spec} vs {cap_spec}): it is baked into the graphs",
                                     self._where)
        for i, (v, s) in enumerate(zip(leaves, cap_sig)):
            if s[0] is torch.Tensor:
                if not isinstance(v, torch.Tensor):
                    raise TpflexInvalidError(f"argument {i} was a tensor at the first call and "
                                             f"is now {type(v).__name__} {v!r}", self._where)
                if v.dtype is not s[1] or v.get_device() != s[2] or v.shape[1:] != s[3]:
                    raise TpflexShapeError(
                        f"tensor argument {i} is {v.dtype} [T, {', '.join(map(str, v.shape[1:]))}]"
                        f" on {v.device}, the static buffers are {s[1]} "
                        f"[T, {', '.join(map(str, s[3]))}] on {s[4]}: only T may change",
                        self._where)
            else:
                old = s[1]
                if isinstance(v, torch.Tensor):
                    raise TpflexInvalidError(f"argument {i} was {old!r} at the first call and is "
                                             "now a tensor", self._where)
                if not _same(v, old):
                    raise TpflexInvalidError(
                        f"argument {i} is {v!r} but was {old!r} at the first call: non-tensor "
                        f"arguments are baked into the graphs (create another graphed callable, "
                        f"or pass the value as a tensor)", self._where)
        return rows

    # -- the call --

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) at this microbatch's T: pads T to its bucket, captures fn on the
        bucket's first use and replays it after, and returns the outputs cut back to T rows."""
        if not self._bound:
            self._bind()
        mgr = self._mgr
        if mgr is not None:
            if state().get("manager") is not mgr:
                raise TpflexStateError("this graphed callable was bound at its first call to "
                                       "another manager (another simulator rank, or before "
                                       "destroy_ub): its graphs use that manager's "
                                       "registrations; create one per rank and manager",
                                       self._where)
            if mgr._h is None:
                raise TpflexStateError("the manager the graphs were captured with is "
                                       "destroyed", self._where)
        leaves, spec = self._flatten(args, kwargs)
        rows = self._check_args(leaves, spec)
        P = self._P
        T = rows * P if self.sequence_parallel else rows
        if P > 1 and T % P:
            raise TpflexDivisibleError(f"T = {T} rows do not divide among tp_size {P} ranks: "
                                       "the padding goes after each rank's T/P rows (pad the "
                                       "microbatch to legal_rows(T) first)", self._where)
        assert self._buckets is not None
        B = self._bucket_for(T)
        bk = self._table.get(B)
        if mgr is not None and self._shape_comm.active_shape[0] != B:
            mgr.set_active_shape([B, self._H])
        st = state()
        outer = st.get(IN_GRAPHED)
        st[IN_GRAPHED] = self   # fn's errors can name graphed's own arguments
        try:
            if bk is None:
                bk = _Bucket(B // P if self.sequence_parallel else B, B)
                try:
                    self._capture(bk, leaves, spec, T)
                except BaseException:
                    if not self._table:   # nothing captured yet: the next call starts afresh
                        self._inputs, self._filled = [], 0
                    raise
                self._table[B] = bk
                if self._sig is None:
                    self._sig = self._signature(leaves, spec)
            else:
                self._fill(leaves, T, B)
                bk.runner.replay()
                bk.replays += 1
        finally:
            st[IN_GRAPHED] = outer
        self.calls += 1
        bk.real += T
        bk.padded += B - T
        outs = self._cut(bk, T)
        if bk.out_form == 1:
            return outs[0]
        if bk.out_form == 2:
            return tuple(outs)
        return pytree.tree_unflatten(outs, bk.out_spec)

    def _cut(self, bk: _Bucket, T: int) -> List[Any]:
        """The static outputs with the call's rows: a local output (B/P rows) is sliced to
        T/P; a full one (B rows) to T, or at P > 1 each rank's chunk of B/P rows to its first
        T/P (a copy unless T = B)."""
        P, B = self._P, bk.tokens
        out = []
        for o, kind in zip(bk.out_leaves, bk.out_kind):
            if kind == _LOCAL:
                o = o[:T // P]
            elif kind == _FULL:
                if P == 1:
                    o = o[:T]
                elif T != B:
                    o = o.view((P, B // P) + tuple(o.shape[1:]))[:, :T // P].reshape(
                        (T,) + tuple(o.shape[1:]))
            out.append(o)
        return out

    def _bucket_for(self, T: int) -> int:
        import bisect
        bs = self._buckets
        assert bs is not None
        i = bisect.bisect_left(bs, T)
        if i == len(bs):
            sp = f" ({T // self._P} rows x P = {self._P})" if self.sequence_parallel else ""
            raise TpflexCapacityError(f"microbatch T = {T}{sp} is above the largest bucket "
                                      f"{bs[-1]} (buckets {bs})", self._where)
        return bs[i]

    def _fill(self, leaves: List[Any], T: int, B: int) -> None:
        """Copies the call's tensors into the static inputs. Local inputs (sequence_parallel,
        or P = 1): into the first rows, zeroing the rows an earlier, longer call left (every
        row from `rows` on stays zero). Full inputs at P > 1: each rank's T/P rows into the
        first rows of its B/P-row chunk, the rest of the chunk zeroed (the layout a gather of
        padded local chunks has, and the one a reduce-scatter splits into padded chunks)."""
        P = self._P
        j = 0
        # (v.detach() where autograd would record the copy: cheaper than a no_grad context)
        if self.sequence_parallel or P == 1:
            rows = T // P if self.sequence_parallel else T
            for v in leaves:
                if isinstance(v, torch.Tensor):
                    s = self._inputs[j]
                    j += 1
                    s[:rows].copy_(v.detach() if v.requires_grad else v)
                    if self._filled > rows:
                        s[rows:self._filled].zero_()
            self._filled = rows
            return
        t, b = T // P, B // P
        for v in leaves:
            if isinstance(v, torch.Tensor):
                rest = tuple(v.shape[1:])
                s = self._inputs[j][:B].view((P, b) + rest)
                j += 1
                s[:, :t].copy_((v.detach() if v.requires_grad else v).view((P, t) + rest))
                if t < b:
                    s[:, t:].zero_()

    def _capture(self, bk: _Bucket, leaves: List[Any], spec: Any, T: int) -> None:
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        dev = tensors[0].device
        for t in tensors[1:]:
            if t.device != dev:
                raise TpflexInvalidError(f"tensor arguments on {dev} and {t.device}: one device",
                                         self._where)
        if dev.type == "cuda":
            if self.warmup < 1:
                raise TpflexInvalidError("warmup=0: a CUDA graph capture needs at least one "
                                         "eager run first (lazy initialisation must stay out of "
                                         "the graph)", self._where)
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=dev)
            if self.share_pool and self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            pool = self._pool if self.share_pool else None
            runner: Any = CudaGraphRunner(dev, pool, self.capture_error_mode, self._stream)
        else:
            runner = EagerRerun()
        if self._mechanism is not None and runner.mechanism != self._mechanism:
            raise TpflexInvalidError(f"this callable's graphs are {self._mechanism}; tensors "
                                     f"on {dev} would need {runner.mechanism}", self._where)
        if not self._inputs:
            assert self._buckets is not None
            top = self._buckets[-1] // (self._P if self.sequence_parallel else 1)
            self._inputs = [torch.zeros((top,) + tuple(t.shape[1:]), dtype=t.dtype, device=dev)
                            for t in tensors]
            self._filled = 0
        bk.inputs = [s[:bk.rows] for s in self._inputs]
        self._fill(leaves, T, bk.tokens)
        it = iter(bk.inputs)
        static = [next(it) if isinstance(v, torch.Tensor) else v for v in leaves]
        a, kw = self._unflatten(static, spec)
        warm_up(runner, self.fn, a, kw, self.warmup)
        out = runner.capture(self.fn, a, kw)
        bk.out_leaves, bk.out_spec = pytree.tree_flatten(out)
        # the usual forms without pytree on every call: one tensor (1), a flat tuple (2)
        bk.out_form = 1 if isinstance(out, torch.Tensor) else 2 if type(out) is tuple and not any(
            isinstance(o, (list, tuple, dict)) for o in out) else 0
        P, B = self._P, bk.tokens
        bk.out_kind = []
        for o in bk.out_leaves:
            n = int(o.shape[0]) if isinstance(o, torch.Tensor) and o.dim() >= 1 else -1
            bk.out_kind.append(_FULL if n == B else _LOCAL if P > 1 and n == B // P else _KEEP)
        bk.runner = runner
        self._mechanism = runner.mechanism
        bk.captures += 1
        if not runner.executes_on_capture:
            runner.replay()

    # -- reporting --

    def stats(self) -> Dict[str, Any]:
        """calls, captures (first uses of a bucket), replays (later calls), rows (the calls'
        real T summed), padded_rows (bucket - T summed; rows are tokens, T units), warmup_runs,
        mechanism (CUDA_GRAPH or EAGER_RERUN; None before the first call), mechanism_text, and
        per bucket {T: {captures, replays, rows, padded_rows}} for the buckets used."""
        per = {b: {"captures": k.captures, "replays": k.replays, "rows": k.real,
                   "padded_rows": k.padded} for b, k in sorted(self._table.items())}
        caps = sum(k.captures for k in self._table.values())
        return {"mechanism": self._mechanism,
                "mechanism_text": MECHANISM_TEXT.get(self._mechanism or "", "not run yet"),
                "calls": self.calls, "captures": caps,
                "replays": sum(k.replays for k in self._table.values()),
                "warmup_runs": caps * self.warmup,
                "rows": sum(k.real for k in self._table.values()),
                "padded_rows": sum(k.padded for k in self._table.values()),
                "buckets": per}

    def reset(self) -> None:
        """Drops every bucket's graph and static buffers (the next call at a bucket captures
        again), the first call's argument signature and the manager it was bound to (the next
        call binds to the current one); the counters restart. Call it before destroy_ub when
        the callable outlives the manager, and use it again after initialize_ub."""
        self._table.clear()
        self._sig = None
        self._inputs = []
        self._filled = 0
        self._pool = None
        self._mechanism = None
        self.calls = 0
        # unbound: the next call binds to the manager current then (re-use after destroy_ub +
        # initialize_ub), resolving the default ladder against it again
        self._bound = False
        self._mgr = self._shape_comm = None
        self._buckets = None
        self._P, self._H = 1, 0

    def __repr__(self) -> str:
        s = self.stats()
        how = s["mechanism_text"]
        return (f"<tpflex graphed {self.__name__}: {how}; buckets {self.buckets}; "
                f"{s['calls']} calls, {s['captures']} first uses, {s['replays']} replays, "
                f"{s['padded_rows']} padded rows>")


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (float, complex)) and a != a and b != b:   # NaN is the same value baked
        return True
    try:
        return bool(a == b)
    except Exception:  # an == that does not give one bool (arrays): compare by identity only
        return False


def graphed(fn: Callable[..., Any], buckets: Optional[Sequence[int]] = None, *,
            sequence_parallel: bool = False, warmup: int = DEFAULT_WARMUP,
            share_pool: bool = True, ratio: float = DEFAULT_RATIO, span: float = DEFAULT_SPAN,
            capture_error_mode: str = "thread_local") -> GraphedCallable:
    """``fn`` for dynamic T under CUDA graphs (docs/SPEC.md §10; this module's docstring has the
    rules): pads each call's T (the leading dimension of its tensor arguments) to the smallest
    bucket >= T, captures fn once per bucket on first use, replays afterwards, and returns the
    outputs sliced back to T rows.

    buckets: token counts T, each legal for the manager (legal_rows(b) == b) and within its
    capacity; None: the default geometric ladder (ratio, span) within the capacity, resolved at
    the first call (so create the callable before or after initialize_ub, call it after).
    sequence_parallel: the tensor arguments hold this rank's T/P rows. warmup: eager runs per
    bucket before its capture. share_pool: one CUDA memory pool for every bucket's graph (the
    memory of about one graph instead of the sum; outputs live until the next call at any
    bucket). capture_error_mode: torch.cuda.graph's. Returns a GraphedCallable (stats(),
    buckets, reset())."""
    return GraphedCallable(fn, buckets, sequence_parallel=sequence_parallel, warmup=warmup,
                           share_pool=share_pool, ratio=ratio, span=span,
                           capture_error_mode=capture_error_mode)
