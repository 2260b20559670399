"""The package's C mirrors against the headers as they are: a small C program, compiled by this
test against include/tpflex/ (and the DLPack header torch ships), prints every mirrored struct's
size and each mirrored field's offset and size, every mirrored enum value and capability bit;
the ctypes classes, the enum tables and the exception classes must agree with it. A field
reordered, inserted or resized in a header, or a renumbered enum, fails here, naming it.

Mirrors checked: _lib's ctypes structs (tpf_shape, tpf_matrix, tpf_comm_config, tpf_sim_config,
tpf_sim_stats, tpf_op_options, tpf_operands, tpf_bootstrap), _checks' tpf_op_kind values, _lib.DTYPES / ALGOS / COLLS / CAP_* / TPF_OK,
errors.py's status numbers and names (every tpf_status has its class), _types' dtype table, and
_dlpack's DLPack structs. Needs a C compiler ($CC, default cc): without one this test fails
(it is the only way to read the compiled layout)."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402

import tpflex._dlpack as D  # noqa: E402
import tpflex._lib as L  # noqa: E402
import tpflex._types as T  # noqa: E402
from tpflex import errors as E  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = os.path.join(ROOT, "include")
TORCH_INCLUDE = os.path.join(os.path.dirname(torch.__file__), "include")

# (ctypes class, C type name); every field of the ctypes class is looked up by its name in C.
STRUCTS = [
    (L.Shape, "tpf_shape"),
    (L.Matrix, "tpf_matrix"),
    (L.CommConfig, "tpf_comm_config"),
    (L.SimConfig, "tpf_sim_config"),
    (L.SimStats, "tpf_sim_stats"),
    (L.OpOptions, "tpf_op_options"),
    (L.Operands, "tpf_operands"),
    (L.Bootstrap, "tpf_bootstrap"),
    (D.DLDevice, "DLDevice"),
    (D.DLDataType, "DLDataType"),
    (D.DLTensor, "DLTensor"),
    (D.DLManagedTensor, "DLManagedTensor"),
]
# Python value -> C constant name.
CONSTANTS = {
    "TPF_OK": L.TPF_OK,
    "TPF_BF16": L.DTYPES["bf16"], "TPF_FP16": L.DTYPES["fp16"], "TPF_FP32": L.DTYPES["fp32"],
    "TPF_FP8_E4M3": L.DTYPES["fp8_e4m3"], "TPF_FP8_E5M2": L.DTYPES["fp8_e5m2"],
    "TPF_ALGO_BULK": L.ALGOS["bulk"], "TPF_ALGO_PIPELINE": L.ALGOS["pipeline"],
    "TPF_ALGO_RING": L.ALGOS["ring"],
    "TPF_COLL_AG": L.COLLS["ag"], "TPF_COLL_RS": L.COLLS["rs"],
    "TPF_BE_CAP_HOST_MEMORY": L.CAP_HOST_MEMORY, "TPF_BE_CAP_OPTIONS": L.CAP_OPTIONS,
    "kDLCPU": D.DL_CPU, "kDLCUDA": D.DL_CUDA,
    "kDLFloat": D.DL_DTYPE[torch.float32][0], "kDLBfloat": D.DL_DTYPE[torch.bfloat16][0],
}
import tpflex._checks as K  # noqa: E402
CONSTANTS.update({"TPF_OP_AG_GEMM": K.OP_AG_GEMM, "TPF_OP_GEMM_RS": K.OP_GEMM_RS,
                  "TPF_OP_BULK": K.OP_BULK})
for _cls in E.STATUS_CLASSES.values():
    CONSTANTS[_cls.status_name] = _cls.status


def _program() -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <tpflex/tpflex.h>",
             "#include <tpflex/tpflex_backend.h>", "#include <tpflex/tpflex_cuda.h>",
             "#include <tpflex/tpflex_sim.h>", "#include <ATen/dlpack.h>",
             "int main(void) {"]
    for cls, cname in STRUCTS:
        lines.append(f'  printf("S {cname} %zu\\n", sizeof({cname}));')
        for fname, _ in cls._fields_:
            lines.append(f'  printf("F {cname}.{fname} %zu %zu\\n", offsetof({cname}, {fname}), '
                         f'sizeof((({cname} *)0)->{fname}));')
    for name in CONSTANTS:
        lines.append(f'  printf("C {name} %lld\\n", (long long)({name}));')
    lines.append('  printf("C TPF_STATUS_COUNT %d\\n", (int)TPF_STATUS_COUNT);')
    lines.append("  return 0;\n}")
    return "\n".join(lines) + "\n"


def c_layout() -> dict:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise AssertionError(f"test_mirrors needs a C compiler to read the headers' layout: "
                             f"'{cc}' is not on PATH (set CC)")
    with tempfile.TemporaryDirectory(prefix="tpflex-mirrors-") as d:
        src, exe = os.path.join(d, "mirrors.c"), os.path.join(d, "mirrors")
        with open(src, "w") as f:
            f.write(_program())
        r = subprocess.run([cc, "-std=c11", "-I", INCLUDE, "-I", TORCH_INCLUDE, src, "-o", exe],
                           capture_output=True, text=True)
        if r.returncode != 0:  # a mirrored field or constant the headers no longer have
            raise AssertionError(f"the mirror program does not compile against {INCLUDE}:\n"
                                 f"{r.stderr}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    got: dict = {}
    for line in out.splitlines():
        kind, name, *vals = line.split()
        got[(kind, name)] = tuple(int(v) for v in vals)
    return got


def c_tolerances() -> dict:
    """harness/reference.c's tpf_ref_tolerance per dtype (the C oracle's), compiled and linked
    against the loaded libtpflex."""
    cc = os.environ.get("CC", "cc")
    prog = ["#include <stdio.h>", '#include "reference.h"', "int main(void) {"]
    for name in ("TPF_BF16", "TPF_FP16", "TPF_FP32"):
        prog.append(f'  {{ tpf_ref_tol t = tpf_ref_tolerance({name}); '
                    f'printf("{name} %.17g %.17g\\n", t.rtol, t.atol); }}')
    prog.append("  return 0;\n}")
    libdir = os.path.dirname(os.path.abspath(L.LIBRARY_PATH))
    with tempfile.TemporaryDirectory(prefix="tpflex-tol-") as d:
        src, exe = os.path.join(d, "tol.c"), os.path.join(d, "tol")
        with open(src, "w") as f:
            f.write("\n".join(prog) + "\n")
        r = subprocess.run([cc, "-std=c11", "-I", INCLUDE, "-I", os.path.join(ROOT, "harness"),
                            src, os.path.join(ROOT, "harness", "reference.c"),
                            os.path.abspath(L.LIBRARY_PATH), f"-Wl,-rpath,{libdir}", "-lm",
                            "-o", exe], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"the tolerance program does not build:\n{r.stderr}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: (float(line.split()[1]), float(line.split()[2]))
            for line in out.splitlines()}


class OracleTolerances(unittest.TestCase):
    def test_python_oracle_uses_the_c_tolerances(self) -> None:
        """tests/python/cases.py's TOL is the C oracle's (SPEC §7), dtype by dtype."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cases
        c = c_tolerances()
        self.assertEqual(cases.TOL, {torch.bfloat16: c["TPF_BF16"], torch.float16: c["TPF_FP16"],
                                     torch.float32: c["TPF_FP32"]})


class Mirrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.c = c_layout()

    def test_struct_layouts(self) -> None:
        for cls, cname in STRUCTS:
            with self.subTest(struct=cname):
                self.assertEqual(ctypes.sizeof(cls), self.c[("S", cname)][0],
                                 f"sizeof({cname}) differs from {cls.__name__}'s")
                for fname, _ in cls._fields_:
                    f = getattr(cls, fname)
                    self.assertEqual((f.offset, f.size), self.c[("F", f"{cname}.{fname}")],
                                     f"{cname}.{fname}: (offset, size) of the mirror vs C")

    def test_constants(self) -> None:
        for name, value in CONSTANTS.items():
            with self.subTest(constant=name):
                self.assertEqual(value, self.c[("C", name)][0], f"{name}: mirror vs C")

    def test_every_status_has_its_class(self) -> None:
        count = self.c[("C", "TPF_STATUS_COUNT")][0]
        self.assertEqual(sorted(E.STATUS_CLASSES), list(range(1, count)))
        for st, cls in E.STATUS_CLASSES.items():
            self.assertEqual(cls.status_name, L.status_name(st))

    def test_dtype_table(self) -> None:
        self.assertEqual(T.TORCH_TO_TPF, {torch.bfloat16: self.c[("C", "TPF_BF16")][0],
                                          torch.float16: self.c[("C", "TPF_FP16")][0],
                                          torch.float32: self.c[("C", "TPF_FP32")][0],
                                          torch.float8_e4m3fn: self.c[("C", "TPF_FP8_E4M3")][0],
                                          torch.float8_e5m2: self.c[("C", "TPF_FP8_E5M2")][0]})

    def test_the_test_sees_a_drift(self) -> None:
        """The comparison itself: a mirror with two fields swapped differs from C."""
        class Swapped(ctypes.Structure):
            _fields_ = [("cols", ctypes.c_uint64), ("rows", ctypes.c_uint64)]
        self.assertNotEqual(Swapped.rows.offset, self.c[("F", "tpf_shape.rows")][0])


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
