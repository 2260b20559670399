"""TE's `transformer_engine.pytorch.module.base`: where TE users import the userbuffer calls."""
from ..._te import destroy_ub, get_ub, initialize_ub

__all__ = ["initialize_ub", "destroy_ub", "get_ub"]
try:  # the precision work (SPEC §14) adds TE's enum to tpflex._te; re-exported where present
    from ..._te import UserBufferQuantizationMode  # noqa: F401
    __all__.append("UserBufferQuantizationMode")
except ImportError:
    pass
