"""The bucket ladder of tpflex.torch.graphed: padding waste against graph count (and memory), a
CPU computation over realistic T distributions, for choosing the default ladder's ratio.

  python3 examples/graphed_buckets.py [--capacity 16384] [--tp 8] [--n 20000] [--seed 0]

The legal T come from a real manager: a simulator world of --tp ranks registers TE's default
communicators at [capacity, 64] and its legal_rows rounds every rung (the ladder is
tpflex._graphs.geometric_ladder, the function graphed() uses). Distributions of T (tokens per
microbatch, capacity C):
  packed      THD packing: documents of log-normal length (median 600 tokens, sigma 1.2,
              capped at C) packed greedily until the next one would overflow C, as a packed
              data loader does (T mostly near C, a tail below)
  uniform     T uniform in [1, C] (e.g. sequence-length curricula, mixed workloads)
  loguniform  T log-uniform in [C/64, C] (inference-like or RL rollouts: many small batches)
For each ratio and span: graphs in the ladder, graphs the distribution used, padded rows as a
percentage of real rows (the compute padding adds, token-weighted), and the sum of the buckets
over C (the memory of graphs with private pools, in units of one full-capacity graph; with
graphed()'s shared pool about 1).
"""
import argparse
import importlib.util
import math
import os
import random
import sys
import warnings

warnings.filterwarnings("ignore")
if importlib.util.find_spec("tpflex") is None:  # not installed: the source tree's
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex._graphs import geometric_ladder, pad_stats  # noqa: E402


def packed(rng, C, n):
    out = []
    pending = None
    while len(out) < n:
        T = 0
        while True:
            d = pending if pending is not None else \
                min(C, max(1, int(rng.lognormvariate(math.log(600), 1.2))))
            pending = None
            if T + d > C:
                pending = d
                break
            T += d
        out.append(max(T, 1))
    return out


def distributions(C, n, seed):
    r = random.Random(seed)
    return {"packed": packed(random.Random(seed), C, n),
            "uniform": [r.randint(1, C) for _ in range(n)],
            "loguniform": [max(1, int(round(math.exp(r.uniform(math.log(C / 64), math.log(C))))))
                           for _ in range(n)]}


def table(C, legal, n, seed, ratios, spans):
    ds = distributions(C, n, seed)
    # Every T is first rounded to a legal one (the eager path pads to legal_rows too), so the
    # waste counted is the ladder's alone.
    ds = {k: [legal(t) for t in v] for k, v in ds.items()}
    lines = [f"capacity {C}; {n} microbatches per distribution; padded rows in % of real rows "
             "(each T first rounded to legal_rows, as eager would)",
             f"{'ratio':>6} {'span':>5} {'graphs':>6} {'mem':>5} | " +
             " | ".join(f"{k:>10} used" for k in ds)]
    rows = []
    for span in spans:
        for ratio in ratios:
            lad = geometric_ladder(C, legal, ratio, span)
            cells = []
            for k, ts in ds.items():
                real, pad, used = pad_stats(ts, lad)
                cells.append((100.0 * pad / real, used))
            rows.append((ratio, span, len(lad), sum(lad) / C, cells))
            lines.append(f"{ratio:>6} {span:>5} {len(lad):>6} {sum(lad) / C:>5.1f} | " +
                         " | ".join(f"{w:>9.1f}% {u:>4}" for w, u in cells))
    return lines, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=16384)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    ratios = (1.0625, 1.125, 1.25, 1.5, 2.0, 4.0)
    spans = (16, 64, 256)

    def body(rank):
        tt.initialize_ub([a.capacity, 64], a.tp, backend="sim")
        try:
            if rank != 0:
                return None
            return table(a.capacity, tt.legal_rows, a.n, a.seed, ratios, spans)[0]
        finally:
            tt.destroy_ub()
    lines = sim.run(a.tp, body, timeout_ms=60000)[0]
    print(f"graphed_buckets: P = {a.tp}, legal_rows(1) = granularity of the sim manager")
    print("\n".join(lines))
    print("graphed_buckets: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
