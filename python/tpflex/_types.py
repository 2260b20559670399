"""The C enums as the torch side names them: tpf_dtype <-> torch.dtype, tpf_algo and tpf_coll by
name, and the status numbers the bootstrap callbacks return. The numbers come from the C mirrors
in _lib.py and errors.py (tests/python/test_mirrors.py checks those against include/tpflex/)."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from . import _lib
from .errors import TpflexBackendError, TpflexTimeoutError

TORCH_TO_TPF: Dict[torch.dtype, int] = {
    torch.bfloat16: _lib.DTYPES["bf16"],
    torch.float16: _lib.DTYPES["fp16"],
    torch.float32: _lib.DTYPES["fp32"],
    torch.float8_e4m3fn: _lib.DTYPES["fp8_e4m3"],   # SPEC §11: E4M3 "fn", as TE's Float8Tensor
    torch.float8_e5m2: _lib.DTYPES["fp8_e5m2"],
}
TPF_TO_TORCH: Dict[int, torch.dtype] = {v: k for k, v in TORCH_TO_TPF.items()}
GEMM_DTYPES: Tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES: Tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)
ALGO: Dict[str, int] = dict(_lib.ALGOS)   # "bulk", "pipeline", "ring"
COLL: Dict[str, int] = dict(_lib.COLLS)   # "ag", "rs"
ALGO_NAME: Dict[int, str] = {v: k for k, v in ALGO.items()}
COLL_NAME: Dict[int, str] = {v: k for k, v in COLL.items()}
TPF_ETIMEOUT: int = TpflexTimeoutError.status
TPF_EBACKEND: int = TpflexBackendError.status


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
