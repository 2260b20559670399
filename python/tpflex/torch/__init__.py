"""TransformerEngine-style API over tpflex, on torch tensors.

    initialize_ub([max_tokens, hidden], tp_size, dtype=torch.bfloat16)   # once, at capacity
    T = legal_rows(tokens)                    # the smallest T >= tokens every site accepts
    set_ub_active_shape([T, hidden])          # per microbatch, all-or-nothing, no allocation
    ub = get_ub("fc1_fprop"); ub.local_chunk().copy_(x_local); y = ub.ag_gemm(w1, bias=b1)
    destroy_ub()

Backends. ``backend="sim"``: the calling thread must be a simulator rank (inside
tpflex.sim.run); module state is then per rank and tensors are CPU tensors. ``backend="cuda"``:
one process per rank (torchrun), bootstrapped over a gloo process group of torch.distributed,
so several processes may share one GPU; operations are enqueued on
torch.cuda.current_stream() (or ``stream=``). The default (None) picks "sim" inside
tpflex.sim.run and "cuda" otherwise.

Every operation checks device, dtype, shape and strides of its tensors before anything is
enqueued (TpflexInvalidError / TpflexShapeError naming the tensor and both shapes); every
tpf_status of the C library is raised as its exception class with tpf_last_error()'s text.
buffer() and local_chunk() are zero-copy views of the registration (DLPack) describing the
active shape of the time they were taken; a view keeps its registration's memory alive.

torch.compile: the operations are torch.library custom ops, torch.ops.tpflex.ag_gemm /
gemm_rs / bulk_overlap (out=None: they return the output) and *_out (they write `out`), with
fake implementations; the methods call them. The communicator is passed as (name, key), the
active buffer as the mutated `buffer` argument. set_ub_active_shape and the other calls into C
stay outside the compiled region. python/README.md ("torch.compile") has the details and the
limits (no autograd formula: wrap the methods in a torch.autograd.Function).

Operation options (tpf_op_options; the same on every rank of a collective call): _options.py.

This module is the public face; the code lives in modules named for what they do:
    _te.py         initialize_ub (TE's signature and ub_cfgs), set_ub_active_shape, get_ub,
                   destroy_ub, legal_rows
    _manager.py    Manager (tpf_manager): shape changes, legal_rows over every communicator
    _comm.py       Communicator (tpf_comm): views, shapes, the operation methods
    _ops.py        the torch.library custom ops and their fake implementations
    _options.py    keyword options -> tpf_op_options
    _checks.py     tensor checks (shared with the fake implementations); _args.py: C integers
    _dlpack.py     zero-copy views (DLPack) that keep their registration alive
    _bootstrap.py  the CUDA backend's bootstrap over a gloo process group
    _state.py      per-process / per-simulator-rank state and the communicator registry
    _types.py      torch dtypes and the C enums
    _graphs.py     graphed(fn): dynamic T under CUDA graphs (a ladder of buckets, one capture
                   per bucket; on the simulator a stand-in that re-runs fn)
    layers/        Linear, LayerNormMLP, active_tokens: TE's modules on these operations
    _observe.py    profile (torch.profiler / NVTX ranges, or TPFLEX_PROFILE=1), stats,
                   print_stats, reset_stats (telemetry per communicator), trace (a Chrome /
                   Perfetto JSON trace of the steps inside it)
    torch/module/  LayerNormLinear, LayerNorm, RMSNorm (and base: TE's userbuffer path)
    torch/attention/, torch/transformer.py   DotProductAttention (THD), MultiheadAttention,
                   TransformerLayer (SPEC §13)
    quantization.py  autocast (FP8, TE's recipes from tpflex.common.recipe), quantized_model_init
                   (SPEC §14); the code in tpflex._quant, below the layers
    _help.py       help() shows the public names' annotations evaluated, not quoted
"""
from __future__ import annotations

from .._bootstrap import GlooBootstrap
from .._comm import Communicator
from .._dlpack import dlpack_view
from .._graphs import GraphedCallable, graphed
from .._manager import Manager
from .._observe import (StatsReport, print_stats, profile, profiling, reset_stats, stats,
                        trace)
from .._ops import OP_NAMES
from .._options import OPTION_NAMES
from .._te import (DEFAULT_UB_CFGS, UserBufferQuantizationMode, destroy_ub, get_ub,
                  initialize_ub, legal_rows, set_ub_active_shape)
from ..common import recipe
from ..common.recipe import (CustomRecipe, DelayedScaling, Float8BlockScaling,
                             Float8CurrentScaling, Format, MXFP8BlockScaling, NVFP4BlockScaling,
                             Recipe)
from ..layers import Linear, LayerNormMLP, active_tokens
from .module import LayerNorm, LayerNormLinear, RMSNorm
from .attention import DotProductAttention, MultiheadAttention
from .transformer import TransformerLayer
from . import module, quantization  # noqa: F401 (TE's paths: te.module.base, te.quantization)
from .quantization import (autocast, fp8_autocast, fp8_model_init, is_fp8_enabled,
                           quantized_model_init)

__all__ = ["initialize_ub", "set_ub_active_shape", "get_ub", "destroy_ub", "legal_rows",
           "Manager", "Communicator", "GlooBootstrap", "DEFAULT_UB_CFGS", "OPTION_NAMES",
           "OP_NAMES", "dlpack_view", "Linear", "LayerNormMLP", "active_tokens", "graphed",
           "GraphedCallable", "profile", "profiling", "stats", "print_stats", "reset_stats",
           "StatsReport", "trace", "LayerNormLinear", "LayerNorm", "RMSNorm",
           "DotProductAttention", "MultiheadAttention", "TransformerLayer",
           "UserBufferQuantizationMode", "autocast", "fp8_autocast",
           "quantized_model_init", "fp8_model_init", "is_fp8_enabled", "recipe", "Recipe",
           "Format", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling",
           "Float8BlockScaling", "NVFP4BlockScaling", "CustomRecipe"]

from .. import _help  # noqa: E402 (help() shows the annotations, not their source text)
_help.evaluate([getattr(quantization, n) for n in quantization.__all__]
              + [globals()[n] for n in __all__], globals())
