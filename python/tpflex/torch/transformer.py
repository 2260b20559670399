"""TE's TransformerLayer (transformer_engine/pytorch/transformer.py), the encoder layer:

    a   = self_attention(x)                     # LayerNormLinear 'qkv' -> attention -> 'proj'
    x1  = x + dropout(a + proj_bias)            # TE's bias-dropout-add, hidden_dropout
    m   = layernorm_mlp(x1)                     # 'fc1' -> activation -> 'fc2'
    out = x1 + dropout(m + fc2_bias)

Parameters as TE's: self_attention.layernorm_qkv.*, self_attention.proj.*, layernorm_mlp.*.
The sites are TE's ('qkv', 'proj', 'fc1', 'fc2'), so initialize_ub's default registration
serves the layer; ub_tp_comm_overlap switches the per-site ub flags on, as in TE."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as Fn

from ..errors import TpflexInvalidError
from ..layers._modules import LayerNormMLP, _flag, _tp_size
from ..layers._sites import _native
from ..layers._te_args import _SharesGroups, _refuse
from .attention.dot_product_attention import QKV_FORMATS, _check_mask
from .attention.multi_head_attention import MultiheadAttention


def _bias_dropout_add(x: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor,
                      p: float, training: bool) -> torch.Tensor:
    """residual + dropout(x + bias): each sum rounded once to x's dtype (TE's fused kernel
    keeps fp32 inside; here CPU 16-bit inputs add in fp32 and round after each sum, as the
    layers' CPU paths do)."""
    if bias is not None:
        x = x + bias if _native(x) else (x.float() + bias.float()).to(x.dtype)
    if p > 0.0 and training:
        x = Fn.dropout(x, p, True)
    return residual + x if _native(x) else (residual.float() + x.float()).to(x.dtype)


class TransformerLayer(_SharesGroups, torch.nn.Module):
    """TransformerEngine's TransformerLayer (encoder, pre-norm). forward(hidden_states, ...)
    with TE's arguments; attn_input_format 'thd' takes cu_seqlens_q / cu_seqlens_kv and
    max_seqlen_q / max_seqlen_kv. With sequence_parallel the input and output are this rank's
    rows [T/P, H] (THD) or [s/P, b, H]."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: Optional[int] = None, layernorm_epsilon: float = 1e-5,
                 hidden_dropout: float = 0.1, attention_dropout: float = 0.1,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 output_layer_init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 layer_number: Optional[int] = None, kv_channels: Optional[int] = None,
                 self_attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None,
                 bottom_right_diagonal: Optional[bool] = None,
                 enc_dec_attn_mask_type: str = "no_mask",
                 enc_dec_bottom_right_diagonal: Optional[bool] = None,
                 enc_dec_window_size: Optional[Tuple[int, int]] = None, tp_group: Any = None,
                 tp_size: int = 1, params_dtype: Optional[torch.dtype] = None,
                 get_rng_state_tracker: Optional[Callable[[], Any]] = None,
                 fuse_wgrad_accumulation: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, sequence_parallel: bool = False,
                 apply_residual_connection_post_layernorm: bool = False,
                 output_layernorm: bool = False, parallel_attention_mlp: bool = False,
                 layer_type: str = "encoder", drop_path_rate: float = 0.0,
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False,
                 rotary_pos_interleaved: bool = False, zero_centered_gamma: bool = False,
                 qkv_weight_interleaved: bool = True, ub_tp_comm_overlap: bool = False,
                 ub_overlap_ag: bool = True, ub_overlap_rs: bool = True,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = True,
                 ub_bulk_wgrad: bool = True, bias: bool = True, activation: str = "gelu",
                 activation_params: Optional[dict] = None, normalization: str = "LayerNorm",
                 device: Union[torch.device, str, None] = None, attn_input_format: str = "sbhd",
                 name: Optional[str] = None, qk_norm_type: Optional[str] = None,
                 qk_norm_eps: float = 1e-6, qk_norm_before_rope: bool = False,
                 softmax_type: str = "vanilla") -> None:
        super().__init__()
        where = f"TransformerLayer({hidden_size}, {ffn_hidden_size}, {num_attention_heads})"
        _refuse(where, apply_residual_connection_post_layernorm=(
                    apply_residual_connection_post_layernorm, False),
                output_layernorm=(output_layernorm, False),
                parallel_attention_mlp=(parallel_attention_mlp, False),
                layer_type=(layer_type, "encoder"), drop_path_rate=(float(drop_path_rate), 0.0),
                zero_centered_gamma=(zero_centered_gamma, False))
        # enc_dec_* only act with layer_type 'decoder' (refused above): accepted.
        if not fuse_qkv_params and fuse_wgrad_accumulation:
            raise TpflexInvalidError("fuse_wgrad_accumulation=True needs fuse_qkv_params=True "
                                     "(as TE: one qkv weight with a main_grad)", where)
        if attn_input_format not in QKV_FORMATS:
            raise TpflexInvalidError(f"attn_input_format={attn_input_format!r} "
                                     f"({', '.join(QKV_FORMATS)})", where)
        _check_mask(where, self_attn_mask_type)
        for nm, v in (("hidden_dropout", hidden_dropout),):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise TpflexInvalidError(f"{nm}={v!r} must be a float in [0, 1)", where)
        on = _flag(where, "ub_tp_comm_overlap", ub_tp_comm_overlap)
        ub = {k: on and _flag(where, k, v) for k, v in (
            ("ub_overlap_ag", ub_overlap_ag), ("ub_overlap_rs", ub_overlap_rs),
            ("ub_overlap_rs_dgrad", ub_overlap_rs_dgrad), ("ub_bulk_dgrad", ub_bulk_dgrad),
            ("ub_bulk_wgrad", ub_bulk_wgrad))}
        P = _tp_size(where, tp_group, tp_size)
        self.tp_size, self.tp_group = P, tp_group
        self.sequence_parallel = P > 1 and bool(sequence_parallel)
        self.hidden_size = hidden_size
        self.hidden_dropout = float(hidden_dropout)
        self.self_attn_mask_type, self.window_size = self_attn_mask_type, window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.attn_input_format = attn_input_format
        self.layer_number, self.name, self.seq_length = layer_number, name, seq_length
        self.kv_channels = kv_channels if kv_channels else hidden_size // num_attention_heads
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, self.kv_channels, attention_dropout,
            layernorm_epsilon, init_method, output_layer_init_method,
            layer_number=layer_number, attn_mask_type=self_attn_mask_type,
            window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
            tp_group=tp_group, tp_size=P, num_gqa_groups=num_gqa_groups,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel,
            params_dtype=params_dtype, return_bias=True, return_layernorm_output=False,
            input_layernorm=True, attention_type="self", set_parallel_mode=set_parallel_mode,
            fuse_qkv_params=fuse_qkv_params, zero_centered_gamma=zero_centered_gamma,
            qkv_weight_interleaved=qkv_weight_interleaved,
            rotary_pos_interleaved=rotary_pos_interleaved, bias=bias,
            normalization=normalization, device=device, qkv_format=attn_input_format,
            name=None if name is None else name + ".self_attention", qk_norm_type=qk_norm_type,
            qk_norm_eps=qk_norm_eps, qk_norm_before_rope=qk_norm_before_rope,
            seq_length=seq_length, micro_batch_size=micro_batch_size,
            softmax_type=softmax_type, **ub)
        self.layernorm_mlp = LayerNormMLP(
            hidden_size, ffn_hidden_size, eps=layernorm_epsilon,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation, tp_group=tp_group, tp_size=P,
            get_rng_state_tracker=get_rng_state_tracker, init_method=init_method,
            output_layer_init_method=output_layer_init_method, bias=bias, return_bias=True,
            sequence_parallel=sequence_parallel, params_dtype=params_dtype,
            seq_length=seq_length, micro_batch_size=micro_batch_size,
            set_parallel_mode=set_parallel_mode, activation=activation,
            activation_params=activation_params, normalization=normalization, device=device,
            name=None if name is None else name + ".layernorm_mlp", **ub)
        self._where = where

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None,
                self_attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None,
                bottom_right_diagonal: Optional[bool] = None,
                encoder_output: Optional[torch.Tensor] = None, enc_dec_attn_mask: Any = None,
                enc_dec_attn_mask_type: Optional[str] = None,
                enc_dec_window_size: Optional[Tuple[int, int]] = None,
                enc_dec_bottom_right_diagonal: Optional[bool] = None,
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
                fast_zero_fill: bool = True,
                pad_between_seqs: Optional[bool] = None) -> torch.Tensor:
        """x + proj(attention(norm(x))), then + fc2(act(fc1(norm(.)))) (TE's encoder layer):
        hidden_states is this rank's rows [T/P, H] of the active T with sequence_parallel, and
        so is the output. THD takes cu_seqlens_q / cu_seqlens_kv and max_seqlen_q /
        max_seqlen_kv as DotProductAttention's."""
        # encoder_output and the enc_dec_* arguments belong to the decoder's cross-attention
        # (layer_type 'decoder', refused at construction): an encoder layer ignores them, as TE.
        mt = self.self_attn_mask_type if self_attn_mask_type is None else self_attn_mask_type
        a, a_bias = self.self_attention(
            hidden_states, attention_mask=attention_mask, attn_mask_type=mt,
            window_size=self.window_size if window_size is None else window_size,
            bottom_right_diagonal=bottom_right_diagonal, is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention,
            inference_params=inference_params, rotary_pos_emb=rotary_pos_emb,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
            fast_zero_fill=fast_zero_fill, pad_between_seqs=pad_between_seqs)
        x = hidden_states if hidden_states.dtype == a.dtype else hidden_states.to(a.dtype)
        x1 = _bias_dropout_add(a, a_bias, x, self.hidden_dropout, self.training)
        m, m_bias = self.layernorm_mlp(x1, is_first_microbatch=is_first_microbatch)
        return _bias_dropout_add(m, m_bias, x1, self.hidden_dropout, self.training)


__all__ = ["TransformerLayer"]
