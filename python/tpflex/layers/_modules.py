"""The modules: Linear, LayerNormMLP, and active_tokens."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, Tuple

import torch
import torch.nn.functional as Fn

from .. import sim
from ..errors import (TpflexDivisibleError, TpflexError, TpflexInvalidError, TpflexShapeError,
                      TpflexStateError, TpflexUnsupportedError)
from ._autograd import _Call, _check_tokens, _ColumnParallel, _RowParallel
from .. import _quant
from ._sites import (_TOKENS, _Plain, _autocast_off, _autocast_on, _compute_dtype, _get, _linear,
                     _native, _need, _precision, _site_names, _tt)
from ._te_args import _ExtraState, _init_param, _refuse


# ---- modules -----------------------------------------------------------------------------------

def _flag(where: str, name: str, v: Any) -> bool:
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise TpflexInvalidError(f"{name}={v!r} must be a bool", where)


def _tp_size(where: str, tp_group: Any, tp_size: Any) -> int:
    if tp_group is not None:
        import torch.distributed as dist
        return int(dist.get_world_size(tp_group))
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TpflexInvalidError(f"tp_size={tp_size!r} must be an int >= 1", where)
    return tp_size


def _divide(where: str, what: str, n: int, P: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TpflexInvalidError(f"{what}={n!r} must be an int >= 1", where)
    if n % P:
        raise TpflexDivisibleError(f"{what} {n} does not divide among tp_size {P} ranks", where)
    return n // P


def _device(device: Any) -> torch.device:
    if device is not None:
        return torch.device(device)
    if sim.current() is not None or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _default_init(w: torch.Tensor) -> None:
    torch.nn.init.normal_(w, mean=0.0, std=0.023)  # TE's get_default_init_method


def _main_grad(where: str, p: torch.nn.Parameter, pname: str) -> torch.Tensor:
    mg = getattr(p, "main_grad", None)
    if not isinstance(mg, torch.Tensor):
        raise TpflexStateError(f"fuse_wgrad_accumulation=True: set {pname}.main_grad (an fp32 "
                               f"tensor of shape {list(p.shape)}) before the forward", where)
    if mg.dtype != torch.float32 or tuple(mg.shape) != tuple(p.shape) or mg.device != p.device:
        raise TpflexInvalidError(f"{pname}.main_grad is {mg.dtype} {list(mg.shape)} on "
                                 f"{mg.device}; expected torch.float32 {list(p.shape)} on "
                                 f"{p.device}", where)
    return mg


def _last_dim(where: str, inp: Any, K: int, what: str) -> None:
    if not isinstance(inp, torch.Tensor):
        raise TpflexInvalidError(f"{what} must be a torch.Tensor, got {type(inp).__name__}", where)
    if inp.dim() < 1 or inp.shape[-1] != K:
        raise TpflexShapeError(f"{what} has shape {list(inp.shape)}; its last dimension must be "
                               f"{K}", where)


def _2d(where: str, inp: Any, K: int, what: str) -> torch.Tensor:
    _last_dim(where, inp, K, what)
    x = inp if inp.dim() == 2 else inp.reshape(-1, K)
    return x if x.is_contiguous() else x.contiguous()   # a transposed input: row-major rows


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def _autocast_on(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:   # an older torch: no device argument
        return bool(torch.is_autocast_enabled() or (device_type == "cpu" and
                                                    torch.is_autocast_cpu_enabled()))


def _check_tp(where: str, P: int, mgr: Any) -> None:
    """A module that communicates over the manager's communicators must have its tp_size."""
    if mgr is not None and mgr.tp_size != P:
        raise TpflexInvalidError(
            f"the module's tp_size is {P} but initialize_ub registered tp_size {mgr.tp_size}: "
            f"build the module with tp_size={mgr.tp_size} (or the manager with {P} ranks)", where)


class _Site:
    """One GEMM site's parallel mode, flags in effect (TE's rules) and communicators."""

    def __init__(self, where: str, mode: Optional[str], P: int, sp: bool, ub_name: Optional[str],
                 group: Any, ag: bool, rs: bool, rs_dgrad: bool, bulk_dgrad: bool,
                 bulk_wgrad: bool) -> None:
        self.where, self.mode, self.P, self.sp, self.ub_name, self.group = \
            where, mode, P, sp, ub_name, group
        col, row = mode == "column" and sp, mode == "row" and sp
        self.ag = col and ag                 # fprop RING AG + GEMM
        self.rs_dgrad = col and rs_dgrad
        self.bulk_dgrad = col and bulk_dgrad and not self.rs_dgrad
        self.bulk_wgrad = col and bulk_wgrad and not self.rs_dgrad
        self.rs = row and rs                 # fprop GEMM + RS
        self.ag_dgrad = row and ag           # dgrad RING AG + GEMM
        self._cache: Any = None              # (key, _resolve's result)
        if self.any_ub:
            if not ub_name:
                raise TpflexInvalidError("a ub_* overlap needs ub_name (the sites "
                                         "'{ub_name}_fprop/_dgrad/_wgrad')", where)
            n = ub_name
            if self.ag:
                _need(where, f"{n}_fprop", "ub_overlap_ag", ("ring",), "ag")
            if self.rs:
                _need(where, f"{n}_fprop", "ub_overlap_rs", ("ring", "pipeline"), "rs")
            if self.ag_dgrad:
                _need(where, f"{n}_dgrad", "ub_overlap_ag (dgrad)", ("ring",), "ag")
            if self.rs_dgrad:
                _need(where, f"{n}_dgrad", "ub_overlap_rs_dgrad", ("ring", "pipeline"), "rs")
            if self.bulk_dgrad:
                _need(where, f"{n}_dgrad", "ub_bulk_dgrad", ("bulk",), "ag")
            if self.bulk_wgrad:
                _need(where, f"{n}_wgrad", "ub_bulk_wgrad", ("bulk",), "rs")
            _check_tp(where, P, _tt().current_manager())

    def __getstate__(self) -> dict:
        # The cache holds the registration's communicators (C handles, locks): a deep copy or
        # a pickle of the module takes the site without it and resolves again on first use.
        d = dict(self.__dict__)
        d["_cache"] = None
        return d

    @property
    def any_ub(self) -> bool:
        return self.ag or self.rs or self.ag_dgrad or self.rs_dgrad or self.bulk_dgrad or \
            self.bulk_wgrad

    def _resolve(self, reduce: bool,
                 fp8: bool = False) -> Tuple[Any, Any, Any, Optional[_Plain], Any]:
        """(fprop, dgrad, wgrad, plain, ref): the communicators of this site's flags, the plain
        path's collectives and the communicator whose active shape the rows are checked
        against. Resolved once per registration (manager) and kept: a manager's communicators
        by name do not change until destroy_ub, after which another manager is current."""
        P = self.P
        on_sim = P > 1 and reduce and self.group is None and sim.current() is not None
        mgr = _tt().current_manager() if self.any_ub or on_sim else None
        key = (mgr, reduce, on_sim, fp8)   # fp8: the FP8 mode's registrations (SPEC §14)
        hit = self._cache
        if hit is not None and hit[0] == key:
            return hit[1]
        _check_tp(self.where, P, mgr)
        n = self.ub_name
        fprop = _get(f"{n}_fprop", fp8) if self.ag or self.rs else None
        dgrad = _get(f"{n}_dgrad", fp8) if self.ag_dgrad or self.rs_dgrad or self.bulk_dgrad \
            else None
        wgrad = _get(f"{n}_wgrad", fp8) if self.bulk_wgrad else None
        plain = None
        if P > 1 and reduce:
            pre = (f"{n}_dgrad", f"{n}_wgrad") if n else ()
            plain = _Plain(self.where, P, self.group, pre, pre)
        ref = fprop or dgrad or wgrad
        if ref is None and plain is not None and plain.on_sim:
            ref = plain._comm("ag" if self.sp and self.mode == "column" else "rs")
        res = (fprop, dgrad, wgrad, plain, ref)
        self._cache = (key, res)
        return res

    def call(self, rows: int, cols: int, weight: torch.nn.Parameter, fuse_wgrad: bool,
             accumulate: bool, reduce: bool = True,
             first_microbatch: Optional[bool] = None) -> _Call:
        """This call's settings: the communicators (resolved once per registration), the rows
        checked against the active shape. rows, cols: the input's (column) or the output's
        (row) row count and width."""
        c = _Call(self.where)
        c.P, c.sp, c.reduce = self.P, self.sp, reduce
        c.ag, c.rs, c.ag_dgrad, c.rs_dgrad = self.ag, self.rs, self.ag_dgrad, self.rs_dgrad
        c.bulk_dgrad, c.bulk_wgrad = self.bulk_dgrad, self.bulk_wgrad
        c.fprop, c.dgrad, c.wgrad, c.plain, ref = self._resolve(reduce,
                                                                _quant.is_fp8_enabled())
        if ref is not None:
            tokens = rows * self.P if self.mode == "column" and self.sp else rows
            what = ("the input" if self.mode == "column" else "the input (row-parallel)")
            H = _check_tokens(c, ref, tokens, rows, what)
            if cols != H:
                side = "input's width (in_features)" if self.mode == "column" else \
                    "output's width (out_features)"
                raise TpflexShapeError(f"the {side} is {cols}, but the registered hidden size is "
                                       f"{H} ('{ref.name}')", self.where)
        c.fuse_wgrad = fuse_wgrad
        if fuse_wgrad and torch.is_grad_enabled() and weight.requires_grad:
            c.main_grad = _main_grad(self.where, weight, "weight")
        elif fuse_wgrad:
            c.fuse_wgrad = False
        c.accumulate = accumulate
        # torch.autocast / FP8 autocast: the GEMMs' dtype, the quantization, the weight cast
        # (FP8: cached per is_first_microbatch), each communicator's dtype checked against it.
        _precision(self, c, weight, first_microbatch, self.group)
        return c


def _plain_precision(w: torch.Tensor) -> bool:
    """Whether the parameters' dtype is what the GEMMs run in: no torch.autocast for w's device
    and no FP8 autocast (else the modules take their autograd functions, which cast)."""
    return not _autocast_on(w.device.type) and not _quant.is_fp8_enabled()


class Linear(_ExtraState, torch.nn.Module):
    """TransformerEngine's Linear (SPEC §12): parallel_mode None, "column" or "row"."""

    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable[[], Any]] = None,
                 rng_tracker_name: Optional[str] = None,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 parameters_split: Any = None, device: Any = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, ub_name: Optional[str] = None,
                 delay_wgrad_compute: bool = False, symmetric_ar_type: Optional[str] = None,
                 save_original_input: bool = False, name: Optional[str] = None) -> None:
        super().__init__()
        where = f"Linear({in_features}, {out_features})"
        # TE's order and every TE argument (SPEC §12's correction); save_original_input only
        # changes what TE's FP8 path saves, so it is accepted; name labels the module.
        _refuse(where, parameters_split=(parameters_split, None),
                delay_wgrad_compute=(delay_wgrad_compute, False),
                symmetric_ar_type=(symmetric_ar_type, None))
        self.name = name
        if parallel_mode not in (None, "column", "row"):
            raise TpflexInvalidError(f"parallel_mode={parallel_mode!r} (None, 'column' or 'row')",
                                     where)
        P = _tp_size(where, tp_group, tp_size)
        self.in_features, self.out_features = in_features, out_features
        self.tp_size, self.tp_group, self.parallel_mode = P, tp_group, parallel_mode
        self.use_bias = _flag(where, "bias", bias)
        self.return_bias = _flag(where, "return_bias", return_bias)
        self.apply_bias = self.use_bias and not self.return_bias
        self.fuse_wgrad_accumulation = _flag(where, "fuse_wgrad_accumulation",
                                             fuse_wgrad_accumulation)
        self.sequence_parallel = P > 1 and _flag(where, "sequence_parallel", sequence_parallel)
        self.ub_name = ub_name
        n_out = _divide(where, "out_features", out_features, P) if parallel_mode == "column" \
            else out_features
        n_in = _divide(where, "in_features", in_features, P) if parallel_mode == "row" \
            else in_features
        self._site = _Site(where, parallel_mode, P, self.sequence_parallel, ub_name, tp_group,
                           _flag(where, "ub_overlap_ag", ub_overlap_ag),
                           _flag(where, "ub_overlap_rs", ub_overlap_rs),
                           _flag(where, "ub_overlap_rs_dgrad", ub_overlap_rs_dgrad),
                           _flag(where, "ub_bulk_dgrad", ub_bulk_dgrad),
                           _flag(where, "ub_bulk_wgrad", ub_bulk_wgrad))
        self._where = where
        # No communication in either direction (tp_size 1, as TE turns sequence parallelism
        # off there, or no parallel mode): forward() is torch's own linear (see there).
        self._local = P == 1 or parallel_mode is None
        dt = params_dtype or torch.get_default_dtype()
        dev = _device(device)
        self.weight = torch.nn.Parameter(torch.empty(n_out, n_in, dtype=dt, device=dev))
        _init_param(self.weight.data, init_method or _default_init, get_rng_state_tracker,
                    rng_tracker_name)
        if parallel_mode is not None:
            self.weight.tensor_model_parallel = True
            self.weight.partition_dim = 0 if parallel_mode == "column" else 1
        if self.use_bias:
            self.bias = torch.nn.Parameter(torch.zeros(n_out, dtype=dt, device=dev))
            if parallel_mode == "row":
                self.bias.sequence_parallel = self.sequence_parallel
            elif parallel_mode == "column":
                self.bias.tensor_model_parallel = True
                self.bias.partition_dim = 0
        else:
            self.register_parameter("bias", None)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None) -> Any:
        """y = inp @ weight.T + bias over the TP group. With sequence_parallel a column-parallel
        input and a row-parallel output are this rank's rows [T/P, ...] of the active shape's T
        (a mismatch is TpflexShapeError naming both); returns y, or (y, bias) with return_bias.
        is_first_microbatch as TE: True overwrites main_grad and caches the FP8 weight, False
        reuses the cache, None quantizes every call."""
        w = self.weight
        K = w.shape[1]
        if self._local and not self.fuse_wgrad_accumulation and _native(w) and \
                _plain_precision(w):
            # Nothing to communicate and torch's kernels round as the operation does: torch's
            # linear and its own backward (no autograd Function, no per-call settings), the
            # same aten ops as torch.nn.Linear (tests/python/test_layers.py counts them).
            _last_dim(self._where, inp, K, "the input")
            y = _linear(inp if inp.dtype == w.dtype else inp.to(w.dtype), w,
                        self.bias if self.apply_bias else None)
            return (y, self.bias) if self.return_bias else y
        x = _2d(self._where, inp, K, "the input")
        cdt = _compute_dtype(self.weight)   # torch.autocast's dtype, else the parameters'
        if x.dtype != cdt:
            x = x.to(cdt)
        mode, P = self.parallel_mode, self.tp_size
        reduce = mode is not None
        if mode == "row":
            call = self._site.call(x.shape[0], self.weight.shape[0], self.weight,
                                   self.fuse_wgrad_accumulation, not is_first_microbatch, reduce,
                                   first_microbatch=is_first_microbatch)
            fn = _RowParallel
        else:
            call = self._site.call(x.shape[0], K, self.weight, self.fuse_wgrad_accumulation,
                                   not is_first_microbatch, reduce and P > 1,
                                   first_microbatch=is_first_microbatch)
            fn = _ColumnParallel
        if mode is None:
            call.P, call.sp, call.plain = 1, False, None
        b = self.bias if self.apply_bias else None
        y = fn.apply(x, self.weight, b, call)
        if inp.dim() != 2:
            y = y.view(-1, *inp.shape[1:-1], y.shape[-1])
        if self.return_bias:
            return y, self.bias
        return y

    def extra_repr(self) -> str:
        """The sizes, parallel mode, tp_size and the overlap flags on (print(module))."""
        s = self._site
        flags = [k for k in ("ag", "rs", "ag_dgrad", "rs_dgrad", "bulk_dgrad", "bulk_wgrad")
                 if getattr(s, k)]
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, parallel_mode={self.parallel_mode}, tp_size={self.tp_size}"
                f", sequence_parallel={self.sequence_parallel}, ub_name={self.ub_name}, "
                f"ub={flags}")


_NORMS = ("LayerNorm", "RMSNorm")
_ACTS = ("gelu", "relu")


class LayerNormMLP(_ExtraState, torch.nn.Module):
    """TransformerEngine's LayerNormMLP (SPEC §12): norm -> fc1 (column-parallel) -> activation
    -> fc2 (row-parallel), on the sites 'fc1' and 'fc2'."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5,
                 sequence_parallel: bool = False, return_bias: bool = False,
                 get_rng_state_tracker: Optional[Callable[[], Any]] = None,
                 tp_group: Any = None, tp_size: int = 1,
                 init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 bias: bool = True, normalization: str = "LayerNorm",
                 activation: str = "gelu", activation_params: Optional[dict] = None,
                 output_layer_init_method: Optional[Callable[[torch.Tensor], Any]] = None,
                 fuse_wgrad_accumulation: bool = False,
                 params_dtype: Optional[torch.dtype] = None,
                 return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False,
                 seq_length: Optional[int] = None, micro_batch_size: Optional[int] = None,
                 set_parallel_mode: bool = False, zero_centered_gamma: bool = False,
                 device: Any = None, ub_overlap_ag: bool = False, name: Optional[str] = None,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 delay_wgrad_compute: bool = False, symmetric_ar_type: Optional[str] = None,
                 checkpoint: bool = False) -> None:
        super().__init__()
        where = f"LayerNormMLP({hidden_size}, {ffn_hidden_size})"
        # TE's order and every TE argument (SPEC §12's correction). seq_length and
        # micro_batch_size are TE's JIT-warmup hints: accepted, nothing to warm up here.
        _refuse(where, activation_params=(activation_params, None),
                return_layernorm_output=(return_layernorm_output, False),
                return_layernorm_output_gathered=(return_layernorm_output_gathered, False),
                zero_centered_gamma=(zero_centered_gamma, False),
                delay_wgrad_compute=(delay_wgrad_compute, False),
                symmetric_ar_type=(symmetric_ar_type, None), checkpoint=(checkpoint, False))
        self.name, self.seq_length, self.micro_batch_size = name, seq_length, micro_batch_size
        if normalization not in _NORMS:
            raise TpflexInvalidError(f"normalization={normalization!r} ({' or '.join(_NORMS)})",
                                     where)
        if activation not in _ACTS:
            raise TpflexUnsupportedError(f"activation={activation!r} (tpflex offers "
                                         f"{' and '.join(_ACTS)}; gelu is the tanh form)", where)
        P = _tp_size(where, tp_group, tp_size)
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.eps = float(eps)
        self.normalization, self.activation = normalization, activation
        self.tp_size, self.tp_group = P, tp_group
        self.use_bias = _flag(where, "bias", bias)
        self.return_bias = _flag(where, "return_bias", return_bias)
        self.apply_bias = self.use_bias and not self.return_bias
        self.fuse_wgrad_accumulation = _flag(where, "fuse_wgrad_accumulation",
                                             fuse_wgrad_accumulation)
        self.sequence_parallel = P > 1 and _flag(where, "sequence_parallel", sequence_parallel)
        self.set_parallel_mode = _flag(where, "set_parallel_mode", set_parallel_mode)
        if P > 1 and not self.set_parallel_mode:
            raise TpflexUnsupportedError(
                f"tp_size {P} needs set_parallel_mode=True (without it TE leaves fc2's reduction "
                f"and fc1's input gradient to its caller; tpflex does not offer that mode)", where)
        Fp = _divide(where, "ffn_hidden_size", ffn_hidden_size, P)
        _divide(where, "hidden_size", hidden_size, 1)
        flags = [_flag(where, k, v) for k, v in (
            ("ub_overlap_ag", ub_overlap_ag), ("ub_overlap_rs", ub_overlap_rs),
            ("ub_overlap_rs_dgrad", ub_overlap_rs_dgrad), ("ub_bulk_dgrad", ub_bulk_dgrad),
            ("ub_bulk_wgrad", ub_bulk_wgrad))]
        ag, rs, rs_dgrad, bulk_dgrad, bulk_wgrad = flags
        sp = self.sequence_parallel
        self._fc1 = _Site(where, "column", P, sp, "fc1", tp_group, ag, False, rs_dgrad,
                          bulk_dgrad, bulk_wgrad)
        self._fc2 = _Site(where, "row", P, sp, "fc2", tp_group, ag, rs, False, False, False)
        self._where = where
        self._local = P == 1   # nothing to communicate: forward() runs torch's own ops
        self._hshape = (hidden_size,)
        dt = params_dtype or torch.get_default_dtype()
        dev = _device(device)
        H = hidden_size
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(H, dtype=dt, device=dev))
        self.layer_norm_weight.sequence_parallel = sp
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(H, dtype=dt, device=dev))
            self.layer_norm_bias.sequence_parallel = sp
        else:
            self.register_parameter("layer_norm_bias", None)
        self.fc1_weight = torch.nn.Parameter(torch.empty(Fp, H, dtype=dt, device=dev))
        _init_param(self.fc1_weight.data, init_method or _default_init, get_rng_state_tracker,
                    None)
        self.fc2_weight = torch.nn.Parameter(torch.empty(H, Fp, dtype=dt, device=dev))
        _init_param(self.fc2_weight.data, output_layer_init_method or _default_init,
                    get_rng_state_tracker, None)
        self.fc1_weight.tensor_model_parallel, self.fc1_weight.partition_dim = True, 0
        self.fc2_weight.tensor_model_parallel, self.fc2_weight.partition_dim = True, 1
        if self.use_bias:
            self.fc1_bias = torch.nn.Parameter(torch.zeros(Fp, dtype=dt, device=dev))
            self.fc1_bias.tensor_model_parallel, self.fc1_bias.partition_dim = True, 0
            self.fc2_bias = torch.nn.Parameter(torch.zeros(H, dtype=dt, device=dev))
            self.fc2_bias.sequence_parallel = sp
        else:
            self.register_parameter("fc1_bias", None)
            self.register_parameter("fc2_bias", None)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """The normalisation in fp32, rounded once to the compute dtype (TE's kernels). On CUDA
        torch's LayerNorm kernel does exactly that for 16-bit inputs (fp32 statistics and
        affine, one rounding), so nothing is converted there: the conversions were 2 of the 4
        kernels and most of the bytes of the norm. fp32 inputs take torch's kernel directly
        (any norm, any device); RMSNorm on 16-bit inputs keeps the explicit fp32 path."""
        w, hs = self.layer_norm_weight, self._hshape
        with _autocast_off(x):   # under torch.autocast: fp32 parameters, x in its dtype
            return self._norm_body(x, w, hs)

    def _norm_body(self, x: torch.Tensor, w: torch.Tensor, hs: Tuple[int, ...]) -> torch.Tensor:
        if (x.dtype == torch.float32 and w.dtype == torch.float32) or \
                (x.is_cuda and self.normalization == "LayerNorm" and w.dtype == x.dtype):
            if self.normalization == "LayerNorm":
                return Fn.layer_norm(x, hs, w, self.layer_norm_bias, self.eps)
            return Fn.rms_norm(x, hs, w, self.eps)
        if self.normalization == "LayerNorm":
            y = Fn.layer_norm(x.float(), hs, w.float(), self.layer_norm_bias.float(), self.eps)
        else:
            y = Fn.rms_norm(x.float(), hs, w.float(), self.eps)
        return y.to(x.dtype)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None) -> Any:
        """fc2(act(fc1(norm(inp)))): inp is this rank's rows [T/P, H] with sequence_parallel
        (else [T, H]), the output likewise; returns it, or (out, fc2_bias) with return_bias.
        is_first_microbatch as Linear's."""
        H = self.hidden_size
        w1 = self.fc1_weight
        if self._local and not self.fuse_wgrad_accumulation and _native(w1) and \
                _plain_precision(w1):
            # tp_size 1 (TE turns sequence parallelism off): torch's own norm, linears and
            # activation with their own backward, the aten ops of the same block in torch.nn
            # (tests/python/test_layers.py counts them): no autograd Function, no settings.
            _last_dim(self._where, inp, H, "the input")
            y = self._norm(inp if inp.dtype == w1.dtype else inp.to(w1.dtype))
            y = _linear(y, w1, self.fc1_bias)
            y = Fn.gelu(y, approximate="tanh") if self.activation == "gelu" else Fn.relu(y)
            y = _linear(y, self.fc2_weight, self.fc2_bias if self.apply_bias else None)
            return (y, self.fc2_bias) if self.return_bias else y
        x = _2d(self._where, inp, H, "the input")
        cdt = _compute_dtype(self.fc1_weight)   # torch.autocast's dtype, else the parameters'
        if x.dtype != cdt:
            x = x.to(cdt)
        acc = not is_first_microbatch
        fuse = self.fuse_wgrad_accumulation
        c1 = self._fc1.call(x.shape[0], H, self.fc1_weight, fuse, acc,
                            first_microbatch=is_first_microbatch)
        ln = self._norm(x)
        # The GELU in fc1's epilogue only when nothing needs the pre-activation.
        c1.gelu = (self.activation == "gelu" and c1.ag and not torch.is_grad_enabled())
        y1 = _ColumnParallel.apply(ln, self.fc1_weight, self.fc1_bias, c1)
        if not c1.gelu:
            y1 = Fn.gelu(y1, approximate="tanh") if self.activation == "gelu" else Fn.relu(y1)
        c2 = self._fc2.call(y1.shape[0], H, self.fc2_weight, fuse, acc,
                            first_microbatch=is_first_microbatch)
        b2 = self.fc2_bias if self.apply_bias else None
        y = _RowParallel.apply(y1, self.fc2_weight, b2, c2)
        if inp.dim() != 2:
            y = y.view(-1, *inp.shape[1:-1], H)
        if self.return_bias:
            return y, self.fc2_bias
        return y

    def extra_repr(self) -> str:
        """The sizes, norm, activation, tp_size and sequence_parallel (print(module))."""
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"normalization={self.normalization}, activation={self.activation}, "
                f"tp_size={self.tp_size}, sequence_parallel={self.sequence_parallel}")


def _shape_comm() -> Any:
    """A registered communicator that takes the manager's active shape (not external)."""
    for n in _site_names():
        try:
            c = _get(n)
        except TpflexStateError:
            raise
        except TpflexError:
            continue
        if not getattr(c, "external", False):
            return c
    raise TpflexStateError("active_tokens: no registered communicator takes an active shape",
                           "active_tokens")


@contextlib.contextmanager
def active_tokens(tokens: int) -> Iterator[Tuple[int, int]]:
    """Sets the manager's active shape to [tokens, H] (H: the registration's hidden size) for
    the block, and restores the shape that was active before on exit. Yields (tokens, H).

    The restore is owed, not made, on a normal exit: the next call of this package that uses
    the shape (an operation, a view, active_shape, legal_rows, ...) applies it first, and the
    next set_ub_active_shape / active_tokens supersedes it, so a training loop of one block per
    microbatch makes one shape change per microbatch, not two (tests/python/test_geometry.py
    counts them). A block left by an exception restores at once. Inside the block the modules
    take T from this block's shape rather than reading it back from the C library."""
    tt = _tt()
    c = _shape_comm()
    m = c._mgr
    H = c._cols  # the registration's hidden size (fixed at creation)
    # the shape to restore: one a previous block still owes (superseded below), else the
    # active one
    prev = m._pending if m._pending is not None else tuple(c.active_shape)
    tt.set_ub_active_shape([tokens, H])
    serial = m._serial
    tok = _TOKENS.set((m, serial, int(tokens), int(H)))
    try:
        yield (int(tokens), int(H))
    except BaseException as e:
        _TOKENS.reset(tok)
        # the block's own exception is the one raised; a restore that fails too is noted on it
        try:
            tt.set_ub_active_shape(list(prev))
        except TpflexError as e2:
            note = f"active_tokens could not restore the active shape {list(prev)}: {e2}"
            if hasattr(e, "add_note"):
                e.add_note(note)
            else:  # Python < 3.11
                e.args = e.args + (note,)
        raise
    _TOKENS.reset(tok)
    if m._h is not None and (m._serial != serial or tuple(prev) != (int(tokens), int(H))):
        m._pending = (int(prev[0]), int(prev[1]))
