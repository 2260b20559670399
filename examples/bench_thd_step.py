"""Benchmark (not a test): one THD training step (forward + backward of two te.TransformerLayer
blocks on packed sequences, examples/thd_model.py: causal attention within each sequence of 64
tokens, every ub_* overlap) on tpflex.torch's modules against the same shapes in plain PyTorch
(nn.Linear / nn.LayerNorm / scaled_dot_product_attention on this rank's shards, no
communication), side by side in one run, at each T. With --profile, the host-time table of
torch.profiler for one tpflex step at the first T (where the host time goes).

  torchrun --standalone --nproc-per-node 1 examples/bench_thd_step.py --T 1024,4096,16384
  torchrun --standalone --nproc-per-node 2 examples/bench_thd_step.py     (P = 2; under MPS)

Prints, per T: the median ms of tpflex's step, of plain torch's, and their ratio (issue 24's
target at P = 1: <= 1.2). --ops adds the aten operations per step of each (forward + backward,
counted by a TorchDispatchMode) and those whose counts differ.

--device cpu: the host path without a GPU (no torchrun: P = 1 on the simulator, fp32 by default,
small shapes so that the arithmetic is small: H 64, T 16,64,256):

  python3 examples/bench_thd_step.py --device cpu [--dtype fp32|bf16] [--blocks 9] [--iters 50]

Per T: the host µs per step of tpflex's modules and of plain torch, timed in alternating blocks
of --iters steps (the median of --blocks blocks each), their ratio and difference, and the aten
operations per step of each (--ops: those whose counts differ). In fp32 the CPU takes the
modules' CUDA code path (torch's kernels round as the operation does there); bf16 on the CPU
takes the explicit fp32 path. CPU figures: the modules' own Python, autograd and dispatch work,
not the GPU's."""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("tpflex") is None:  # not installed: the source tree's
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402,F401
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import tpflex.torch as te  # noqa: E402
from thd_model import Block, PlainBlock  # noqa: E402  (te.TransformerLayer on THD; plain torch)


class AtenOps(TorchDispatchMode):
    """Counts the aten operations dispatched (forward and autograd's backward) by name."""

    def __init__(self):
        super().__init__()
        self.ops = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        n = func.overloadpacket.__name__
        self.ops[n] = self.ops.get(n, 0) + 1
        return func(*args, **(kwargs or {}))


def aten_ops(step) -> dict:
    """{aten operation: count} of one call of step()."""
    with AtenOps() as c:
        step()
    return c.ops


def ops_differ(ours: dict, theirs: dict) -> str:
    """The aten operations whose counts differ, 'name tpflex/torch', or 'none'."""
    d = [f"{k} {ours.get(k, 0)}/{theirs.get(k, 0)}" for k in sorted(set(ours) | set(theirs))
         if ours.get(k, 0) != theirs.get(k, 0)]
    return ", ".join(d) if d else "none"


def host_us(steps, iters: int, blocks: int):
    """The median over `blocks` of the mean host µs per call of each step, the steps timed in
    alternating blocks of `iters` calls (CPU tensors: a call's time is the host's)."""
    ts = [[] for _ in steps]
    for _ in range(blocks):
        for i, step in enumerate(steps):
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            ts[i].append(1e6 * (time.perf_counter() - t0) / iters)
    return [statistics.median(t) for t in ts]


def cpu_main(a) -> int:
    """--device cpu: P = 1 on the simulator; host µs per step and aten operations."""
    import tpflex.sim as sim
    torch.set_num_threads(a.threads)
    name = a.dtype or "fp32"
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
    H = a.hidden or 64
    Ts = [int(t) for t in (a.T or "16,64,256").split(",")]
    iters, dev = a.iters or 50, torch.device("cpu")

    def body(rank):
        modes = [te.UserBufferQuantizationMode.NONE] + \
            ([te.UserBufferQuantizationMode.FP8] if a.fp8 else [])
        te.initialize_ub([max(Ts), H], 1, dtype=dt, backend="sim", quantization_modes=modes)
        recipe = {"": None, "delayed": te.DelayedScaling,
                  "current": te.Float8CurrentScaling}[a.fp8]
        lines = [f"bench_thd_step --device cpu: P 1 (simulator), H {H}, {name}, two blocks, "
                 f"forward + backward; host µs per step: median of {a.blocks} alternating blocks "
                 f"of {iters} steps; torch threads {torch.get_num_threads()}; CPU figures (no GPU)",
                 f"{'T':>6} {'tpflex µs':>10} {'torch µs':>10} {'ratio':>7} {'excess µs':>10} "
                 f"{'aten ops tpflex':>16} {'torch':>6}"]
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(Block(H, 1, dt, dev), Block(H, 1, dt, dev))
            plain = torch.nn.Sequential(PlainBlock(H, 1, dt, dev), PlainBlock(H, 1, dt, dev))
            for T in (te.legal_rows(t) for t in Ts):
                x = torch.randn(T, H, dtype=dt, requires_grad=True)
                xp = torch.randn(T, H, dtype=dt, requires_grad=True)
                with te.active_tokens(T):
                    ours = lambda: model(x).sum().backward()  # noqa: E731
                    theirs = lambda: plain(xp).sum().backward()  # noqa: E731
                    for s in (ours, theirs):   # warm-up; the gradients allocated
                        for _ in range(3):
                            s()
                    o, p = aten_ops(ours), aten_ops(theirs)
                    u, v = host_us([ours, theirs], iters, a.blocks)
                    if recipe is not None:   # the same step in FP8 (the CPU's exact FP8 GEMM)
                        def fp8_step():
                            with torch.autocast("cpu", dtype=dt, enabled=dt != torch.float32), \
                                    te.autocast(recipe=recipe()):
                                y = model(x)
                            y.sum().backward()
                        fp8_step()
                        f8 = host_us([fp8_step], iters, a.blocks)[0]
                    if a.profile and T == te.legal_rows(Ts[0]):
                        from torch.profiler import ProfilerActivity, profile
                        with profile(activities=[ProfilerActivity.CPU]) as prof:
                            ours()
                        lines.append(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                               row_limit=18))
                lines.append(f"{T:>6} {u:>10.1f} {v:>10.1f} {u / v:>7.2f} {u - v:>10.1f} "
                             f"{sum(o.values()):>16} {sum(p.values()):>6}")
                if recipe is not None:
                    lines.append(f"       FP8 ({a.fp8} scaling) µs per step: {f8:.1f} "
                                 f"({f8 / u:.2f}x the {name} step; CPU arithmetic, not a GPU's)")
                if a.ops:
                    lines.append(f"       aten ops that differ (tpflex/torch): {ops_differ(o, p)}")
        finally:
            te.destroy_ub()
        return lines
    print("\n".join(sim.run(1, body, timeout_ms=600000)[0]))
    print("bench_thd_step: done (CPU figures, not judged)")
    return 0


def median_ms(step, iters: int) -> float:
    ts = []
    for i in range(iters + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= 3:
            ts.append(time.perf_counter() - t0)
    return 1e3 * sorted(ts)[len(ts) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--T", default="", help="cuda: 1024,4096,16384; cpu: 16,64,256")
    ap.add_argument("--hidden", type=int, default=0, help="cuda: 1024; cpu: 64")
    ap.add_argument("--iters", type=int, default=0,
                    help="cuda: steps timed (20); cpu: steps per block (50)")
    ap.add_argument("--dtype", default="", choices=("", "fp32", "bf16"),
                    help="cpu: fp32 (default) or bf16; cuda runs bf16")
    ap.add_argument("--blocks", type=int, default=9, help="cpu: alternating blocks timed")
    ap.add_argument("--threads", type=int, default=1, help="cpu: torch threads")
    ap.add_argument("--ops", action="store_true",
                    help="the aten operations per step, and those whose counts differ")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--fp8", default="", choices=("", "delayed", "current"),
                    help="cuda: also time tpflex's step under tpflex.torch.autocast with this "
                         "recipe (FP8 registrations beside the bf16 ones), and fp8/bf16")
    a = ap.parse_args()
    if a.device == "cpu":
        return cpu_main(a)
    a.T, a.hidden, a.iters = a.T or "1024,4096,16384", a.hidden or 1024, a.iters or 20
    import torch.distributed as dist
    dist.init_process_group("gloo")
    P, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dt, H = torch.bfloat16, a.hidden
    Ts = [int(t) for t in a.T.split(",")]
    modes = [te.UserBufferQuantizationMode.NONE] + \
        ([te.UserBufferQuantizationMode.FP8] if a.fp8 else [])
    te.initialize_ub([max(Ts), H], P, quantization_modes=modes, dtype=dt)
    recipe = {"": None, "delayed": te.DelayedScaling, "current": te.Float8CurrentScaling}[a.fp8]
    model = torch.nn.Sequential(Block(H, P, dt, dev), Block(H, P, dt, dev))
    plain = torch.nn.Sequential(PlainBlock(H, P, dt, dev), PlainBlock(H, P, dt, dev))
    if rank == 0:
        print(f"bench_thd_step: P {P}, H {H}, bf16, two blocks, median of {a.iters} steps "
              f"(forward + backward), tpflex.torch modules vs plain torch on the same shards")
        print(f"{'T':>6} {'tpflex ms':>10} {'torch ms':>10} {'ratio':>7}" +
              (f" {'fp8 ms':>8} {'bf16/fp8':>9}  ({a.fp8} scaling)" if a.fp8 else ""))
    for T in (te.legal_rows(t) for t in Ts):
        x = torch.randn(T // P, H, device=dev, dtype=dt, requires_grad=True)
        xp = torch.randn(T // P, H, device=dev, dtype=dt, requires_grad=True)
        with te.active_tokens(T):
            ours = median_ms(lambda: model(x).sum().backward(), a.iters)
            if a.profile and T == Ts[0] and rank == 0:
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    model(x).sum().backward()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
            o = aten_ops(lambda: model(x).sum().backward()) if a.ops else None
            if recipe is not None:
                def fp8_step():
                    with te.autocast(recipe=recipe()):
                        y = model(x)
                    y.sum().backward()
                fp8 = median_ms(fp8_step, a.iters)
        theirs = median_ms(lambda: plain(xp).sum().backward(), a.iters)
        p = aten_ops(lambda: plain(xp).sum().backward()) if a.ops else None
        if rank == 0:
            print(f"{T:>6} {ours:>10.3f} {theirs:>10.3f} {ours / theirs:>7.2f}" +
                  (f" {fp8:>8.3f} {ours / fp8:>9.2f}" if recipe is not None else ""))
            if a.ops:
                print(f"       aten ops per step: tpflex {sum(o.values())}, torch "
                      f"{sum(p.values())}; differ (tpflex/torch): {ops_differ(o, p)}")
    te.destroy_ub()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
