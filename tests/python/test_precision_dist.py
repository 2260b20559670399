"""FP8 modules on the plain path over torch.distributed (gloo, CPU): TE's setup without ub
flags, where the TP group is a process group. A column-parallel Linear with sequence
parallelism under Float8CurrentScaling (the input's amax max-reduced over tp_group, its FP8
bytes all-gathered) against the host model of test_precision.py, and DelayedScaling's amax
reduced over the world (amax_reduction_group=None, as TE) at the autocast's exit. Run under
torchrun:

    torchrun --standalone --nproc-per-node 2 tests/python/test_precision_dist.py
"""
import datetime
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpflex.torch as te  # noqa: E402
from cases import close  # noqa: E402
from test_precision import BF, E4, E5, F, H, h_mm, h_q, h_scale, rnd  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {dist.get_rank()}: FAIL {what}", flush=True)


def linear(P, r):
    m = te.Linear(H, F, tp_size=P, tp_group=dist.group.WORLD, sequence_parallel=True,
                  parallel_mode="column", params_dtype=torch.float32)
    Fp = F // P
    with torch.no_grad():
        m.weight.copy_(rnd(F, H, seed=81, scale=0.3)[r * Fp:(r + 1) * Fp])
        m.bias.copy_(rnd(F, seed=82, scale=0.1)[r * Fp:(r + 1) * Fp])
    return m


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    r, P = dist.get_rank(), dist.get_world_size()
    T, Fp, n = 32, F // P, 32 // P
    X = rnd(T, H, seed=83, scale=3.0).to(BF)
    X[5, 7] = 40.0 if P > 1 else X[5, 7]   # the largest |x| lives on rank 0's rows only
    dY = [rnd(T, Fp, seed=84 + q, scale=0.01).to(BF) for q in range(P)]

    m = linear(P, r)
    x = X[r * n:(r + 1) * n].clone().requires_grad_()
    with torch.autocast("cpu", dtype=BF), te.autocast(recipe=te.Float8CurrentScaling()):
        y = m(x)
    y.backward(dY[r])
    xq, xi = h_q(X, h_scale(X.float().abs().max(), 448.0), E4)   # one scale: the world's amax
    w = rnd(F, H, seed=81, scale=0.3)[r * Fp:(r + 1) * Fp]
    wq, wi = h_q(w, h_scale(w.abs().max(), 448.0), E4)
    b = rnd(F, seed=82, scale=0.1)[r * Fp:(r + 1) * Fp].to(BF).float()
    check(close(y.detach(), h_mm(xq, wq.t(), xi, wi) + b, BF), "current scaling: y")
    dyq, dyi = h_q(dY[r], h_scale(dY[r].float().abs().max(), 57344.0), E5)
    check(close(m.weight.grad, h_mm(dyq.t(), xq, dyi, xi), BF), "current scaling: dW")

    m = linear(P, r)
    recipe = te.DelayedScaling(amax_history_len=2)
    with torch.autocast("cpu", dtype=BF), te.autocast(recipe=recipe):
        y = m(X[r * n:(r + 1) * n])
    _, fwd, bwd = m._site._fp8_metas
    # After the exit: the reduced amaxes rolled to the history's last row, the scales updated.
    amax_x = float(X.float().abs().max())
    amax_w = float(rnd(F, H, seed=81, scale=0.3).abs().max())
    check(fwd.amax_history[-1].tolist() == [amax_x, amax_w], f"delayed: history "
          f"{fwd.amax_history.tolist()} vs {[amax_x, amax_w]}")
    check(fwd.scale.tolist() == [h_scale(amax_x, 448.0), h_scale(amax_w, 448.0)],
          "delayed: scales")
    y.backward(dY[r])
    amax_dy = max(float(d.float().abs().max()) for d in dY)
    check(bwd.amax_history[-1].tolist() == [amax_dy], "delayed: backward history")
    check(bwd.scale.tolist() == [h_scale(amax_dy, 57344.0)], "delayed: backward scale")
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        return 1
    if r == 0:
        print("test_precision_dist: every check OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
