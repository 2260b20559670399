"""TE's RMSNorm module (transformer_engine/pytorch/module/rmsnorm.py)."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch

from .layernorm import _Norm


class RMSNorm(_Norm):
    """TransformerEngine's RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma (gamma -> 1 + gamma
    with zero_centered_gamma); parameter `weight`."""

    KIND = "RMSNorm"

    def __init__(self, normalized_shape: Union[Iterable[int], int, None] = None,
                 eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False,
                 hidden_size: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(normalized_shape, eps, sequence_parallel, params_dtype,
                         zero_centered_gamma, hidden_size, **kwargs)


__all__ = ["RMSNorm"]
