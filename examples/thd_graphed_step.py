"""The THD training step (two te.TransformerLayer blocks on packed sequences,
examples/thd_model.py: causal attention within each sequence, every ub_* overlap on, forward +
backward) under CUDA graphs: tpflex.torch.graphed against plain torch graphed with
torch.cuda.graph, at fixed T and over a random T stream.

  torchrun --standalone --nproc-per-node 1 examples/thd_graphed_step.py --backend cuda
  torchrun --standalone --nproc-per-node 2 examples/thd_graphed_step.py --backend cuda   (MPS)
  python3 examples/thd_graphed_step.py --backend sim       (a smoke run of the code paths, tiny
                                                            sizes; no CUDA graph, no timing)

What is timed, per rank, bf16, H = --hidden (1024), capacity --capacity (16384):
  fixed T (--tokens, default 1024,4096,16384; each rounded to legal_rows):
    tpflex graphed    tpflex.torch.graphed(step, buckets=[T]): no padding, one graph
    plain graphed     the same step in plain torch (nn.LayerNorm / nn.Linear / SDPA on this
                      rank's weight shards, no communication: at P = 1 exactly the model, at P > 1 a
                      lower bound of any TP step), captured with torch.cuda.graph at T
    tpflex eager      the step without graphs, under active_tokens(T)
  stream: --stream microbatches with T from THD packing (log-normal documents packed up to the
    capacity, examples/graphed_buckets.py's 'packed') rounded to legal_rows; tpflex graphed with
    the default ladder, plain graphed with the same ladder (its own torch.cuda.graph per bucket,
    input padded with zeros), tpflex eager at each legal T (no padding). Every bucket is
    captured in an untimed first pass.
Figures: median ms per step (synchronised around each call), the ratio to plain graphed, the
host µs per call (the time until the call returns, the GPU kept busy: the replay's host cost
per microbatch, copies and the shape change included), and for the stream the padded rows in %
of the real rows and the buckets used. Output: one table on rank 0; ends with
"thd_graphed_step: done" (and "check OK": graphed outputs match eager ones at the first T).
"""
import argparse
import bisect
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
import torch.nn.functional as Fn  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from graphed_buckets import packed  # noqa: E402
from thd_model import Block, PlainBlock  # noqa: E402  (te.TransformerLayer on THD; plain torch)


def step_fn(model):
    """Forward + backward inside the graph: returns (out, dx); parameter gradients accumulate
    into .grad (allocated by the first eager run, outside any capture)."""
    def step(x, dy):
        x = x.detach().requires_grad_(True)
        out = model(x)
        out.backward(dy)
        return out.detach(), x.grad
    return step


class PlainGraphs:
    """plain torch graphed: one torch.cuda.graph per bucket (the torch idiom: static input,
    warmup on a side stream, capture, copy in, replay, slice)."""

    def __init__(self, fn, buckets, dev):
        self.fn, self.buckets, self.dev, self.g = fn, sorted(buckets), dev, {}
        self.pool, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(dev)

    def __call__(self, x, dy):
        T = x.shape[0]
        B = self.buckets[bisect.bisect_left(self.buckets, T)]
        if B not in self.g:
            sx = torch.zeros((B,) + x.shape[1:], dtype=x.dtype, device=self.dev)
            sdy = torch.zeros_like(sx)
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                for _ in range(3):
                    self.fn(sx, sdy)
            torch.cuda.current_stream().wait_stream(self.stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
                out = self.fn(sx, sdy)
            self.g[B] = (g, sx, sdy, out)
        g, sx, sdy, out = self.g[B]
        sx[:T].copy_(x)
        sdy[:T].copy_(dy)
        if T < B:
            sx[T:].zero_()
            sdy[T:].zero_()
        g.replay()
        return tuple(o[:T] for o in out)


def timed(call, inputs, cuda, reps=1):
    """(median ms per call, synchronised around each; median host µs until return, GPU busy)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ms, host = [], []
    for _ in range(reps):
        for a in inputs:
            sync()
            t0 = time.perf_counter()
            call(*a)
            sync()
            ms.append(1e3 * (time.perf_counter() - t0))
    for i, a in enumerate(inputs * reps):
        if i % 8 == 0:
            sync()
        t0 = time.perf_counter()
        call(*a)
        host.append(1e6 * (time.perf_counter() - t0))
    sync()
    return statistics.median(ms), statistics.median(host)


def run(rank, P, a, dev):
    cuda = dev.type == "cuda"
    dt = torch.bfloat16 if cuda else torch.float32
    H, C = a.hidden, a.capacity
    te.initialize_ub([C, H], P, dtype=dt, **({} if cuda else {"backend": "sim"}))
    lines = []
    try:
        torch.manual_seed(1)
        model = torch.nn.Sequential(Block(H, P, dt, dev), Block(H, P, dt, dev))
        plain = torch.nn.Sequential(PlainBlock(H, P, dt, dev), PlainBlock(H, P, dt, dev))
        step, pstep = step_fn(model), step_fn(plain)
        gen = torch.Generator().manual_seed(2)

        def data(T):   # this rank's rows for tpflex (T/P), all T rows for plain
            x = (torch.randn(T, H, generator=gen) * 0.5).to(dev, dt)
            dy = (torch.randn(T, H, generator=gen) * 0.01).to(dev, dt)
            m = slice(rank * T // P, (rank + 1) * T // P)
            return (x[m].contiguous(), dy[m].contiguous()), (x, dy)

        def eager(x, dy):
            with te.active_tokens(x.shape[0] * P):
                return step(x, dy)
        head = (f"{'case':<14} {'tpflex graphed':>15} {'plain graphed':>14} {'ratio':>6} "
                f"{'tpflex eager':>13} {'host µs graphed':>16} {'plain':>7} {'eager':>7}  notes")
        lines += [f"P = {P}, H = {H}, capacity {C}, {dt}, two blocks fwd+bwd, median ms per step",
                  head]
        ok = True
        for T in (te.legal_rows(int(t)) for t in a.tokens.split(",")):
            batches = [data(T) for _ in range(3)]
            g = te.graphed(step, [T], sequence_parallel=True)
            got = [t.float().cpu().clone() for t in g(*batches[0][0])]
            ref = [t.float().cpu() for t in eager(*batches[0][0])]
            ok &= all(torch.allclose(u, v, rtol=0.05, atol=0.02) for u, v in zip(got, ref))
            pg = PlainGraphs(pstep, [T], dev) if cuda else pstep
            tg = timed(g, [b[0] for b in batches], cuda, a.reps)
            tp = timed(pg, [b[1] for b in batches], cuda, a.reps)
            tE = timed(eager, [b[0] for b in batches], cuda, a.reps)
            lines.append(f"{'T=' + str(T):<14} {tg[0]:>15.3f} {tp[0]:>14.3f} "
                         f"{tg[0] / tp[0]:>6.3f} {tE[0]:>13.3f} {tg[1]:>16.1f} {tp[1]:>7.1f} "
                         f"{tE[1]:>7.1f}  {g.stats()['mechanism']}")
            g.reset()
        # the random T stream
        ts = [te.legal_rows(t) for t in packed(random.Random(a.seed), C, a.stream)]
        batches = [data(T) for T in ts]
        g = te.graphed(step, sequence_parallel=True)
        lad = None
        for b in batches:                     # first pass: every bucket captured, untimed
            g(*b[0])
            lad = g.buckets
        pg = PlainGraphs(pstep, lad, dev) if cuda else pstep
        for b in batches:
            pg(*b[1])
        st0 = g.stats()
        tg = timed(g, [b[0] for b in batches], cuda)
        tp = timed(pg, [b[1] for b in batches], cuda)
        tE = timed(eager, [b[0] for b in batches], cuda)
        st = g.stats()
        real = st["rows"] - st0["rows"]
        pad = st["padded_rows"] - st0["padded_rows"]
        lines.append(f"{'stream':<14} {tg[0]:>15.3f} {tp[0]:>14.3f} {tg[0] / tp[0]:>6.3f} "
                     f"{tE[0]:>13.3f} {tg[1]:>16.1f} {tp[1]:>7.1f} {tE[1]:>7.1f}  "
                     f"{len(ts)} microbatches, T {min(ts)}..{max(ts)} (median "
                     f"{int(statistics.median(ts))}), padding {100.0 * pad / real:.1f}% of "
                     f"rows, {len(st['buckets'])} of {len(lad)} buckets used, "
                     f"{st['captures']} captures")
        lines.append(f"plain graphed: {'torch.cuda.graph per bucket' if cuda else 'eager (no CUDA here)'};"
                     f" tpflex graphed: {st['mechanism_text']}")
        lines.append("check OK" if ok else "check FAILED: graphed != eager at the first T")
        g.reset()
        if cuda:
            torch.cuda.synchronize()
        return lines, ok
    finally:
        te.destroy_ub()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--tp", type=int, default=2, help="simulator ranks (cuda: torchrun's)")
    ap.add_argument("--hidden", type=int, default=0)
    ap.add_argument("--capacity", type=int, default=0)
    ap.add_argument("--tokens", default="")
    ap.add_argument("--stream", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cuda = a.backend == "cuda"
    a.hidden = a.hidden or (1024 if cuda else 32)
    a.capacity = a.capacity or (16384 if cuda else 256)
    a.tokens = a.tokens or ("1024,4096,16384" if cuda else "64,256")
    a.stream = a.stream or (200 if cuda else 12)
    if not cuda:
        a.reps = 1
        res = sim.run(a.tp, lambda r: run(r, a.tp, a, torch.device("cpu")), timeout_ms=60000)
        lines, ok = res[0][0], all(o for _, o in res)
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        P, rank = dist.get_world_size(), dist.get_rank()
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        lines, ok = run(rank, P, a, dev)
        flags = [None] * P
        dist.all_gather_object(flags, ok)
        ok = all(flags)
        if rank != 0:
            lines = []
        dist.destroy_process_group()
    print("\n".join(f"thd_graphed_step: {ln}" for ln in lines))
    print("thd_graphed_step: done" if ok else "thd_graphed_step: CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
