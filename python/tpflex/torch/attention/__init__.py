"""TE's `transformer_engine.pytorch.attention` path: MultiheadAttention, DotProductAttention."""
from .dot_product_attention import DotProductAttention
from .multi_head_attention import MultiheadAttention

__all__ = ["DotProductAttention", "MultiheadAttention"]
