"""One operand rulebook (issue 38, item 3): the Python binding and the C operations refuse bad
operands with the same status and the same words, because both ask tpf_check_operands
(core/operands.c). On the simulator, P = 1: every bad case of the table below goes once through
the Python method (its checks run before any C operation) and once straight to the C operation
through ctypes with the same tensors; the two must give the same status, messages that name the
operand, and the same text once the operand names are mapped (Python says "weight", the C API
"weight w"). A mutation check runs the rulebook over a valid descriptor with each dimension
moved by one: every move that breaks a rule is refused naming the operand it changed."""
import ctypes
import os
import sys
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import tpflex._checks as K  # noqa: E402
import tpflex._lib as L  # noqa: E402
import tpflex.sim as sim  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex import errors as E  # noqa: E402

H, T = 32, 16
F32, F16, BF, E4, E5 = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                        torch.float8_e5m2)
# The C API's operand names -> the Python methods'.
C_TO_PY = (("weight w", "weight"), ("input x", "x"), ("output out", "out"), ("output d", "out"))


# (op, moved operand, dimension) -> the operand then named, for the dimensions an operand
# defines rather than obeys.
FREE = {(K.OP_AG_GEMM, "W", "rows"): "D", (K.OP_GEMM_RS, "A", "cols"): "W",
        (K.OP_BULK, "A", "rows"): "D", (K.OP_BULK, "A", "cols"): "W",
        (K.OP_BULK, "W", "rows"): "D"}


def z(shape, dtype=F32):
    return torch.zeros(shape, dtype=torch.float32).to(dtype)


# (label, site, operands: (a, w, out), options, status class, the operand the message names)
CASES = (
    ("ag: weight columns", "fc1_fprop", (None, z((8, 12)), z((T, 8))), {}, E.TpflexShapeError,
     "weight"),
    ("ag: out shape", "fc1_fprop", (None, z((8, H)), z((T, 9))), {}, E.TpflexShapeError, "out"),
    ("ag: out dtype", "fc1_fprop", (None, z((8, H)), z((T, 8), F16)), {}, E.TpflexInvalidError,
     "out"),
    ("ag: weight dtype", "fc1_fprop", (None, z((8, H), BF), z((T, 8))), {},
     E.TpflexInvalidError, "weight"),
    ("ag: trans_a", "fc1_fprop", (None, z((8, H)), z((T, 8))), {"trans_a": True},
     E.TpflexUnsupportedError, "trans_a"),
    ("ag: trans_w shape", "fc1_fprop", (None, z((8, H)), z((T, 8))), {"trans_w": True},
     E.TpflexShapeError, "weight"),
    ("ag: scale on fp32", "fc1_fprop", (None, z((8, H)), z((T, 8))),
     {"a_scale_inv": torch.ones(1)}, E.TpflexInvalidError, "a_scale_inv"),
    ("rs: x rows", "proj_fprop", (z((T - 1, 8)), z((H, 8)), z((T, H))), {}, E.TpflexShapeError,
     "x"),
    ("rs: weight K", "proj_fprop", (z((T, 8)), z((H, 9)), z((T, H))), {}, E.TpflexShapeError,
     "weight"),
    ("rs: out rows", "proj_fprop", (z((T, 8)), z((H, 8)), z((T // 2, H))), {},
     E.TpflexShapeError, "out"),
    ("rs: fp8 x, fp32 w", "proj_fprop", (z((T, 8), E4), z((H, 8)), z((T, H))), {},
     E.TpflexInvalidError, "x"),
    ("rs: w dtype", "proj_fprop", (z((T, 8)), z((H, 8), F16), z((T, H))), {},
     E.TpflexInvalidError, "weight"),
    ("bulk: b K", "qkv_dgrad", (z((T, 8)), z((12, 9)), z((T, 12))), {}, E.TpflexShapeError, "b"),
    ("bulk: out shape", "qkv_dgrad", (z((T, 8)), z((12, 8)), z((T, 13))), {},
     E.TpflexShapeError, "out"),
    ("bulk: b dtype", "qkv_dgrad", (z((T, 8)), z((12, 8), BF), z((T, 12))), {},
     E.TpflexInvalidError, "b"),
    ("bulk: e5m2 x e5m2", "qkv_dgrad", (z((T, 8), E5), z((12, 8), E5), z((T, 12))), {},
     E.TpflexUnsupportedError, "e5m2"),
    ("bulk: fp8 out", "qkv_dgrad", (z((T, 8), E4), z((12, 8), E4), z((T, 12), E4)), {},
     E.TpflexInvalidError, "out"),
)


def _c_call(comm, a, w, out, options):
    """The C operation on the same tensors, no Python check in between: (status, detail)."""
    o = L.op_options_default()
    o.trans_a, o.trans_w = options.get("trans_a", False), options.get("trans_w", False)
    if "a_scale_inv" in options:
        o.a_scale_inv = options["a_scale_inv"].data_ptr()
    mats = [None if t is None else ctypes.byref(K.matrix(t, t.stride(0))) for t in (a, w, out)]
    if comm.algo == "bulk":
        rc = L.lib.tpf_bulk_overlap_ex(comm._h, mats[0], mats[1], mats[2], ctypes.byref(o), None)
    elif comm.coll == "rs":
        rc = L.lib.tpf_gemm_rs_ex(comm._h, mats[0], mats[1], mats[2], ctypes.byref(o), None)
    else:
        rc = L.lib.tpf_ag_gemm_ex(comm._h, mats[1], mats[2], ctypes.byref(o), None)
    return rc, L.last_error()


def _py_call(comm, a, w, out, options):
    try:
        if comm.algo == "bulk":
            comm.bulk_overlap(a, w, out, **options)
        elif comm.coll == "rs":
            comm.gemm_rs(a, w, out, **options)
        else:
            comm.ag_gemm(w, out, **options)
    except E.TpflexError as e:
        return e
    return None


def _pythonic(c_detail):
    """The C detail without the operation's "'site' tpf_op: " prefix, in the methods' names."""
    d = c_detail.split(": ", 1)[1] if c_detail.startswith("'") else c_detail
    for c, p in C_TO_PY:
        d = d.replace(c, p)
    return d


def table(rank):
    tt.initialize_ub([64, H], 1, dtype=F32, backend="sim")
    try:
        tt.set_ub_active_shape([T, H])
        rows = []
        for label, site, (a, w, out), options, cls, names in CASES:
            comm = tt.get_ub(site)
            py = _py_call(comm, a, w, out, options)
            rc, detail = _c_call(comm, a, w, out, options)
            rows.append((label, cls, names, py, rc, detail))
        return rows
    finally:
        tt.destroy_ub()


class Rulebook(unittest.TestCase):
    def test_python_and_c_agree_on_bad_operands(self):
        rows = sim.run(1, table)[0]
        for label, cls, names, py, rc, detail in rows:
            with self.subTest(label):
                self.assertIsInstance(py, cls, f"{label}: {py!r}")
                self.assertEqual(rc, cls.status, f"{label}: C said {rc} ({detail})")
                self.assertIn(names, py.detail, label)
                self.assertIn(names, detail, label)
                self.assertEqual(py.detail, _pythonic(detail), label)

    def test_mutations_are_refused_naming_the_operand(self):
        """A valid descriptor per operation, each operand's rows, cols and ld moved by +-1 (ld
        only down: a larger ld is legal): the rulebook refuses every move that breaks a rule,
        naming the operand it moved, and a valid one yields the output's shape."""
        def desc(op, a, w, d, **kw):
            m = [None if x is None else L.Matrix(None, *x) for x in (a, w, d)]
            p = [None if x is None else ctypes.pointer(x) for x in m]
            return m, L.Operands(ctypes.sizeof(L.Operands), op, kw.get("bt", 2),
                                 L.Shape(T, H), kw.get("P", 2), False, False, False, False,
                                 p[0], p[1], p[2], b"A", b"W", b"D")
        f32 = 2
        valid = {  # op: (a, w, d) as (rows, cols, ld, dtype), and the output's shape
            K.OP_AG_GEMM: ((None, (8, H, H, f32), (T, 8, 8, f32)), (T, 8)),
            K.OP_GEMM_RS: (((T, 8, 8, f32), (H, 8, 8, f32), (T // 2, H, H, f32)), (T // 2, H)),
            K.OP_BULK: (((T, 8, 8, f32), (12, 8, 8, f32), (T, 12, 12, f32)), (T, 12)),
        }
        for op, (ops, want) in valid.items():
            m, d = desc(op, *ops)
            shape = L.Shape()
            self.assertEqual(L.lib.tpf_check_operands(ctypes.byref(d), ctypes.byref(shape)), 0,
                             L.last_error())
            self.assertEqual((shape.rows, shape.cols), want)
            for i, role in enumerate("AWD"):
                if ops[i] is None:
                    continue
                for field, delta in (("rows", 1), ("rows", -1), ("cols", 1), ("cols", -1),
                                     ("ld", -1)):
                    m2, d2 = desc(op, *ops)
                    setattr(m2[i], field, getattr(m2[i], field) + delta)
                    if field == "cols" and delta > 0:
                        m2[i].ld = max(m2[i].ld, m2[i].cols)
                    rc = L.lib.tpf_check_operands(ctypes.byref(d2), None)
                    # A free dimension (ag's N in w, bulk's M in a, ...) moves another
                    # operand's expected shape: that operand is named.
                    named = FREE.get((op, role, field), role) if field != "ld" else role
                    self.assertNotEqual(rc, 0, f"op {op} {role}.{field}{delta:+d} passed")
                    self.assertTrue(L.last_error().startswith(named + " "),
                                    f"op {op} {role}.{field}{delta:+d}: {L.last_error()}")


if __name__ == "__main__":
    unittest.main()
