"""TE's `transformer_engine.common` path: the FP8 recipes (`tpflex.common.recipe`)."""
from . import recipe

__all__ = ["recipe"]
