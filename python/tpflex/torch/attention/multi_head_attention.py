"""TE's MultiheadAttention (transformer_engine/pytorch/attention/multi_head_attention.py):
[norm ->] qkv projection (column-parallel, site 'qkv') -> DotProductAttention over this rank's
heads -> output projection (row-parallel, site 'proj').

Parameters as TE's self-attention: with input_layernorm, `layernorm_qkv` (LayerNormLinear:
layer_norm_weight, layer_norm_bias, and `weight` [(np + 2 ng) d / P, H] with fuse_qkv_params,
else query_weight [np d / P, H], key_weight and value_weight [ng d / P, H] and their biases);
without it `qkv` (Linear; fuse_qkv_params only). `proj` (Linear: weight [H, np d / P], bias
[H]). The fused weight's rows are TE's: grouped by GQA group, each group's np/ng query heads
then its key and its value head (qkv_weight_interleaved=True), else [query | key | value].
Rank r holds the heads [r np/P, (r+1) np/P) and groups [r ng/P, (r+1) ng/P)."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import torch

from ...errors import TpflexInvalidError, TpflexUnsupportedError  # noqa: F401
from ...layers._modules import Linear, _divide, _flag, _tp_size
from ...layers._te_args import _SharesGroups, _refuse
from ..module.layernorm_linear import LayerNormLinear, _SplitLinear
from .dot_product_attention import QKV_FORMATS, DotProductAttention, _check_mask


class MultiheadAttention(_SharesGroups, torch.nn.Module):
    """TransformerEngine's MultiheadAttention (self-attention). forward(hidden_states, ...)
    returns the projection's output [T/P, H] with sequence_parallel (THD: [t/P, H]; sbhd:
    [s/P, b, H]), then the projection's bias with return_bias, then the norm's output with
    return_layernorm_output."""

    def __init__(self, hidden_size: int, num_attention_heads: int,
                 kv_channels: Optional[int] = None, attention_dropout: float = 0.1,
                 layernorm_epsilon: float = 1e-5,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 output_layer_init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 layer_number: Optional[int] = None, attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None,
                 bottom_right_diagonal: Optional[bool] = None, tp_group: Any = None,
                 tp_size: int = 1, num_gqa_groups: Optional[int] = None,
                 fuse_wgrad_accumulation: bool = False,
                 get_rng_state_tracker: Optional[Callable[[], Any]] = None,
                 sequence_parallel: bool = False, params_dtype: Optional[torch.dtype] = None,
                 return_bias: bool = False, return_layernorm_output: bool = False,
                 input_layernorm: bool = False, attention_type: str = "self",
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False,
                 zero_centered_gamma: bool = False, qkv_weight_interleaved: bool = True,
                 rotary_pos_interleaved: bool = False, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False, bias: bool = True,
                 normalization: str = "LayerNorm", device: Union[torch.device, str, None] = None,
                 qkv_format: str = "sbhd", name: Optional[str] = None,
                 qk_norm_type: Optional[str] = None, qk_norm_eps: float = 1e-6,
                 qk_norm_before_rope: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, softmax_type: str = "vanilla") -> None:
        super().__init__()
        where = f"MultiheadAttention({hidden_size}, {num_attention_heads})"
        _refuse(where, attention_type=(attention_type, "self"),
                qk_norm_type=(qk_norm_type, None), softmax_type=(softmax_type, "vanilla"))
        # qk_norm_eps / qk_norm_before_rope only act with qk_norm_type; rotary_pos_interleaved
        # only with rotary_pos_emb (refused in forward); seq_length / micro_batch_size are TE's
        # JIT-warmup hints. Accepted.
        P = _tp_size(where, tp_group, tp_size)
        if qkv_format not in QKV_FORMATS:
            raise TpflexInvalidError(f"qkv_format={qkv_format!r} ({', '.join(QKV_FORMATS)})",
                                     where)
        _check_mask(where, attn_mask_type)
        self.set_parallel_mode = _flag(where, "set_parallel_mode", set_parallel_mode)
        if P > 1 and not self.set_parallel_mode:
            raise TpflexUnsupportedError(
                f"tp_size {P} needs set_parallel_mode=True (the heads are split over the ranks "
                f"by the column-parallel qkv and row-parallel proj)", where)
        self.fuse_qkv_params = _flag(where, "fuse_qkv_params", fuse_qkv_params)
        self.input_layernorm = _flag(where, "input_layernorm", input_layernorm)
        self.qkv_weight_interleaved = self.fuse_qkv_params and bool(qkv_weight_interleaved)
        self.hidden_size, self.num_attention_heads = hidden_size, num_attention_heads
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        _divide(where, "hidden_size", hidden_size, 1)
        kv = kv_channels if kv_channels else hidden_size // num_attention_heads
        self.hidden_size_per_attention_head = _divide(where, "kv_channels", kv, 1)
        self.num_attention_heads_per_partition = _divide(where, "num_attention_heads",
                                                         num_attention_heads, P)
        self.num_gqa_groups_per_partition = _divide(where, "num_gqa_groups",
                                                    self.num_gqa_groups, P)
        self.tp_size, self.tp_group = P, tp_group
        self.sequence_parallel = P > 1 and bool(sequence_parallel)
        self.qkv_format, self.attn_mask_type = qkv_format, attn_mask_type
        self.window_size, self.bottom_right_diagonal = window_size, bottom_right_diagonal
        self.return_bias = _flag(where, "return_bias", return_bias)
        self.return_layernorm_output = _flag(where, "return_layernorm_output",
                                             return_layernorm_output)
        self.layer_number, self.name = layer_number, name
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        d = self.hidden_size_per_attention_head
        hq, hkv = d * num_attention_heads, d * self.num_gqa_groups
        self.hidden_size_q, self.hidden_size_kv = hq, hkv
        common = dict(fuse_wgrad_accumulation=fuse_wgrad_accumulation, tp_group=tp_group,
                      tp_size=tp_size, get_rng_state_tracker=get_rng_state_tracker,
                      sequence_parallel=sequence_parallel, params_dtype=params_dtype,
                      device=device)
        mode = "column" if self.set_parallel_mode else None
        if self.input_layernorm:
            split = None if self.fuse_qkv_params else {"query": hq, "key": hkv, "value": hkv}
            self.layernorm_qkv = LayerNormLinear(
                hidden_size, hq + 2 * hkv, eps=layernorm_epsilon, init_method=init_method,
                bias=bias, return_bias=False, parallel_mode=mode,
                return_layernorm_output=self.return_layernorm_output, parameters_split=split,
                zero_centered_gamma=zero_centered_gamma, ub_bulk_wgrad=ub_bulk_wgrad,
                ub_bulk_dgrad=ub_bulk_dgrad, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
                ub_overlap_ag=ub_overlap_ag, normalization=normalization, ub_name="qkv",
                name=None if name is None else name + ".layernorm_linear_qkv", **common)
        elif not self.fuse_qkv_params:
            # TE's qkv Linear with parameters_split (query/key/value): LayerNormLinear's GEMM
            # without the norm; like TE's, it takes no ub flags.
            self.qkv = _SplitLinear(hidden_size, hq + 2 * hkv, init_method=init_method,
                                    bias=bias, return_bias=False, parallel_mode=mode,
                                    parameters_split={"query": hq, "key": hkv, "value": hkv},
                                    name=None if name is None else name + ".linear_qkv",
                                    **common)
        else:
            # TE's qkv Linear takes no ub flags (its overlap needs the norm's module).
            self.qkv = Linear(hidden_size, hq + 2 * hkv, init_method=init_method, bias=bias,
                              return_bias=False, parallel_mode=mode,
                              name=None if name is None else name + ".linear_qkv", **common)
        self.core_attention = DotProductAttention(
            num_attention_heads, d, num_gqa_groups=self.num_gqa_groups,
            attention_dropout=attention_dropout, qkv_format=qkv_format,
            attn_mask_type=attn_mask_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel,
            tp_group=tp_group, layer_number=layer_number, attention_type=attention_type,
            softmax_type=softmax_type,
            name=None if name is None else name + ".core_attention")
        self.proj = Linear(hq, hidden_size, init_method=output_layer_init_method, bias=bias,
                           return_bias=self.return_bias,
                           parallel_mode="row" if self.set_parallel_mode else None,
                           ub_overlap_rs=ub_overlap_rs, ub_overlap_ag=ub_overlap_ag,
                           ub_name="proj", name=None if name is None else name + ".proj",
                           **common)
        self._where = where

    def _split_qkv(self, mixed: torch.Tensor, fmt: str) -> Tuple[torch.Tensor, ...]:
        """[lead..., (np + 2 ng) d / P] -> q [lead..., np/P, d], k, v [lead..., ng/P, d]."""
        lead = mixed.shape[:-1]
        np_, ng, d = (self.num_attention_heads_per_partition,
                      self.num_gqa_groups_per_partition, self.hidden_size_per_attention_head)
        r = np_ // ng
        if self.qkv_weight_interleaved:
            m = mixed.view(*lead, ng, r + 2, d)
            q, k, v = m.split((r, 1, 1), dim=-2)
        else:
            m = mixed.view(*lead, r + 2, ng, d)
            q, k, v = m.split((r, 1, 1), dim=-3)
        return (q.reshape(*lead, np_, d), k.reshape(*lead, ng, d), v.reshape(*lead, ng, d))

    def forward(self, hidden_states: torch.Tensor,
                attention_mask: Any = None, encoder_output: Optional[torch.Tensor] = None,
                attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None,
                bottom_right_diagonal: Optional[bool] = None,
                is_first_microbatch: Optional[bool] = None,
                checkpoint_core_attention: bool = False, inference_params: Any = None,
                rotary_pos_emb: Any = None, core_attention_bias_type: str = "no_bias",
                core_attention_bias: Optional[torch.Tensor] = None,
                alibi_slopes: Optional[torch.Tensor] = None,
                cu_seqlens_q: Optional[torch.Tensor] = None,
                cu_seqlens_kv: Optional[torch.Tensor] = None,
                cu_seqlens_q_padded: Optional[torch.Tensor] = None,
                cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
                max_seqlen_q: Optional[int] = None, max_seqlen_kv: Optional[int] = None,
                fast_zero_fill: bool = True, pad_between_seqs: Optional[bool] = None) -> Any:
        """Self-attention of hidden_states: the qkv projection (site 'qkv', with the input
        norm when input_layernorm), DotProductAttention, the output projection (site 'proj').
        With sequence_parallel and THD, hidden_states is this rank's rows [T/P, H] of the
        active T and so is the output (sbhd: [s/P, b, H]); returns it, then the proj bias with
        return_bias, then the norm's output with return_layernorm_output. encoder_output,
        inference_params and rotary_pos_emb are refused unless None."""
        where = self._where
        _refuse(where, encoder_output=(encoder_output, None),
                inference_params=(inference_params, None), rotary_pos_emb=(rotary_pos_emb, None))
        fmt = self.qkv_format
        if fmt == "thd" and hidden_states.dim() != 2:
            raise TpflexInvalidError(f"qkv_format 'thd': hidden_states is [tokens, "
                                     f"{self.hidden_size}], got {list(hidden_states.shape)}",
                                     where)
        if fmt != "thd" and hidden_states.dim() != 3:
            raise TpflexInvalidError(f"qkv_format '{fmt}': hidden_states is 3-D, got "
                                     f"{list(hidden_states.shape)}", where)
        ln = None
        if self.input_layernorm:
            out = self.layernorm_qkv(hidden_states, is_first_microbatch=is_first_microbatch)
            mixed, ln = out if self.return_layernorm_output else (out, None)
        else:
            mixed = self.qkv(hidden_states, is_first_microbatch=is_first_microbatch)
        q, k, v = self._split_qkv(mixed, fmt)
        ctx = self.core_attention(
            q, k, v, attention_mask=attention_mask, qkv_format=fmt, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=self.attn_mask_type if attn_mask_type is None else attn_mask_type,
            window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
            checkpoint_core_attention=checkpoint_core_attention,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
            fast_zero_fill=fast_zero_fill, pad_between_seqs=pad_between_seqs)
        out = self.proj(ctx, is_first_microbatch=is_first_microbatch)
        outs: Tuple[Any, ...] = out if self.return_bias else (out,)
        if self.input_layernorm and self.return_layernorm_output:
            outs = outs + (ln,)
        return outs if len(outs) > 1 else outs[0]


__all__ = ["MultiheadAttention"]
