"""TE's `transformer_engine.pytorch.module` path: the modules and `base` (userbuffers)."""
from ...layers import LayerNormMLP, Linear

__all__ = ["Linear", "LayerNormMLP"]
