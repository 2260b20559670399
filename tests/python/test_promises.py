"""Issue 41's Python promises, each a regression test that failed on the code before its fix:

1. the gradient contract (SPEC §12): an all-reduce over the TP group of every parameter marked
   sequence_parallel gives the unsharded gradient (the row-parallel bias held the full one);
3. a module whose tp_size differs from the manager's is refused, naming both;
4. graphed with a backward inside fn leaves .grad as one eager call does (warmup and capture
   accumulated into it), on the shared warmup logic both mechanisms run;
5. a stale local_chunk()/buffer() view (taken before T changed) is refused as an operation's
   argument;
9. the errors name the real cause and a fix that works;
10-12. the package: the examples do not shadow the installed package, `python -m tpflex`
   refuses what it does not do, numpy is declared.
unittest style; the simulator (CPU), seconds in all."""
import math
import os
import subprocess
import sys
import unittest
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402
from tpflex.layers import LayerNormMLP, Linear, active_tokens  # noqa: E402

H, F, C = 16, 32, 64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def on_ranks(P, fn, cap=C, **kw):
    def body(rank):
        torch.set_num_threads(1)
        tt.initialize_ub([cap, H], P, dtype=torch.float32, **kw)
        try:
            return fn(rank)
        finally:
            tt.destroy_ub()
    return sim.run(P, body, timeout_ms=20000)


def shard(full, p, rank, P):
    """This rank's part of the unsharded parameter `full` as TE's attributes say."""
    if getattr(p, "tensor_model_parallel", False):
        return full.chunk(P, p.partition_dim)[rank]
    return full


# ---- 1: the gradient contract ------------------------------------------------------------------

def _mlp(P, **flags):
    return LayerNormMLP(H, F, tp_size=P, sequence_parallel=P > 1, set_parallel_mode=P > 1,
                        params_dtype=torch.float32, **flags)


def _row(P, **flags):
    return Linear(F, H, parallel_mode="row", tp_size=P, sequence_parallel=P > 1,
                  params_dtype=torch.float32, ub_name="fc2", **flags)


class GradientContract(unittest.TestCase):
    """Megatron's rule: after backward, every parameter with sequence_parallel=True is
    all-reduced (summed) over the TP group; tensor_model_parallel ones are shards. Together
    they must equal the unsharded model's gradient, in every module and overlap mode."""

    def check(self, make, K, P, flags, T=32):
        torch.manual_seed(0)
        ref = make(1, **{})
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_()
        x = torch.randn(T, K)
        dy = torch.randn(T, H)
        ref(x).backward(dy)
        full = {n: p.detach().clone() for n, p in ref.named_parameters()}
        want = {n: p.grad for n, p in ref.named_parameters()}

        def f(rank):
            m = make(P, **flags)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(shard(full[n], p, rank, P))
            # row-parallel Linear: x [T, K/P] (every row, this rank's columns); the MLP: x
            # this rank's rows. dy: this rank's rows of the output (sequence parallel).
            xl = x.chunk(P, 1)[rank] if K == F else x.chunk(P, 0)[rank]
            with active_tokens(T):
                m(xl.contiguous()).backward(dy.chunk(P, 0)[rank])
            return {n: (p.grad.clone(), bool(getattr(p, "sequence_parallel", False)),
                        getattr(p, "partition_dim", None)
                        if getattr(p, "tensor_model_parallel", False) else None)
                    for n, p in m.named_parameters()}
        res = on_ranks(P, f)
        for n in want:
            sp = res[0][n][1]
            dim = res[0][n][2]
            if sp:   # the TP all-reduce of a sequence_parallel parameter
                got = sum(r[n][0] for r in res)
            elif dim is not None:
                got = torch.cat([r[n][0] for r in res], dim)
            else:
                got = res[0][n][0]
            self.assertTrue(torch.allclose(got, want[n], rtol=1e-4, atol=1e-4),
                            f"P={P} {flags} {n} (sequence_parallel={sp}): all-reduced grad "
                            f"{got.flatten()[:4].tolist()} vs unsharded "
                            f"{want[n].flatten()[:4].tolist()}")

    def test_layernorm_mlp(self):
        for P in (2, 4):
            for flags in ({}, {"ub_overlap_ag": True, "ub_overlap_rs": True,
                               "ub_bulk_dgrad": True, "ub_bulk_wgrad": True}):
                self.check(_mlp, H, P, flags)

    def test_row_linear(self):
        for P in (2, 4):
            for flags in ({}, {"ub_overlap_rs": True}, {"ub_overlap_ag": True}):
                self.check(_row, F, P, flags)

    def test_marks(self):
        """The row-parallel bias is the parameter the contract concerns: marked so."""
        m, r = _mlp(2), _row(2)
        self.assertTrue(m.fc2_bias.sequence_parallel and r.bias.sequence_parallel)


# ---- 3: a module's tp_size against the manager's ------------------------------------------------

class TpSizeMismatch(unittest.TestCase):
    def test_refused_naming_both(self):
        def f(rank):
            out = []
            other = 4 if tt.get_ub("fc1_fprop").tp_size == 2 else 2
            # with a ub flag: at construction
            try:
                Linear(F, H, parallel_mode="row", tp_size=other, sequence_parallel=True,
                       ub_name="fc2", ub_overlap_rs=True, params_dtype=torch.float32)
                out.append("constructed")
            except E.TpflexInvalidError as e:
                out.append(str(e))
            # the plain path on the simulator: at the first call, before anything runs
            m = LayerNormMLP(H, F, tp_size=other, sequence_parallel=True,
                             set_parallel_mode=True, params_dtype=torch.float32)
            x = torch.randn(C // other, H)
            try:
                with active_tokens(C):
                    m(x)
                out.append("ran")
            except E.TpflexInvalidError as e:
                out.append(str(e))
            return out
        for P in (2, 4):
            other = 4 if P == 2 else 2
            for msgs in on_ranks(P, f):
                for m in msgs:
                    self.assertIn(f"tp_size is {other} but initialize_ub registered tp_size "
                                  f"{P}", m)
                    self.assertIn(f"tp_size={P}", m)


# ---- 4: graphed's warmup leaves the caller's gradients as one eager call ------------------------

import tpflex._graphs as G  # noqa: E402


class _CudaLike(G.EagerRerun):
    """The CUDA runner's order on the CPU: its capture changes no value and the replay that
    follows it runs fn once; here the capture runs fn (both effects at once) and that first
    replay is skipped. executes_on_capture False, as CudaGraphRunner: the wrapper replays."""
    executes_on_capture = False

    def capture(self, fn, args, kwargs):
        self._skip = True
        return super().capture(fn, args, kwargs)

    def replay(self):
        if getattr(self, "_skip", False):
            self._skip = False
            return
        super().replay()


class GraphedWarmup(unittest.TestCase):
    def run_case(self, runner_cls, preset, fuse):
        P, T = 2, 32

        def f(rank):
            torch.manual_seed(1)
            m = LayerNormMLP(H, F, tp_size=P, sequence_parallel=True, set_parallel_mode=True,
                             params_dtype=torch.float32, ub_overlap_ag=True, ub_overlap_rs=True,
                             ub_bulk_dgrad=True, ub_bulk_wgrad=True,
                             fuse_wgrad_accumulation=fuse)
            g = torch.Generator().manual_seed(2 + rank)
            x, dy = torch.randn(T // P, H, generator=g), torch.randn(T // P, H, generator=g)
            params = list(m.parameters())
            if fuse:
                for p in (m.fc1_weight, m.fc2_weight):
                    p.main_grad = torch.zeros(p.shape)

            def start():
                for p in params:
                    p.grad = torch.full_like(p, 0.5) if preset else None
                if fuse:
                    for p in (m.fc1_weight, m.fc2_weight):
                        p.main_grad.fill_(0.25)

            def state():
                out = {n: None if p.grad is None else p.grad.clone()
                       for n, p in m.named_parameters()}
                if fuse:
                    out.update({n + ".main_grad": getattr(m, n).main_grad.clone()
                                for n in ("fc1_weight", "fc2_weight")})
                return out

            def step(xs, dys):
                out = m(xs)
                out.backward(dys)
                return out.detach()

            start()
            eager = []
            for _ in range(2):
                with active_tokens(T):
                    step(x, dy)
                eager.append(state())
            start()
            held = [p.grad for p in params]
            old = G.EagerRerun
            G.EagerRerun = runner_cls
            got = []
            try:
                gs = tt.graphed(step, [T], sequence_parallel=True)
                for _ in range(2):   # the first call (warmup, capture) and a replay
                    gs(x, dy)
                    got.append(state())
            finally:
                G.EagerRerun = old
            ident = all(p.grad is h for p, h in zip(params, held)) if preset else True
            return eager, got, gs.stats()["warmup_runs"], ident
        for eager, got, warm, ident in on_ranks(P, f):
            self.assertEqual(warm, 3)
            self.assertTrue(ident, "a .grad the caller held was replaced")
            for k in range(2):
                for n in eager[k]:
                    e, g = eager[k][n], got[k][n]
                    self.assertEqual(e is None, g is None, n)
                    if e is not None:
                        self.assertTrue(torch.allclose(e, g, rtol=1e-5, atol=1e-5),
                                        f"{runner_cls.__name__} preset={preset} fuse={fuse} "
                                        f"{n} after call {k + 1}: graphed "
                                        f"{g.flatten()[:3].tolist()} vs eager "
                                        f"{e.flatten()[:3].tolist()}")

    def test_stand_in(self):
        for preset in (False, True):
            self.run_case(G.EagerRerun, preset, False)
        self.run_case(G.EagerRerun, True, True)

    def test_cuda_order(self):
        for preset in (False, True):
            self.run_case(_CudaLike, preset, False)
        self.run_case(_CudaLike, True, True)


# ---- 9: errors that name the real cause and a fix that works -----------------------------------

def _raises(fn, cls=E.TpflexError):
    try:
        fn()
    except cls as e:
        return str(e)
    return None


class Messages(unittest.TestCase):
    P, T = 2, 32

    def sp_mlp(self, **kw):
        return LayerNormMLP(H, F, tp_size=self.P, sequence_parallel=True, set_parallel_mode=True,
                            params_dtype=kw.pop("params_dtype", torch.float32), **kw)

    def test_full_t_input_and_empty_microbatch(self):
        P, T = self.P, self.T

        def f(rank):
            out = []
            for flags in ({}, {"ub_overlap_ag": True, "ub_overlap_rs": True}):
                m = self.sp_mlp(**flags)
                with active_tokens(T):
                    out.append(_raises(lambda: m(torch.randn(T, H))))
                    out.append(_raises(lambda: m(torch.randn(0, H))))
                # the fix the first message names works
                with active_tokens(T):
                    m(torch.randn(T // P, H))
            return out
        for msgs in on_ranks(P, f):
            for full, empty in zip(msgs[::2], msgs[1::2]):
                self.assertIn(f"takes this rank's T/P = {T // P} rows", full)
                self.assertNotIn("set_ub_active_shape", full)
                self.assertIn("empty microbatch", empty)
                self.assertNotIn("active_tokens(0)", empty)

    def test_inside_graphed_points_to_sequence_parallel(self):
        P, T = self.P, self.T

        def f(rank):
            m = self.sp_mlp(ub_overlap_ag=True, ub_overlap_rs=True)
            x = torch.randn(T // P, H)
            bad = _raises(lambda: tt.graphed(lambda a: m(a), [T // P])(x))
            good = tt.graphed(lambda a: m(a), [T], sequence_parallel=True)(x)   # the fix
            return bad, tuple(good.shape)
        for bad, shape in on_ranks(P, f):
            self.assertIn("sequence_parallel=True", bad)
            self.assertIn("graphed", bad)
            self.assertNotIn("set_ub_active_shape", bad)
            self.assertEqual(shape, (T // P, H))

    def test_use_fp8_manager(self):
        P, T = self.P, self.T

        def f(rank):
            out = []
            for flags in ({}, {"ub_overlap_ag": True, "ub_overlap_rs": True}):
                m = self.sp_mlp(**flags)
                with active_tokens(T):
                    out.append(_raises(lambda: m(torch.randn(T // P, H))))
            return out
        for msgs in on_ranks(P, f, use_fp8=True):
            for m in msgs:   # the plain path: no activation-dtype BULK site; ub: FP8 autocast
                self.assertIn("LayerNormMLP", m)
                self.assertNotIn("a_scale_inv", m)
            self.assertIn("UserBufferQuantizationMode.NONE", msgs[0])
            self.assertNotIn("_empty_gemm", msgs[0])
            self.assertIn("tpflex.torch.autocast(recipe=", msgs[1])

    def test_dtype_names_the_module(self):
        P, T = self.P, self.T

        def f(rank):
            tt.destroy_ub()
            tt.initialize_ub([C, H], P, dtype=torch.float32)   # autocast runs the GEMMs in bf16
            m = Linear(H, F, parallel_mode="column", tp_size=P, sequence_parallel=True,
                       ub_name="fc1", ub_overlap_ag=True, params_dtype=torch.float32)
            with torch.autocast("cpu", dtype=torch.bfloat16), active_tokens(T):
                return _raises(lambda: m(torch.randn(T // P, H)))
        for msg in on_ranks(P, f):
            self.assertIn("Linear(", msg)
            self.assertIn("initialize_ub(..., dtype=torch.bfloat16)", msg)
            self.assertIn("torch.autocast", msg)
            self.assertNotIn("ag_gemm", msg)

    def test_transposed_input_and_column_major_main_grad(self):
        P, T = self.P, self.T

        def f(rank):
            torch.manual_seed(3)
            row = Linear(F, H, parallel_mode="row", tp_size=P, sequence_parallel=True,
                         ub_name="fc2", ub_overlap_rs=True, params_dtype=torch.float32)
            col = Linear(H, F, parallel_mode="column", tp_size=P, sequence_parallel=True,
                         ub_name="fc1", ub_bulk_dgrad=True, ub_bulk_wgrad=True,
                         fuse_wgrad_accumulation=True, params_dtype=torch.float32)
            xt = torch.randn(F // P, T)                      # x = xt.t(): [T, F/P] transposed
            xl = torch.randn(T // P, H, requires_grad=True)
            with active_tokens(T):
                a, b = row(xt.t()), row(xt.t().contiguous())
                res = [bool(torch.equal(a, b))]
                mgs = []
                for mg in (torch.zeros(F // P, H), torch.zeros(H, F // P).t()):
                    col.weight.main_grad = mg
                    col(xl).sum().backward()
                    mgs.append(mg.clone())
                res.append(bool(torch.equal(mgs[0], mgs[1])) and bool(mgs[0].abs().sum() > 0))
            return res
        for res in on_ranks(P, f):
            self.assertEqual(res, [True, True])

    def test_dgrad_rs_cfgs_on_the_simulator(self):
        P, T = self.P, self.T
        cfgs = {"qkv_dgrad": {"method": "pipeline"}, "fc1_dgrad": {"method": "pipeline"}}

        def f(rank):
            m = self.sp_mlp()
            with active_tokens(T):
                return _raises(lambda: m(torch.randn(T // P, H)))
        for msg in on_ranks(P, f, ub_cfgs=cfgs):
            self.assertIn("has none", msg)
            self.assertIn("fc1_dgrad PIPELINE RS", msg)
            self.assertNotIn("initialize_ub registers TE's", msg)

    def test_active_tokens_keeps_the_blocks_exception(self):
        def f(rank):
            try:
                with active_tokens(self.T):
                    tt.destroy_ub()     # the restore will fail too
                    raise E.TpflexTimeoutError("the block's own failure", "test")
            except E.TpflexError as e:
                tt.initialize_ub([C, H], self.P, dtype=torch.float32)
                return type(e).__name__, str(e), " ".join(getattr(e, "__notes__", []))
        for name, msg, notes in on_ranks(self.P, f):
            self.assertEqual(name, "TpflexTimeoutError")
            self.assertIn("the block's own failure", msg)
            self.assertIn("could not restore", notes)

    def test_graphed_nan_argument_and_reset(self):
        P, T = self.P, self.T

        def f(rank):
            w = torch.randn(H, H)
            g = tt.graphed(lambda x, s: x @ w * (1.0 if s != s else 2.0), [T])
            x = torch.randn(T // P * P, H)
            g(x, float("nan"))
            second = _raises(lambda: g(x, float("nan")))
            g.reset()
            tt.destroy_ub()
            tt.initialize_ub([C, H], P, dtype=torch.float32)
            y = g(x, float("nan"))     # re-use after destroy_ub + initialize_ub
            return second, bool(torch.allclose(y, x @ w))
        for second, ok in on_ranks(P, f):
            self.assertIsNone(second)
            self.assertTrue(ok)


# ---- 5: stale views ------------------------------------------------------------------------------

class StaleViews(unittest.TestCase):
    def test_stale_view_as_an_operation_argument(self):
        P = 2

        def f(rank):
            out = []
            tt.set_ub_active_shape([32, H])
            dg, wg = tt.get_ub("fc1_dgrad"), tt.get_ub("fc1_wgrad")
            held_buf = dg.buffer()              # [32, H], taken before T grows
            held_chunk = dg.local_chunk()       # [16, H]
            tt.set_ub_active_shape([64, H])     # T grew: the views cover the old rows
            w = torch.randn(H, H)
            # shapes the GEMM beside the collective accepts: without the check they ran on the
            # old rows silently
            out.append(_raises(lambda: wg.bulk_overlap(torch.randn(8, 32), held_buf,
                                                       trans_w=True)))
            out.append(_raises(lambda: wg.bulk_overlap(held_chunk, w)))
            out.append(_raises(lambda: wg.bulk_overlap(torch.randn(32, H), w, out=held_buf)))
            # the fix the message names: take the view again
            wg.bulk_overlap(torch.randn(8, 64), dg.buffer(), trans_w=True)
            # back at the old shape, the held view covers the active rows again: accepted
            tt.set_ub_active_shape([32, H])
            wg.bulk_overlap(torch.randn(8, 32), held_buf, trans_w=True)
            return out
        for msgs in on_ranks(P, f):
            for m, arg in zip(msgs, ("b", "a", "out")):
                self.assertIsNotNone(m, f"a stale view as {arg} was accepted")
                self.assertIn(f"{arg} is a ", m)
                self.assertIn("taken while the active shape was [32, 16]", m)
                self.assertIn("again after set_ub_active_shape", m)


# ---- 10-12: the package on a fresh install -----------------------------------------------------

import shutil  # noqa: E402
import tempfile  # noqa: E402


def _run(args, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("TPFLEX_LIBRARY", "PYTHONPATH")}
    env.update(env_extra)
    p = subprocess.run([sys.executable] + args, env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


class Package(unittest.TestCase):
    def test_example_uses_the_installed_package(self):
        """README: pip install './python[torch]', then examples/thd_training_step.py from the
        checkout. A checkout without a build folder (a fresh clone) and the package installed
        (a copy with the library bundled, as pip lays it out): the example must not shadow it
        with the checkout's python/ (no library there), and the checkout's package itself finds
        the installed library."""
        lib = os.environ.get("TPFLEX_LIBRARY") or __import__("tpflex").LIBRARY_PATH
        with tempfile.TemporaryDirectory() as tmp:
            site = os.path.join(tmp, "site")
            shutil.copytree(os.path.join(ROOT, "python", "tpflex"), os.path.join(site, "tpflex"),
                            ignore=shutil.ignore_patterns("__pycache__", "lib"))
            os.makedirs(os.path.join(site, "tpflex", "lib"))
            shutil.copy2(lib, os.path.join(site, "tpflex", "lib", "libtpflex.so"))
            clone = os.path.join(tmp, "clone")   # a checkout: core/tpflex.map, python/, no build
            os.makedirs(os.path.join(clone, "core"))
            shutil.copy2(os.path.join(ROOT, "core", "tpflex.map"), os.path.join(clone, "core"))
            shutil.copytree(os.path.join(ROOT, "python", "tpflex"),
                            os.path.join(clone, "python", "tpflex"),
                            ignore=shutil.ignore_patterns("__pycache__", "lib"))
            os.makedirs(os.path.join(clone, "examples"))
            ex = os.path.join(clone, "examples", "thd_training_step.py")
            shutil.copy2(os.path.join(ROOT, "examples", "thd_training_step.py"), ex)
            rc, out, err = _run([ex, "--backend", "sim", "--steps", "1"], {"PYTHONPATH": site},
                                clone)
            self.assertEqual(rc, 0, out + err)
            self.assertIn("thd_training_step: every check OK", out)
            # the checkout's package first on sys.path, no build: the installed library
            code = "import tpflex; print(tpflex.LIBRARY_PATH)"
            rc, out, err = _run(["-c", code],
                                {"PYTHONPATH": os.path.join(clone, "python") + os.pathsep + site},
                                tmp)
            self.assertEqual(rc, 0, out + err)
            self.assertEqual(out.strip().splitlines()[-1],
                             os.path.join(site, "tpflex", "lib", "libtpflex.so"))
            # nothing installed, no build: the error names the cause and the fixes, not the
            # `pip install ./python` a user may just have run
            import ctypes.util
            if ctypes.util.find_library("tpflex") is None:   # no system-wide libtpflex here
                rc, out, err = _run(["-c", code], {"PYTHONPATH": os.path.join(clone, "python")},
                                    tmp)
                self.assertNotEqual(rc, 0)
                self.assertIn("this is the source tree's package", err)
                self.assertIn("without the source tree's python/ on sys.path", err)

    def test_readme_installs_torch(self):
        """The README's install command names the torch extra, and the extra holds torch and
        numpy (item 12: torch warns 'Failed to initialize NumPy' on every import without it)."""
        with open(os.path.join(ROOT, "python", "pyproject.toml"), encoding="utf-8") as f:
            text = f.read()
        try:
            import tomllib
            extra = tomllib.loads(text)["project"]["optional-dependencies"]["torch"]
        except ImportError:   # Python < 3.11
            import re
            extra = re.findall(r'"([^"]+)"', re.search(r"^torch = \[(.*)\]", text, re.M)[1])
        self.assertIn("torch", extra)
        self.assertIn("numpy", extra)
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        self.assertIn("pip install './python[torch]'", readme)

    def test_python_m_tpflex_refuses_arguments(self):
        env = {"PYTHONPATH": os.path.join(ROOT, "python")}
        if os.environ.get("TPFLEX_LIBRARY"):
            env["TPFLEX_LIBRARY"] = os.environ["TPFLEX_LIBRARY"]
        rc, out, err = _run(["-m", "tpflex", "plan", "--tp", "4"], env, ROOT)
        self.assertEqual(rc, 2, out + err)
        self.assertEqual(out, "")
        self.assertIn("pip does not install", err)
        self.assertIn("build/tpflex plan --tp 4", err)
        rc, out, err = _run(["-m", "tpflex", "--bogus"], env, ROOT)
        self.assertEqual(rc, 2)
        self.assertIn("unknown argument '--bogus'", err)
        rc, out, err = _run(["-m", "tpflex"], env, ROOT)
        self.assertEqual(rc, 0, err)
        self.assertIn("library ", out)


if __name__ == "__main__":
    unittest.main()
