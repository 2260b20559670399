"""TE's LayerNorm module (transformer_engine/pytorch/module/layernorm.py) and the normalisation
that LayerNorm, RMSNorm and LayerNormLinear share.

Arithmetic: fp32 statistics and affine, rounded once to the input's dtype (TE's kernels). fp32
inputs, and CUDA 16-bit LayerNorm (torch's kernel already keeps fp32 statistics and rounds
once), take torch's kernel directly; CPU 16-bit inputs and 16-bit RMSNorm compute in fp32
explicitly. zero_centered_gamma: the scale is (1 + gamma), gamma initialised to zero."""
from __future__ import annotations

import warnings
from typing import Any, Iterable, Optional, Tuple, Union

import torch
import torch.nn.functional as Fn

from ...errors import TpflexInvalidError, TpflexShapeError
from ...layers._modules import _device
from ...layers._te_args import _ExtraState


def _normalize(x: torch.Tensor, kind: str, shape: Tuple[int, ...], w: torch.Tensor,
               b: Optional[torch.Tensor], eps: float, zero_centered: bool) -> torch.Tensor:
    """LayerNorm or RMSNorm of x over its trailing `shape` in fp32, rounded once to x's dtype."""
    wide = x.dtype in (torch.float32, torch.float64)
    if zero_centered:
        w = w + 1.0 if wide else w.float() + 1.0
    if wide or (x.is_cuda and kind == "LayerNorm" and not zero_centered):
        if kind == "LayerNorm":
            return Fn.layer_norm(x, shape, w if w.dtype == x.dtype else w.to(x.dtype),
                                 None if b is None else b.to(x.dtype), eps)
        return Fn.rms_norm(x, shape, w if w.dtype == x.dtype else w.to(x.dtype), eps)
    if kind == "LayerNorm":
        y = Fn.layer_norm(x.float(), shape, w.float(), None if b is None else b.float(), eps)
    else:
        y = Fn.rms_norm(x.float(), shape, w.float(), eps)
    return y.to(x.dtype)


def _shape(where: str, normalized_shape: Any, hidden_size: Any) -> Tuple[int, ...]:
    if normalized_shape is None:
        if hidden_size is None:
            raise TpflexInvalidError("give normalized_shape (hidden_size is TE's deprecated "
                                     "name for it)", where)
        warnings.warn("hidden_size is TE's deprecated name: use normalized_shape",
                      DeprecationWarning, stacklevel=3)
        normalized_shape = hidden_size
    elif hidden_size is not None:
        raise TpflexInvalidError("both normalized_shape and hidden_size given (hidden_size is "
                                 "the deprecated name of normalized_shape): give one", where)
    dims = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise TpflexInvalidError(f"normalized_shape={normalized_shape!r} must be an int >= 1 or "
                                 f"a sequence of them", where)
    return dims


class _Norm(_ExtraState, torch.nn.Module):
    """TE's ops-based norm modules: parameters `weight` (and `bias` for LayerNorm) of
    normalized_shape; keyword tail as TE's basic op (device, dtype, sm_margin)."""

    KIND = "LayerNorm"

    def __init__(self, normalized_shape: Union[Iterable[int], int, None] = None,
                 eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False,
                 hidden_size: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__()
        where = f"{type(self).__name__}({normalized_shape if hidden_size is None else hidden_size})"
        unknown = sorted(set(kwargs) - {"device", "dtype", "sm_margin"})
        if unknown:
            raise TpflexInvalidError(f"unknown keyword arguments {unknown} (TE's: device, dtype, "
                                     f"sm_margin)", where)
        if params_dtype is not None and "dtype" in kwargs:
            raise TpflexInvalidError("both dtype and params_dtype (TE's deprecated name) given: "
                                     "give one", where)
        # sm_margin reserves SMs for TE's communication kernels; tpflex launches none.
        self.normalized_shape = _shape(where, normalized_shape, hidden_size)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
            raise TpflexInvalidError(f"eps={eps!r} must be a float >= 0", where)
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = sequence_parallel
        dt = params_dtype or kwargs.get("dtype") or torch.get_default_dtype()
        dev = _device(kwargs.get("device"))
        self._where = where
        fill = torch.zeros if self.zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(fill(self.normalized_shape, dtype=dt, device=dev))
        if self.KIND == "LayerNorm":
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, dtype=dt,
                                                       device=dev))
        else:
            self.register_parameter("bias", None)
        if sequence_parallel is not None:   # Megatron's flag on the parameters, as TE sets it
            for p in (self.weight, self.bias):
                if p is not None:
                    p.sequence_parallel = sequence_parallel

    def reset_parameters(self) -> None:
        """weight to 1 (0 with zero_centered_gamma), bias to 0."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        """The norm over inp's trailing normalized_shape dimensions (computed in fp32, rounded
        once to inp's dtype)."""
        n = len(self.normalized_shape)
        if not isinstance(inp, torch.Tensor):
            raise TpflexInvalidError(f"the input must be a torch.Tensor, got "
                                     f"{type(inp).__name__}", self._where)
        if tuple(inp.shape[inp.dim() - n:]) != self.normalized_shape:
            raise TpflexShapeError(f"the input has shape {list(inp.shape)}; its trailing "
                                   f"dimensions must be {list(self.normalized_shape)}",
                                   self._where)
        return _normalize(inp, self.KIND, self.normalized_shape, self.weight, self.bias,
                          self.eps, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        """normalized_shape, eps and zero_centered_gamma (print(module))."""
        return (f"{list(self.normalized_shape)}, eps={self.eps}, "
                f"zero_centered_gamma={self.zero_centered_gamma}")


class LayerNorm(_Norm):
    """TransformerEngine's LayerNorm: y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta
    (gamma -> 1 + gamma with zero_centered_gamma); parameters `weight`, `bias`."""

    KIND = "LayerNorm"

    def __init__(self, normalized_shape: Union[Iterable[int], int, None] = None,
                 eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False,
                 hidden_size: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(normalized_shape, eps, sequence_parallel, params_dtype,
                         zero_centered_gamma, hidden_size, **kwargs)


__all__ = ["LayerNorm"]
