"""TransformerEngine's FP8 recipes (`transformer_engine.common.recipe`), with TE's class names,
fields and defaults, importable as `tpflex.common.recipe` and from `tpflex.torch` (SPEC §14).

tpflex runs the per-tensor recipes, DelayedScaling and Float8CurrentScaling, inside
`tpflex.torch.autocast`. The block-scaled recipes (MXFP8BlockScaling, Float8BlockScaling,
NVFP4BlockScaling) and CustomRecipe are here so that TE code imports unchanged; autocast refuses
them with TpflexUnsupportedError naming the recipe. Fields are checked when a recipe is made
(TpflexInvalidError naming the field), where TE asserts."""
from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any, Callable, NamedTuple, Optional, Union

from ..errors import TpflexInvalidError

_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


class _FormatHelper(NamedTuple):
    """The largest finite value of the forward and the backward FP8 format."""
    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """TE's FP8 formats: E4M3 everywhere, E5M2 everywhere, or HYBRID (E4M3 forward: inputs and
    weights; E5M2 backward: gradients). E2M1 is FP4 (NVFP4 recipes)."""
    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


@dataclasses.dataclass(frozen=True)
class MMParams:
    """GEMM options (TE: use_split_accumulator = cuBLASLt's fast accumulation off)."""
    use_split_accumulator: bool = True


@dataclasses.dataclass(frozen=True)
class QParams:
    """Quantization options of one tensor kind."""
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


def _check(cond: bool, what: str, recipe: str) -> None:
    if not cond:
        raise TpflexInvalidError(what, recipe)


def _format(recipe: "Recipe") -> None:
    name = type(recipe).__name__
    _check(isinstance(recipe.fp8_format, Format), f"fp8_format={recipe.fp8_format!r} must be a "
           f"tpflex.common.recipe.Format (E4M3 or HYBRID)", name)
    _check(recipe.fp8_format is not Format.E5M2, "fp8_format=Format.E5M2: pure E5M2 training is "
           "not supported (as TE): use Format.HYBRID (E5M2 gradients) or Format.E4M3", name)
    _check(recipe.backward_override in _BACKWARD_OVERRIDES,
           f"backward_override={recipe.backward_override!r}: None, 'high_precision' or "
           f"'dequantized' (NVTE_BACKWARD_OVERRIDE)", name)


class Recipe:
    """TE's recipe base class, with its classification helpers."""

    @classmethod
    def nvfp4(cls) -> bool:
        """True for NVFP4BlockScaling and its subclasses (TE's helper)."""
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        """True for MXFP8BlockScaling and its subclasses (TE's helper)."""
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def delayed(cls) -> bool:
        """True for DelayedScaling and its subclasses (TE's helper)."""
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        """True for Float8CurrentScaling and its subclasses (TE's helper)."""
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        """True for the per-tensor recipes, DelayedScaling and Float8CurrentScaling (TE's
        helper)."""
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def float8_block_scaling(cls) -> bool:
        """True for Float8BlockScaling and its subclasses (TE's helper)."""
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        """True for CustomRecipe and its subclasses (TE's helper)."""
        return issubclass(cls, CustomRecipe)


@dataclasses.dataclass
class DelayedScaling(Recipe):
    """Per-tensor scales from the amax history of earlier steps (TE's DelayedScaling): a tensor
    is cast with the scale of the last update; its amax goes into the history; at the update
    (forward: leaving the outermost autocast; backward: the end of the autocast's first
    module's backward) the amaxes are max-reduced over amax_reduction_group (reduce_amax), amax
    = max of the history ("max") or its newest entry ("most_recent") or
    amax_compute_algo(history), the history rolls, and scale = fp8_max / amax / 2**margin
    (kept where amax is 0 or not finite; fp32's max where that overflows)."""
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable[..., Any]] = "max"
    scaling_factor_compute_algo: Optional[Callable[..., Any]] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_BACKWARD_OVERRIDE", None))

    def __post_init__(self) -> None:
        _format(self)
        n = "DelayedScaling"
        _check(self.backward_override is None, "backward_override: delayed scaling only supports "
               "None (as TE)", n)
        _check(isinstance(self.margin, int) and not isinstance(self.margin, bool) and
               self.margin >= 0, f"margin={self.margin!r} must be an int >= 0", n)
        _check(isinstance(self.amax_history_len, int) and
               not isinstance(self.amax_history_len, bool) and self.amax_history_len >= 1,
               f"amax_history_len={self.amax_history_len!r} must be an int >= 1", n)
        _check(callable(self.amax_compute_algo) or self.amax_compute_algo in ("max",
                                                                              "most_recent"),
               f"amax_compute_algo={self.amax_compute_algo!r}: 'max', 'most_recent' or a "
               f"callable(amax_history) -> amax", n)
        _check(self.scaling_factor_compute_algo is None or
               callable(self.scaling_factor_compute_algo),
               "scaling_factor_compute_algo must be None or a callable(amax, scale, fp8_max, "
               "recipe) -> scale", n)


@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    """Per-tensor scales from each tensor's own amax at cast time (TE's Float8CurrentScaling):
    scale = fp8_max / max(amax, amax_epsilon) (a power of 2 below it with power_2_scale)."""
    use_power_2_scales: bool = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0") == "1")
    fp8_format: Format = Format.HYBRID
    fp8_quant_fwd_inp: Optional[QParams] = None
    fp8_quant_fwd_weight: Optional[QParams] = None
    fp8_quant_bwd_grad: Optional[QParams] = None
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_BACKWARD_OVERRIDE", None))

    def __post_init__(self) -> None:
        _format(self)
        for f in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
            if getattr(self, f) is None:  # TE's class-level defaults follow use_power_2_scales
                setattr(self, f, QParams(power_2_scale=self.use_power_2_scales))


@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """TE's MXFP8 recipe (32-element blocks, E8M0 scales: Blackwell). Not run by tpflex."""
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_BACKWARD_OVERRIDE", None))
    enable_2d_quantization: bool = False

    def __post_init__(self) -> None:
        _format(self)


@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    """TE's FP8 block-scaling recipe (1D/2D blocks, fp32 scales). Not run by tpflex."""
    use_f32_scales: bool = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0") == "1")
    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_BACKWARD_OVERRIDE", None))

    def __post_init__(self) -> None:
        _format(self)


@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """TE's NVFP4 recipe (16-element blocks of E2M1 with E4M3 scales: Blackwell). Not run by
    tpflex."""
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_BACKWARD_OVERRIDE", None))


@dataclasses.dataclass
class CustomRecipe(Recipe):
    """TE's recipe of user-made quantizers (qfactory). Not run by tpflex."""
    qfactory: Optional[Callable[..., Any]] = None
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None
    quantization_alignment: int = 16


__all__ = ["Format", "MMParams", "QParams", "Recipe", "DelayedScaling", "Float8CurrentScaling",
           "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling", "CustomRecipe"]


from .. import _help  # noqa: E402 (help() shows the annotations, not their source text)
_help.evaluate(v for v in list(globals().values())
               if isinstance(v, type) and v.__module__ == __name__)
