"""TE's `transformer_engine.pytorch.module` path: the modules and `base` (userbuffers)."""
from ...layers import LayerNormMLP, Linear
from . import base  # noqa: F401 (TE's te.module.base.initialize_ub)

__all__ = ["Linear", "LayerNormMLP"]
