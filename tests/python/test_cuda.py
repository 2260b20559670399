"""tpflex.torch on the CUDA backend: the cases of cases.py (every operation and option against
torch, every error path) with one process per rank, bootstrapped over gloo, all processes on
one GPU by default. Run under torchrun (every process runs every test in the same order; the
per-rank results are gathered, so every rank reaches the same verdict):

    torchrun --standalone --nproc-per-node 2 tests/python/test_cuda.py [-v] [-k PATTERN]

Rank 0 prints the unittest report; the other ranks write theirs to $TPFLEX_TEST_LOGDIR/rank<r>.log
when set. TPFLEX_TEST_DEVICE_PER_RANK=1 puts rank r on GPU LOCAL_RANK instead of GPU 0.

Outside torchrun (collected by pytest) the cases run as one rank in a one-process gloo group;
those that need peers skip, naming the torchrun command. Without a GPU or a CUDA-enabled
libtpflex every case skips naming which is missing."""
import datetime
import os
import sys
import threading
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpflex._lib as L  # noqa: E402
import tpflex.torch as tt  # noqa: E402

import cases  # noqa: E402
from cases import C, H, Env, Err, with_ub  # noqa: E402

RANK = WORLD = 0
DEVICE = torch.device("cpu")
GATHER = None


TORCHRUN = "torchrun --standalone --nproc-per-node 2 tests/python/test_cuda.py"


def why_no_cuda():
    """Why the CUDA backend cannot run in this process, or None when it can."""
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or a CPU build of torch)"
    if not L.HAVE_CUDA:
        return f"{L.LIBRARY_PATH} has no CUDA backend (build it with -DTPF_WITH_CUDA=ON)"
    return None


def single_process():
    """Outside torchrun (e.g. collected by pytest): one rank in a one-process gloo group, so the
    cases that need no peer run; the others skip naming the torchrun command."""
    global RANK, WORLD, DEVICE, GATHER
    why = why_no_cuda()
    if why is not None:
        raise unittest.SkipTest(f"the CUDA backend's tests need a GPU: {why}")
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    DEVICE = torch.device("cuda", 0)
    torch.cuda.set_device(DEVICE)
    GATHER = tt.GlooBootstrap(dist.group.WORLD, timeout_ms=300000)


def cuda_run_ranks(P, body, *args, timeout_ms=5000):
    if GATHER is None:
        single_process()
    if P != WORLD:
        raise unittest.SkipTest(f"P={P} needs {P} processes; this run has {WORLD} ({TORCHRUN})")
    env = Env("cuda", DEVICE, P, timeout_ms=max(timeout_ms, 1000))
    try:
        res = body(RANK, env, *args)
    except Exception as e:
        res = Err(e)
    return GATHER.allgather_object(res)


class Shared(cases.SharedCases, unittest.TestCase):
    backend = "cuda"

    def run_ranks(self, P, body, *args, timeout_ms=5000):
        return cuda_run_ranks(P, body, *args, timeout_ms=timeout_ms)

    def p_values(self, wanted):
        if GATHER is None:
            single_process()
        return [WORLD]

    def need_ranks(self, n, why):
        if GATHER is None:
            single_process()
        if WORLD < n:
            self.skipTest(f"needs {n} processes ({why}); this run has {WORLD}: {TORCHRUN}")


class CudaOnly(unittest.TestCase):
    def test_backend_and_views(self):
        def f(r, env):
            tt.set_ub_active_shape([8 * env.tp_size, H])
            ub = tt.get_ub("fc1_fprop")
            v = ub.buffer()
            assert v.device == env.device and v.is_cuda, v.device
            assert ub.local_chunk().device == env.device
            return ub.backend_name, ub.supports_options, tuple(v.shape)
        res = cuda_run_ranks(WORLD, with_ub(f))
        for r, x in enumerate(res):
            self.assertNotIsInstance(x, Err, f"rank {r}: {x!r}")
            name, opts, shape = x
            self.assertEqual(name, "cuda")
            self.assertEqual(shape, (8 * WORLD, H))
            self.assertTrue(opts, "the CUDA backend no longer reports TPF_BE_CAP_OPTIONS: "
                                  "transposes and epilogues would be refused")

    def test_side_stream_and_explicit_stream(self):
        """Operations follow torch.cuda.current_stream() (a side stream here) or stream=."""
        def f(r, env):
            P = env.tp_size
            T = 8 * P
            tt.set_ub_active_shape([T, H])
            g = torch.Generator().manual_seed(5)
            xs = [torch.randn(T // P, H, generator=g).to(torch.bfloat16) for _ in range(P)]
            w = torch.randn(24, H, generator=g).to(torch.bfloat16)
            ref = torch.cat(xs).float() @ w.float().T
            ub = tt.get_ub("fc1_fprop")
            s = torch.cuda.Stream(device=env.device)
            s.wait_stream(torch.cuda.current_stream(env.device))
            with torch.cuda.stream(s):
                ub.local_chunk().copy_(env.put(xs[r]))
                y1 = ub.ag_gemm(env.put(w))
            s.synchronize()
            ub.local_chunk().copy_(env.put(xs[r]))
            torch.cuda.current_stream(env.device).synchronize()
            y2 = torch.empty_like(y1)
            ub.ag_gemm(env.put(w), out=y2, stream=s)
            s.synchronize()
            return cases.close(y1, ref, torch.bfloat16), cases.close(y2, ref, torch.bfloat16)
        for r, x in enumerate(cuda_run_ranks(WORLD, with_ub(f))):
            self.assertEqual(x, (True, True), f"rank {r}: {x!r}")

    def test_destroy_refused_while_a_view_lives(self):
        """The CUDA destroy is collective: with a view alive on one rank, destroy_ub refuses on
        every rank (naming that rank) and destroys nothing; without it, it destroys."""
        def f(r, env):
            env.init()
            tt.set_ub_active_shape([8 * env.tp_size, H])
            v = tt.get_ub("fc1_fprop").buffer() if r == env.tp_size - 1 else None
            try:
                tt.destroy_ub()
                refused = None
            except Exception as e:
                refused = Err(e)
            usable = tt.get_ub("fc1_fprop").active_shape if refused is not None else None
            del v
            tt.destroy_ub()
            return refused, usable
        for r, x in enumerate(cuda_run_ranks(WORLD, f)):
            self.assertNotIsInstance(x, Err, f"rank {r}: {x!r}")
            refused, usable = x
            self.assertIsInstance(refused, Err, f"rank {r}")
            self.assertEqual(refused.cls, "TpflexStateError", f"rank {r}: {refused!r}")
            self.assertIn(f"rank {WORLD - 1} (1)", refused.text)
            self.assertEqual(usable, (8 * WORLD, H), "nothing was destroyed")

    def test_get_ub_from_another_thread(self):
        """Module state is the process's: autograd runs CUDA backward on a thread of its own."""
        def f(r, env):
            out = []
            t = threading.Thread(target=lambda: out.append(tt.get_ub("fc2_dgrad").name))
            t.start()
            t.join()
            return out
        self.assertEqual(cuda_run_ranks(WORLD, with_ub(f)), [["fc2_dgrad"]] * WORLD)


def main() -> int:
    global RANK, WORLD, DEVICE, GATHER
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    per_rank = os.environ.get("TPFLEX_TEST_DEVICE_PER_RANK") == "1"
    why = why_no_cuda()
    if why is not None:
        print(f"test_cuda: FAIL: {why}", file=sys.stderr)
        return 1
    DEVICE = torch.device("cuda", local if per_rank else 0)
    torch.cuda.set_device(DEVICE)
    GATHER = tt.GlooBootstrap(dist.group.WORLD, timeout_ms=300000)
    argv = [sys.argv[0]] + sys.argv[1:]
    stream = sys.stdout
    if RANK != 0:
        d = os.environ.get("TPFLEX_TEST_LOGDIR")
        stream = open(os.path.join(d, f"rank{RANK}.log"), "w") if d else open(os.devnull, "w")
    print(f"test_cuda: rank {RANK} of {WORLD} on {DEVICE} ({torch.cuda.get_device_name(DEVICE)}), "
          f"library {L.LIBRARY_PATH}", file=stream, flush=True)
    prog = unittest.main(module=sys.modules[__name__], argv=argv, exit=False,
                         testRunner=unittest.TextTestRunner(stream=stream, verbosity=2))
    ok = prog.result.wasSuccessful()
    oks = GATHER.allgather_object(ok)
    if RANK == 0:
        print(f"test_cuda: P={WORLD}: " + ("every test OK" if all(oks) else
                                           f"FAILED (ranks ok: {oks})"), flush=True)
    GATHER.allgather(b"\0")  # nobody tears the group down while a peer still uses it
    dist.destroy_process_group()
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
