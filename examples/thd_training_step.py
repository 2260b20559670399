"""A sequence-parallel tensor-parallel MLP block trained on packed (THD) microbatches whose
token count T changes every step, under ONE tpflex registration, checked against the plain
PyTorch block.

  fc1: column-parallel, RING AG+GEMM on 'fc1_fprop'   y1 = AG(x) W1_r^T          [T, F/P]
  gelu (torch)
  fc2: row-parallel, GEMM+RS on 'fc2_fprop'            out_r = RS(h W2_r^T)       [T/P, H]
  backward (TE's default communicators):
    fc2 dgrad: RING AG+GEMM on 'fc2_dgrad'   dh = AG(dout) W2_r  (W2_r^T materialised: interim)
    fc2 wgrad: torch, dW2_r = AG(dout)^T h, reading AG(dout) from fc2_dgrad's buffer (TE's
               fc2_wgrad is external: no communication of its own)
    fc1 dgrad: BULK AG on 'fc1_dgrad'  re-gathers x while dx_partial = dy1 W1_r runs beside it,
               written straight into fc1_wgrad's registration (W1_r^T materialised: interim)
    fc1 wgrad: BULK RS on 'fc1_wgrad'  reduce-scatters dx_partial while dW1_r = dy1^T AG(x)
               runs beside it (dy1^T and AG(x)^T materialised: interim, until API v1 transposes)

  python3 examples/thd_training_step.py --backend sim [--tp 2] [--dtype bf16|fp32] [--steps 6]

On the simulator the reference is the unsharded block (plain torch autograd). Checks use TE's
tolerances (bf16 rtol 0.02 atol 0.002, fp32 rtol 1e-4 atol 1e-5), the atol scaled by the
tensor's largest magnitude."""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from typing import Any, Dict, List, Tuple

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex.torch import Communicator  # noqa: E402

TOLS = {torch.bfloat16: (0.02, 0.002), torch.float32: (1e-4, 1e-5)}
VIA = {
    "fc1 fprop": "tpflex ag_gemm on fc1_fprop (RING AG)",
    "fc2 fprop": "tpflex gemm_rs on fc2_fprop (PIPELINE RS)",
    "fc2 dgrad": "tpflex ag_gemm on fc2_dgrad (RING AG; W2 shard transposed in torch: interim)",
    "fc2 wgrad": "torch matmul on AG(dout) read from fc2_dgrad's buffer (external in TE)",
    "fc1 dgrad": "tpflex bulk_overlap on fc1_dgrad (BULK AG of x beside dgrad GEMM)",
    "fc1 wgrad": "tpflex bulk_overlap on fc1_wgrad (BULK RS of dx beside wgrad GEMM; "
                 "operands transposed in torch: interim)",
    "gelu, loss": "torch",
}


class ColumnParallelAGGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x_local: torch.Tensor, w1: torch.Tensor, fprop: Communicator,
                dgrad: Communicator, wgrad: Communicator) -> torch.Tensor:
        fprop.local_chunk().copy_(x_local)
        y = fprop.ag_gemm(w1)
        ctx.save_for_backward(x_local, w1)
        ctx.ubs = (dgrad, wgrad)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        x_local, w1 = ctx.saved_tensors
        dgrad, wgrad = ctx.ubs
        dy = dy.contiguous()
        dgrad.local_chunk().copy_(x_local)
        # dx_partial [T, H] = dy [T, F/P] @ W1_r, written into fc1_wgrad's registration.
        dgrad.bulk_overlap(dy, w1.t().contiguous(), out=wgrad.buffer())
        ag_x = dgrad.buffer()  # AG(x) [T, H], gathered beside the dgrad GEMM
        # dW1_r [F/P, H] = dy^T AG(x), while fc1_wgrad reduce-scatters dx_partial.
        dw1 = wgrad.bulk_overlap(dy.t().contiguous(), ag_x.t().contiguous())
        dx_local = wgrad.local_chunk().clone()
        return dx_local, dw1, None, None, None


class RowParallelGemmRS(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, w2: torch.Tensor, fprop: Communicator,
                dgrad: Communicator) -> torch.Tensor:
        out = fprop.gemm_rs(h.contiguous(), w2)
        ctx.save_for_backward(h, w2)
        ctx.dgrad = dgrad
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor):
        h, w2 = ctx.saved_tensors
        ub = ctx.dgrad
        ub.local_chunk().copy_(dout)
        dh = ub.ag_gemm(w2.t().contiguous())  # AG(dout) [T, H] @ W2_r [H, F/P]
        ag_dout = ub.buffer()
        dw2 = (ag_dout.t().float() @ h.float()).to(h.dtype)
        return dh, dw2, None, None


def rank_setup(rank: int, P: int, C: int, H: int, dtype: torch.dtype) -> int:
    torch.set_num_threads(1)
    mgr = te.initialize_ub([C, H], P, dtype=dtype, backend="sim")
    return len(mgr)


def rank_step(rank: int, P: int, T: int, H: int, x: torch.Tensor, tgt: torch.Tensor,
              w1_full: torch.Tensor, w2_full: torch.Tensor) -> Dict[str, Any]:
    te.set_ub_active_shape([T, H])
    F = w1_full.shape[0]
    rows = slice(rank * T // P, (rank + 1) * T // P)
    cols = slice(rank * F // P, (rank + 1) * F // P)
    x_local = x[rows].clone().requires_grad_(True)
    w1 = w1_full[cols].clone().requires_grad_(True)          # [F/P, H]
    w2 = w2_full[:, cols].contiguous().requires_grad_(True)  # [H, F/P]
    y1 = ColumnParallelAGGemm.apply(x_local, w1, te.get_ub("fc1_fprop"), te.get_ub("fc1_dgrad"),
                                    te.get_ub("fc1_wgrad"))
    h = Fn.gelu(y1)
    out = RowParallelGemmRS.apply(h, w2, te.get_ub("fc2_fprop"), te.get_ub("fc2_dgrad"))
    loss = 0.5 * ((out.float() - tgt[rows]) ** 2).sum() / T
    loss.backward()
    return {"out": out.detach(), "loss": loss.item(), "dx": x_local.grad, "dw1": w1.grad,
            "dw2": w2.grad, "epoch": te.get_ub("fc1_fprop").epoch}


def rank_teardown(rank: int) -> None:
    te.destroy_ub()


def reference(x, tgt, w1, w2, T):
    x = x.clone().requires_grad_(True)
    w1 = w1.clone().requires_grad_(True)
    w2 = w2.clone().requires_grad_(True)
    out = Fn.gelu(x @ w1.t()) @ w2.t()
    loss = 0.5 * ((out.float() - tgt) ** 2).sum() / T
    loss.backward()
    return out.detach(), loss.item(), x.grad, w1.grad, w2.grad


def max_err(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> Tuple[float, bool]:
    rtol, atol = TOLS[dtype]
    g, r = got.float(), ref.float()
    scale = max(1.0, r.abs().max().item())
    ok = bool(torch.allclose(g, r, rtol=rtol, atol=atol * scale))
    return (g - r).abs().max().item(), ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", default="sim", choices=["sim", "cuda"])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.backend != "sim":
        print("thd_training_step: --backend cuda is not available yet in the Python binding "
              "(tpflex.torch raises TpflexUnsupportedError); use --backend sim")
        return 2
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    P, H, C = a.tp, a.hidden, a.capacity
    F = 4 * H
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(a.seed)
    rng = random.Random(a.seed)
    w1 = torch.randn(F, H, generator=g) / H ** 0.5  # fp32 master weights
    w2 = torch.randn(H, F, generator=g) / F ** 0.5
    print(f"thd_training_step: backend sim, P={P}, H={H}, F={F}, capacity C={C}, dtype {a.dtype}")
    for k, v in VIA.items():
        print(f"  {k:10s}: {v}")
    all_ok = True
    with sim.World(P, seed=a.seed, timeout_ms=10000) as world:
        ncomm = world.run(rank_setup, P, C, H, dtype)[0]
        regs_setup = world.stats().registrations
        print(f"registered {ncomm} communicators per rank at [{C}, {H}]: "
              f"{regs_setup} registrations")
        print(f"{'step':>4} {'T':>5} {'loss':>10} {'ref loss':>10} {'max err':>9} "
              f"{'tpflex ms':>9} {'torch ms':>8}  check")
        for step in range(a.steps):
            T = P * rng.randint(max(1, C // (8 * P)), C // P)  # packed tokens, changes every step
            x = torch.randn(T, H, generator=g).to(dtype)
            tgt = torch.randn(T, H, generator=g)
            w1d, w2d = w1.to(dtype), w2.to(dtype)
            t0 = time.perf_counter()
            res = world.run(rank_step, P, T, H, x, tgt, w1d, w2d)
            t1 = time.perf_counter()
            r_out, r_loss, r_dx, r_dw1, r_dw2 = reference(x, tgt, w1d, w2d, T)
            t2 = time.perf_counter()
            got = {
                "out": torch.cat([r["out"] for r in res]),
                "dx": torch.cat([r["dx"] for r in res]),
                "dw1": torch.cat([r["dw1"] for r in res], 0),
                "dw2": torch.cat([r["dw2"] for r in res], 1),
            }
            ref = {"out": r_out, "dx": r_dx, "dw1": r_dw1, "dw2": r_dw2}
            errs = {k: max_err(got[k], ref[k], dtype) for k in got}
            loss = sum(r["loss"] for r in res)
            loss_ok = abs(loss - r_loss) <= TOLS[dtype][0] * abs(r_loss) + 1e-6
            ok = all(v[1] for v in errs.values()) and loss_ok
            bad = [k for k, v in errs.items() if not v[1]] + ([] if loss_ok else ["loss"])
            all_ok &= ok
            print(f"{step:>4} {T:>5} {loss:>10.5f} {r_loss:>10.5f} "
                  f"{max(v[0] for v in errs.values()):>9.2e} {1e3 * (t1 - t0):>9.2f} "
                  f"{1e3 * (t2 - t1):>8.2f}  {'OK' if ok else 'FAIL ' + ','.join(bad)}")
            # SGD on the fp32 master weights with the tpflex gradients.
            w1 -= a.lr * got["dw1"].float()
            w2 -= a.lr * got["dw2"].float()
        regs_train = world.stats().registrations - regs_setup
        epochs = res[0]["epoch"]
        world.run(rank_teardown)
    print(f"registrations: {regs_setup} at setup (one per communicator), {regs_train} during "
          f"training; shape epochs {epochs} over {a.steps} steps")
    all_ok &= regs_setup == ncomm and regs_train == 0
    print("thd_training_step: every check OK" if all_ok else "thd_training_step: CHECK FAILED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
