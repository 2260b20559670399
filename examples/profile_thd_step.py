"""Looking at a THD training step (SPEC §16): two te.TransformerLayer blocks on packed sequences
(examples/thd_model.py, every ub_* overlap on) under torch.profiler with tpflex's ranges on,
then tpflex.torch.stats(): per communicator the operations, rows against a pad-to-capacity run,
bytes, and (CUDA, profiling on) the exposed communication and the share hidden under GEMMs.

  torchrun --standalone --nproc-per-node 1 examples/profile_thd_step.py --T 4096 --out /tmp/prof
  torchrun --standalone --nproc-per-node 2 examples/profile_thd_step.py      (P = 2; under MPS)
  TPFLEX_BACKEND=sim torchrun --standalone --nproc-per-node 2 examples/profile_thd_step.py
                                                       (CPU: the simulator, small shapes)

Writes, per rank, <out>/profile.rank<r>.json (torch.profiler's Chrome trace: open it in
Perfetto or chrome://tracing; tpflex's ranges are named "tpflex.<op> <site> T=<rows> ...") and
<out>/tpflex-trace.rank<r>.json (tpflex.torch.trace's own host spans). Prints, on rank 0, the
tpflex ranges the profiler recorded (count, host µs, device µs where CUDA ran) and stats()'s
table. Exits 1 when the profiler recorded no tpflex range or stats() counted no operation (or,
on CUDA, timed none); ends with "profile_thd_step: done"."""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("tpflex") is None:  # not installed: the source tree's
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import tpflex.torch as te  # noqa: E402
from thd_model import Block  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--T", type=int, default=0, help="tokens (cuda 4096, sim 256)")
    ap.add_argument("--capacity", type=int, default=0, help="registered tokens (cuda 16384, sim 512)")
    ap.add_argument("--hidden", type=int, default=0, help="cuda 1024, sim 64")
    ap.add_argument("--steps", type=int, default=3, help="steps profiled (after 3 warm-ups)")
    ap.add_argument("--out", default="profile-out", help="folder of the JSON traces")
    ap.add_argument("--fp8", default="", choices=("", "delayed", "current"),
                    help="the step under tpflex.torch.autocast with this recipe (FP8 "
                         "registrations beside the bf16 ones)")
    ap.add_argument("--kernels", type=int, default=12,
                    help="CUDA: the top kernels by device time in the table (0: none)")
    a = ap.parse_args()
    sim = os.environ.get("TPFLEX_BACKEND", "") == "sim" or not torch.cuda.is_available()
    dist.init_process_group("gloo")
    P, rank = dist.get_world_size(), dist.get_rank()
    if sim:
        dev, dt = torch.device("cpu"), torch.float32
        C, T0, H = a.capacity or 512, a.T or 256, a.hidden or 64
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dt, C, T0, H = torch.bfloat16, a.capacity or 16384, a.T or 4096, a.hidden or 1024
    os.makedirs(a.out, exist_ok=True)
    te.profile(True)
    modes = [te.UserBufferQuantizationMode.NONE] + \
        ([te.UserBufferQuantizationMode.FP8] if a.fp8 else [])
    te.initialize_ub([C, H], P, dtype=dt, backend="sim" if sim else "cuda",
                     quantization_modes=modes)
    recipe = {"": None, "delayed": te.DelayedScaling, "current": te.Float8CurrentScaling}[a.fp8]
    T = te.legal_rows(T0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(H, P, dt, dev), Block(H, P, dt, dev))
    x = torch.randn(T // P, H, device=dev, dtype=dt, requires_grad=True)

    def step():
        if recipe is None:
            model(x).sum().backward()
            return
        with te.autocast(recipe=recipe()):
            y = model(x)
        y.sum().backward()

    sync = torch.cuda.synchronize if not sim else (lambda: None)
    with te.active_tokens(T):
        for _ in range(3):
            step()
        sync()
        te.reset_stats()
        acts = [ProfilerActivity.CPU] + ([] if sim else [ProfilerActivity.CUDA])
        with profile(activities=acts) as prof:
            for _ in range(a.steps):
                step()
            sync()
        prof.export_chrome_trace(os.path.join(a.out, f"profile.rank{rank}.json"))
        with te.trace(os.path.join(a.out, "tpflex-trace.rank{rank}.json")):
            step()
            sync()
    sync()
    rep = te.stats()
    ranges = {}
    for e in prof.key_averages():
        if e.key.startswith("tpflex."):
            dev_us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
            ranges[e.key] = (e.count, e.cpu_time_total, dev_us)
    ops = sum(s["ops"] for s in rep.values())
    timed = sum(s.get("timed_ops") or 0 for s in rep.values())
    bad = []
    if P == 1 and rank == 0:   # one rank: the modules communicate nothing, tpflex runs nothing
        print("profile_thd_step: P = 1: no tensor-parallel communication, so no tpflex "
              "operation ran (the modules' plain path); run P >= 2 to see tpflex's work")
    elif not ranges:
        bad.append("the profiler recorded no tpflex range")
    if P > 1 and ops == 0:
        bad.append("stats() counted no operation")
    if P > 1 and not sim and timed == 0:
        bad.append("stats() timed no operation on the device")
    if rank == 0:
        print(f"profile_thd_step: P {P}, T {T} of capacity {C}, H {H}, {str(dt)[6:]}"
              f"{', FP8 ' + a.fp8 + ' scaling' if a.fp8 else ''}, "
              f"{'simulator (CPU)' if sim else 'cuda'}, {a.steps} steps profiled")
        print(f"{'tpflex range (torch.profiler)':<64} {'count':>6} {'host µs':>9} {'device µs':>10}")
        for k, (n, cpu, gpu) in sorted(ranges.items()):
            print(f"{k[:64]:<64} {n:>6} {cpu:>9.0f} {gpu:>10.0f}")
        if not sim and a.kernels:
            def dev_us(e):
                return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
            ks = sorted((e for e in prof.key_averages() if dev_us(e) > 0 and
                         str(getattr(e, "device_type", "")).endswith("CUDA")),
                        key=lambda e: -dev_us(e))   # the kernels themselves
            tot = sum(dev_us(e) for e in ks)
            ks = ks[:a.kernels]
            print(f"kernels: {tot / a.steps / 1e3:.3f} ms of device time per step; the top "
                  f"{len(ks)} (µs per step, calls per step):")
            for e in ks:
                print(f"  {dev_us(e) / a.steps:>9.0f} {e.count / a.steps:>5.0f}  "
                      f"{e.key[:90]}")
        print(rep.table())
        print(f"traces: {a.out}/profile.rank*.json (torch.profiler), "
              f"{a.out}/tpflex-trace.rank*.json (tpflex.torch.trace)")
    te.destroy_ub()
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        print(f"profile_thd_step: rank {rank}: " + "; ".join(bad), file=sys.stderr)
        return 1
    if rank == 0:
        print("profile_thd_step: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
