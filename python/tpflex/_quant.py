"""Precision in the modules (SPEC §14): `autocast` (alias `fp8_autocast`), `quantized_model_init`
(alias `fp8_model_init`), the per-tensor recipes' state and the FP8 casts and GEMMs the modules
run inside autocast. Public face: tpflex.torch.quantization (TE's
`transformer_engine.pytorch.quantization`); this module sits below the layers, which use it.

Method. Inside `autocast(enabled=True, recipe=...)` every module's GEMM site quantizes its
operands per tensor: the input and the weight in the forward format (E4M3), the output gradient
in the backward format (E5M2 under Format.HYBRID, else E4M3). A tensor x with scale s becomes
q = fp8(clamp(x * s, -max, max)) (round to nearest even, saturating: SPEC §11) and carries
scale_inv = 1 / s; a GEMM of two quantized tensors is sum(qa * qb) * scale_inv_a * scale_inv_b,
accumulated in fp32 (the simulator's and cuBLASLt's FP8 GEMM; on the plain path torch._scaled_mm
on CUDA, the same sum on the CPU), written in the activation dtype (torch.autocast's, else the
parameters'). Scales:
  Float8CurrentScaling  s = fp8_max / amax(x) at cast time (amax below amax_epsilon raised to
                        it; 1 where amax is 0, inf or NaN; fp32's max where the quotient
                        overflows; its power of 2 with use_power_2_scales). A tensor that is
                        gathered (a sequence-parallel input, a row-parallel output gradient)
                        takes the amax max-reduced over the TP group first, as TE does, so that
                        every rank's shard has the one scale of the gathered tensor.
  DelayedScaling        s from the amax history (TE's DelayedScaling, see the recipe): casts
                        max their amax into the history's newest row; the forward rows are
                        updated when the outermost autocast exits (grad enabled), the backward
                        rows at the end of the backward of the autocast's first module; both
                        max-reduce the amaxes over amax_reduction_group first (reduce_amax;
                        default group: torch.distributed's world, or the simulator world
                        inside tpflex.sim.run).
Gathered activations travel in FP8 where the site is registered FP8 (initialize_ub(use_fp8=True)
or the FP8 quantization mode): half the bytes of bf16; reduce-scatters stay in the activation
dtype (SPEC §11). The plain (ub-less) path gathers in the activation dtype and quantizes the
gathered tensor with the shard's scale (the same values: a per-tensor cast is elementwise)."""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from ctypes import c_float, c_int, c_uint64, c_void_p
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from . import sim
from ._state import state
from .common.recipe import (CustomRecipe, DelayedScaling, Float8BlockScaling,
                             Float8CurrentScaling, Format, MXFP8BlockScaling,
                             NVFP4BlockScaling, Recipe)
from .errors import TpflexInvalidError, TpflexTimeoutError, TpflexUnsupportedError

FP32_MAX = float(torch.finfo(torch.float32).max)
_FMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_UNSUPPORTED = {
    MXFP8BlockScaling: "MXFP8 block scaling needs Blackwell's block-scaled FP8 GEMMs (sm_100+), "
                       "which tpflex's operations do not run",
    Float8BlockScaling: "FP8 block scaling (1D/2D blocks with a scale per block) needs "
                        "block-scaled GEMM operands, which tpflex's operations do not take",
    NVFP4BlockScaling: "NVFP4 (FP4 with E4M3 block scales) needs Blackwell's FP4 GEMMs, which "
                       "tpflex's operations do not run",
    CustomRecipe: "custom quantizer factories produce tensor types tpflex's operations do not "
                  "take",
}


# ---- the autocast state (per process, or per simulator rank) --------------------------------

class _QState:
    __slots__ = ("enabled", "recipe", "group", "graph", "depth", "first_module", "buffers",
                 "packed", "fp8_parameters")

    def __init__(self) -> None:
        self.enabled = False
        self.recipe: Optional[Recipe] = None
        self.group: Any = None
        self.graph = False
        self.depth = 0
        self.first_module = False
        # (forward, recipe key, group id) -> (recipe, group, [_DelayedMeta]): the delayed-
        # scaling metas updated together (TE's global amax buffers).
        self.buffers: Dict[Tuple[bool, str, int], Tuple[Recipe, Any, List[Any]]] = {}
        # buffer key -> (metas packed, (history, scale) or None): reduce_and_update's packing.
        self.packed: Dict[Tuple[bool, str, int], Tuple[int, Any]] = {}
        self.fp8_parameters = False


def _qstate() -> _QState:
    st = state()
    q = st.get("quantization")
    if q is None:
        q = st["quantization"] = _QState()
    return q


def is_fp8_enabled() -> bool:
    """Whether the caller is inside autocast(enabled=True)."""
    return _qstate().enabled


def get_fp8_recipe() -> Recipe:
    """The recipe of the innermost active autocast, else TE's default recipe."""
    q = _qstate()
    return q.recipe if q.recipe is not None else get_default_fp8_recipe()


def get_default_fp8_recipe() -> Recipe:
    """TE's default on Hopper: DelayedScaling() (tpflex runs no MXFP8, TE's Blackwell default)."""
    return DelayedScaling()


def check_recipe_support(recipe: Any) -> None:
    """TpflexUnsupportedError for a recipe tpflex does not run, naming it and why."""
    if recipe is None:
        return
    if not isinstance(recipe, Recipe):
        raise TpflexInvalidError(f"recipe={recipe!r} is not a recipe (tpflex.common.recipe."
                                 f"DelayedScaling or Float8CurrentScaling)", "autocast")
    for cls, why in _UNSUPPORTED.items():
        if isinstance(recipe, cls):
            raise TpflexUnsupportedError(
                f"recipe {type(recipe).__name__}: {why}; tpflex runs the per-tensor recipes "
                f"DelayedScaling and Float8CurrentScaling", "autocast")
    if not isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        raise TpflexUnsupportedError(f"recipe {type(recipe).__name__}: tpflex runs "
                                     f"DelayedScaling and Float8CurrentScaling", "autocast")
    if getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False):
        raise TpflexUnsupportedError(f"recipe {type(recipe).__name__} with fp8_dpa/fp8_mha: "
                                     f"tpflex's attention runs in the activation dtype; leave "
                                     f"them False", "autocast")
    if getattr(recipe, "backward_override", None) is not None:
        raise TpflexUnsupportedError(f"recipe {type(recipe).__name__} with backward_override="
                                     f"{recipe.backward_override!r} (NVTE_BACKWARD_OVERRIDE): "
                                     f"tpflex's backward quantizes as the recipe's format says; "
                                     f"leave it None", "autocast")


class autocast:
    """TE's autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None,
    _graph=False): inside it (enabled) the modules run their GEMMs in FP8 per `recipe` (None:
    DelayedScaling()). Nested contexts restore the outer state on exit; leaving the outermost
    one with grad enabled updates the delayed-scaling forward scales (skipped with _graph=True,
    as TE). calibrating=True is refused (tpflex keeps no calibration statistics)."""

    __slots__ = ("_enabled", "_calibrating", "_recipe", "_amax_reduction_group", "_graph",
                 "_saved")

    def __init__(self, enabled: bool = True, calibrating: bool = False,
                 recipe: Optional[Recipe] = None, amax_reduction_group: Any = None,
                 _graph: bool = False) -> None:
        where = "autocast"
        for n, v in (("enabled", enabled), ("calibrating", calibrating), ("_graph", _graph)):
            if not isinstance(v, bool):
                raise TpflexInvalidError(f"{n}={v!r} must be a bool", where)
        if calibrating:
            raise TpflexUnsupportedError("calibrating=True: tpflex collects no FP8 calibration "
                                         "statistics outside FP8 training; leave it False",
                                         where)
        if enabled:
            check_recipe_support(recipe)
        elif recipe is not None and not isinstance(recipe, Recipe):
            raise TpflexInvalidError(f"recipe={recipe!r} is not a recipe", where)
        self._enabled, self._calibrating = enabled, calibrating
        self._recipe, self._amax_reduction_group, self._graph = recipe, amax_reduction_group, _graph
        self._saved: Optional[tuple] = None

    def __enter__(self) -> "autocast":
        if self._saved is not None:
            raise TpflexInvalidError("this autocast object is already entered: make one per "
                                     "region (it cannot be nested in itself)", "autocast")
        q = _qstate()
        self._saved = (q.enabled, q.recipe, q.group, q.graph, q.first_module)
        q.enabled = self._enabled
        q.recipe = self._recipe if self._recipe is not None else get_default_fp8_recipe()
        q.group, q.graph = self._amax_reduction_group, self._graph
        if q.depth == 0:
            q.first_module = True
        q.depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        q = _qstate()
        saved, self._saved = self._saved, None
        q.depth -= 1
        recipe, group = q.recipe, q.group
        assert saved is not None
        q.enabled, q.recipe, q.group, q.graph, q.first_module = saved
        if self._enabled and q.depth == 0 and not self._graph and torch.is_grad_enabled() and \
                exc[0] is None:
            reduce_and_update(True, recipe, group)


def fp8_autocast(enabled: bool = True, calibrating: bool = False,
                 fp8_recipe: Optional[Recipe] = None, fp8_group: Any = None,
                 _graph: bool = False) -> autocast:
    """TE's deprecated spelling of autocast (its argument names)."""
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe,
                    amax_reduction_group=fp8_group, _graph=_graph)


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                         preserve_high_precision_init_val: bool = False) -> Iterator[None]:
    """TE's quantized_model_init: modules built inside it would hold FP8 parameters only.
    tpflex keeps parameters in their dtype and quantizes (and caches, per is_first_microbatch)
    at the GEMM, so enabled=True is refused; enabled=False is a no-op, as in TE."""
    if enabled:
        raise TpflexUnsupportedError(
            "quantized_model_init(enabled=True): tpflex modules keep high-precision parameters "
            "and quantize them per recipe inside autocast (with is_first_microbatch caching the "
            "FP8 weights); build the model outside it (or with enabled=False)",
            "quantized_model_init")
    if recipe is not None:
        check_recipe_support(recipe)
    yield


def fp8_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                   preserve_high_precision_init_val: bool = False) -> Any:
    """TE's deprecated spelling of quantized_model_init."""
    return quantized_model_init(enabled, recipe, preserve_high_precision_init_val)


# ---- amax reduction -------------------------------------------------------------------------

class _SimReduce:
    """A max all-reduce among the rank threads of one simulator world (threads mode has no
    torch.distributed): a barrier-protected exchange with a bounded wait."""

    def __init__(self, P: int) -> None:
        self.P = P
        self.barrier = threading.Barrier(P)
        self.slots: List[Any] = [None] * P


_sim_reducers: "weakref.WeakKeyDictionary[Any, _SimReduce]" = weakref.WeakKeyDictionary()
_sim_lock = threading.Lock()


def _sim_max(t: torch.Tensor, timeout_s: float = 30.0) -> None:
    ctx = sim.current()
    assert ctx is not None
    with _sim_lock:
        r = _sim_reducers.get(ctx.world)
        if r is None:
            r = _sim_reducers[ctx.world] = _SimReduce(ctx.tp_size)
    try:
        r.slots[ctx.rank] = t.detach().clone()
        r.barrier.wait(timeout_s)
        m = torch.stack([s.to(t.device) for s in r.slots]).amax(0)
        r.barrier.wait(timeout_s)
    except threading.BrokenBarrierError:
        raise TpflexTimeoutError("the amax reduction over the simulator world timed out: every "
                                 "rank must run the same FP8 modules in the same order",
                                 "autocast") from None
    t.copy_(m)


def amax_allreduce(t: torch.Tensor, group: Any) -> None:
    """Max-reduces t in place over `group` (torch.distributed; None: the world), or over the
    simulator world in tpflex.sim.run's threads; nothing where there is no group."""
    import torch.distributed as dist
    if sim.current() is not None and group is None and \
            not (dist.is_available() and dist.is_initialized()):
        if sim.current().tp_size > 1:
            _sim_max(t)
        return
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)


# ---- scales ---------------------------------------------------------------------------------

def fp8_dtype(recipe: Recipe, forward: bool) -> torch.dtype:
    """TE's get_fp8_torch_dtype."""
    if recipe.fp8_format == Format.E4M3 or (recipe.fp8_format == Format.HYBRID and forward):
        return torch.float8_e4m3fn
    return torch.float8_e5m2


def scale_from_amax(amax: torch.Tensor, fp8_max: float, pow2: bool = False,
                    epsilon: float = 0.0) -> torch.Tensor:
    """Current scaling's scale (TE's compute_scale_from_amax), elementwise, fp32: fp8_max / amax
    (amax below epsilon raised to it), correctly rounded; 1 where amax is 0, inf or NaN; fp32's
    max where the quotient overflows; its power of 2 (the exponent alone) with pow2."""
    a = amax.float()
    if epsilon > 0.0:
        a = torch.clamp_min(a, epsilon)   # NaN stays NaN
    s = torch.div(torch.full_like(a, fp8_max), a)   # 0 -> inf, inf -> 0, NaN -> NaN
    s.nan_to_num_(nan=1.0, posinf=FP32_MAX)
    s.masked_fill_((a == 0.0) | (s == 0.0), 1.0)   # amax 0 or inf: 1
    if pow2:
        s = (s.view(torch.int32) & torch.tensor(-8388608, dtype=torch.int32, device=s.device)
             ).view(torch.float32)  # 0xFF800000: the exponent only
    return s


class _DelayedMeta:
    """One GEMM site's delayed-scaling state in one direction: scale [n] and amax_history
    [len, n] (TE's DelayedScalingRecipeState), fp32 on the site's device. reduce_and_update packs
    the metas of one buffer into one history and one scale tensor (TE's global amax buffer), so
    that an update is a few operations for every site together; each meta then holds views."""

    def __init__(self, recipe: DelayedScaling, n: int, device: torch.device) -> None:
        self.recipe = recipe
        self.point(torch.zeros(recipe.amax_history_len, n, dtype=torch.float32, device=device),
                   torch.ones(n, dtype=torch.float32, device=device))

    def point(self, amax_history: torch.Tensor, scale: torch.Tensor) -> None:
        """Holds these tensors (views of a packed buffer, or its own) and their per-tensor views:
        newest[i], the newest amax row's element i, and scale_of[i]."""
        self.amax_history, self.scale = amax_history, scale
        n = scale.shape[0]
        self.newest = [amax_history[0, i:i + 1] for i in range(n)]
        self.scale_of = [scale[i:i + 1] for i in range(n)]

    def record(self, i: int, amax: torch.Tensor) -> None:
        torch.maximum(self.newest[i], amax, out=self.newest[i])

    def update(self, fp8_max: float) -> None:
        """TE's _amax_and_scale_update: amax from the history, roll, scale from amax."""
        _update_delayed(self.recipe, self.amax_history, self.scale, fp8_max)


def _update_delayed(r: DelayedScaling, h: torch.Tensor, scale: torch.Tensor,
                    fp8_max: float) -> None:
    """The delayed-scaling update of a history h [len, n] and scale [n] in place (columns are
    independent, so a packed buffer updates every site at once)."""
    if callable(r.amax_compute_algo):
        amax = r.amax_compute_algo(h)
    elif r.amax_compute_algo == "max":
        amax = h.amax(0)
    else:
        amax = h[0].clone()
    if h.shape[0] > 1:
        h.copy_(torch.roll(h, -1, 0))
    h[0].zero_()
    if r.scaling_factor_compute_algo is not None:
        scale.copy_(r.scaling_factor_compute_algo(amax, scale, fp8_max, r))
        return
    # A correctly rounded fp32 quotient (TE's fused update divides with __fdiv_rn; torch's
    # scalar / tensor multiplies by a reciprocal instead, one ulp off at times). Where amax is 0
    # or not finite the scale stays; an infinite quotient becomes fp32's max.
    sf = torch.div(torch.full_like(amax, fp8_max / (2 ** r.margin)), amax) \
        if r.margin == 0 else (torch.full_like(amax, fp8_max) / amax) / (2 ** r.margin)
    sf.nan_to_num_(nan=0.0, posinf=FP32_MAX)
    keep = (amax > 0.0) & (amax < float("inf"))
    scale.copy_(torch.where(keep, sf, scale))


def _pack(metas: List[_DelayedMeta]) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """One buffer's metas in one history and one scale tensor (their values kept; each meta then
    holds views of them): the packed pair, or None where the metas cannot share one tensor
    (different devices or history lengths)."""
    h0 = metas[0].amax_history
    if any(m.amax_history.device != h0.device or m.amax_history.shape[0] != h0.shape[0]
           for m in metas):
        return None
    if len(metas) > 1 or metas[0].amax_history.shape[1] != metas[0].scale.shape[0]:
        h = torch.cat([m.amax_history for m in metas], 1)
        sc = torch.cat([m.scale for m in metas])
        off = 0
        for m in metas:
            n = m.scale.shape[0]
            m.point(h[:, off:off + n], sc[off:off + n])
            off += n
        return h, sc
    return metas[0].amax_history, metas[0].scale


def _key(recipe: Recipe, group: Any) -> Tuple[str, int]:
    return repr(recipe), id(group)


def reduce_and_update(forward: bool, recipe: Optional[Recipe] = None, group: Any = None) -> None:
    """TE's reduce_and_update_fp8_tensors: for every delayed-scaling buffer of this direction
    (of `recipe`/`group` when given), max-reduce the newest amaxes over the autocast's group
    (recipe.reduce_amax), then update each site's history and scale. The buffer's metas are
    packed into one history (TE's global amax buffer): one reduction and one update for all."""
    q = _qstate()
    want = None if recipe is None else _key(recipe, group)
    for key, (rec, grp, metas) in list(q.buffers.items()):
        fwd, rk, gk = key
        if fwd != forward or (want is not None and (rk, gk) != want) or not metas:
            continue
        packed = q.packed.get(key)
        if packed is None or packed[0] != len(metas):
            pk = _pack(metas)
            packed = q.packed[key] = (len(metas), pk)
        fmax = _FMAX[fp8_dtype(rec, forward)]
        if packed[1] is not None and not callable(rec.amax_compute_algo) and \
                rec.scaling_factor_compute_algo is None:
            h, sc = packed[1]
            if rec.reduce_amax:
                amax_allreduce(h[0], grp)
            _update_delayed(rec, h, sc, fmax)
            continue
        newest = torch.cat([m.amax_history[0] for m in metas])
        if rec.reduce_amax:
            amax_allreduce(newest, grp)
        off = 0
        for m in metas:
            n = m.amax_history.shape[1]
            m.amax_history[0].copy_(newest[off:off + n])
            off += n
            m.update(fmax)


# ---- quantized tensors and GEMMs -----------------------------------------------------------

# ---- the CUDA casts (tpflex_cuda.h's tpf_cuda_fp8_cast: one kernel per cast) --------------

_DT_CODE = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float8_e4m3fn: 3,
            torch.float8_e5m2: 4}   # tpf_dtype
_fast_fns: Any = None


def _fast() -> Any:
    """(cast, amax, transpose_bytes) of a library built with the CUDA backend, else False; also
    False with TPFLEX_FP8_TORCH_CAST=1 (the torch operations instead: the benchmarks' baseline)."""
    global _fast_fns
    if _fast_fns is None:
        from ._lib import lib
        fc = getattr(lib, "tpf_cuda_fp8_cast", None)
        if fc is None or os.environ.get("TPFLEX_FP8_TORCH_CAST", "").strip() not in ("", "0"):
            _fast_fns = False
        else:
            fc.argtypes = [c_void_p, c_int, c_uint64, c_uint64, c_void_p, c_void_p, c_int,
                           c_void_p, c_void_p, c_float, c_int, c_void_p, c_void_p, c_void_p]
            fc.restype = c_int
            am, tb = lib.tpf_cuda_fp8_amax, lib.tpf_cuda_transpose_bytes
            am.argtypes, am.restype = [c_void_p, c_int, c_uint64, c_void_p, c_void_p], c_int
            tb.argtypes = [c_void_p, c_uint64, c_uint64, c_void_p, c_void_p]
            tb.restype = c_int
            _fast_fns = (fc, am, tb)
    return _fast_fns


def _on_fast(x: torch.Tensor) -> Any:
    """The CUDA casts when x can take them (a CUDA tensor in bf16, fp16 or fp32), else False."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and \
        x.numel() > 0 and _fast()


def _rows_cols(x: torch.Tensor) -> Tuple[int, int]:
    cols = x.shape[-1] if x.dim() else 1
    return (x.numel() // cols if cols else 0), cols


def _fast_cast(fns: Any, x: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor],
               amax: Optional[torch.Tensor] = None, pow2: bool = False, eps: float = 0.0,
               record: Optional[torch.Tensor] = None) -> "QTensor":
    from ._lib import check
    x = x.detach().contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    sinv = torch.empty(1, dtype=torch.float32, device=x.device)
    rows, cols = _rows_cols(x)
    check(fns[0](x.data_ptr(), _DT_CODE[x.dtype], rows, cols, out.data_ptr(), None,
                 _DT_CODE[dtype], None if scale is None else scale.data_ptr(),
                 None if amax is None else amax.data_ptr(), eps, int(pow2), sinv.data_ptr(),
                 None if record is None else record.data_ptr(),
                 torch.cuda.current_stream(x.device).cuda_stream), "FP8 cast")
    return QTensor(out, sinv)


def _fast_amax(fns: Any, x: torch.Tensor) -> torch.Tensor:
    from ._lib import check
    x = x.detach().contiguous()
    a = torch.zeros(1, dtype=torch.float32, device=x.device)
    check(fns[1](x.data_ptr(), _DT_CODE[x.dtype], x.numel(), a.data_ptr(),
                 torch.cuda.current_stream(x.device).cuda_stream), "FP8 amax")
    return a


class QTensor:
    """A per-tensor quantized tensor: data (fp8) and scale_inv (one-element fp32, 1 / the scale
    it was cast with); scale is 1 / scale_inv, computed when read."""
    __slots__ = ("data", "scale_inv", "_t")

    def __init__(self, data: torch.Tensor, scale_inv: torch.Tensor) -> None:
        self.data, self.scale_inv = data, scale_inv
        self._t: Optional[torch.Tensor] = None

    def t_data(self) -> torch.Tensor:
        """data transposed, contiguous (made once per QTensor: a cached FP8 weight's transpose
        is made once per cache). cuBLASLt runs FP8 GEMMs in the TN layout only, so the
        operations take FP8 operands stored as they multiply, never with trans_a / trans_w."""
        if self._t is None:
            d = self.data
            fns = _fast() if d.is_cuda and d.dim() == 2 else False
            if fns:
                from ._lib import check
                d = d.contiguous()
                t = torch.empty((d.shape[1], d.shape[0]), dtype=d.dtype, device=d.device)
                check(fns[2](d.data_ptr(), d.shape[0], d.shape[1], t.data_ptr(),
                             torch.cuda.current_stream(d.device).cuda_stream), "FP8 transpose")
                self._t = t
            else:
                self._t = d.t().contiguous()
        return self._t

    @property
    def scale(self) -> torch.Tensor:
        return torch.reciprocal(self.scale_inv)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.data.float() * self.scale_inv).to(dtype)


def cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> QTensor:
    """fp8(clamp(x * scale)) with scale_inv = 1 / scale (fp32), round to nearest even. scale: a
    one-element fp32 tensor (read now: later changes to it change neither the data nor the
    returned scale_inv, a new tensor). x * scale is one fp32 product per element (a one-element
    fp32 tensor promotes x, exactly, to fp32). CUDA: one kernel (tpf_cuda_fp8_cast), the same
    bits."""
    m = _FMAX[dtype]
    s = scale.detach()
    if s.dim() != 1 or s.dtype != torch.float32:
        s = s.reshape(1).float()
    fns = _on_fast(x)
    if fns and s.is_cuda:
        return _fast_cast(fns, x, dtype, s.contiguous())
    data = torch.mul(x, s).clamp_(-m, m).to(dtype)
    return QTensor(data, torch.reciprocal(s))


_INF = float("inf")


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| in fp32 (NaN where x holds one), one element; 0 for an empty x."""
    if not x.numel():
        return torch.zeros(1, dtype=torch.float32, device=x.device)
    fns = _on_fast(x)
    if fns:
        return _fast_amax(fns, x)
    return torch.linalg.vector_norm(x.detach(), _INF, dtype=torch.float32).reshape(1)


def fp8_mm(a: QTensor, b: QTensor, out_dtype: torch.dtype, trans_a: bool = False,
           trans_b: bool = False, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None, beta: float = 0.0) -> torch.Tensor:
    """op(a) @ op(b) * a.scale_inv * b.scale_inv (+ bias), accumulated in fp32, rounded once to
    out_dtype (or accumulated into out with beta = 1). CUDA: torch._scaled_mm where it takes
    the shapes; else the fp32 sum of the exactly decoded fp8 products."""
    if a.data.is_cuda:   # _scaled_mm's layout: A row-major, B column-major (b's rows as [N, K])
        A = a.t_data() if trans_a else a.data.contiguous()
        Bt = b.data.contiguous() if trans_b else b.t_data()
        try:
            y = torch._scaled_mm(A, Bt.t(), a.scale_inv, b.scale_inv,
                                 bias=bias if out is None else None,
                                 out_dtype=out_dtype if out is None else torch.float32)
        except (RuntimeError, TypeError):
            y = None
        if y is not None and out is None:
            return y
        if y is not None:
            if bias is not None:
                y = y + bias.float()
            return out.add_(y.to(out.dtype)) if beta else out.copy_(y)
    A = a.data.t() if trans_a else a.data
    B = b.data.t() if trans_b else b.data
    y = (A.float() @ B.float()) * (a.scale_inv * b.scale_inv)
    if bias is not None:
        y = y + bias.float()
    if out is not None:
        if beta:
            out.add_(y.to(out.dtype))
        else:
            out.copy_(y)
        return out
    return y.to(out_dtype)


class SiteQuant:
    """One GEMM site's quantization under the current autocast: the recipe, the formats and
    (delayed scaling) the site's metas: forward [input, weight], backward [grad_output]."""

    def __init__(self, owner: Any, recipe: Recipe, group: Any, device: torch.device) -> None:
        self.recipe, self.group = recipe, group
        self.fwd, self.bwd = fp8_dtype(recipe, True), fp8_dtype(recipe, False)
        self.delayed = isinstance(recipe, DelayedScaling)
        self.meta_fwd = self.meta_bwd = None
        if self.delayed:
            metas = getattr(owner, "_fp8_metas", None)
            k = _key(recipe, group)
            if metas is None or metas[0] != k:
                metas = (k, _DelayedMeta(recipe, 2, device), _DelayedMeta(recipe, 1, device))
                owner._fp8_metas = metas
                q = _qstate()
                for fwd, m in ((True, metas[1]), (False, metas[2])):
                    q.buffers.setdefault((fwd, *k), (recipe, group, []))[2].append(m)
            self.meta_fwd, self.meta_bwd = metas[1], metas[2]
        self.reduce_bwd_at_end = False

    def _qp(self, which: str) -> Tuple[bool, float]:
        qp = getattr(self.recipe, which, None)
        return (bool(qp.power_2_scale), float(qp.amax_epsilon)) if qp is not None else (False,
                                                                                         0.0)

    def quantize(self, x: torch.Tensor, kind: str, tp: Optional[Any] = None) -> QTensor:
        """kind: "input", "weight" or "grad". tp: the TP group's reducer for a tensor that is
        gathered afterwards (a callable max-reducing a one-element tensor in place), else None:
        current scaling then scales by the group's amax."""
        forward = kind != "grad"
        dt = self.fwd if forward else self.bwd
        fns = _on_fast(x)
        if self.delayed:
            meta = self.meta_fwd if forward else self.meta_bwd
            i = 1 if kind == "weight" else 0
            if fns and meta.scale.is_cuda:   # one kernel: the cast, its amax recorded
                return _fast_cast(fns, x, dt, meta.scale_of[i], record=meta.newest[i])
            meta.record(i, amax(x))
            return cast(x, meta.scale_of[i], dt)
        a = amax(x)
        if tp is not None:
            tp(a)
        pow2, eps = self._qp({"input": "fp8_quant_fwd_inp", "weight": "fp8_quant_fwd_weight",
                              "grad": "fp8_quant_bwd_grad"}[kind])
        if fns:   # the scale from the amax on the device, in the cast's kernel
            return _fast_cast(fns, x, dt, None, amax=a, pow2=pow2, eps=eps)
        return cast(x, scale_from_amax(a, _FMAX[dt], pow2, eps), dt)

    def end_of_backward(self) -> None:
        """The first module of an autocast updates the backward scales after its backward."""
        if self.reduce_bwd_at_end and self.delayed:
            reduce_and_update(False, self.recipe, self.group)


def site_quant(owner: Any, device: torch.device) -> Optional[SiteQuant]:
    """The site's quantization when the caller is inside autocast(enabled=True), else None."""
    q = _qstate()
    if not q.enabled:
        return None
    sq = SiteQuant(owner, q.recipe, q.group, device)
    if q.first_module:
        q.first_module = False
        sq.reduce_bwd_at_end = torch.is_grad_enabled()
    return sq


__all__ = ["autocast", "fp8_autocast", "quantized_model_init", "fp8_model_init",
           "is_fp8_enabled", "get_fp8_recipe", "get_default_fp8_recipe", "check_recipe_support",
           "reduce_and_update", "QTensor", "cast", "fp8_mm", "scale_from_amax", "fp8_dtype"]
