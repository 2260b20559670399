"""tpflex: TP communication/GEMM overlap with dynamic token counts (ctypes binding).

``tpflex.sim`` runs ranks as threads on the simulator; ``tpflex.torch`` is the
TransformerEngine-style API (initialize_ub / set_ub_active_shape / get_ub / destroy_ub)."""
from .errors import *  # noqa: F401,F403
from .errors import TpflexError, STATUS_CLASSES  # noqa: F401
from ._lib import LIBRARY_PATH, last_error  # noqa: F401

__version__ = "0.2.0"
