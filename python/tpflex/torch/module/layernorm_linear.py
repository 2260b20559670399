"""TE's LayerNormLinear (transformer_engine/pytorch/module/layernorm_linear.py): a LayerNorm or
RMSNorm followed by a column-parallel linear, on one GEMM site ('qkv' in MultiheadAttention).

The linear is tpflex's column-parallel autograd function (tpflex/layers/_autograd.py), so every
ub flag schedules as in Linear and LayerNormMLP's fc1: ub_overlap_ag (RING AG + GEMM on
'{ub_name}_fprop'), ub_bulk_dgrad / ub_bulk_wgrad (BULK AG of the norm's output beside the dgrad
GEMM, BULK RS of dgrad beside the wgrad GEMM), ub_overlap_rs_dgrad (dgrad GEMM + RS). The norm
runs on this rank's rows before the gather, as TE's does.

parameters_split (TE's): a tuple of names (equal parts) or a dict name -> size; the weight
becomes parameters `{name}_weight` [size/P, in] (and `{name}_bias` [size/P]) in that order,
concatenated along the output dimension for the GEMM (TE registers them as views of one buffer;
here they are separate tensors and the forward concatenates them)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from ...errors import TpflexDivisibleError, TpflexInvalidError
from ...layers._autograd import _ColumnParallel
from ...layers._modules import (_NORMS, _Site, _default_init, _device, _divide, _flag,
                                _last_dim, _plain_precision, _tp_size)
from ...layers._sites import _compute_dtype, _linear, _native
from ...layers._te_args import _ExtraState, _init_param, _refuse
from .layernorm import _normalize


def _splits(where: str, parameters_split: Any, out_features: int) -> List[Tuple[str, int]]:
    """TE's parameters_split -> [(parameter name prefix, size)]."""
    if parameters_split is None:
        return [("", out_features)]
    if isinstance(parameters_split, dict):
        items = list(parameters_split.items())
        if not items:
            raise TpflexInvalidError("parameters_split is empty (give names, or None)", where)
        for k, v in items:
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TpflexInvalidError(f"parameters_split entry {k!r}: {v!r} must be a name "
                                         f"and a size >= 1", where)
    elif isinstance(parameters_split, (tuple, list)) and \
            all(isinstance(k, str) for k in parameters_split):
        if not parameters_split:
            raise TpflexInvalidError("parameters_split is empty (give names, or None)", where)
        n = len(parameters_split)
        if out_features % n:
            raise TpflexDivisibleError(f"out_features {out_features} does not split into "
                                       f"{n} equal parameters {tuple(parameters_split)}", where)
        items = [(k, out_features // n) for k in parameters_split]
    else:
        raise TpflexInvalidError(f"parameters_split={parameters_split!r} must be None, a tuple "
                                 f"of names or a dict name -> size", where)
    total = sum(v for _, v in items)
    if total != out_features:
        raise TpflexInvalidError(f"parameters_split sizes {[v for _, v in items]} sum to "
                                 f"{total}, not out_features {out_features}", where)
    return [(k.rstrip("_") + "_", v) for k, v in items]


class LayerNormLinear(_ExtraState, torch.nn.Module):
    """TransformerEngine's LayerNormLinear: y = norm(x) W^T + b, W column-parallel [out/P, in].
    Parameters: layer_norm_weight [in], layer_norm_bias [in] (LayerNorm only), weight [out/P, in]
    and bias [out/P] (or TE's parameters_split names). With sequence_parallel the input is this
    rank's rows [T/P, in] and the output the full [T, out/P]."""

    _WITH_NORM = True

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable[[], Any]] = None,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 bias: bool = True, normalization: str = "LayerNorm",
                 return_bias: bool = False, params_dtype: Optional[torch.dtype] = None,
                 parallel_mode: Optional[str] = None, return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False,
                 parameters_split: Optional[Union[Tuple[str, ...], Dict[str, int]]] = None,
                 zero_centered_gamma: bool = False, device: Any = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_name: Optional[str] = None,
                 delay_wgrad_compute: bool = False, symmetric_ar_type: Optional[str] = None,
                 name: Optional[str] = None) -> None:
        super().__init__()
        where = f"LayerNormLinear({in_features}, {out_features})"
        _refuse(where, return_layernorm_output_gathered=(return_layernorm_output_gathered,
                                                         False),
                delay_wgrad_compute=(delay_wgrad_compute, False),
                symmetric_ar_type=(symmetric_ar_type, None))
        if parallel_mode == "row":
            _refuse(where, parallel_mode=(parallel_mode, "column"))
        if parallel_mode not in (None, "column"):
            raise TpflexInvalidError(f"parallel_mode={parallel_mode!r} (None or 'column')", where)
        if normalization not in _NORMS:
            raise TpflexInvalidError(f"normalization={normalization!r} ({' or '.join(_NORMS)})",
                                     where)
        P = _tp_size(where, tp_group, tp_size)
        _divide(where, "in_features", in_features, 1)
        _divide(where, "out_features", out_features, 1)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
            raise TpflexInvalidError(f"eps={eps!r} must be a float >= 0", where)
        self.name = name
        self.in_features, self.out_features = in_features, out_features
        self.eps, self.normalization = float(eps), normalization
        self.tp_size, self.tp_group, self.parallel_mode = P, tp_group, parallel_mode
        self.use_bias = _flag(where, "bias", bias)
        self.return_bias = _flag(where, "return_bias", return_bias)
        self.apply_bias = self.use_bias and not self.return_bias
        self.return_layernorm_output = _flag(where, "return_layernorm_output",
                                             return_layernorm_output)
        self.zero_centered_gamma = _flag(where, "zero_centered_gamma", zero_centered_gamma)
        self.fuse_wgrad_accumulation = _flag(where, "fuse_wgrad_accumulation",
                                             fuse_wgrad_accumulation)
        self.sequence_parallel = P > 1 and _flag(where, "sequence_parallel", sequence_parallel)
        self.ub_name = ub_name
        splits = _splits(where, parameters_split, out_features)
        if parallel_mode == "column":
            splits = [(k, _divide(where, f"parameters_split '{k or 'weight'}' size", v, P))
                      for k, v in splits]
        if len(splits) > 1 and self.fuse_wgrad_accumulation:
            _refuse(where, parameters_split=(parameters_split, None))   # main_grad per weight
        self.weight_names = [f"{k}weight" for k, _ in splits]
        self.bias_names = [f"{k}bias" for k, _ in splits]
        self.parameter_split_sizes = [v for _, v in splits]
        self._site = _Site(where, parallel_mode, P, self.sequence_parallel, ub_name, tp_group,
                           _flag(where, "ub_overlap_ag", ub_overlap_ag),
                           _flag(where, "ub_overlap_rs", ub_overlap_rs),
                           _flag(where, "ub_overlap_rs_dgrad", ub_overlap_rs_dgrad),
                           _flag(where, "ub_bulk_dgrad", ub_bulk_dgrad),
                           _flag(where, "ub_bulk_wgrad", ub_bulk_wgrad))
        self._where = where
        self._local = P == 1 or parallel_mode is None
        self._hshape = (in_features,)
        dt = params_dtype or torch.get_default_dtype()
        dev = _device(device)
        fill = torch.zeros if self.zero_centered_gamma else torch.ones
        if self._WITH_NORM:
            self.layer_norm_weight = torch.nn.Parameter(fill(in_features, dtype=dt, device=dev))
            self.layer_norm_weight.sequence_parallel = self.sequence_parallel
        if self._WITH_NORM and normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(in_features, dtype=dt,
                                                                  device=dev))
            self.layer_norm_bias.sequence_parallel = self.sequence_parallel
        else:
            self.register_parameter("layer_norm_bias", None)
        for wn, n in zip(self.weight_names, self.parameter_split_sizes):
            w = torch.nn.Parameter(torch.empty(n, in_features, dtype=dt, device=dev))
            _init_param(w.data, init_method or _default_init, get_rng_state_tracker, None)
            if parallel_mode == "column":
                w.tensor_model_parallel, w.partition_dim = True, 0
            self.register_parameter(wn, w)
        for bn, n in zip(self.bias_names, self.parameter_split_sizes):
            if self.use_bias:
                b = torch.nn.Parameter(torch.zeros(n, dtype=dt, device=dev))
                if parallel_mode == "column":
                    b.tensor_model_parallel, b.partition_dim = True, 0
                self.register_parameter(bn, b)
            else:
                self.register_parameter(bn, None)

    def _weight(self) -> torch.Tensor:
        ws = [getattr(self, n) for n in self.weight_names]
        return ws[0] if len(ws) == 1 else torch.cat(ws, 0)

    def _bias(self) -> Optional[torch.Tensor]:
        if not self.use_bias:
            return None
        bs = [getattr(self, n) for n in self.bias_names]
        return bs[0] if len(bs) == 1 else torch.cat(bs, 0)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                fp8_output: Optional[bool] = False, fp8_grad: Optional[bool] = False) -> Any:
        """y = norm(inp) @ weight.T + bias: inp is this rank's rows [T/P, in] with
        sequence_parallel (column-parallel), else [..., in]; returns y, then bias with
        return_bias and the norm's output with return_layernorm_output, as TE. fp8_output and
        fp8_grad are accepted at False only; is_first_microbatch as Linear's."""
        _refuse(self._where, fp8_output=(bool(fp8_output), False),
                fp8_grad=(bool(fp8_grad), False))
        H = self.in_features
        _last_dim(self._where, inp, H, "the input")
        w0 = getattr(self, self.weight_names[0])
        x = inp if inp.dim() == 2 else inp.reshape(-1, H)
        cdt = _compute_dtype(w0)   # torch.autocast's dtype, else the parameters'
        if x.dtype != cdt:
            x = x.to(cdt)
        ln = x if not self._WITH_NORM else _normalize(
            x, self.normalization, self._hshape, self.layer_norm_weight, self.layer_norm_bias,
            self.eps, self.zero_centered_gamma)
        W, b = self._weight(), self._bias()
        if self._local and not self.fuse_wgrad_accumulation and _native(W) and \
                _plain_precision(w0):
            # Nothing to communicate: torch's own linear and backward (as Linear's fast path).
            y = _linear(ln, W, b if self.apply_bias else None)
        else:
            reduce = self.parallel_mode is not None and self.tp_size > 1
            # The whole weight (split parameters concatenated): the GEMM's operand, whose
            # compute form (autocast / FP8 cast) the call prepares.
            call = self._site.call(ln.shape[0], H, W, self.fuse_wgrad_accumulation,
                                   not is_first_microbatch, reduce,
                                   first_microbatch=is_first_microbatch)
            if self.parallel_mode is None:
                call.P, call.sp, call.plain = 1, False, None
            y = _ColumnParallel.apply(ln, W, b if self.apply_bias else None, call)
        if inp.dim() != 2:
            y = y.view(-1, *inp.shape[1:-1], y.shape[-1])
            ln = ln.view(inp.shape)
        out: Tuple[Any, ...] = (y,)
        if self.return_bias:
            out += (b,)
        if self.return_layernorm_output:
            out += (ln,)
        return out if len(out) > 1 else y

    def extra_repr(self) -> str:
        """The sizes, norm, bias, parallel mode, tp_size and the overlap flags on."""
        s = self._site
        flags = [k for k in ("ag", "rs_dgrad", "bulk_dgrad", "bulk_wgrad") if getattr(s, k)]
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"normalization={self.normalization}, bias={self.use_bias}, "
                f"parallel_mode={self.parallel_mode}, tp_size={self.tp_size}, "
                f"sequence_parallel={self.sequence_parallel}, ub_name={self.ub_name}, "
                f"ub={flags}")


class _SplitLinear(LayerNormLinear):
    """TE's Linear with parameters_split (MultiheadAttention's `qkv` without input_layernorm):
    LayerNormLinear's column-parallel GEMM and split parameters, no norm and no norm
    parameters; state_dict keys as TE's Linear ({name}_weight, {name}_bias, _extra_state)."""

    _WITH_NORM = False


__all__ = ["LayerNormLinear"]
