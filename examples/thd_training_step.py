"""A sequence-parallel tensor-parallel MLP block trained on packed (THD) microbatches whose
token count T changes every microbatch, under ONE tpflex registration, checked against plain
PyTorch.

  fc1: column-parallel, RING AG+GEMM on 'fc1_fprop'  y1 = AG(x) W1_r^T + b1_r       [T, F/P]
       (bias in the GEMM epilogue)
  gelu (torch, tanh form)
  fc2: row-parallel, GEMM+RS on 'fc2_fprop'           out_r = RS(h W2_r^T) + b2      [T/P, H]
       (bias in the epilogue: applied once, to the reduced rows)
  backward (TE's default communicators and GEMM layouts):
    fc2 dgrad: RING AG+GEMM on 'fc2_dgrad', trans_w      dh = AG(dout) W2_r         (TE "NN")
    fc2 wgrad: torch, main_grad(W2_r) += AG(dout)^T h, AG(dout) read from fc2_dgrad's buffer
               (TE's fc2_wgrad is external: no communication of its own); db2 = sum AG(dout)
    fc1 dgrad: BULK AG on 'fc1_dgrad' re-gathers x while dx_partial = dy1 W1_r (trans_w) runs
               beside it, written straight into fc1_wgrad's registration              (TE "NN")
    fc1 wgrad: BULK RS on 'fc1_wgrad' reduce-scatters dx_partial while
               main_grad(W1_r) += dy1^T AG(x) runs beside it (trans_a + trans_w, beta = 1 into
               the fp32 main_grad: TE's fuse_wgrad_accumulation)                      (TE "NT")

Each step runs --micro microbatches (gradient accumulation); a microbatch packs random-length
sequences, padded to the communicator's legal row count (the padding is masked out of the
loss). The reference: on the simulator the unsharded block (plain autograd); on CUDA the same
TP block with torch.distributed all_gather / reduce_scatter and torch matmuls. Tolerances are
TE's (bf16 rtol 0.02 atol 0.002, fp32 rtol 1e-4 atol 1e-5; atol scaled by the tensor's largest
magnitude).

  python3 examples/thd_training_step.py --backend sim [--tp 2] [--dtype bf16|fp32] [--steps 6]
  torchrun --standalone --nproc-per-node 2 examples/thd_training_step.py --backend cuda
  torchrun ... examples/thd_training_step.py --backend cuda --bench 1024,4096,16384

With --backend cuda every process uses GPU LOCAL_RANK when there are enough GPUs (NCCL for the
reference's collectives), else all share GPU 0 (gloo for everything; --share-gpu forces it).
--bench times one forward+backward at each T against the references instead of training."""
from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex.torch import Communicator  # noqa: E402

TOLS = {torch.bfloat16: (0.02, 0.002), torch.float32: (1e-4, 1e-5)}
VIA = {
    "fc1 fprop": "ag_gemm on fc1_fprop (RING AG), bias epilogue",
    "fc2 fprop": "gemm_rs on fc2_fprop (PIPELINE RS), bias epilogue after the reduction",
    "fc2 dgrad": "ag_gemm on fc2_dgrad (RING AG), trans_w",
    "fc2 wgrad": "torch matmul on AG(dout) from fc2_dgrad's buffer (external in TE)",
    "fc1 dgrad": "bulk_overlap on fc1_dgrad (BULK AG of x beside dgrad), trans_w",
    "fc1 wgrad": "bulk_overlap on fc1_wgrad (BULK RS of dx beside wgrad), trans_a+trans_w, "
                 "beta=1 into fp32 main_grad",
    "gelu, loss": "torch",
}


def gelu(x: torch.Tensor) -> torch.Tensor:
    return Fn.gelu(x, approximate="tanh")  # the C epilogue's form (for fused variants)


# ---- the tpflex block ---------------------------------------------------------------------------

class ColumnParallelAGGemm(torch.autograd.Function):
    """fc1 (column-parallel, sequence-parallel input): forward RING AG+GEMM; backward BULK AG of
    x beside the dgrad GEMM, BULK RS of dx beside the wgrad GEMM."""

    @staticmethod
    def forward(ctx: Any, x_local: torch.Tensor, b1: torch.Tensor, w1: torch.Tensor,
                main_grad: torch.Tensor, fprop: Communicator, dgrad: Communicator,
                wgrad: Communicator) -> torch.Tensor:
        fprop.local_chunk().copy_(x_local)
        y = fprop.ag_gemm(w1, bias=b1)                   # AG(x) W1_r^T + b1_r
        ctx.save_for_backward(x_local, w1)
        ctx.main_grad, ctx.ubs = main_grad, (dgrad, wgrad)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        x_local, w1 = ctx.saved_tensors
        dgrad, wgrad = ctx.ubs
        dy = dy.contiguous()
        dgrad.local_chunk().copy_(x_local)
        # dgrad: dx_partial [T, H] = dy [T, F/P] @ W1_r [F/P, H] (W1_r stored [K, N]: trans_w),
        # into fc1_wgrad's buffer, while fc1_dgrad all-gathers x in place.
        dgrad.bulk_overlap(dy, w1, out=wgrad.buffer(), trans_w=True)
        # wgrad: main_grad [F/P, H] += dy^T [F/P, T] @ AG(x) [T, H] (dy stored [K, M]: trans_a;
        # AG(x) stored [K, N]: trans_w), while fc1_wgrad reduce-scatters dx_partial.
        wgrad.bulk_overlap(dy, dgrad.buffer(), out=ctx.main_grad, trans_a=True, trans_w=True,
                           accumulate=True)
        dx_local = wgrad.local_chunk().clone()
        db1 = dy.float().sum(0).to(dy.dtype)
        return dx_local, db1, None, None, None, None, None


class RowParallelGemmRS(torch.autograd.Function):
    """fc2 (row-parallel, sequence-parallel output): forward GEMM+RS; backward RING AG+GEMM for
    dgrad, the wgrad GEMM in torch on the gathered dout."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, b2: torch.Tensor, w2: torch.Tensor,
                main_grad: torch.Tensor, fprop: Communicator, dgrad: Communicator) -> torch.Tensor:
        h = h.contiguous()
        out = fprop.gemm_rs(h, w2, bias=b2)              # rows of RS(h W2_r^T) + b2
        ctx.save_for_backward(h, w2)
        ctx.main_grad, ctx.dgrad = main_grad, dgrad
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor):
        h, w2 = ctx.saved_tensors
        ub = ctx.dgrad
        ub.local_chunk().copy_(dout)
        dh = ub.ag_gemm(w2, trans_w=True)                # AG(dout) [T, H] @ W2_r [H, F/P]
        ag_dout = ub.buffer()
        ctx.main_grad.add_(ag_dout.t() @ h)              # main_grad(W2_r) += AG(dout)^T h
        db2 = ag_dout.float().sum(0).to(dout.dtype)      # every row of every rank
        return dh, db2, None, None, None, None


class RankParams:
    """One rank's shards: compute-dtype weights, fp32 main_grads (accumulated over microbatches),
    biases with autograd grads."""

    def __init__(self, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.w1 = w1.to(device, dtype).contiguous()        # [F/P, H]
        self.w2 = w2.to(device, dtype).contiguous()        # [H, F/P]
        self.b1 = b1.to(device, dtype).requires_grad_(True)
        self.b2 = b2.to(device, dtype).requires_grad_(True)
        self.g_w1 = torch.zeros(self.w1.shape, dtype=torch.float32, device=device)
        self.g_w2 = torch.zeros(self.w2.shape, dtype=torch.float32, device=device)


def tpflex_block(x_local: torch.Tensor, p: RankParams) -> torch.Tensor:
    y1 = ColumnParallelAGGemm.apply(x_local, p.b1, p.w1, p.g_w1, te.get_ub("fc1_fprop"),
                                    te.get_ub("fc1_dgrad"), te.get_ub("fc1_wgrad"))
    return RowParallelGemmRS.apply(gelu(y1), p.b2, p.w2, p.g_w2, te.get_ub("fc2_fprop"),
                                   te.get_ub("fc2_dgrad"))


def masked_loss(out: torch.Tensor, tgt: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    return 0.5 * (((out.float() - tgt) ** 2) * mask[:, None]).sum() / n


# ---- microbatches -------------------------------------------------------------------------------

def packed_rows(rng: random.Random, C: int, P: int) -> int:
    """Tokens of one packed microbatch: random-length sequences up to about C."""
    budget = rng.randint(max(P, C // 6), C - 2 * P)
    t = 0
    while t < budget:
        t += rng.randint(8, max(9, C // 6))
    return min(t, C - 2 * P)


def microbatch(g: torch.Generator, T_raw: int, T: int, H: int, dtype: torch.dtype):
    x = torch.zeros(T, H, dtype=dtype)
    x[:T_raw] = torch.randn(T_raw, H, generator=g).to(dtype)
    tgt = torch.randn(T, H, generator=g)
    mask = (torch.arange(T) < T_raw).float()
    return x, tgt, mask


def rank_step(rank: int, P: int, H: int, micro: List[Tuple[int, int, Any]], shards: Dict[str, Any],
              dtype: torch.dtype, device: torch.device) -> Dict[str, Any]:
    """One training step on this rank: every microbatch forward+backward through tpflex."""
    p = RankParams(shards["w1"], shards["b1"], shards["w2"], shards["b2"], dtype, device)
    outs, dxs, loss = [], [], 0.0
    for T_raw, T, (x, tgt, mask) in micro:
        te.set_ub_active_shape([T, H])
        rows = slice(rank * T // P, (rank + 1) * T // P)
        x_local = x[rows].to(device).requires_grad_(True)
        out = tpflex_block(x_local, p)
        l_r = masked_loss(out, tgt[rows].to(device), mask[rows].to(device), T_raw)
        l_r.backward()
        outs.append(out.detach())
        dxs.append(x_local.grad)
        loss += l_r.item()
    return {"out": outs, "dx": dxs, "loss": loss, "dw1": p.g_w1, "dw2": p.g_w2,
            "db1": p.b1.grad, "db2": p.b2.grad, "epoch": te.get_ub("fc1_fprop").epoch}


# ---- references ---------------------------------------------------------------------------------

def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of dtype at |t| (fp32 tensor, same device)."""
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    _, e = torch.frexp(t.detach().float().abs())
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), torch.clamp(e - 1, min=-126) - mant)


def _fp32(t: torch.Tensor, dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    """The compute-dtype value of t, as an fp32 leaf (references compute in fp32)."""
    return t.to(device or t.device, dtype).float().clone().requires_grad_(True)


def reference_unsharded(micro, full, dtype, P) -> Dict[str, Any]:
    """The unsharded block in plain PyTorch autograd (simulator reference), fp32 math over the
    compute-dtype values (docs/SPEC.md §7), rounding y1 and h to the compute dtype where the
    model stores them. slack: one ulp per rank's rounded partial of the reduce-scattered
    results (out, dx) plus one of the result: a rank's partial passes through the buffer dtype
    (SPEC §7; the reference has no partials)."""
    w1, b1, w2, b2 = (_fp32(full[k], dtype) for k in ("w1", "b1", "w2", "b2"))
    F = w1.shape[0]
    cols = [slice(r * F // P, (r + 1) * F // P) for r in range(P)]
    outs, dxs, slack, loss = [], [], {}, 0.0
    for i, (T_raw, T, (x, tgt, mask)) in enumerate(micro):
        x = x.float().requires_grad_(True)
        y1 = (x @ w1.t() + b1).to(dtype).float()
        y1.retain_grad()
        h = gelu(y1).to(dtype).float()
        out = h @ w2.t() + b2
        l_ = masked_loss(out, tgt, mask, T_raw)
        l_.backward()
        with torch.no_grad():
            parts = [h[:, c] @ w2[:, c].t() for c in cols]
            slack[f"out[{i}]"] = sum(ulp(q, dtype) for q in parts) + ulp(out, dtype)
            parts = [y1.grad[:, c] @ w1[c] for c in cols]
            slack[f"dx[{i}]"] = sum(ulp(q, dtype) for q in parts) + ulp(x.grad, dtype)
        outs.append(out.detach())
        dxs.append(x.grad)
        loss += l_.item()
    return {"out": outs, "dx": dxs, "loss": loss, "dw1": w1.grad, "dw2": w2.grad,
            "db1": b1.grad, "db2": b2.grad, "slack": slack}


class TorchCollectives:
    """all_gather / reduce_scatter over torch.distributed for the CUDA reference: NCCL on CUDA
    tensors when the group has it, else gloo through host memory (processes sharing a GPU)."""

    def __init__(self) -> None:
        import torch.distributed as dist
        self.dist = dist
        self.P = dist.get_world_size()
        self.rank = dist.get_rank()
        self.nccl = "nccl" in str(dist.get_backend())
        self.via = "nccl" if self.nccl else "gloo via host memory"

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        d = self.dist
        if self.nccl:
            out = torch.empty((self.P * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype,
                              device=t.device)
            d.all_gather_into_tensor(out, t.contiguous())
            return out
        h = t.detach().cpu().contiguous()
        hv = h.view(torch.uint8)  # bit-exact, and a type gloo has for every dtype
        parts = [torch.empty_like(hv) for _ in range(self.P)]
        d.all_gather(parts, hv)
        return torch.cat(parts).view(h.dtype).to(t.device)

    def reduce_scatter(self, t: torch.Tensor) -> torch.Tensor:
        d = self.dist
        n = t.shape[0] // self.P
        if self.nccl:
            out = torch.empty((n,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
            d.reduce_scatter_tensor(out, t.contiguous())
            return out
        h = t.detach().float().cpu().clone()  # gloo reduces in place: never into t
        d.all_reduce(h)
        return h[self.rank * n:(self.rank + 1) * n].to(t.device, t.dtype)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        h = t.detach().float().clone()
        if not self.nccl:
            h = h.cpu()
        self.dist.all_reduce(h)
        return h.to(t.device, t.dtype)


class _AG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cc):
        ctx.cc = cc
        return cc.all_gather(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.cc.reduce_scatter(g), None


class _RS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cc):
        ctx.cc = cc
        return cc.reduce_scatter(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.cc.all_gather(g.contiguous()), None


def torch_tp_block(x_local, w1, b1, w2, b2, cc: TorchCollectives) -> torch.Tensor:
    """The same TP block with torch.distributed collectives and torch matmuls (compute dtype)."""
    x_full = _AG.apply(x_local, cc)
    h = gelu(x_full @ w1.t() + b1)
    return _RS.apply(h @ w2.t(), cc) + b2


def reference_tp(rank, P, micro, shards, dtype, device, cc: TorchCollectives) -> Dict[str, Any]:
    """This rank's shards of the TP block through torch.distributed all_gather / reduce_scatter
    (CUDA reference), fp32 math over the compute-dtype values as reference_unsharded, with the
    slack of the reduce-scattered results: RS of each rank's ulps."""
    w1, b1, w2, b2 = (_fp32(shards[k], dtype, device) for k in ("w1", "b1", "w2", "b2"))
    outs, dxs, slack, loss = [], [], {}, 0.0
    for i, (T_raw, T, (x, tgt, mask)) in enumerate(micro):
        rows = slice(rank * T // P, (rank + 1) * T // P)
        x_local = x[rows].to(device).float().requires_grad_(True)
        x_full = _AG.apply(x_local, cc)
        y1 = (x_full @ w1.t() + b1).to(dtype).float()
        y1.retain_grad()
        h = gelu(y1).to(dtype).float()
        part = h @ w2.t()
        out = _RS.apply(part, cc) + b2
        l_ = masked_loss(out, tgt[rows].to(device), mask[rows].to(device), T_raw)
        l_.backward()
        with torch.no_grad():
            slack[f"out[{i}]"] = cc.reduce_scatter(ulp(part, dtype)) + ulp(out, dtype)
            slack[f"dx[{i}]"] = (cc.reduce_scatter(ulp(y1.grad @ w1, dtype)) +
                                 ulp(x_local.grad, dtype))
        outs.append(out.detach())
        dxs.append(x_local.grad)
        loss += l_.item()
    # b2 is replicated and sees only this rank's rows: its full gradient sums over ranks.
    return {"out": outs, "dx": dxs, "loss": loss, "dw1": w1.grad, "dw2": w2.grad,
            "db1": b1.grad, "db2": cc.all_reduce(b2.grad), "slack": slack}


def max_err(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
            slack: Optional[torch.Tensor] = None) -> Tuple[float, bool]:
    """TE's tolerances per element (atol scaled by the reference's largest magnitude); with
    slack, an element also passes within 1.25 x its slack (reduce-scattered results)."""
    rtol, atol = TOLS[dtype]
    g, r = got.detach().float().cpu(), ref.detach().float().cpu()
    if g.shape != r.shape:
        return float("inf"), False
    scale = max(1.0, r.abs().max().item())
    diff = (g - r).abs()
    ok = diff <= atol * scale + rtol * r.abs()
    if slack is not None:
        ok |= diff <= 1.25 * slack.detach().float().cpu()
    return diff.max().item(), bool(ok.all()) and not bool(torch.isnan(g).any())


def compare(got: Dict[str, Any], ref: Dict[str, Any], dtype: torch.dtype) -> Dict[str, Any]:
    errs = {}
    for k in ("out", "dx"):
        for i, (a, b) in enumerate(zip(got[k], ref[k])):
            errs[f"{k}[{i}]"] = max_err(a, b, dtype, ref["slack"][f"{k}[{i}]"])
    for k in ("dw1", "dw2", "db1", "db2"):
        errs[k] = max_err(got[k], ref[k], dtype)
    loss_ok = abs(got["loss"] - ref["loss"]) <= TOLS[dtype][0] * abs(ref["loss"]) + 1e-6
    bad = [k for k, v in errs.items() if not v[1]] + ([] if loss_ok else ["loss"])
    return {"max": max(v[0] for v in errs.values()), "bad": bad}


# ---- drivers ------------------------------------------------------------------------------------

def shard(full: Dict[str, torch.Tensor], rank: int, P: int) -> Dict[str, torch.Tensor]:
    F = full["w1"].shape[0]
    cols = slice(rank * F // P, (rank + 1) * F // P)
    return {"w1": full["w1"][cols].contiguous(), "b1": full["b1"][cols].contiguous(),
            "w2": full["w2"][:, cols].contiguous(), "b2": full["b2"].clone()}


def init_weights(g: torch.Generator, H: int, F: int) -> Dict[str, torch.Tensor]:
    return {"w1": torch.randn(F, H, generator=g) / H ** 0.5, "b1": 0.1 * torch.randn(F, generator=g),
            "w2": torch.randn(H, F, generator=g) / F ** 0.5, "b2": 0.1 * torch.randn(H, generator=g)}


def sgd(full: Dict[str, torch.Tensor], grads: Dict[str, torch.Tensor], lr: float) -> None:
    for k, gk in (("w1", "dw1"), ("b1", "db1"), ("w2", "dw2"), ("b2", "db2")):
        full[k] -= lr * grads[gk].float().cpu()


def header(a, P, H, F, C, backend_note: str) -> None:
    print(f"thd_training_step: backend {a.backend}{backend_note}, P={P}, H={H}, F={F}, capacity "
          f"C={C}, dtype {a.dtype}, {a.micro} microbatches per step")
    for k, v in VIA.items():
        print(f"  {k:10s}: {v}")


def table_header() -> None:
    print(f"{'step':>4} {'T (tokens->rows) per microbatch':>34} {'loss':>10} {'ref loss':>10} "
          f"{'max err':>9} {'tpflex ms':>9} {'ref ms':>8}  check")


def make_micro(rng, g, a, C, P, H, dtype, legal: Callable[[int], int]):
    out = []
    for _ in range(a.micro):
        T_raw = packed_rows(rng, C, P)
        T = legal(T_raw)
        out.append((T_raw, T, microbatch(g, T_raw, T, H, dtype)))
    return out


def run_sim(a, dtype) -> int:
    P, H, C = a.tp, a.hidden, a.capacity
    F = 4 * H
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(a.seed)
    rng = random.Random(a.seed)
    full = init_weights(g, H, F)
    all_ok = True
    with sim.World(P, seed=a.seed, timeout_ms=10000) as world:
        def setup(rank):
            torch.set_num_threads(1)
            return len(te.initialize_ub([C, H], P, dtype=dtype, backend="sim"))
        ncomm = world.run(setup)[0]
        legal = world.run(lambda r, n: te.get_ub("fc1_fprop").legal_rows(n), 1)[0]
        regs_setup = world.stats().registrations
        header(a, P, H, F, C, "")
        print(f"registered {ncomm} communicators per rank at [{C}, {H}]: {regs_setup} "
              f"registrations (legal rows for 1 token: {legal})")
        table_header()
        for step in range(a.steps):
            micro = []
            for _ in range(a.micro):
                T_raw = packed_rows(rng, C, P)
                T = world.run(lambda r, n: te.get_ub("fc1_fprop").legal_rows(n), T_raw)[0]
                micro.append((T_raw, T, microbatch(g, T_raw, T, H, dtype)))
            shards = [shard(full, r, P) for r in range(P)]
            t0 = time.perf_counter()
            res = world.run(lambda r: rank_step(r, P, H, micro, shards[r], dtype,
                                                torch.device("cpu")))
            t1 = time.perf_counter()
            ref = reference_unsharded(micro, full, dtype, P)
            t2 = time.perf_counter()
            got = {"out": [torch.cat([r["out"][i] for r in res]) for i in range(a.micro)],
                   "dx": [torch.cat([r["dx"][i] for r in res]) for i in range(a.micro)],
                   "loss": sum(r["loss"] for r in res),
                   "dw1": torch.cat([r["dw1"] for r in res], 0),
                   "dw2": torch.cat([r["dw2"] for r in res], 1),
                   "db1": torch.cat([r["db1"] for r in res], 0),
                   "db2": res[0]["db2"]}
            c = compare(got, ref, dtype)
            ok = not c["bad"]
            all_ok &= ok
            ts = " ".join(f"{m[0]}->{m[1]}" for m in micro)
            print(f"{step:>4} {ts:>34} {got['loss']:>10.5f} {ref['loss']:>10.5f} {c['max']:>9.2e} "
                  f"{1e3 * (t1 - t0):>9.2f} {1e3 * (t2 - t1):>8.2f}  "
                  f"{'OK' if ok else 'FAIL ' + ','.join(c['bad'])}")
            sgd(full, got, a.lr)
        regs_train = world.stats().registrations - regs_setup
        epochs = res[0]["epoch"]
        world.run(lambda r: te.destroy_ub())
    print(f"registrations: {regs_setup} at setup (one per communicator: {ncomm}), {regs_train} "
          f"during training; shape epochs {epochs} over {a.steps} steps x {a.micro} microbatches")
    all_ok &= regs_setup == ncomm and regs_train == 0 and epochs == a.steps * a.micro
    print("thd_training_step: every check OK" if all_ok else "thd_training_step: CHECK FAILED")
    return 0 if all_ok else 1


def init_distributed(a) -> Tuple[int, int, torch.device]:
    import torch.distributed as dist
    if "RANK" not in os.environ:  # one process without torchrun
        path = os.path.join(tempfile.mkdtemp(prefix="tpflex-"), "store")
        init = f"file://{path}"
        rank, world = 0, 1
    else:
        init, rank, world = "env://", int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    share = a.share_gpu or world == 1 or torch.cuda.device_count() < world
    device = torch.device("cuda", 0 if share else local)
    torch.cuda.set_device(device)
    # Sharing one GPU: NCCL refuses several ranks on one device, so gloo carries everything
    # (also for one process: nothing to reduce, and no NCCL socket bootstrap).
    backend = "gloo" if share else "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    return rank, world, device


def run_cuda(a, dtype) -> int:
    import torch.distributed as dist
    if not torch.cuda.is_available():
        print("thd_training_step: --backend cuda needs torch with CUDA and a GPU")
        return 2
    rank, P, device = init_distributed(a)
    H, C = a.hidden, a.capacity
    F = 4 * H
    if a.tp not in (0, P) and rank == 0:
        print(f"thd_training_step: --tp {a.tp} ignored: the process group has {P} ranks")
    mgr = te.initialize_ub([C, H], P, dtype=dtype, backend="cuda")
    ncomm = len(mgr)
    regs0 = {n: te.get_ub(n).registration() for n in mgr.names}
    boot = te.GlooBootstrap(te._gloo_group(None), timeout_ms=300000)
    cc = TorchCollectives()
    try:
        if a.bench:
            return bench_cuda(a, dtype, rank, P, H, F, device, cc, boot)
        g = torch.Generator().manual_seed(a.seed)
        rng = random.Random(a.seed)
        full = init_weights(g, H, F)
        legal = te.get_ub("fc1_fprop").legal_rows
        if rank == 0:
            where = ("one process" if P == 1 else f"{P} processes sharing {device}" if not cc.nccl
                     else f"{P} processes, one GPU each")
            header(a, P, H, F, C, f" ({where}; reference collectives: {cc.via})")
            print(f"registered {ncomm} communicators per rank at [{C}, {H}]: one registration "
                  f"each")
            table_header()
        all_ok = True
        eps0 = te.get_ub("fc1_fprop").epoch
        for step in range(a.steps):
            micro = make_micro(rng, g, a, C, P, H, dtype, legal)
            sh = shard(full, rank, P)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            got = rank_step(rank, P, H, micro, sh, dtype, device)
            torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            ref = reference_tp(rank, P, micro, sh, dtype, device, cc)
            torch.cuda.synchronize(device)
            t2 = time.perf_counter()
            c = compare(got, ref, dtype)
            # Gradients of the shards, gathered to update the replicated fp32 master weights.
            parts = boot.allgather_object({"c": c, "t": (t1 - t0, t2 - t1), "loss": got["loss"],
                                           "ref_loss": ref["loss"],
                                           "g": {k: got[k].float().cpu() for k in
                                                 ("dw1", "dw2", "db1", "db2")}})
            bad = sorted({f"rank{q}:{b}" for q, p in enumerate(parts) for b in p["c"]["bad"]})
            ok = not bad
            all_ok &= ok
            if rank == 0:
                ts = " ".join(f"{m[0]}->{m[1]}" for m in micro)
                loss = sum(p["loss"] for p in parts)
                rl = sum(p["ref_loss"] for p in parts)
                mx = max(p["c"]["max"] for p in parts)
                tt = max(p["t"][0] for p in parts)
                tr = max(p["t"][1] for p in parts)
                print(f"{step:>4} {ts:>34} {loss:>10.5f} {rl:>10.5f} {mx:>9.2e} {1e3 * tt:>9.2f} "
                      f"{1e3 * tr:>8.2f}  {'OK' if ok else 'FAIL ' + ','.join(bad)}", flush=True)
            grads = {"dw1": torch.cat([p["g"]["dw1"] for p in parts], 0),
                     "dw2": torch.cat([p["g"]["dw2"] for p in parts], 1),
                     "db1": torch.cat([p["g"]["db1"] for p in parts], 0),
                     "db2": parts[0]["g"]["db2"]}
            sgd(full, grads, a.lr)
        epochs = te.get_ub("fc1_fprop").epoch - eps0
        # The CUDA backend has no registration counter: every communicator must still hold the
        # very registration (address and size) it was created with.
        moved = boot.allgather_object(sum(te.get_ub(n).registration() != r
                                          for n, r in regs0.items()) + abs(len(mgr) - ncomm))
        all_ok &= epochs == a.steps * a.micro and not any(moved)
        if rank == 0:
            print(f"registrations: {ncomm} at setup (one per communicator), "
                  f"{sum(moved)} changed during training (every communicator kept its "
                  f"registration's address and size); shape epochs {epochs} over {a.steps} steps "
                  f"x {a.micro} microbatches")
            print("thd_training_step: every check OK" if all_ok else
                  "thd_training_step: CHECK FAILED")
        return 0 if all_ok else 1
    finally:
        torch.cuda.synchronize(device)
        te.destroy_ub()
        boot.allgather(b"\0")  # nobody tears the group down while a peer still uses it
        dist.destroy_process_group()


def _time_ms(fn: Callable[[], Any], iters: int, warmup: int, device) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def bench_cuda(a, dtype, rank, P, H, F, device, cc, boot) -> int:
    """Median forward+backward time of the TP block at each T: tpflex vs the same TP block on
    torch.distributed collectives vs the unsharded block in one process (rank 0 alone, the
    others idle). Every T is also checked once (outputs and gradients) like a training step."""
    Ts = [int(t) for t in a.bench.split(",")]
    g = torch.Generator().manual_seed(a.seed)
    full = init_weights(g, H, F)
    sh = shard(full, rank, P)
    p = RankParams(sh["w1"], sh["b1"], sh["w2"], sh["b2"], dtype, device)
    rw1, rb1, rw2, rb2 = (sh[k].to(device, dtype).requires_grad_(True)
                          for k in ("w1", "b1", "w2", "b2"))
    uw1, ub1, uw2, ub2 = (full[k].to(device, dtype).requires_grad_(True)
                          for k in ("w1", "b1", "w2", "b2"))
    rows_out = []
    for T in Ts:
        T = te.get_ub("fc1_fprop").legal_rows(T)
        xg = torch.Generator(device=device).manual_seed(a.seed + T)  # the same on every rank
        x_full = torch.randn(T, H, generator=xg, device=device).to(dtype)
        tgt = torch.randn(T, H, generator=xg, device=device)
        micro = [(T, T, (x_full, tgt, torch.ones(T, device=device)))]
        c = compare(rank_step(rank, P, H, micro, sh, dtype, device),
                    reference_tp(rank, P, micro, sh, dtype, device, cc), dtype)
        rows = slice(rank * T // P, (rank + 1) * T // P)
        x = x_full[rows].clone().requires_grad_(True)
        dout = torch.randn(T, H, generator=xg, device=device).to(dtype)[rows].contiguous()

        def tpflex_iter():
            tpflex_block(x, p).backward(dout)

        def torch_tp_iter():
            torch_tp_block(x, rw1, rb1, rw2, rb2, cc).backward(dout)

        t_tp = _time_ms(tpflex_iter, a.bench_iters, 2, device)
        t_ref = _time_ms(torch_tp_iter, a.bench_iters, 1, device)
        boot.allgather(b"\0")
        t_un = float("nan")
        if rank == 0:
            xu = x_full.clone().requires_grad_(True)
            du = torch.randn(T, H, generator=xg, device=device).to(dtype)

            def unsharded_iter():
                (gelu(xu @ uw1.t() + ub1) @ uw2.t() + ub2).backward(du)
            t_un = _time_ms(unsharded_iter, a.bench_iters, 2, device)
        parts = boot.allgather_object((t_tp, t_ref, c))
        rows_out.append((T, max(q[0] for q in parts), max(q[1] for q in parts), t_un,
                         max(q[2]["max"] for q in parts),
                         sorted({f"rank{i}:{b}" for i, q in enumerate(parts) for b in q[2]["bad"]})))
    if rank == 0:
        where = (f"one GPU shared by {P} processes" if P > 1 and not cc.nccl else
                 "one GPU per process" if P > 1 else "one process")
        print(f"thd_training_step --bench: P={P} on {torch.cuda.get_device_name(device)} ({where}), "
              f"H={H}, F={F}, {dtype}, one microbatch forward+backward, median of "
              f"{a.bench_iters} (ms)")
        print(f"{'T':>6} {'tpflex':>9} {'torch TP':>9} {'unsharded':>10} {'tpflex/unsh':>11} "
              f"{'max err':>9}  check   (torch TP: the same block on torch.distributed, via "
              f"{cc.via}; unsharded: plain PyTorch on rank 0 alone)")
        for T, t_tp, t_ref, t_un, e, bad in rows_out:
            print(f"{T:>6} {t_tp:>9.3f} {t_ref:>9.3f} {t_un:>10.3f} {t_tp / t_un:>11.2f} "
                  f"{e:>9.2e}  {'OK' if not bad else 'FAIL ' + ','.join(bad)}")
    ok = all(not r[5] for r in rows_out)
    if rank == 0:
        print("thd_training_step: every check OK" if ok else "thd_training_step: CHECK FAILED")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", default="sim", choices=["sim", "cuda"])
    ap.add_argument("--tp", type=int, default=2, help="P (sim); cuda: the process count")
    ap.add_argument("--hidden", type=int, default=None, help="H (default 64; --bench 1024)")
    ap.add_argument("--capacity", type=int, default=None,
                    help="C (default 512; --bench the largest T)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro", type=int, default=2, help="microbatches per step")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--share-gpu", action="store_true",
                    help="cuda: every process on GPU 0 (default when GPUs < processes)")
    ap.add_argument("--bench", default="", help="cuda: comma-separated T values to time")
    ap.add_argument("--bench-iters", type=int, default=10)
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    if a.bench:
        if a.backend != "cuda":
            ap.error("--bench needs --backend cuda")
        a.hidden = a.hidden or 1024
        a.capacity = a.capacity or max(int(t) for t in a.bench.split(","))
    a.hidden = a.hidden or 64
    a.capacity = a.capacity or 512
    return run_sim(a, dtype) if a.backend == "sim" else run_cuda(a, dtype)


if __name__ == "__main__":
    sys.exit(main())
