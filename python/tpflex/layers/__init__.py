"""Drop-in layers in TransformerEngine's signatures: tpflex.torch.Linear, LayerNormMLP and the
context helper active_tokens(T) (SPEC §12).

    te.initialize_ub([C, H], P, dtype=torch.bfloat16)             # once, at capacity
    mlp = tpflex.torch.LayerNormMLP(H, F, tp_size=P, sequence_parallel=True,
                                    set_parallel_mode=True, ub_overlap_ag=True,
                                    ub_overlap_rs=True, ub_bulk_dgrad=True, ub_bulk_wgrad=True)
    for x_local in microbatches:                                 # T changes per microbatch
        with tpflex.torch.active_tokens(x_local.shape[0] * P):
            mlp(x_local).backward(dy_local)

Parameters, their names and shapes are TE's: Linear ``weight`` ([out/P, in] column-parallel,
[out, in/P] row-parallel) and ``bias`` ([out/P] column, [out] row); LayerNormMLP
``layer_norm_weight``, ``layer_norm_bias``, ``fc1_weight`` [F/P, H], ``fc1_bias`` [F/P],
``fc2_weight`` [H, F/P], ``fc2_bias`` [H]. With sequence_parallel a column-parallel input and a
row-parallel output are this rank's rows [T/P, ...] of the packed microbatch.

The schedule is TE's (module/linear.py, module/layernorm_mlp.py), on tpflex's operations:
  column-parallel fprop   ub_overlap_ag: RING AG + GEMM on '{ub_name}_fprop' (bias epilogue)
  row-parallel fprop      ub_overlap_rs: GEMM + RS on '{ub_name}_fprop' (bias applied once, to
                          the reduced rows)
  row-parallel dgrad      ub_overlap_ag: RING AG of dY + GEMM on '{ub_name}_dgrad'; the wgrad
                          GEMM reads the gathered dY from that buffer (TE's '_wgrad' of a
                          row-parallel site is external: no communication of its own)
  column-parallel bwd     ub_bulk_dgrad: BULK AG of the input on '{ub_name}_dgrad' beside the
                          dgrad GEMM (written into '{ub_name}_wgrad''s buffer with ub_bulk_wgrad);
                          ub_bulk_wgrad: BULK RS of dgrad on '{ub_name}_wgrad' beside the wgrad
                          GEMM; ub_overlap_rs_dgrad: dgrad GEMM + RS on '{ub_name}_dgrad' (a RING
                          or PIPELINE RS registration; it turns the bulk flags off, as in TE)
  fuse_wgrad_accumulation weight gradients accumulate into param.main_grad (fp32, beta = 1;
                          forward(..., is_first_microbatch=True) overwrites it, as TE)
LayerNormMLP uses the sites 'fc1' and 'fc2': ub_overlap_ag covers fc1's fprop and fc2's dgrad.
The GELU of LayerNormMLP runs in the fc1 GEMM's epilogue only when no gradient is needed (the
C epilogue does not keep the pre-activation that the backward needs); in training it is torch's
tanh GELU on the fc1 output. Normalisation: torch, in fp32, rounded once to the compute dtype.

Without a ub flag the plain path runs: torch.distributed collectives over tp_group when one is
given (or the default group when torch.distributed is initialised), no communication at
tp_size 1. The simulator has no collective outside the communicators, so on it
(tpflex.sim.run) the plain path at tp_size > 1 uses the BULK AG / BULK RS communicators that
initialize_ub registered ('{ub_name}_dgrad' / '{ub_name}_wgrad' first, then TE's other bulk
sites) with an empty GEMM beside.

Where nothing is communicated in either direction (tp_size 1, where TE turns sequence
parallelism off, or Linear's parallel_mode None) and fuse_wgrad_accumulation is off, forward is
torch's own ops with their own backward, on CUDA and in fp32: no autograd function, no per-call
settings, the aten operations of torch.nn's same block (a test counts them). CPU 16-bit tensors
keep the functions' explicit fp32 arithmetic (one rounding, as the C epilogue). Elsewhere a
module resolves its sites' communicators once per registration (initialize_ub), not per call.

T changes per call under one registration: a module reads the active shape the manager holds
(set_ub_active_shape, or active_tokens(T)); a microbatch whose rows disagree with it raises
TpflexShapeError naming both, before anything is communicated. The gradients of the
sequence-parallel LayerNorm parameters and of a sequence-parallel row-parallel bias are this
rank's partial sums (the bias: the sum over this rank's rows of dY, in every precision): those
parameters carry ``sequence_parallel = True`` and the caller all-reduces them over the TP group
(Megatron does) for the unsharded gradient (SPEC §12's gradient contract).

Precision (SPEC §14): under torch.autocast the parameters keep their dtype and every GEMM and
communicator runs in the autocast dtype (a registration in another dtype is refused naming
both); inside tpflex.torch.autocast the GEMM inputs are quantized per the recipe
(tpflex._quant) and gathered in FP8 on FP8 registrations. The FP8 weight is cached per site
as TE caches it (is_first_microbatch); the AMP cast is made every call, as TE's.

The package: _sites.py (communicators by site name, the plain path's GEMMs and collectives),
_autograd.py (one call's settings, the column- and row-parallel autograd functions),
_modules.py (Linear, LayerNormMLP, active_tokens).
"""
from ._modules import LayerNormMLP, Linear, active_tokens

__all__ = ["Linear", "LayerNormMLP", "active_tokens"]
