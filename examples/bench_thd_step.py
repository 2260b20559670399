"""Benchmark (not a test): one THD training step (forward + backward of the two blocks of
examples/thd_training_step.py) on tpflex.torch's modules against the same shapes in plain
PyTorch (torch.nn.functional on this rank's shards, no communication), side by side in one run,
at each T. With --profile, the host-time table of torch.profiler for one tpflex step at the
first T (where the host time goes).

  torchrun --standalone --nproc-per-node 1 examples/bench_thd_step.py --T 1024,4096,16384
  torchrun --standalone --nproc-per-node 2 examples/bench_thd_step.py     (P = 2; under MPS)

Prints, per T: the median ms of tpflex's step, of plain torch's, and their ratio (issue 24's
target at P = 1: <= 1.2)."""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.torch as te  # noqa: E402
from thd_graphed_step import PlainBlock  # noqa: E402  (this rank's shards, plain torch)
from thd_training_step import Block  # noqa: E402


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
    ap.add_argument("--T", default="1024,4096,16384")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    import torch.distributed as dist
    dist.init_process_group("gloo")
    P, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dt, H = torch.bfloat16, a.hidden
    Ts = [int(t) for t in a.T.split(",")]
    te.initialize_ub([max(Ts), H], P, dtype=dt)
    model = torch.nn.Sequential(Block(H, P, dt, dev), Block(H, P, dt, dev))
    plain = torch.nn.Sequential(PlainBlock(H, P, dt, dev), PlainBlock(H, P, dt, dev))
    if rank == 0:
        print(f"bench_thd_step: P {P}, H {H}, bf16, two blocks, median of {a.iters} steps "
              f"(forward + backward), tpflex.torch modules vs plain torch on the same shards")
        print(f"{'T':>6} {'tpflex ms':>10} {'torch ms':>10} {'ratio':>7}")
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
        theirs = median_ms(lambda: plain(xp).sum().backward(), a.iters)
        if rank == 0:
            print(f"{T:>6} {ours:>10.3f} {theirs:>10.3f} {ours / theirs:>7.2f}")
    te.destroy_ub()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
