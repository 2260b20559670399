"""TE's DotProductAttention (transformer_engine/pytorch/attention/dot_product_attention/) on
torch's own kernels, for this rank's heads: 'thd' (packed sequences, cu_seqlens), 'sbhd' and
'bshd'.

Method (SPEC §13). THD: a token attends only to the tokens of its own sequence as cu_seqlens_q /
cu_seqlens_kv say (causal or not); tokens past cu_seqlens[-1] (padding up to a legal T) get a
zero output, as TE's fast_zero_fill. Which kernel:
  * CUDA, bf16/fp16, no attention dropout in effect, head dim a multiple of 8 up to 256:
    torch.nn.attention.varlen.varlen_attn (torch's flash/cuDNN varlen kernel) on the packed
    tokens, cu_seqlens as int32 on the device. With max_seqlen_q / max_seqlen_kv given as ints
    nothing reads the device (no host sync per layer); without them the maximum is read back
    once per call, as TE does.
  * otherwise (the simulator's CPU tensors, fp32, dropout): torch's
    scaled_dot_product_attention over the packed tokens with a block-diagonal boolean mask
    built on the device from cu_seqlens (searchsorted; no host sync). 16-bit CPU inputs are
    computed in fp32 and rounded once (torch's CPU 16-bit kernels are not relied on, as the
    layers' other CPU paths).
'sbhd' / 'bshd': SDPA with is_causal for "causal", attention_mask (TE's convention: True =
masked out; [b, 1, 1, s_kv] or a (q, kv) pair for the padding types, [b|1, h|1, s_q, s_kv] for
"arbitrary") otherwise. GQA: key/value have num_gqa_groups / P heads, query head h uses group
h // (heads / groups), as TE's kernels do."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as Fn

from ...errors import TpflexDivisibleError, TpflexInvalidError, TpflexShapeError
from ...layers._modules import _divide, _tp_size
from ...layers._te_args import _ExtraState, _refuse

try:  # torch >= 2.9: the varlen (flash) attention over packed sequences
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
    import inspect as _inspect
    _VARLEN_ARGS = frozenset(_inspect.signature(_varlen_attn).parameters)
except (ImportError, TypeError, ValueError):  # older torch: the masked SDPA path serves
    _varlen_attn, _VARLEN_ARGS = None, frozenset()


def _use_varlen(q: torch.Tensor, dropout: float, causal: bool, same: bool) -> bool:
    """Whether torch's varlen kernel serves this call: CUDA, 16-bit, no dropout (it has none),
    a head dim its kernels take, and a causal mask only over one cu_seqlens (its causal mask is
    bottom-right aligned; with equal q/kv lengths that is TE's top-left one)."""
    d = q.shape[-1]
    return (_varlen_attn is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
            and dropout == 0.0 and d % 8 == 0 and d <= 256 and (not causal or same))


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, iq: torch.Tensor,
            ik: torch.Tensor, mq: int, mk: int, causal: bool, scale: float) -> torch.Tensor:
    """torch's varlen_attn with the arguments this torch's version names: the causal mask as
    window_size (-1, 0) (2.10 on) or is_causal (2.9); GQA as enable_gqa, else k/v repeated."""
    kw = {"scale": scale}
    if "window_size" in _VARLEN_ARGS:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        kw["is_causal"] = causal
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in _VARLEN_ARGS:
            kw["enable_gqa"] = True
        else:
            r = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    return _varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), iq, ik, mq, mk, **kw)

QKV_FORMATS = ("sbhd", "bshd", "thd")
MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary")


def _causal(mask_type: str) -> bool:
    return "causal" in mask_type


def _check_cu(where: str, name: str, cu: Any, t: int) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or \
            cu.dtype not in (torch.int32, torch.int64):
        raise TpflexInvalidError(f"{name} must be a 1-D int32/int64 tensor of N+1 cumulative "
                                 f"sequence offsets (0, len0, len0+len1, ...), got "
                                 f"{cu!r:.80}", where)
    if not cu.is_cuda and (int(cu[0]) != 0 or int(cu[-1]) > t or
                           bool((cu[1:] < cu[:-1]).any())):
        raise TpflexShapeError(f"{name} = {cu.tolist()} must start at 0, never decrease and end "
                               f"at most at the {t} packed tokens", where)
    return cu


def _thd_mask(cu_q: torch.Tensor, cu_k: torch.Tensor, tq: int, tk: int, causal: bool,
              bottom_right: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(allowed [tq, tk], valid_q [tq]) from the cumulative offsets, on their device."""
    dev = cu_q.device
    iq = torch.arange(tq, device=dev, dtype=cu_q.dtype)
    ik = torch.arange(tk, device=dev, dtype=cu_k.dtype)
    sq = torch.searchsorted(cu_q, iq, right=True) - 1
    sk = torch.searchsorted(cu_k, ik, right=True) - 1
    n = cu_q.numel() - 1
    valid_q = iq < cu_q[-1]
    valid_k = ik < cu_k[-1]
    allowed = (sq[:, None] == sk[None, :]) & valid_k[None, :]
    if causal:
        pq = iq - cu_q[sq]
        pk = ik - cu_k[sk]
        lim = pq[:, None]
        if bottom_right:
            s = sq.clamp(max=n - 1)
            lim = lim + ((cu_k[s + 1] - cu_k[s]) - (cu_q[s + 1] - cu_q[s]))[:, None]
        allowed &= pk[None, :] <= lim
    # A query row with nothing to attend to (padding past cu_seqlens[-1], or a causal
    # bottom-right row of a longer query) attends everywhere and is zeroed after.
    live = allowed.any(1)
    allowed = allowed | ~live[:, None]
    return allowed, valid_q & live


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
          causal: bool, dropout: float, scale: float) -> torch.Tensor:
    """q [b, hq, sq, d], k/v [b, hkv, sk, d] -> [b, hq, sq, d]; fp32 for CPU 16-bit inputs."""
    dt = q.dtype
    up = not q.is_cuda and dt != torch.float32 and dt != torch.float64
    if up:
        q, k, v = q.float(), k.float(), v.float()
    gqa = q.shape[1] != k.shape[1]
    o = Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                        is_causal=causal and mask is None, scale=scale,
                                        enable_gqa=gqa)
    return o.to(dt) if up else o


def attend(where: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qkv_format: str,
           mask_type: str, attention_mask: Any = None, cu_seqlens_q: Any = None,
           cu_seqlens_kv: Any = None, max_seqlen_q: Optional[int] = None,
           max_seqlen_kv: Optional[int] = None, dropout: float = 0.0,
           scale: Optional[float] = None) -> torch.Tensor:
    """The core attention of one rank's heads. q: thd [t, hq, d], sbhd [s, b, hq, d], bshd
    [b, s, hq, d]; k, v: the same with hkv heads. Returns [t, hq*d] / [s, b, hq*d] /
    [b, s, hq*d]."""
    d = q.shape[-1]
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv < 1 or hq % hkv:
        raise TpflexDivisibleError(f"{hq} query heads do not group over {hkv} key/value heads",
                                   where)
    sc = (1.0 / math.sqrt(d)) if scale is None else float(scale)
    causal = _causal(mask_type)
    if qkv_format == "thd":
        if mask_type == "arbitrary":
            _refuse(where, attn_mask_type=(mask_type, "padding_causal"))
        tq, tk = q.shape[0], k.shape[0]
        if cu_seqlens_q is None:
            raise TpflexInvalidError("qkv_format='thd' needs cu_seqlens_q (and cu_seqlens_kv): "
                                     "the packed sequences' cumulative offsets", where)
        cu_q = _check_cu(where, "cu_seqlens_q", cu_seqlens_q, tq)
        cu_k = cu_q if cu_seqlens_kv is None else _check_cu(where, "cu_seqlens_kv",
                                                             cu_seqlens_kv, tk)
        if cu_k.numel() != cu_q.numel():
            raise TpflexShapeError(f"cu_seqlens_q has {cu_q.numel() - 1} sequences, "
                                   f"cu_seqlens_kv {cu_k.numel() - 1}", where)
        same = cu_k is cu_q
        bottom = "bottom_right" in mask_type
        if _use_varlen(q, dropout, causal, same):
            iq, ik = cu_q.to(torch.int32), cu_k.to(torch.int32)
            mq = int((iq[1:] - iq[:-1]).max()) if max_seqlen_q is None else int(max_seqlen_q)
            mk = mq if same and max_seqlen_kv is None else (
                int((ik[1:] - ik[:-1]).max()) if max_seqlen_kv is None else int(max_seqlen_kv))
            # Tokens past cu_seqlens[-1] (the padding up to a legal T) belong to no sequence:
            # the kernel leaves their output rows and, in its backward, their dq/dk/dv rows
            # unwritten (whatever the allocator held). Masking the inputs as well as the output
            # makes those gradient rows zeros, so they cannot reach the qkv GEMM's weight
            # gradient or the norms' (found on an H100 at P = 2, where T is padded to even).
            z = torch.zeros((), dtype=q.dtype, device=q.device)
            valid = torch.arange(tq, device=q.device) < iq[-1]
            vk = valid if same and tk == tq else torch.arange(tk, device=k.device) < ik[-1]
            q = torch.where(valid[:, None, None], q, z)
            k, v = (torch.where(vk[:, None, None], t, z) for t in (k, v))
            o = _varlen(q, k, v, iq, ik, mq, mk, causal, sc)
            o = torch.where(valid[:, None, None], o, z)
            return o.reshape(tq, hq * d)
        allowed, valid = _thd_mask(cu_q, cu_k, tq, tk, causal, bottom)
        o = _sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                  allowed, False, dropout, sc)[0].transpose(0, 1)
        o = torch.where(valid[:, None, None], o, torch.zeros((), dtype=o.dtype, device=o.device))
        return o.reshape(tq, hq * d)
    # sbhd / bshd: to [b, h, s, d]
    if qkv_format == "sbhd":
        qb, kb, vb = (x.permute(1, 2, 0, 3) for x in (q, k, v))
    else:
        qb, kb, vb = (x.transpose(1, 2) for x in (q, k, v))
    b, sq, sk = qb.shape[0], qb.shape[2], kb.shape[2]
    mask = None
    valid = None
    if "padding" in mask_type or mask_type == "arbitrary":
        if attention_mask is None:
            raise TpflexInvalidError(f"attn_mask_type={mask_type!r} in '{qkv_format}' needs "
                                     f"attention_mask (True = masked out, as TE)", where)
        if mask_type == "arbitrary":
            m = attention_mask
            if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
                raise TpflexInvalidError("attention_mask must be a bool tensor [b|1, h|1, s_q, "
                                         "s_kv] (True = masked out)", where)
            mask = ~m
        else:
            mq, mk = attention_mask if isinstance(attention_mask, (tuple, list)) else \
                (attention_mask, attention_mask)
            for m in (mq, mk):
                if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.dim() != 4:
                    raise TpflexInvalidError("a padding attention_mask is a bool tensor "
                                             "[b, 1, 1, s] or a pair of them (True = masked "
                                             "out)", where)
            mask = ~mk.reshape(b, 1, 1, sk)
            if isinstance(attention_mask, (tuple, list)):
                valid = ~mq.reshape(b, 1, sq, 1)
                mask = mask & valid
        if causal:
            tri = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
            tri = tri.tril(sk - sq if "bottom_right" in mask_type else 0)
            mask = mask & tri
        live = mask.any(-1, keepdim=True)
        mask = mask | ~live
        valid = live
    o = _sdpa(qb, kb, vb, mask, causal and mask is None, dropout, sc)
    if valid is not None:
        o = torch.where(valid, o, torch.zeros((), dtype=o.dtype, device=o.device))
    if qkv_format == "sbhd":
        return o.permute(2, 0, 1, 3).reshape(sq, b, -1)
    return o.transpose(1, 2).reshape(b, sq, -1)


class DotProductAttention(_ExtraState, torch.nn.Module):
    """TransformerEngine's DotProductAttention: softmax(q k^T * scale) v over this rank's heads
    (num_attention_heads / tp_size; GQA groups num_gqa_groups / tp_size). No parameters."""

    def __init__(self, num_attention_heads: int, kv_channels: Union[int, Tuple[int, int]],
                 num_gqa_groups: Optional[int] = None, attention_dropout: float = 0.0,
                 qkv_format: str = "sbhd", attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None,
                 bottom_right_diagonal: Optional[bool] = None, sequence_parallel: bool = False,
                 tp_size: int = 1, get_rng_state_tracker: Optional[Callable[[], Any]] = None,
                 tp_group: Any = None, layer_number: Optional[int] = None,
                 attention_type: str = "self", cp_group: Any = None,
                 cp_global_ranks: Optional[List[int]] = None, cp_stream: Any = None,
                 cp_comm_type: str = "p2p", softmax_scale: Optional[float] = None,
                 softmax_type: str = "vanilla", return_max_logit: Optional[bool] = False,
                 name: Optional[str] = None) -> None:
        super().__init__()
        where = f"DotProductAttention({num_attention_heads}, {kv_channels})"
        _refuse(where, cp_group=(cp_group, None), cp_global_ranks=(cp_global_ranks, None),
                cp_stream=(cp_stream, None), cp_comm_type=(cp_comm_type, "p2p"),
                softmax_type=(softmax_type, "vanilla"),
                return_max_logit=(bool(return_max_logit), False))
        if isinstance(kv_channels, (tuple, list)):
            if len(kv_channels) != 2 or kv_channels[0] != kv_channels[1]:
                _refuse(where, kv_channels=(tuple(kv_channels), "one head size for k and v"))
            kv_channels = kv_channels[0]
        P = _tp_size(where, tp_group, tp_size)
        self.tp_size, self.tp_group = P, tp_group
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        self.heads_per_partition = _divide(where, "num_attention_heads", num_attention_heads, P)
        self.groups_per_partition = _divide(where, "num_gqa_groups", self.num_gqa_groups, P)
        if num_attention_heads % self.num_gqa_groups:
            raise TpflexDivisibleError(f"num_attention_heads {num_attention_heads} is not a "
                                       f"multiple of num_gqa_groups {self.num_gqa_groups}", where)
        self.hidden_size_per_attention_head = _divide(where, "kv_channels", kv_channels, 1)
        if qkv_format not in QKV_FORMATS:
            raise TpflexInvalidError(f"qkv_format={qkv_format!r} ({', '.join(QKV_FORMATS)})",
                                     where)
        _check_mask(where, attn_mask_type)
        _check_window(where, window_size, attn_mask_type)
        if isinstance(attention_dropout, bool) or not isinstance(attention_dropout,
                                                                 (int, float)) or \
                not 0.0 <= attention_dropout < 1.0:
            raise TpflexInvalidError(f"attention_dropout={attention_dropout!r} must be a float "
                                     f"in [0, 1)", where)
        self.attention_dropout = float(attention_dropout)
        self.qkv_format, self.attn_mask_type = qkv_format, attn_mask_type
        self.window_size, self.bottom_right_diagonal = window_size, bottom_right_diagonal
        self.sequence_parallel = sequence_parallel
        self.get_rng_state_tracker = get_rng_state_tracker
        self.layer_number, self.attention_type, self.name = layer_number, attention_type, name
        self.softmax_scale = (1.0 / math.sqrt(self.hidden_size_per_attention_head)
                              if softmax_scale is None else float(softmax_scale))
        self._where = where

    def forward(self, query_layer: Optional[torch.Tensor] = None,
                key_layer: Optional[torch.Tensor] = None,
                value_layer: Optional[torch.Tensor] = None, attention_mask: Any = None,
                qkv_format: Optional[str] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
                cu_seqlens_kv: Optional[torch.Tensor] = None,
                cu_seqlens_q_padded: Optional[torch.Tensor] = None,
                cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
                max_seqlen_q: Optional[int] = None, max_seqlen_kv: Optional[int] = None,
                attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None,
                bottom_right_diagonal: Optional[bool] = None,
                checkpoint_core_attention: bool = False,
                core_attention_bias_type: str = "no_bias",
                core_attention_bias: Optional[torch.Tensor] = None,
                alibi_slopes: Optional[torch.Tensor] = None, fast_zero_fill: bool = True,
                inference_params: Any = None, pad_between_seqs: Optional[bool] = None,
                fp8_output: Optional[bool] = False, bf16_backward: Optional[bool] = False,
                num_splits: Optional[int] = 1, score_mod: Optional[Callable] = None,
                score_mod_bprop: Optional[Callable] = None,
                score_mod_tensors: Optional[Dict[str, torch.Tensor]] = None,
                score_mod_bprop_tensors: Optional[Dict[str, torch.Tensor]] = None,
                qkv_layer: Optional[torch.Tensor] = None, kv_layer: Optional[torch.Tensor] = None,
                qkv_interleave_dim: int = -3) -> torch.Tensor:
        """Attention of query_layer over key_layer / value_layer in TE's arguments. THD
        (qkv_format="thd"): [T, heads, d] packed sequences that cu_seqlens_q / cu_seqlens_kv
        delimit (causal within each for the *causal* mask types; rows past cu_seqlens[-1] are
        0), returned as [T, heads * d]; "sbhd" / "bshd" run SDPA with attention_mask (True =
        masked out). TE's arguments tpflex does not implement are refused off their defaults
        (TpflexUnsupportedError naming them)."""
        where = self._where
        _refuse(where, cu_seqlens_q_padded=(cu_seqlens_q_padded, None),
                cu_seqlens_kv_padded=(cu_seqlens_kv_padded, None),
                core_attention_bias_type=(core_attention_bias_type, "no_bias"),
                core_attention_bias=(core_attention_bias, None),
                alibi_slopes=(alibi_slopes, None), inference_params=(inference_params, None),
                pad_between_seqs=(bool(pad_between_seqs), False),
                fp8_output=(bool(fp8_output), False),
                num_splits=(1 if num_splits is None else num_splits, 1),
                score_mod=(score_mod, None), score_mod_bprop=(score_mod_bprop, None),
                score_mod_tensors=(score_mod_tensors, None),
                score_mod_bprop_tensors=(score_mod_bprop_tensors, None),
                qkv_layer=(qkv_layer, None), kv_layer=(kv_layer, None))
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in QKV_FORMATS:
            raise TpflexInvalidError(f"qkv_format={fmt!r} ({', '.join(QKV_FORMATS)})", where)
        mt = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        _check_mask(where, mt)
        _check_window(where, self.window_size if window_size is None else window_size, mt)
        q, k, v = query_layer, key_layer, value_layer
        nd = 3 if fmt == "thd" else 4
        for nm, t, h in (("query_layer", q, self.heads_per_partition),
                         ("key_layer", k, self.groups_per_partition),
                         ("value_layer", v, self.groups_per_partition)):
            if not isinstance(t, torch.Tensor):
                raise TpflexInvalidError(f"{nm} must be a torch.Tensor", where)
            if t.dim() != nd or t.shape[-2] != h or \
                    t.shape[-1] != self.hidden_size_per_attention_head:
                lead = {"thd": "t", "sbhd": "s, b", "bshd": "b, s"}[fmt]
                raise TpflexShapeError(f"{nm} has shape {list(t.shape)}; '{fmt}' on this rank "
                                       f"is [{lead}, {h}, {self.hidden_size_per_attention_head}]",
                                       where)
        p = self.attention_dropout if self.training else 0.0

        def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return attend(where, q, k, v, fmt, mt, attention_mask, cu_seqlens_q, cu_seqlens_kv,
                          max_seqlen_q, max_seqlen_kv, p, self.softmax_scale)

        if checkpoint_core_attention and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            return checkpoint(core, q, k, v, use_reentrant=False)
        return core(q, k, v)


def _check_mask(where: str, mt: Any) -> None:
    if mt not in MASK_TYPES:
        raise TpflexInvalidError(f"attn_mask_type={mt!r} ({', '.join(MASK_TYPES)})", where)


def _check_window(where: str, window_size: Any, mt: str) -> None:
    """TE's window_size: None, (-1, -1) (no window) or (-1, 0) (the causal masks); a sliding
    window is not implemented."""
    if window_size is None:
        return
    ok = tuple(window_size) in ((-1, -1), (-1, 0)) if isinstance(window_size, (tuple, list)) \
        else False
    if not ok or (tuple(window_size) == (-1, 0)) != _causal(mt):
        _refuse(where, window_size=(window_size, None))


__all__ = ["DotProductAttention", "attend", "QKV_FORMATS", "MASK_TYPES"]
