"""Seeing what tpflex does (SPEC §16) on the simulator: the profiler switch and its
torch.profiler ranges, the telemetry per communicator (checked against the simulator's own count
of bytes between ranks), and tpflex.torch.trace's Chrome / Perfetto JSON (every step of every
rank, the host spans, the same bytes). unittest style (runs under `python3 -m unittest` and
pytest)."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import unittest
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402

import tpflex._observe as obs  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as te  # noqa: E402
from tpflex import errors as E  # noqa: E402

C, H, N = 64, 16, 8
TS = (16, 32, 48, 32)


def step(rank, ts=TS, keep=None):
    """Per T: the shape change, then RING AG, RING RS (fc2_fprop) and a BULK AG (fc1_dgrad)."""
    te.initialize_ub([C, H], 2, dtype=torch.float32)
    try:
        w, wr = torch.ones(N, H), torch.ones(H, N)
        for T in ts:
            te.set_ub_active_shape([T, H])
            ag = te.get_ub("fc1_fprop")
            ag.local_chunk().fill_(1.0)
            ag.ag_gemm(w)
            te.get_ub("fc2_fprop").gemm_rs(torch.ones(T, N), wr)
            dg = te.get_ub("fc1_dgrad")
            dg.local_chunk().fill_(1.0)
            dg.bulk_overlap(torch.ones(4, 4), torch.ones(4, 4))
        return keep(rank) if keep else te.stats()
    finally:
        te.destroy_ub()


class Profile(unittest.TestCase):
    def tearDown(self):
        te.profile(False)

    def test_off_by_default_and_env_switch(self):
        self.assertFalse(te.profiling())
        self.assertFalse(obs.ON)
        env = dict(os.environ, TPFLEX_PROFILE="1")
        out = subprocess.run([sys.executable, "-c", "import warnings; warnings.filterwarnings("
                              "'ignore'); import tpflex.torch as te; print(te.profiling())"],
                             env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.strip(), "True", out.stderr[-2000:])

    def test_switch_returns_previous_and_checks_its_argument(self):
        self.assertFalse(te.profile(True))
        self.assertTrue(obs.ON)
        self.assertTrue(te.profile(False))
        self.assertFalse(obs.ON)
        with self.assertRaises(E.TpflexInvalidError) as cm:
            te.profile("yes")
        self.assertIn("True or False", str(cm.exception))
        self.assertFalse(te.profiling())

    @unittest.skipUnless(hasattr(obs.lib, "tpf_cuda_set_profile"), "library without CUDA")
    def test_switch_reaches_the_cuda_backend(self):
        fn = obs.lib.tpf_cuda_profile_enabled
        fn.restype = ctypes.c_int
        te.profile(True)
        self.assertEqual(fn(), 1)  # NVTX ranges on in the C library too
        te.profile(False)
        self.assertEqual(fn(), 0)

    def _names(self, on):
        """The events of rank 0's thread under torch.profiler (a profiler sees the thread that
        started it: here the simulator rank's, as in a training process its main thread)."""
        te.profile(on)
        names = []

        def body(rank):
            if rank:
                return step(rank)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                step(rank)
            names.extend(e.name for e in p.events())
        # The profiler's first start initialises its library (seconds on a loaded machine)
        # while rank 1 waits at the next collective: a wide timeout.
        sim.run(2, body, timeout_ms=120000)
        self.assertTrue(names)  # the profiler saw the rank's aten calls at least
        return names

    def test_ranges_in_torch_profiler(self):
        names = self._names(True)
        for T in (16, 32, 48):
            self.assertIn(f"tpflex.set_active_shape all sites T={T}", names)
            self.assertIn(f"tpflex.ag_gemm fc1_fprop T={T} ring splits=auto", names)
            self.assertIn(f"tpflex.gemm_rs fc2_fprop T={T} pipeline splits=auto", names)
            self.assertIn(f"tpflex.bulk_overlap fc1_dgrad T={T} bulk splits=auto", names)
        # Rank 0's ranges: 4 shape changes and 4 of each operation.
        self.assertEqual(sum(n.startswith("tpflex.ag_gemm") for n in names), len(TS))
        self.assertEqual(sum(n.startswith("tpflex.set_active_shape") for n in names), len(TS))

    def test_no_ranges_when_off(self):
        self.assertFalse([n for n in self._names(False) if n.startswith("tpflex.")])

    def test_errors_unchanged_with_ranges_on(self):
        te.profile(True)

        def bad(rank):
            te.initialize_ub([C, H], 2, dtype=torch.float32)
            try:
                te.set_ub_active_shape([16, H])
                with self.assertRaises(E.TpflexShapeError):
                    te.get_ub("fc1_fprop").ag_gemm(torch.ones(N, H + 1))
                with self.assertRaises(E.TpflexDivisibleError):
                    te.set_ub_active_shape([15, H])
                self.assertEqual(te.get_ub("fc1_fprop").active_shape, (16, H))
                ub = te.get_ub("fc1_fprop")
            finally:
                te.destroy_ub()
            errs = []
            for on in (False, True) if rank == 0 else ():  # after destroy_ub: the same refusal
                te.profile(on)
                with self.assertRaises(E.TpflexError) as cm:
                    ub.ag_gemm(torch.ones(N, H))
                errs.append((type(cm.exception), str(cm.exception)))
            if errs:
                self.assertEqual(errs[0], errs[1])
        sim.run(2, bad)


class Stats(unittest.TestCase):
    def test_counters_against_the_simulator(self):
        with sim.World(2) as w:
            reps = w.run(step)
            moved = w.stats().bytes_moved
        total = 0
        for r, rep in enumerate(reps):
            self.assertEqual(rep.rank, r)
            ag = rep["fc1_fprop"]
            self.assertEqual(ag["ops"], len(TS))
            self.assertEqual(ag["rows"], sum(TS))
            self.assertEqual(ag["padded_rows"], len(TS) * C)
            self.assertEqual(ag["shape_changes"], len(TS))
            # RING AG, P = 2: one chunk of T/2 rows (fp32) leaves each rank per operation.
            self.assertEqual(ag["bytes"], sum(T // 2 * H * 4 for T in TS))
            self.assertEqual(ag["padded_bytes"], len(TS) * (C // 2 * H * 4))
            self.assertEqual(set(ag["schedules"]), {"[16, 32)", "[32, 64)"})
            b32 = ag["schedules"]["[32, 64)"]
            self.assertEqual((b32["ops"], b32["rows"]), (3, 32 + 48 + 32))
            self.assertEqual(sum(b32["schedules"].values()) + b32["other_ops"], 3)
            self.assertIsNone(ag["exposed_comm_us"])
            self.assertEqual(rep["qkv_fprop"]["ops"], 0)
            self.assertEqual(rep["fc1_dgrad"]["schedules"]["[32, 64)"]["schedules"], {"bulk": 3})
            total += sum(d["bytes"] for d in rep.values())
        self.assertGreater(total, 0)
        self.assertEqual(total, moved)  # the ranks' counts add up to what crossed between them

    def test_table_and_reset(self):
        def keep(rank):
            text = str(te.stats())
            te.reset_stats()
            after = te.stats()
            return text, after
        text, after = sim.run(2, step, TS, keep)[0]
        self.assertIn("fc1_fprop", text)
        self.assertIn("padded rows", text)
        self.assertIn("%", text)
        self.assertEqual(after["fc1_fprop"]["ops"], 0)
        self.assertEqual(after["fc1_fprop"]["schedules"], {})

    def test_device_timing_keys(self):
        """What stats() makes of tpf_cuda_backend_comm_timing's sums (the CUDA backend with
        profiling on): per timed operation, and the hidden share of the communication."""
        t = obs.CudaTiming(size=ctypes.sizeof(obs.CudaTiming), timed_ops=4, pending_ops=1,
                           untimed_ops=0, op_us=400.0, gemm_us=300.0, comm_us=200.0,
                           exposed_us=100.0, hidden_us=150.0)
        k = obs._timing_keys(t)
        self.assertEqual((k["timed_ops"], k["pending_ops"]), (4, 1))
        self.assertAlmostEqual(k["exposed_comm_us"], 25.0)
        self.assertAlmostEqual(k["op_us"], 100.0)
        self.assertAlmostEqual(k["hidden_comm_share"], 0.75)
        none = obs._timing_keys(None)
        self.assertIsNone(none["exposed_comm_us"])
        self.assertIsNone(none["hidden_comm_share"])
        self.assertIsNone(obs._timing_keys(obs.CudaTiming(timed_ops=0))["exposed_comm_us"])

    def test_without_initialize_ub(self):
        with self.assertRaises(E.TpflexStateError):
            te.stats()
        with self.assertRaises(E.TpflexStateError):
            te.reset_stats()


class Trace(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "step.json")

    def tearDown(self):
        self.dir.cleanup()

    def test_every_step_of_every_rank(self):
        run = sim.World.run
        with sim.World(2) as w:
            with te.trace(self.path) as t:
                self.assertTrue(obs.ON)
                w.run(step)
                self.assertGreater(t.spans, 0)
            moved = w.stats().bytes_moved
        self.assertFalse(obs.ON)
        self.assertIs(sim.World.run, run)  # the simulator's runner is restored
        with open(self.path) as f:
            ev = json.load(f)["traceEvents"]
        names = {(e["pid"], e["args"]["name"]) for e in ev
                 if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertEqual(names, {(0, "rank 0"), (1, "rank 1")})
        spans = [e for e in ev if e["ph"] == "X"]
        host = [e for e in spans if e["tid"] == obs.HOST_TID]
        steps = [e for e in spans if e["tid"] != obs.HOST_TID]
        for r in (0, 1):
            self.assertEqual(sum(e["pid"] == r and e["name"].startswith("tpflex.ag_gemm")
                                 for e in host), len(TS))
            kinds = {e["name"].split()[0] for e in steps if e["pid"] == r}
            self.assertTrue({"GEMM", "SEND", "RECV", "HANDSHAKE"} <= kinds, kinds)
        self.assertEqual(sum(e["args"]["bytes"] for e in steps), moved)
        # Each operation's steps lie within its rank's host span (one clock for both).
        for e in host:
            if e["name"].startswith("tpflex.ag_gemm"):
                inside = [s for s in steps if s["pid"] == e["pid"] and s["cat"] == "fc1_fprop"
                          and e["ts"] - 1 <= s["ts"] and s["ts"] + s["dur"] <= e["ts"] + e["dur"] + 1]
                self.assertTrue(inside, e)

    def test_inside_rank_functions_host_spans(self):
        def body(rank):
            with te.trace(self.path):
                return step(rank)
        sim.run(2, body)
        with open(self.path) as f:
            ev = json.load(f)["traceEvents"]
        self.assertTrue(any(e["ph"] == "X" and e["name"].startswith("tpflex.gemm_rs")
                            for e in ev))

    def test_bad_paths_and_nesting(self):
        for p in (self.dir.name, os.path.join(self.dir.name, "no", "such", "t.json"), "", 3):
            with self.assertRaises(E.TpflexInvalidError) as cm:
                te.trace(p)
            self.assertIn("tpflex.torch.trace", str(cm.exception))
        self.assertFalse(os.path.exists(self.path))
        with te.trace(self.path):
            with self.assertRaises(E.TpflexStateError) as cm:
                with te.trace(os.path.join(self.dir.name, "other.json")):
                    pass
            self.assertIn("already open", str(cm.exception))
        self.assertTrue(os.path.exists(self.path))
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "other.json")))
        self.assertFalse(obs.ON)


if __name__ == "__main__":
    unittest.main()
