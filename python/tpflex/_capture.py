"""CUDA-graph capture mechanisms of tpflex.torch.graphed (python/tpflex/_graphs.py): the Runner
protocol with its two mechanisms (CudaGraphRunner: torch.cuda.CUDAGraph capture and replay;
EagerRerun: the simulator's stand-in that re-runs the callable on static buffers), and the
warm-up that leaves what the caller sees as it was (LeafGuard: gradients of leaves the callable
touches are saved and restored around each warm-up run)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from .errors import TpflexStateError

CUDA_GRAPH = "cuda_graph"
EAGER_RERUN = "eager_rerun"
MECHANISM_TEXT = {CUDA_GRAPH: "torch.cuda.CUDAGraph capture and replay",
                  EAGER_RERUN: "eager re-run on static buffers (simulator stand-in, no CUDA graph)"}


# ---- the capture mechanisms ---------------------------------------------------------------------

class Runner(Protocol):
    """One bucket's graph. warmup runs fn eagerly; capture records fn over the static inputs and
    returns fn's outputs (the static outputs) and, where the mechanism executes fn while
    capturing (the stand-in), leaves them computed; replay re-runs the recorded work over the
    static buffers, writing the static outputs."""
    mechanism: str
    executes_on_capture: bool

    def warmup(self, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any],
               n: int) -> None: ...

    def capture(self, fn: Callable[..., Any], args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> Any: ...

    def replay(self) -> None: ...


class CudaGraphRunner:
    """torch.cuda.CUDAGraph: warmup on a side stream (torch.cuda.graphs' convention: lazy
    initialisation and the caching allocator's state stay out of the capture), capture on that
    stream into `pool`, replay on the caller's current stream. capture_error_mode
    'thread_local' (the default here, as tests/gpu/test_cuda_capture.c captures): only this
    thread's CUDA calls are checked against the capture, so threads of the CUDA backend or of
    autograd may use CUDA meanwhile."""
    mechanism = CUDA_GRAPH
    executes_on_capture = False

    def __init__(self, device: torch.device, pool: Any, capture_error_mode: str,
                 stream: Any) -> None:
        self.device = device
        self.pool = pool
        self.mode = capture_error_mode
        self.graph: Optional[Any] = None
        self.stream = stream   # one per callable: captures into a shared pool use one stream

    def warmup(self, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any],
               n: int) -> None:
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            for _ in range(n):
                fn(*args, **kwargs)
        cur.wait_stream(self.stream)

    def capture(self, fn: Callable[..., Any], args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> Any:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream,
                              capture_error_mode=self.mode):
            out = fn(*args, **kwargs)
        self.graph = g
        return out

    def replay(self) -> None:
        assert self.graph is not None
        self.graph.replay()


class EagerRerun:
    """The simulator's stand-in (no CUDA graph exists there): 'capture' runs fn once on the
    static inputs and keeps its outputs as the static outputs; 'replay' runs fn again on the
    static inputs and copies its outputs into the static outputs, which must keep their
    shapes, dtypes and structure (a graph's would; a change raises TpflexStateError). Warmup
    runs fn eagerly like the CUDA runner's."""
    mechanism = EAGER_RERUN
    executes_on_capture = True

    def __init__(self) -> None:
        self.fn: Optional[Callable[..., Any]] = None
        self.args: Tuple[Any, ...] = ()
        self.kwargs: Dict[str, Any] = {}
        self.static: List[Any] = []
        self.spec: Any = None

    def warmup(self, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any],
               n: int) -> None:
        for _ in range(n):
            fn(*args, **kwargs)

    def capture(self, fn: Callable[..., Any], args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> Any:
        out = fn(*args, **kwargs)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.static, self.spec = pytree.tree_flatten(out)
        return out

    def replay(self) -> None:
        assert self.fn is not None
        out = self.fn(*self.args, **self.kwargs)
        leaves, spec = pytree.tree_flatten(out)
        if spec != self.spec:
            raise TpflexStateError(f"fn returned another structure than at its first run "
                                   f"({spec} vs {self.spec}); a graph's outputs are fixed",
                                   "graphed")
        with torch.no_grad():
            for i, (s, v) in enumerate(zip(self.static, leaves)):
                if isinstance(s, torch.Tensor):
                    if not isinstance(v, torch.Tensor) or v.shape != s.shape or \
                            v.dtype != s.dtype:
                        raise TpflexStateError(
                            f"output {i} of fn is {_desc(v)} where its first run gave "
                            f"{_desc(s)}; a graph's outputs are fixed", "graphed")
                    if v is not s:
                        s.copy_(v)


def _desc(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{v.dtype} {list(v.shape)} on {v.device}"
    return repr(v)


# ---- warmup leaves what the caller sees as it was ----------------------------------------------

class LeafGuard(TorchFunctionMode):
    """Active around a bucket's warmup runs (both mechanisms): every backward that fn runs
    (Tensor.backward, torch.autograd.backward) is seen before it runs, and the leaves it will
    accumulate into (the AccumulateGrad nodes of its graph: parameters, inputs that require
    grad) have their .grad and .main_grad (fuse_wgrad_accumulation's) saved as the caller left
    them (a copy of each, held during the warmup only). restore() puts the values back, in
    place (references the caller holds see them; a .grad that was None becomes the warmup's
    tensor, zeroed): the capture starts from the caller's values, and the call leaves one eager
    call's gradients (torch.cuda.make_graphed_callables' contract)."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: Dict[int, Tuple[torch.Tensor, Any, Any, Any, Any]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.backward or func is torch.autograd.backward:
            roots = args[0] if args else kwargs.get("tensors")
            self._watch(roots if isinstance(roots, (list, tuple)) else [roots])
        return func(*args, **kwargs)

    def _watch(self, roots: Sequence[Any]) -> None:
        seen = set()
        stack = [getattr(t, "grad_fn", None) for t in roots if isinstance(t, torch.Tensor)]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            leaf = getattr(node, "variable", None)   # an AccumulateGrad node's leaf
            if isinstance(leaf, torch.Tensor) and id(leaf) not in self.saved:
                g = leaf.grad
                mg = getattr(leaf, "main_grad", None)
                mg = mg if isinstance(mg, torch.Tensor) else None
                self.saved[id(leaf)] = (leaf, g, None if g is None else g.detach().clone(),
                                        mg, None if mg is None else mg.detach().clone())
            stack.extend(n for n, _ in node.next_functions)

    def restore(self) -> None:
        with torch.no_grad():
            for leaf, g, gv, mg, mgv in self.saved.values():
                if g is None:
                    # None before: the warmup's tensor stays, zeroed (zero + one call's gradient
                    # is one eager call's), so that the capture accumulates into memory outside
                    # the graph's pool and every replay adds, as eager calls do
                    if leaf.grad is not None:
                        leaf.grad.zero_()
                else:
                    g.copy_(gv)
                    if leaf.grad is not g:
                        leaf.grad = g
                if mg is not None:
                    mg.copy_(mgv)
                    if getattr(leaf, "main_grad", None) is not mg:
                        leaf.main_grad = mg
        self.saved.clear()


def warm_up(runner: Any, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any],
            n: int) -> int:
    """Runs the runner's warmup under a LeafGuard and restores what fn's backward accumulated
    into (the shared logic of both mechanisms). Returns the number of leaves restored."""
    guard = LeafGuard()
    try:
        with guard:
            runner.warmup(fn, args, kwargs, n)
    finally:
        k = len(guard.saved)
        guard.restore()
    return k
