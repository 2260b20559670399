"""TE's `transformer_engine.pytorch.module.base`: where TE users import the userbuffer calls."""
from ..._te import UserBufferQuantizationMode, destroy_ub, get_ub, initialize_ub

__all__ = ["initialize_ub", "destroy_ub", "get_ub", "UserBufferQuantizationMode"]
