"""TransformerEngine's layer-overlap example (examples/pytorch/comm_gemm_overlap/
te_layer_with_overlap.py in TE's repository), on tpflex: the same command line, layers, ub flags,
initialize_ub call, autocast and training loop, written in our own code. What differs from TE's,
line by line, is listed in python/README.md ("Porting TE's layer example and test"): the import
(`import tpflex.torch as te`), the device (CPU tensors on the simulator) and the process group's
backend (gloo on the CPU; NCCL or gloo on GPUs).

  torchrun --standalone --nproc-per-node 2 examples/te_layer_with_overlap.py            (GPUs)
  TPFLEX_BACKEND=sim torchrun --standalone --nproc-per-node 2 \\
      examples/te_layer_with_overlap.py -s 64 -n 4 -d 16 --layer-type transformerlayer  (CPU)

Ends with "te_layer_with_overlap: done" (rank 0) after --num-iters Adam steps whose losses are
finite on every rank."""
import argparse
import importlib.util
import math
import os
import sys
import warnings

warnings.filterwarnings("ignore")
if importlib.util.find_spec("tpflex") is None:  # not installed: the source tree's
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpflex.torch as te  # noqa: E402
from tpflex.common.recipe import DelayedScaling, Format  # noqa: E402

SIM = os.environ.get("TPFLEX_BACKEND", "").strip().lower() == "sim"
DEVICE = "cpu" if SIM else "cuda"
LAYERS = {c.__name__.lower(): c for c in (te.Linear, te.LayerNormLinear, te.LayerNormMLP,
                                          te.MultiheadAttention, te.TransformerLayer)}


def layer_type(name):
    if name.lower() not in LAYERS:
        raise argparse.ArgumentTypeError(f"--layer-type {name!r}: one of {sorted(LAYERS)}")
    return LAYERS[name.lower()]


def parse(argv=None):
    p = argparse.ArgumentParser(description="Train a tpflex.torch module with GEMM+comm overlap.")
    p.add_argument("-i", "--num-iters", type=int, default=5)
    p.add_argument("-b", "--batch-size", type=int, default=2)
    p.add_argument("-s", "--seq-length", type=int, default=2048)
    p.add_argument("-n", "--num-heads", type=int, default=64)
    p.add_argument("-d", "--head-dim", type=int, default=128)
    p.add_argument("--layer-type", type=layer_type, default=te.TransformerLayer)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--no-comm-overlap", action="store_true")
    p.add_argument("--bootstrap-backend", type=str.lower, default="nccl",
                   choices=["gloo", "mpi", "nccl"])
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--debug", action="store_true")
    return p.parse_args(argv)


def layer_args(o, tp_group, tp_size):
    """TE's example's arguments per layer type: (args, kwargs, input shape [s, b, h])."""
    H = o.num_heads * o.head_dim
    shape, args = [o.seq_length, o.batch_size, H], [H]
    ub = not o.no_comm_overlap
    kw = dict(params_dtype=torch.float32, device=DEVICE, tp_group=tp_group, tp_size=tp_size,
              sequence_parallel=True, ub_overlap_ag=ub)
    if o.layer_type is te.Linear:      # row-parallel: this rank's H/P input columns
        shape[2] = H // tp_size
        args.append(H)
        kw.update(parallel_mode="row", ub_overlap_rs=ub, ub_name="proj")
        return args, kw, shape
    shape[0] = o.seq_length // tp_size  # sequence-parallel: this rank's s/P rows
    kw.update(ub_bulk_wgrad=ub, ub_bulk_dgrad=ub)
    if o.layer_type is te.LayerNormLinear:
        args.append(3 * H)
        kw.update(parallel_mode="column", ub_name="qkv")
        return args, kw, shape
    kw.update(set_parallel_mode=True, ub_overlap_rs=ub)
    if o.layer_type in (te.LayerNormMLP, te.TransformerLayer):
        args.append(4 * H)
        kw["seq_length"] = o.seq_length
    if o.layer_type in (te.MultiheadAttention, te.TransformerLayer):
        args.append(o.num_heads)
        kw.update(attention_dropout=0.0, fuse_qkv_params=True)
        if o.layer_type is te.MultiheadAttention:
            kw["input_layernorm"] = True
        else:
            kw.update(ub_tp_comm_overlap=ub, hidden_dropout=0.0)
    return args, kw, shape


def train(o):
    rank, world = int(os.getenv("RANK", "0")), int(os.getenv("WORLD_SIZE", "1"))
    if not SIM:
        torch.cuda.set_device(int(os.getenv("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group("gloo" if SIM else "nccl", rank=rank, world_size=world)
    group = dist.new_group(backend="gloo" if SIM else "nccl")
    tp_size = dist.get_world_size(group)

    def say(msg, debug=False):
        if (not debug or o.debug) and (o.verbose or dist.get_rank(group) == 0):
            print(f"[rank{rank}] {msg}", flush=True)
    say(f"Initialized the process group with {world} ranks ({DEVICE})")
    H = o.num_heads * o.head_dim
    if not o.no_comm_overlap:
        mode = te.module.base.UserBufferQuantizationMode
        te.module.base.initialize_ub([o.seq_length * o.batch_size, H], tp_size,
                                     quantization_modes=[mode.FP8 if o.fp8 else mode.NONE],
                                     dtype=torch.bfloat16, bootstrap_backend=o.bootstrap_backend)
    torch.manual_seed(o.seed)
    args, kw, shape = layer_args(o, group, tp_size)
    model = o.layer_type(*args, **kw)
    optim = torch.optim.Adam(model.parameters(), lr=0.0001)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=32, amax_compute_algo="max")
    say("Starting training iterations...")
    ok = True
    for i in range(o.num_iters):
        x = torch.randn(shape, dtype=torch.float32, device=DEVICE, requires_grad=True)
        with torch.amp.autocast(DEVICE, dtype=torch.bfloat16):
            with te.autocast(enabled=o.fp8, recipe=recipe, amax_reduction_group=group):
                y = model(x)
                out = y[0] if isinstance(y, tuple) else y
                loss = out.sum()
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        ok &= math.isfinite(loss.item())
        say(f"    Iter {i + 1}: loss {loss.item():.4f}", debug=True)
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag, group=dist.new_group(backend="gloo"))
    if not o.no_comm_overlap:
        te.module.base.destroy_ub()
    say("Finished training!" if not flag.item() else "a loss was not finite")
    dist.destroy_process_group()
    if rank == 0:
        print("te_layer_with_overlap: done" if not flag.item() else "te_layer_with_overlap: FAILED")
    return int(flag.item())


if __name__ == "__main__":
    sys.exit(train(parse()))
