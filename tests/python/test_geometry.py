"""One geometry, owned by C (issue 38 item 1): after a shape change Python reads every site's
geometry with one tpf_manager_geometry call and builds its views from it; the layers take T from
the active_tokens context they set; active_tokens makes one manager shape change per microbatch.

The counts are of ctypes calls (every tpf_* function object of _lib.lib wrapped), made by one
rank's thread."""
import os
import sys
import threading
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex._lib as L  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402

H = 32
P = 2
CFGS = {"ring_rs": {"method": "ring", "coll": "rs"}}

# set_ub_active_shape + the first operation of each of the 11 non-external sites (TE's default
# sites and a ring RS) cost 77 ctypes calls on rank 0 before this change (measured on commit
# 720f902 with this test's counting: 1 manager shape change, 25 epoch queries, 11 buffer and 11
# local-chunk views, 18 active-shape reads, 11 operations).
SITES = 11
BEFORE = 77

_tls = threading.local()


def _counting(name, f):
    def g(*a):
        if getattr(_tls, "on", False):
            _tls.counts[name] = _tls.counts.get(name, 0) + 1
        return f(*a)
    return g


class _Patched:
    """Wraps every tpf_* function object the package bound (and the ones it may bind lazily)."""

    def __enter__(self):
        names = [n for n in dir(L.lib) if n.startswith("tpf_")]
        names += [n for n in ("tpf_manager_geometry", "tpf_comm_active_shape", "tpf_comm_epoch",
                              "tpf_comm_buffer", "tpf_comm_local_chunk", "tpf_comm_registration",
                              "tpf_manager_set_active_shape", "tpf_comm_capacity_shape")
                  if hasattr(L.lib, n) and n not in names]
        self.saved = {n: getattr(L.lib, n) for n in names}
        for n, f in self.saved.items():
            setattr(L.lib, n, _counting(n, f))
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(L.lib, n, f)


def _count(fn):
    _tls.on, _tls.counts = True, {}
    try:
        fn()
    finally:
        _tls.on = False
    return dict(_tls.counts)


def _first_ops(T):
    """One operation on every site the active shape applies to."""
    m = tt.get_ub("fc1_fprop")._mgr
    for c in m._comms.values():
        if c.external:
            continue
        if c.algo == "bulk":
            c.bulk_overlap(torch.ones(8, 16), torch.ones(24, 16))
        elif c.coll == "ag":
            c.ag_gemm(torch.ones(8, H))
        else:
            c.gemm_rs(torch.ones(T, 16), torch.ones(H, 16))


class CtypesCalls(unittest.TestCase):
    def test_shape_change_and_first_operations(self):
        def f(rank):
            tt.initialize_ub([64, H], P, dtype=torch.float32, backend="sim", ub_cfgs=CFGS)
            try:
                tt.set_ub_active_shape([16, H])
                _first_ops(16)  # registrations mapped, every signature seen once

                def step():
                    tt.set_ub_active_shape([32, H])
                    _first_ops(32)
                counts = _count(step)
                sites = sum(1 for c in tt.get_ub("fc1_fprop")._mgr._comms.values()
                            if not c.external)
                return counts, sites
            finally:
                tt.destroy_ub()
        with _Patched():
            res = sim.run(P, f)
        counts, sites = res[0]
        total = sum(counts.values())
        print(f"\nset_ub_active_shape + first operation of {sites} sites: {total} ctypes calls "
              f"({counts})", file=sys.stderr)
        self.assertEqual(sites, SITES)
        self.assertLess(total, BEFORE, counts)
        # the shape change itself is the manager's call plus one geometry read, whatever the
        # number of sites; each operation is the op and its epoch check
        self.assertEqual(counts.get("tpf_manager_set_active_shape"), 1, counts)
        self.assertEqual(counts.get("tpf_manager_geometry"), 1, counts)
        for n in ("tpf_comm_buffer", "tpf_comm_local_chunk", "tpf_comm_active_shape"):
            self.assertNotIn(n, counts)


def _on_ranks(fn):
    def f(rank):
        tt.initialize_ub([64, H], P, dtype=torch.float32, backend="sim", ub_cfgs=CFGS)
        try:
            return fn(rank)
        finally:
            tt.destroy_ub()
    with _Patched():
        return sim.run(P, f)


class ActiveTokens(unittest.TestCase):
    def test_one_shape_change_per_microbatch(self):
        """A loop of one active_tokens block per microbatch: one manager shape change each
        (before: two, the set and the restore); the restore is still observed after the block."""
        def f(rank):
            ub = tt.get_ub("fc1_fprop")
            tt.set_ub_active_shape([24, H])

            def loop():
                for T in (8, 16, 32, 8):
                    with tt.active_tokens(T) as s:
                        assert s == (T, H), s
                        ub.local_chunk().fill_(1.0)
                        ub.ag_gemm(torch.ones(8, H))
            n_loop = _count(loop).get("tpf_manager_set_active_shape", 0)
            n_after = _count(lambda: None)  # nothing happens without a call that uses the shape
            shape = ub.active_shape           # the restore, applied by this read
            raw = L.lib.tpf_comm_active_shape(ub._h)
            return n_loop, n_after, shape, (raw.rows, raw.cols)
        for n_loop, n_after, shape, raw in _on_ranks(f):
            self.assertEqual(n_loop, 4)
            self.assertEqual(n_after, {})
            self.assertEqual(shape, (24, H))
            self.assertEqual(raw, (24, H))

    def test_owed_restore_survives_a_refused_shape(self):
        """A set_ub_active_shape that is refused after a block leaves the restored shape
        active, as when the restore was made at once."""
        def f(rank):
            ub = tt.get_ub("fc1_fprop")
            tt.set_ub_active_shape([24, H])
            with tt.active_tokens(8):
                pass
            try:
                tt.set_ub_active_shape([7, H])
            except Exception as e:  # noqa: BLE001
                err = type(e).__name__
            return err, ub.active_shape, ub.buffer().shape[0], ub.local_chunk().shape[0]
        for err, shape, brows, crows in _on_ranks(f):
            self.assertEqual(err, "TpflexDivisibleError")
            self.assertEqual(shape, (24, H))
            self.assertEqual((brows, crows), (24, 24 // P))

    def test_layers_take_tokens_from_the_block(self):
        """A module's forward and backward inside active_tokens read no active shape back from
        C; outside a block, or after another shape change inside it, they still check T."""
        from tpflex.layers import LayerNormMLP

        def f(rank):
            torch.manual_seed(0)
            m = LayerNormMLP(H, 64, tp_size=P, sequence_parallel=True, set_parallel_mode=True,
                             params_dtype=torch.float32, ub_overlap_ag=True, ub_overlap_rs=True)
            out = []
            for T in (16, 32, 16):
                x = torch.randn(T // P, H, requires_grad=True)
                with tt.active_tokens(T):
                    out.append(_count(lambda: m(x).sum().backward()))
            errs = []
            with tt.active_tokens(16):
                tt.set_ub_active_shape([32, H])   # the block's shape no longer holds
                try:
                    m(torch.randn(16 // P, H))
                except Exception as e:  # noqa: BLE001
                    errs.append(type(e).__name__)
                y = m(torch.randn(32 // P, H, requires_grad=True))
                tt.set_ub_active_shape([16, H])
                try:
                    y.sum().backward()            # its shape is gone before its backward
                except Exception as e:  # noqa: BLE001
                    errs.append(type(e).__name__)
            try:
                m(torch.randn(32 // P, H))        # after the block: the restored shape [64, H]
            except Exception as e:  # noqa: BLE001
                errs.append(type(e).__name__)
            return out, errs
        for counts, errs in _on_ranks(f):
            for c in counts:
                self.assertNotIn("tpf_comm_active_shape", c, counts)
                self.assertIn("tpf_ag_gemm_ex", c)  # the overlapped path ran
            self.assertEqual(errs, ["TpflexShapeError"] * 3)


if __name__ == "__main__":
    unittest.main()
