"""TransformerEngine's module arguments that tpflex accepts without implementing (refused when
given a value other than TE's default), TE's parameter initialisation under an RNG tracker, and
TE's `_extra_state` entries in a module's state_dict (SPEC §12's correction, §13)."""
from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Optional

import torch

from ..errors import TpflexConfigWarning, TpflexInvalidError, TpflexUnsupportedError

_WHY = {
    "parameters_split": "Linear keeps one weight (LayerNormLinear splits; MultiheadAttention "
                        "builds its qkv from LayerNormLinear)",
    "delay_wgrad_compute": "tpflex computes the weight gradient in the backward",
    "symmetric_ar_type": "tpflex's plain path all-reduces with torch.distributed",
    "checkpoint": "recompute the module under torch.utils.checkpoint instead",
    "activation_params": "tpflex's activations take no parameters",
    "return_layernorm_output": "LayerNormLinear returns its norm's output",
    "return_layernorm_output_gathered": "the norm's output is returned as this rank's rows",
    "zero_centered_gamma": "LayerNormLinear, LayerNorm and RMSNorm offer it",
}


def _refuse(where: str, **given: Any) -> None:
    """given: name=(value, TE's default). A value other than the default is a
    TpflexUnsupportedError naming the argument: TE has it, tpflex does not implement it."""
    for name, (value, default) in given.items():
        same = value is default if default is None or isinstance(default, bool) else \
            value == default
        if isinstance(default, bool) and isinstance(value, int) and not isinstance(value, bool):
            same = value == int(default)
        if not same:
            why = _WHY.get(name, "not implemented by tpflex")
            raise TpflexUnsupportedError(f"{name}={value!r}: tpflex accepts only TE's default "
                                         f"{default!r} ({why})", where)


def _init_param(w: torch.Tensor, init: Callable[[torch.Tensor], Any],
                tracker: Optional[Callable[[], Any]], tracker_name: Optional[str]) -> None:
    """init(w), inside get_rng_state_tracker().fork(rng_tracker_name) when a tracker is given
    (TE's reset_parameters: Megatron's tracker keeps tensor-parallel shards' RNG apart)."""
    if tracker is None:
        init(w)
        return
    if not callable(tracker):
        raise TpflexInvalidError(f"get_rng_state_tracker={tracker!r} must be a callable "
                                 f"returning an RNG tracker (with fork())", "init")
    st = tracker()
    with (st.fork(tracker_name) if tracker_name else st.fork()):
        init(w)


class _SharesGroups:
    """deepcopy shares the torch.distributed process groups a module (or any module inside it)
    holds, instead of trying to copy them (a ProcessGroup cannot be copied or pickled, so a
    plain deep copy of a module built with tp_group fails, in TE as well): a group is a
    handle on the processes, the same for the copy. Everything else is copied as usual."""

    def __deepcopy__(self, memo: dict) -> Any:
        for m in self.modules():  # type: ignore[attr-defined]
            for holder in (m, getattr(m, "_site", None), getattr(m, "_fc1", None),
                           getattr(m, "_fc2", None)):
                g = getattr(holder, "tp_group", None) if holder is m else \
                    getattr(holder, "group", None)
                if g is not None:
                    memo[id(g)] = g
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new


class _ExtraState(_SharesGroups):
    """TE's `_extra_state` entry: TE's modules (TransformerEngineBaseModule and the ops-based
    LayerNorm / RMSNorm) store their FP8 scaling state there, an empty uint8 tensor when there
    is none. A TE state_dict therefore loads with strict=True. A non-empty entry (TE's FP8
    scaling state, pickled) is kept unread and saved back as it came (tpflex does not unpickle
    checkpoint bytes); a warning says it is not applied."""

    _tpf_extra: Optional[torch.Tensor] = None

    def get_extra_state(self) -> torch.Tensor:
        """The `_extra_state` entry saved in a state_dict: an empty uint8 tensor, or the TE
        checkpoint's bytes this module was loaded with."""
        e = self._tpf_extra
        return torch.empty(0, dtype=torch.uint8) if e is None else e

    def set_extra_state(self, state: Any) -> None:
        """Takes a state_dict's `_extra_state`: empty or None, or TE's FP8 scaling state kept
        unread (with a warning); anything else is TpflexInvalidError naming what TE saves."""
        if state is None:
            return
        if isinstance(state, torch.Tensor):
            if state.numel() == 0:
                self._tpf_extra = None
                return
            if state.dtype != torch.uint8 or state.dim() != 1:
                raise TpflexInvalidError(
                    f"_extra_state is {state.dtype} {list(state.shape)}; TE saves a 1-D "
                    f"torch.uint8 tensor (empty without FP8 state)", type(self).__name__)
            self._tpf_extra = state.detach().cpu().clone()
            warnings.warn(f"{type(self).__name__}: the checkpoint's _extra_state holds TE's FP8 "
                          f"scaling state ({state.numel()} bytes); tpflex keeps it unread (saved "
                          f"back as it came) and does not apply it", TpflexConfigWarning,
                          stacklevel=3)
            return
        raise TpflexInvalidError(f"_extra_state of type {type(state).__name__}: TE saves a "
                                 f"torch.uint8 tensor (io.BytesIO is TE's deprecated format, "
                                 f"not read)", type(self).__name__)
