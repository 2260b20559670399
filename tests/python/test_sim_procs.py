"""The simulator with ranks as processes (SPEC §15) under torchrun, on CPU with gloo.

  python3 test_sim_procs.py            the driver: torchrun runs examples/thd_training_step.py
                                       with TPFLEX_BACKEND=sim at P = 2 and 4, then this file's
                                       worker at P = 2; each run bounded, its output checked,
                                       and nothing may be left in /dev/shm
  (under torchrun)                     the worker: each process one simulator rank

The worker checks: a bad TPFLEX_BACKEND is refused naming it; backend='sim' wins over
TPFLEX_BACKEND=cuda; a RING AG+GEMM gathers every process's shard; ranks that disagree on the
active rows get TpflexMismatchError on every rank, after which agreed operations run; the
modules' plain path (no ub flag) is torch.distributed over the group and matches fp32 PyTorch;
TE's DGRAD+RS configuration gives what TE's no-overlap baseline gives;
a peer process that exits is named by the survivor's next operation within seconds.
A torchrun whose rendezvous fails (a port in use, no localhost) is reported as such; a run whose
checks passed and whose rank then aborted in teardown fails, naming the cause: every script that
creates a process group must destroy it before exit (checked here over examples/, scripts/ and
tests/python/)."""
import os
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
RUN_TIMEOUT_S = 240
RENDEZVOUS_SIGNS = ("RendezvousError", "RendezvousConnectionError", "EADDRINUSE",
                    "Address already in use", "DistNetworkError", "TCPStore")


def shm_entries():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("tpflex-sim-")}
    except OSError:
        return set()


def torchrun(P, args, env_extra):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **env_extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={P}"] + args
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else \
            (e.stdout or "")
        return None, out, time.time() - t0
    return p.returncode, p.stdout + p.stderr, time.time() - t0


def check_run(name, P, args, env_extra, ok_line):
    """One torchrun, checked. A failure of torchrun's own rendezvous (a localhost port taken by
    a concurrent job: ctest -j runs other torchrun tests beside this one) or an abort in torch's
    teardown after every check passed (pytorch#190489) is retried once, saying so; any other
    failure, or the same one twice, fails."""
    why = _check_run(name, P, args, env_extra, ok_line)
    if why is not None and ("rendezvous failed" in why or "aborted in its teardown" in why):
        print(f"  {name} P={P}: retried once after: {why.splitlines()[0]}")
        why = _check_run(name, P, args, env_extra, ok_line)
    return why


def _check_run(name, P, args, env_extra, ok_line):
    before = shm_entries()
    rc, out, secs = torchrun(P, args, env_extra)
    left = shm_entries() - before
    tail = "\n".join(out.strip().splitlines()[-25:])
    if rc is None:
        return f"{name} P={P}: torchrun did not finish within {RUN_TIMEOUT_S} s\n{tail}"
    if rc != 0 and any(s in out for s in RENDEZVOUS_SIGNS) and ok_line not in out:
        return (f"{name} P={P}: torchrun's rendezvous failed (exit {rc}); torchrun --standalone "
                f"needs a free localhost port (is another job holding it?)\n{tail}")
    if rc != 0 and ok_line in out and "terminate called" in out:
        return (f"{name} P={P}: every check passed, then a rank aborted in its teardown "
                f"(exit {rc}): a process that exits with its gloo process group alive can abort "
                f"so in torch's teardown; destroy_process_group() before exit\n{tail}")
    if rc != 0 or ok_line not in out:
        return f"{name} P={P}: exit {rc}, '{ok_line}' {'missing' if ok_line not in out else 'present'}\n{tail}"
    if left:
        return f"{name} P={P}: left behind in /dev/shm: {sorted(left)}"
    print(f"  {name} P={P}: OK ({secs:.1f} s)")
    return None


def teardown_rule():
    """Every script that may run under torchrun and creates a process group also ends it:
    destroy_process_group() before exit (or os._exit, which runs no teardown). A process that
    exits with its gloo group alive can abort in torch's teardown after its work is done
    ("terminate called without an active exception", SIGABRT: a loaded 2-core machine showed it
    in about one run of ten, with torch alone). Returns the scripts that break the rule."""
    bad = []
    for folder in ("examples", "scripts", os.path.join("tests", "python")):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            path = os.path.join(ROOT, folder, name)
            if not name.endswith(".py") or name == os.path.basename(__file__):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if "init_process_group(" in text and "destroy_process_group(" not in text and \
                    "os._exit(" not in text:
                bad.append(os.path.join(folder, name))
    return bad


def driver():
    import torch  # noqa: F401  (run_tests.py style: a missing torch fails loudly here)
    import tpflex.torch as te
    from tpflex.errors import TpflexStateError
    # Outside tpflex.sim.run and without torch.distributed, backend='sim' says what to do.
    try:
        te.initialize_ub([64, 32], 2, backend="sim")
        return print("test_sim_procs: FAILED: initialize_ub(backend='sim') without "
                     "torch.distributed was accepted") or 1
    except TpflexStateError as e:
        assert "init_process_group" in str(e) and "tpflex.sim.run" in str(e), str(e)
    # Inside tpflex.sim.run the rank thread's world is used whatever TPFLEX_BACKEND says.
    import tpflex.sim as sim
    os.environ["TPFLEX_BACKEND"] = "cuda"

    def rank(r):
        m = te.initialize_ub([64, 32], 2, dtype=torch.float32)
        b = m.backend
        te.destroy_ub()
        return b
    assert sim.run(2, rank) == ["sim", "sim"]
    del os.environ["TPFLEX_BACKEND"]
    fails = [f"{p}: creates a process group and never destroys it (destroy_process_group() "
             f"before exit: a rank can abort in torch's teardown)" for p in teardown_rule()]
    for P in (2, 4):
        fails.append(check_run("thd_training_step", P, ["examples/thd_training_step.py"],
                               {"TPFLEX_BACKEND": "sim"}, "thd_training_step: every check OK"))
    fails.append(check_run("worker", 2, [os.path.abspath(__file__)], {"TPFLEX_BACKEND": "cuda"},
                           "test_sim_procs worker: every check OK"))
    fails = [f for f in fails if f]
    for f in fails:
        print("FAIL", f)
    print("test_sim_procs: every check OK" if not fails else "test_sim_procs: FAILED")
    return 1 if fails else 0


def worker():
    import torch
    import torch.distributed as dist
    import tpflex.torch as te
    from tpflex.errors import TpflexInvalidError, TpflexMismatchError, TpflexTimeoutError
    dist.init_process_group("gloo")
    P, r = dist.get_world_size(), dist.get_rank()
    H = 32
    # A bad environment value is refused before anything collective happens.
    os.environ["TPFLEX_BACKEND"] = "simulator"
    try:
        te.initialize_ub([64, H], P, dtype=torch.float32)
        raise AssertionError("TPFLEX_BACKEND=simulator accepted")
    except TpflexInvalidError as e:
        assert "TPFLEX_BACKEND" in str(e), str(e)
    os.environ["TPFLEX_BACKEND"] = "cuda"  # the explicit argument wins
    m = te.initialize_ub([64, H], P, dtype=torch.float32, backend="sim", timeout_ms=20000)
    assert m.backend == "sim" and m.device.type == "cpu", repr(m)
    # RING AG + GEMM across processes.
    fp = te.get_ub("fc1_fprop")
    te.set_ub_active_shape([32, H])
    fp.local_chunk().copy_(torch.full((32 // P, H), float(r + 1)))
    y = fp.ag_gemm(torch.eye(H))
    want = torch.cat([torch.full((32 // P, H), float(q + 1)) for q in range(P)])
    assert torch.equal(y, want), y[:, 0].tolist()
    # Disagreeing active rows: TpflexMismatchError on every rank, then agreement works again.
    te.set_ub_active_shape([16 if r == 0 else 32, H])
    try:
        fp.ag_gemm(torch.eye(H))
        raise AssertionError("disagreeing rows ran")
    except TpflexMismatchError as e:
        assert "16" in str(e) and "32" in str(e), str(e)
    te.set_ub_active_shape([32, H])
    fp.local_chunk().copy_(torch.full((32 // P, H), float(r + 1)))
    assert torch.equal(fp.ag_gemm(torch.eye(H)), want)
    del y
    # The plain path (no ub flag): row-parallel Linear, sequence parallel, RS over gloo.
    g = torch.Generator().manual_seed(3)
    T, N = 32, 16
    X, W, b = torch.randn(T, H, generator=g), torch.randn(N, H, generator=g), torch.randn(N, generator=g)
    lin = te.Linear(H, N, tp_size=P, parallel_mode="row", sequence_parallel=True,
                    params_dtype=torch.float32, device="cpu")
    with torch.no_grad():
        lin.weight.copy_(W.chunk(P, 1)[r])
        lin.bias.copy_(b)
    with te.active_tokens(T):
        out = lin(X.chunk(P, 1)[r].contiguous())
    ref = (X @ W.t() + b)[r * T // P:(r + 1) * T // P]
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (out - ref).abs().max().item()
    te.destroy_ub()
    # TE's DGRAD+RS configuration (fc1_dgrad a RING RS site) against TE's no-overlap baseline (no
    # ub flag: every collective is torch.distributed over gloo), same weights, same gradients.
    te.initialize_ub([64, H], P, dtype=torch.float32, backend="sim",
                     ub_cfgs={"fc1_dgrad": {"method": "ring_exchange"}})
    kw = dict(tp_size=P, sequence_parallel=True, set_parallel_mode=True,
              params_dtype=torch.float32, device="cpu")
    ub = te.LayerNormMLP(H, 2 * H, ub_overlap_ag=True, ub_overlap_rs=True,
                         ub_overlap_rs_dgrad=True, **kw)
    base = te.LayerNormMLP(H, 2 * H, **kw)
    with torch.no_grad():
        for (n, p), (_, q) in zip(ub.named_parameters(), base.named_parameters()):
            q.copy_(p)
    gr = torch.Generator().manual_seed(10 + r)
    x, dy = torch.randn(T // P, H, generator=gr), torch.randn(T // P, H, generator=gr)
    outs = []
    for mod in (ub, base):
        xi = x.clone().requires_grad_(True)
        with te.active_tokens(T):
            y = mod(xi)
            y.backward(dy)
        outs.append((y.detach(), xi.grad, mod.fc1_weight.grad))
    for a, b, what in zip(outs[0], outs[1], ("output", "input grad", "fc1 weight grad")):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (what, (a - b).abs().max().item())
    del ub, base, outs
    te.destroy_ub()
    # A peer whose process ends is named within a bounded time (not at the 20 s bound): rank 1
    # leaves without a word, rank 0's next operation fails naming it.
    m = te.initialize_ub([64, H], P, dtype=torch.float32, backend="sim", timeout_ms=20000)
    te.set_ub_active_shape([32, H])
    dist.barrier()
    if r == 1:
        os._exit(0)
    fp = te.get_ub("fc1_fprop")
    t0 = time.monotonic()
    try:
        fp.ag_gemm(torch.eye(H))
        raise AssertionError("an operation without rank 1 completed")
    except TpflexTimeoutError as e:
        assert "rank 1" in str(e) and "gone" in str(e), str(e)
    took = time.monotonic() - t0
    assert took < 5.0, f"the dead peer was named after {took:.1f} s"
    print(f"test_sim_procs worker: dead peer named after {took * 1e3:.0f} ms", flush=True)
    print("test_sim_procs worker: every check OK", flush=True)
    os._exit(0)  # destroy_ub and gloo's teardown are collective: the peer is gone


if __name__ == "__main__":
    sys.exit(worker() if "LOCAL_RANK" in os.environ else driver())
