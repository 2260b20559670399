"""Benchmark (not a test): tpflex's bucketed CUDA graphs against Megatron's method for THD under
CUDA graphs (one graph captured at the capacity C, every microbatch padded to C), on the same
model: two te.TransformerLayer blocks (examples/thd_model.py: causal attention within each
packed sequence, every ub_* overlap on), forward + backward inside the graph.

  torchrun --standalone --nproc-per-node 1 examples/bench_graphs_vs_padding.py
  torchrun --standalone --nproc-per-node 2 examples/bench_graphs_vs_padding.py     (P = 2; MPS)
  python3 examples/bench_graphs_vs_padding.py --backend sim   (CPU smoke run of the code paths:
                                                               the simulator's stand-in, tiny
                                                               shapes; figures printed, not judged)

Three ways to run each microbatch, side by side in one run:
  ladder     tpflex.torch.graphed(step): the default bucket ladder, each microbatch padded to
             its bucket (the smallest legal T >= its T), one graph per bucket used
  pad-to-C   tpflex.torch.graphed(step, buckets=[C]): one graph at C, every microbatch padded
             to C (Megatron's --pad-packed-seq-alignment=max under CUDA graphs)
  eager      the step without graphs at the microbatch's own legal T
Rows: fixed T = C/4 and C/2 (median ms per microbatch, synchronised around each call), then
two streams of --stream microbatches: 'packed' (log-normal documents packed up to C, as a packed
data loader; examples/graphed_buckets.py) and 'uniform' (T uniform in [C/16, C]); for a stream,
the mean ms per microbatch over the whole stream (the total is what a training run pays).
Then, per way: graphs captured, capture time (first call of each bucket: warmups + capture,
summed), and the GPU memory the graphs hold (torch.cuda.memory_allocated / memory_reserved
after capturing every bucket the streams use, minus before; the ladder's buckets share one pool).
The issue's target at T = C/4: ladder <= 0.35 x pad-to-C."""
import argparse
import importlib.util
import os
import random
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

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from graphed_buckets import packed  # noqa: E402
from thd_graphed_step import step_fn  # noqa: E402  (forward + backward, returns (out, dx))
from thd_model import Block  # noqa: E402


def run(rank, P, a, dev):
    cuda = dev.type == "cuda"
    dt = torch.bfloat16 if cuda else torch.float32
    H, C = a.hidden, a.capacity
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    te.initialize_ub([C, H], P, dtype=dt, **({} if cuda else {"backend": "sim"}))
    try:
        torch.manual_seed(1)
        model = torch.nn.Sequential(Block(H, P, dt, dev), Block(H, P, dt, dev))
        step = step_fn(model)
        gen = torch.Generator().manual_seed(2)

        def data(T):   # this rank's T/P rows of x and dy
            x = (torch.randn(T // P, H, generator=gen) * 0.5).to(dev, dt)
            return x, (torch.randn(T // P, H, generator=gen) * 0.01).to(dev, dt)

        def eager(x, dy):
            with te.active_tokens(x.shape[0] * P):
                return step(x, dy)

        rng = random.Random(a.seed)
        streams = {"packed": [te.legal_rows(t) for t in packed(rng, C, a.stream)],
                   "uniform": [te.legal_rows(rng.randint(C // 16, C)) for _ in range(a.stream)]}
        fixed = [te.legal_rows(C // 4), te.legal_rows(C // 2)]
        ways = {"ladder": te.graphed(step, sequence_parallel=True),
                "pad-to-C": te.graphed(step, [C], sequence_parallel=True)}
        cap = {}
        for name, g in ways.items():          # capture every bucket the rows below use, timed
            sync()
            m0 = (torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)) if cuda \
                else (0, 0)
            t_cap = 0.0
            for T in sorted(set(fixed + streams["packed"] + streams["uniform"])):
                x, dy = data(T)
                n0 = g.stats()["captures"]
                sync()
                t0 = time.perf_counter()
                g(x, dy)
                sync()
                if g.stats()["captures"] > n0:   # this call captured its bucket's graph
                    t_cap += time.perf_counter() - t0
            m1 = (torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)) if cuda \
                else (0, 0)
            cap[name] = (g.stats()["captures"], 1e3 * t_cap, (m1[0] - m0[0]) / 2**20,
                         (m1[1] - m0[1]) / 2**20)
        calls = dict(ways, eager=eager)

        def per_call_ms(call, Ts, reps):
            inputs = [data(T) for T in Ts]
            ms = []
            for _ in range(reps):
                for x, dy in inputs:
                    sync()
                    t0 = time.perf_counter()
                    call(x, dy)
                    sync()
                    ms.append(1e3 * (time.perf_counter() - t0))
            return ms
        lines = [f"P = {P}, H = {H}, capacity C = {C}, {dt}, two TransformerLayer blocks fwd+bwd "
                 f"in the graph; ms per microbatch",
                 f"{'case':<28} {'ladder':>9} {'pad-to-C':>9} {'eager':>9} {'ladder/pad':>11}"]
        for T in fixed:
            r = {n: statistics.median(per_call_ms(c, [T] * 3, a.reps)) for n, c in calls.items()}
            lines.append(f"{f'T = {T} (C/{C // T})':<28} {r['ladder']:>9.3f} {r['pad-to-C']:>9.3f} "
                         f"{r['eager']:>9.3f} {r['ladder'] / r['pad-to-C']:>11.3f}")
        for sname, Ts in streams.items():
            r = {n: statistics.mean(per_call_ms(c, Ts, 1)) for n, c in calls.items()}
            lines.append(f"{f'{sname} stream (mean T {int(statistics.mean(Ts))})':<28} "
                         f"{r['ladder']:>9.3f} {r['pad-to-C']:>9.3f} {r['eager']:>9.3f} "
                         f"{r['ladder'] / r['pad-to-C']:>11.3f}")
        lines.append(f"{'way':<10} {'graphs':>7} {'capture ms':>11} {'alloc MiB':>10} "
                     f"{'reserved MiB':>13}")
        for name, (n, ms, ma, mr) in cap.items():
            lines.append(f"{name:<10} {n:>7} {ms:>11.1f} {ma:>10.1f} {mr:>13.1f}")
        lad = ways["ladder"]
        lines.append(f"ladder: {len(lad.buckets)} buckets {lad.buckets}; mechanism: "
                     f"{lad.stats()['mechanism_text']}")
        for g in ways.values():
            g.reset()
        return lines
    finally:
        te.destroy_ub()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--tp", type=int, default=1, help="simulator ranks (cuda: torchrun's)")
    ap.add_argument("--hidden", type=int, default=0, help="cuda: 1024; sim: 32")
    ap.add_argument("--capacity", type=int, default=0, help="cuda: 16384; sim: 256")
    ap.add_argument("--stream", type=int, default=0, help="microbatches per stream (cuda: 100)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cuda = a.backend == "cuda"
    a.hidden = a.hidden or (1024 if cuda else 32)
    a.capacity = a.capacity or (16384 if cuda else 256)
    a.stream = a.stream or (100 if cuda else 6)
    if not cuda:
        a.reps = 1
        lines = sim.run(a.tp, lambda r: run(r, a.tp, a, torch.device("cpu")),
                        timeout_ms=120000)[0]
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        P, rank = dist.get_world_size(), dist.get_rank()
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        lines = run(rank, P, a, dev)
        if rank != 0:
            lines = []
        dist.destroy_process_group()
    print("\n".join(f"bench_graphs_vs_padding: {ln}" for ln in lines))
    print("bench_graphs_vs_padding: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
