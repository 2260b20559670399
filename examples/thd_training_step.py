"""A sequence-parallel TP model of two te.TransformerLayers (LayerNormLinear 'qkv', causal attention
within each packed sequence, row-parallel 'proj', LayerNormMLP 'fc1'/'fc2') trained on packed (THD)
microbatches whose T and sequence boundaries (cu_seqlens) change every microbatch, under ONE tpflex
registration, checked step by step against the same model in plain fp32 PyTorch. Every ub_* overlap
on (ub_tp_comm_overlap): RING AG+GEMM, GEMM+RS, the dgrad RING AG, bulk AG/RS beside dgrad/wgrad.
  python3 examples/thd_training_step.py --backend sim [--tp 2] [--dtype bf16|fp32] [--steps 6]
  torchrun --standalone --nproc-per-node 2 examples/thd_training_step.py --backend cuda
  TPFLEX_BACKEND=sim torchrun --standalone --nproc-per-node 2 examples/thd_training_step.py
  (under torchrun --backend sim, or TPFLEX_BACKEND=sim, makes each process a simulator rank on CPU;
  examples/bench_thd_step.py times the step)"""
import argparse, functools, importlib.util, os, random, sys, threading, time, warnings  # noqa: E401
warnings.filterwarnings("ignore")
if importlib.util.find_spec("tpflex") is None:  # not installed: the source tree's (PYTHONPATH=python)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
if importlib.util.find_spec("torch") is None:
    sys.exit("thd_training_step: needs torch: pip install './python[torch]' (or pip install torch)")
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402
import tpflex.sim as sim, tpflex.torch as te  # noqa: E401,E402
HEADS = 4


def full_weights(model, P, dt, seed):
    """Unsharded fp32 leaves named as the model's parameters (partition_dim times P), in dt."""
    g, full = torch.Generator().manual_seed(seed), {}
    for n, p in model.named_parameters():
        shape = [s * (P if getattr(p, "partition_dim", -1) == d else 1)
                 for d, s in enumerate(p.shape)]
        v = torch.randn(shape, generator=g) * (shape[-1] ** -.5 if len(shape) == 2 else .1)
        full[n] = (v + (n.endswith("layer_norm_weight"))).to(dt).float().requires_grad_(True)
    return full


def reference(x, f, lens):
    """The model in plain fp32 PyTorch, unsharded, attention per sequence (qkv rows: TE's)."""
    c, A, M = [0] + torch.tensor(lens).cumsum(0).tolist(), "self_attention.", "layernorm_mlp."
    for i in range(2):
        w = lambda n: f[f"{i}.{n}"]  # noqa: E731
        lin = lambda v, p: Fn.linear(v, w(p + "weight"), w(p + "bias"))  # noqa: E731
        ln = lambda v, p: Fn.layer_norm(v, v.shape[1:], w(p + "layer_norm_weight"),  # noqa: E731
                                        w(p + "layer_norm_bias"))
        q, k, v = lin(ln(x, A + "layernorm_qkv."), A + "layernorm_qkv.").view(
            len(x), HEADS, 3, -1).permute(2, 1, 0, 3)            # [heads, T, d] each
        ctx = torch.cat([Fn.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b],
                         is_causal=True) for a, b in zip(c, c[1:])] + [0 * q[:, c[-1]:]], 1)
        x = x + lin(ctx.transpose(0, 1).reshape(len(x), -1), A + "proj.")
        x = x + lin(Fn.gelu(lin(ln(x, M), M + "fc1_"), approximate="tanh"), M + "fc2_")
    return x


def packed_stream(seed, C, H):
    """Packed microbatches of random-length sequences (length 1 now and then): (lens, x, y)."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    while True:
        lens = [rng.choice([1, rng.randint(2, C // 4)]) for _ in range(8)]
        k = next((k for k in range(1, 9) if sum(lens[:k]) >= C // 2), 8)
        lens = lens[:k] if sum(lens[:k]) <= C - 8 else [C - 8]
        yield lens, torch.randn(sum(lens), H, generator=g), torch.randn(sum(lens), H, generator=g)


def train(rank, P, a, dt, dev, allreduce):  # --steps steps on this rank: (lines, ok)
    H, C = a.hidden, a.capacity
    te.initialize_ub([C, H], P, dtype=dt, **({"backend": "sim"} if a.backend == "sim" else {}))
    model = torch.nn.ModuleList(te.TransformerLayer(    # TE's arguments; THD, causal per sequence
        H, 4 * H, HEADS, tp_size=P, sequence_parallel=True, set_parallel_mode=True,
        fuse_qkv_params=True, params_dtype=dt, device=dev, attn_input_format="thd",
        self_attn_mask_type="padding_causal", hidden_dropout=0.0, attention_dropout=0.0,
        ub_tp_comm_overlap=True) for _ in range(2))
    run = lambda x, cu, m: functools.reduce(lambda h, layer: layer(  # noqa: E731
        h, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=m, max_seqlen_kv=m), model, x)
    full = full_weights(model, P, dt, a.seed)
    with torch.no_grad():                                 # this rank's shards (TE's layout)
        for n, p in model.named_parameters():
            p.copy_(full[n].chunk(P, p.partition_dim)[rank] if getattr(
                p, "tensor_model_parallel", False) else full[n])
    opt, ref_opt = torch.optim.SGD(model.parameters(), a.lr), torch.optim.SGD(full.values(), a.lr)
    tol = 2e-2 if dt == torch.bfloat16 else 1e-4
    head = f"step {'T per microbatch (tokens->rows)':>32} {'loss':>10} {'ref loss':>10} {'ms':>7}"
    rows, ok, stream = [f"{head}  check (rank {rank}'s rows)"], True, packed_stream(a.seed, C, H)
    for step in range(a.steps):
        loss, ref_loss, Ts, t0 = 0.0, 0.0, [], time.perf_counter()
        for lens, x, tgt in (next(stream) for _ in range(a.micro)):
            T_raw, cu = sum(lens), torch.tensor([0] + lens).cumsum(0).int()
            Ts.append(f"{T_raw}->{(T := te.legal_rows(T_raw))}")   # pad to a legal T
            xp, tp = Fn.pad(x, (0, 0, 0, T - T_raw)), Fn.pad(tgt, (0, 0, 0, T - T_raw))
            mask = (torch.arange(T) < T_raw).float()[:, None]
            mine = slice(rank * T // P, (rank + 1) * T // P)
            with te.active_tokens(T):                     # T for this microbatch, then restored
                out = run(xp[mine].to(dev, dt), cu.to(dev), max(lens)).float() - tp[mine].to(dev)
                (l_r := (out ** 2 * mask[mine].to(dev)).sum() / (T_raw * H)).backward()
            loss += l_r.item()
            err = ((reference(xp.to(dt).float(), full, lens) - tp) ** 2) * mask   # all rows
            (err.sum() / (T_raw * H)).backward()
            ref_loss += err[mine].sum().item() / (T_raw * H)
        for p in (p for p in model.parameters() if getattr(p, "sequence_parallel", False)):
            allreduce(rank, p.grad)   # norms, row biases: per-rank partial sums (Megatron's)
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
        ok &= (good := abs(loss - ref_loss) <= tol * abs(ref_loss) + tol)
        rows.append(f"{step:>4} {' '.join(Ts):>32} {loss:>10.5f} {ref_loss:>10.5f} "
                    f"{1e3 * (time.perf_counter() - t0):>7.1f}  {'OK' if good else 'FAIL'}")
    te.destroy_ub()
    return rows, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    torchrun = "LOCAL_RANK" in os.environ                 # one process per rank
    default = os.environ.get("TPFLEX_BACKEND", "") or ("cuda" if torchrun else "sim")
    for k, v in dict(backend=default, tp=2, dtype="bf16", steps=6, micro=2, hidden=0, capacity=256,
                     lr=0.02, seed=0, bench="", bench_iters=10).items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    a = ap.parse_args()
    a.hidden, dt = a.hidden or 64, {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    say = print if int(os.environ.get("RANK", 0)) == 0 else (lambda *_: None)   # rank 0 speaks
    say(f"thd_training_step: backend {a.backend}, {a.dtype}, H={a.hidden}, capacity {a.capacity}"
          f", two TransformerLayers on THD, {a.micro} microbatches per step")
    if a.backend == "sim" and not torchrun:               # ranks are threads of this process
        bar, parts = threading.Barrier(a.tp), [None] * a.tp

        def allreduce(rank, t):                           # sum in memory between the threads
            parts[rank] = t.clone()
            bar.wait()
            s = sum(x.float() for x in parts).to(t.dtype)
            bar.wait()
            t.copy_(s)
        res = sim.run(a.tp, lambda r: train(r, a.tp, a, dt, torch.device("cpu"), allreduce),
                      timeout_ms=30000)
        rows, ok = res[0][0], all(o for _, o in res)
    else:                                                 # torchrun: one process per rank
        import torch.distributed as dist
        dist.init_process_group("gloo")
        P, rank = dist.get_world_size(), dist.get_rank()
        dev = torch.device("cpu") if a.backend == "sim" else torch.device(   # sim: CPU tensors
            "cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        allreduce = lambda _, t: t.copy_(dist.all_reduce(c := t.cpu()) or c)  # noqa: E731
        rows, ok = train(rank, P, a, dt, dev, allreduce)
        dist.all_reduce(flag := torch.tensor([int(ok)]), op=dist.ReduceOp.MIN)  # every rank's
        ok, rows = bool(flag.item()), rows if rank == 0 else []
        dist.barrier(), dist.destroy_process_group()  # every rank done, then gloo's teardown
    say("\n".join(rows))
    say("thd_training_step: every check OK" if ok else "thd_training_step: CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
