"""Per-microbatch, per-parameter check of the THD training example's model (two
te.TransformerLayers, every ub_* overlap): for each of the example's packed microbatches, with the
weights held fixed, the output and every parameter's gradient (sequence_parallel ones all-reduced)
against the unsharded fp32 reference of examples/thd_training_step.py, per element relative to the
tensor's norm. Prints one line per microbatch naming every tensor over the tolerance. A GPU
diagnosis tool (the example's check says which step diverges, this says which tensor and T).

  torchrun --standalone --nproc-per-node 2 scripts/layer_grads_check.py [--microbatches 12] [--dtype bf16]
  TPFLEX_BACKEND=sim torchrun --standalone --nproc-per-node 2 scripts/layer_grads_check.py
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

import tpflex.torch as te  # noqa: E402
from thd_training_step import HEADS, full_weights, packed_stream, reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--microbatches", type=int, default=12)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=256)
    a = ap.parse_args()
    sim = os.environ.get("TPFLEX_BACKEND", "") == "sim"
    dist.init_process_group("gloo")
    P, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cpu") if sim else torch.device("cuda", rank % torch.cuda.device_count())
    if not sim:
        torch.cuda.set_device(dev)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    H, C = a.hidden, a.capacity
    te.initialize_ub([C, H], P, dtype=dt)
    model = torch.nn.ModuleList(te.TransformerLayer(
        H, 4 * H, HEADS, tp_size=P, sequence_parallel=True, set_parallel_mode=True,
        fuse_qkv_params=True, params_dtype=dt, device=dev, attn_input_format="thd",
        self_attn_mask_type="padding_causal", hidden_dropout=0.0, attention_dropout=0.0,
        ub_tp_comm_overlap=True) for _ in range(2))
    full = full_weights(model, P, dt, 0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(full[n].chunk(P, p.partition_dim)[rank] if getattr(
                p, "tensor_model_parallel", False) else full[n])
    tol = 3e-2 if dt == torch.bfloat16 else 1e-4
    stream, bad = packed_stream(0, C, H), 0
    for i in range(a.microbatches):
        lens, x, tgt = next(stream)
        T_raw, cu = sum(lens), torch.tensor([0] + lens).cumsum(0).int()
        T = te.legal_rows(T_raw)
        xp, tp = Fn.pad(x, (0, 0, 0, T - T_raw)), Fn.pad(tgt, (0, 0, 0, T - T_raw))
        mask = (torch.arange(T) < T_raw).float()[:, None]
        mine = slice(rank * T // P, (rank + 1) * T // P)
        for p in model.parameters():
            p.grad = None
        for v in full.values():
            v.grad = None
        h = xp[mine].to(dev, dt)
        with te.active_tokens(T):
            for layer in model:
                h = layer(h, cu_seqlens_q=cu.to(dev), cu_seqlens_kv=cu.to(dev),
                          max_seqlen_q=max(lens), max_seqlen_kv=max(lens))
            out = h.float() - tp[mine].to(dev)
            ((out ** 2 * mask[mine].to(dev)).sum() / (T_raw * H)).backward()
        ref = reference(xp.to(dt).float(), full, lens)
        (((ref - tp) ** 2 * mask).sum() / (T_raw * H)).backward()
        errs = []
        e = float((out.float().cpu() + tp[mine] - ref[mine]).norm() / ref[mine].norm())
        if e > tol:
            errs.append(f"y {e:.3g}")
        for n, p in model.named_parameters():
            g = p.grad.float().cpu()
            if getattr(p, "sequence_parallel", False):
                dist.all_reduce(g)
            r = full[n].grad
            if getattr(p, "tensor_model_parallel", False):
                r = r.chunk(P, p.partition_dim)[rank]
            e = float((g - r).norm() / max(float(r.norm()), 1e-12))
            if e > tol:
                errs.append(f"{n} {e:.3g}")
        bad += bool(errs)
        print(f"rank {rank} microbatch {i} T {T_raw}->{T} seqs {len(lens)} max {max(lens)}: "
              + ("OK" if not errs else "; ".join(errs)), flush=True)
    te.destroy_ub()
    flag = torch.tensor([bad])
    dist.all_reduce(flag)
    if rank == 0:
        print(f"layer_grads_check: {'every check OK' if not flag.item() else 'FAILED'}")
    dist.destroy_process_group()
    return 1 if flag.item() else 0


if __name__ == "__main__":
    sys.exit(main())
