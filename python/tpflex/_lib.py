"""Loads libtpflex.so and declares the C API's argtypes (ctypes.CDLL releases the GIL on every
call). Search order, each by absolute path: $TPFLEX_LIBRARY (the override), the library the
package bundles (tpflex/lib/libtpflex.so, installed by `pip install ./python`), the newest
build*/libtpflex.so of the source tree that is not an ASan or TSan build (TPF_SANITIZE in its
CMakeCache.txt) when the package runs from it (PYTHONPATH=python) or, with no build there, the
bundled library of an installed tpflex further along sys.path, then
an installed library (ctypes.util.find_library / libtpflex.so.0).

A library with the CUDA backend needs libnccl.so.2, libcudart and libcublasLt. Loaded first, it
would bind those sonames to the system's copies, and a later `import torch` would bind its own
libtorch_cuda.so to them too (an older NCCL: "undefined symbol: ncclCommResume"). So when the
library needs them and torch is installed, torch is imported first: its libraries are then the
ones loaded, and libtpflex binds to them (NCCL, cudart and cuBLASLt keep their ABI within a major
version). See python/README.md."""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import struct
import sys
from ctypes import (POINTER, c_bool, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint64,
                    c_void_p)
from typing import List, Optional

from .errors import TpflexError, error_for

TPF_OK = 0
DTYPES = {"bf16": 0, "fp16": 1, "fp32": 2, "fp8_e4m3": 3, "fp8_e5m2": 4}
ALGOS = {"bulk": 0, "pipeline": 1, "ring": 2}
COLLS = {"ag": 0, "rs": 1}


class Shape(ctypes.Structure):
    _fields_ = [("rows", c_uint64), ("cols", c_uint64)]


class SiteGeometry(ctypes.Structure):
    """tpf_site_geometry: one site's views for its active shape (tpf_manager_geometry)."""
    _fields_ = [("size", c_size_t), ("comm", c_void_p), ("name", c_char_p), ("epoch", c_uint64),
                ("active", Shape), ("dtype", c_int), ("base", c_void_p),
                ("registered_bytes", c_uint64), ("ld", c_uint64),
                ("buffer_off_bytes", c_uint64), ("buffer_bytes", c_uint64),
                ("buffer_rows", c_uint64), ("chunk_off_bytes", c_uint64),
                ("chunk_bytes", c_uint64), ("chunk_rows", c_uint64), ("chunk_row_off", c_uint64)]


class Matrix(ctypes.Structure):
    _fields_ = [("ptr", c_void_p), ("rows", c_uint64), ("cols", c_uint64), ("ld", c_uint64),
                ("dtype", c_int)]


class Operands(ctypes.Structure):
    """tpf_operands: one operation's operands for the rulebook (tpf_check_operands)."""
    _fields_ = [("size", c_size_t), ("op", c_int), ("buffer_dtype", c_int), ("active", Shape),
                ("tp_size", c_int), ("trans_a", c_bool), ("trans_w", c_bool),
                ("a_scale", c_bool), ("w_scale", c_bool), ("a", POINTER(Matrix)),
                ("w", POINTER(Matrix)), ("d", POINTER(Matrix)), ("a_name", c_char_p),
                ("w_name", c_char_p), ("d_name", c_char_p)]


class CommConfig(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("name", c_char_p), ("algo", c_int), ("coll", c_int), ("dtype", c_int),
                ("capacity", Shape), ("num_splits", c_int), ("aggregate", c_bool),
                ("external", c_bool), ("plan", c_int), ("cost", c_void_p)]


class SimConfig(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("tp_size", c_int), ("seed", c_uint64), ("max_delay_us", c_uint),
                ("timeout_ms", c_uint), ("arena_bytes", c_uint64)]


class SimStats(ctypes.Structure):
    _fields_ = [(n, c_uint64) for n in ("ops", "steps", "bytes_moved", "flops", "registrations",
                                        "backend_calls", "signals")]


class OpOptions(ctypes.Structure):
    """tpf_op_options (0.2): start from op_options_default()."""
    _fields_ = [("size", c_size_t), ("trans_a", c_bool), ("trans_w", c_bool), ("alpha", c_float),
                ("beta", c_float), ("bias", c_void_p), ("gelu", c_bool), ("num_splits", c_int),
                # appended after 0.2 (SPEC §11): fp8 per-tensor scales, float* or NULL (= 1)
                ("a_scale_inv", c_void_p), ("w_scale_inv", c_void_p)]


def op_options_default() -> OpOptions:
    """TPF_OP_OPTIONS_INIT."""
    return OpOptions(size=ctypes.sizeof(OpOptions), trans_a=False, trans_w=False, alpha=1.0,
                     beta=0.0, bias=None, gelu=False, num_splits=0, a_scale_inv=None,
                     w_scale_inv=None)


SIM_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_void_p)

# tpf_bootstrap (tpflex_cuda.h): allgather(ctx, send, recv, bytes_per_rank), barrier(ctx).
BOOT_ALLGATHER_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t)
BOOT_BARRIER_FN = ctypes.CFUNCTYPE(c_int, c_void_p)


class Bootstrap(ctypes.Structure):
    _fields_ = [("tp_size", c_int), ("rank", c_int), ("device", c_int),
                ("allgather", BOOT_ALLGATHER_FN), ("barrier", BOOT_BARRIER_FN), ("ctx", c_void_p)]


_HERE = os.path.dirname(os.path.abspath(__file__))


def _sanitized(build_dir: str) -> bool:
    """Whether a CMake build folder was configured with TPF_SANITIZE=address or thread (its
    CMakeCache.txt): such a library cannot be loaded into a plain python3 (the ASan and TSan
    runtimes must come first; ASan aborts the process). UBSan loads fine."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8",
                  errors="replace") as f:
            for line in f:
                if line.startswith("TPF_SANITIZE:"):
                    value = line.split("=", 1)[1]
                    return "address" in value or "thread" in value
    except OSError:
        pass
    return False


def _find() -> str:
    env = os.environ.get("TPFLEX_LIBRARY")
    if env:
        return env
    bundled = os.path.join(_HERE, "lib", "libtpflex.so")
    if os.path.isfile(bundled):
        return bundled
    root = os.path.dirname(os.path.dirname(_HERE))
    if os.path.isfile(os.path.join(root, "core", "tpflex.map")):  # running from the source tree
        # The newest build*/ that is not an ASan or TSan build: those (the CI tiers' build-asan,
        # build-tsan) cannot be loaded into a plain python3; name one with TPFLEX_LIBRARY.
        cands = sorted(glob.glob(os.path.join(root, "build*", "libtpflex.so")),
                       key=os.path.getmtime, reverse=True)
        for cand in cands:
            if not _sanitized(os.path.dirname(cand)):
                return cand
        # No build: the library of an installed tpflex (pip install ./python) further along
        # sys.path, e.g. a script that put this source tree's python/ first.
        for entry in sys.path:
            cand = os.path.join(os.path.abspath(entry or "."), "tpflex", "lib", "libtpflex.so")
            if os.path.isfile(cand) and os.path.dirname(os.path.dirname(cand)) != _HERE:
                return cand
    found = ctypes.util.find_library("tpflex")
    return found or "libtpflex.so.0"


def _in_source_tree() -> bool:
    return os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(_HERE)), "core",
                                       "tpflex.map"))


def _needed(path: str) -> Optional[List[str]]:
    """DT_NEEDED entries of an ELF64 little-endian shared library; None when unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return None
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize)
                for k in range(shnum)]
        out: List[str] = []
        for sec in secs:
            if sec[1] != 6:  # SHT_DYNAMIC
                continue
            stroff = secs[sec[6]][4]  # sh_link: its string table's file offset
            for k in range(sec[5] // 16):
                tag, val = struct.unpack_from("<qQ", data, sec[4] + 16 * k)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    end = data.index(b"\0", stroff + val)
                    out.append(data[stroff + val:end].decode("utf-8", "replace"))
        return out
    except (OSError, ValueError, IndexError, struct.error):
        return None


def _needs_cuda_libraries(path: str) -> bool:
    needed = _needed(path)
    if needed is None:  # not a path we can read (a bare soname): assume it may
        return True
    return any(n.startswith(("libnccl", "libcudart", "libcublas")) for n in needed)


_path = _find()
TORCH_IMPORTED_FIRST = False
if _needs_cuda_libraries(_path) and importlib.util.find_spec("torch") is not None:
    try:
        import torch  # noqa: F401  (binds NCCL/cudart/cuBLASLt to torch's copies: see above)
        TORCH_IMPORTED_FIRST = True
    except Exception:  # pragma: no cover - a broken torch: load the library anyway
        pass
try:
    lib = ctypes.CDLL(_path)
except OSError as e:  # pragma: no cover - depends on the machine
    if _in_source_tree() and not os.environ.get("TPFLEX_LIBRARY"):
        raise ImportError(
            f"tpflex: cannot load the C library '{_path}' ({e}): this is the source tree's "
            f"package ({_HERE}), which has no library of its own and found no build*/libtpflex.so "
            "and no installed tpflex: build one (cmake -S . -B build && cmake --build build), or "
            "`pip install ./python` and run without the source tree's python/ on sys.path, or "
            "set TPFLEX_LIBRARY=/path/to/libtpflex.so") from e
    raise ImportError(f"tpflex: cannot load the C library '{_path}' ({e}); install the package "
                      "with `pip install ./python` (it builds and bundles the library), or build "
                      "it with CMake and set TPFLEX_LIBRARY=/path/to/libtpflex.so") from e
LIBRARY_PATH: str = _path


def _decl(name: str, res, *args) -> None:
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)


_decl("tpf_status_name", c_char_p, c_int)
_decl("tpf_last_error", c_char_p)
_decl("tpf_comm_destroy", c_int, c_void_p)
_decl("tpf_comm_set_active_shape", c_int, c_void_p, Shape)
_decl("tpf_comm_active_shape", Shape, c_void_p)
_decl("tpf_comm_capacity_shape", Shape, c_void_p)
_decl("tpf_comm_epoch", c_uint64, c_void_p)
_decl("tpf_comm_config_of", POINTER(CommConfig), c_void_p)
_decl("tpf_comm_buffer", c_int, c_void_p, POINTER(Matrix))
_decl("tpf_comm_local_chunk", c_int, c_void_p, POINTER(Matrix))
_decl("tpf_comm_legal_rows", c_int, c_void_p, c_uint64, POINTER(c_uint64))
_decl("tpf_comm_registration", c_int, c_void_p, POINTER(c_void_p), POINTER(c_uint64))
_decl("tpf_ag_gemm", c_int, c_void_p, POINTER(Matrix), POINTER(Matrix), c_void_p)
_decl("tpf_gemm_rs", c_int, c_void_p, POINTER(Matrix), POINTER(Matrix), POINTER(Matrix), c_void_p)
_decl("tpf_bulk_overlap", c_int, c_void_p, POINTER(Matrix), POINTER(Matrix), POINTER(Matrix),
      c_void_p)
_decl("tpf_ag_gemm_ex", c_int, c_void_p, POINTER(Matrix), POINTER(Matrix), POINTER(OpOptions),
      c_void_p)
_decl("tpf_gemm_rs_ex", c_int, c_void_p, POINTER(Matrix), POINTER(Matrix), POINTER(Matrix),
      POINTER(OpOptions), c_void_p)
_decl("tpf_bulk_overlap_ex", c_int, c_void_p, POINTER(Matrix), POINTER(Matrix), POINTER(Matrix),
      POINTER(OpOptions), c_void_p)
# Variadic (printf-style): no argtypes, callers pass ctypes values. Lets a Python callback that
# C calls (the bootstrap) leave its detail in tpf_last_error().
lib.tpf_set_error.restype = c_int
_decl("tpf_manager_create", c_int, c_void_p, POINTER(c_void_p))
_decl("tpf_manager_add", c_int, c_void_p, POINTER(CommConfig), POINTER(c_void_p))
_decl("tpf_manager_get", c_int, c_void_p, c_char_p, POINTER(c_void_p))
_decl("tpf_manager_set_active_shape", c_int, c_void_p, Shape)
_decl("tpf_manager_count", c_int, c_void_p)
_decl("tpf_manager_at", c_int, c_void_p, c_int, POINTER(c_void_p))
_decl("tpf_manager_destroy", c_int, c_void_p)
_decl("tpf_check_operands", c_int, POINTER(Operands), POINTER(Shape))
_decl("tpf_manager_geometry", c_int, c_void_p, POINTER(SiteGeometry), c_int, POINTER(c_int))

HAVE_SIM = hasattr(lib, "tpf_sim_world_create")
HAVE_CUDA = hasattr(lib, "tpf_cuda_backend_create")
if HAVE_CUDA:
    _decl("tpf_cuda_backend_create", c_int, POINTER(Bootstrap), POINTER(c_void_p))
    _decl("tpf_cuda_backend_destroy", c_int, c_void_p)
    _decl("tpf_cuda_backend_set_timeout", c_int, c_void_p, c_uint)
if HAVE_SIM:
    _decl("tpf_sim_world_create", c_int, POINTER(SimConfig), POINTER(c_void_p))
    _decl("tpf_sim_run", c_int, c_void_p, SIM_FN, c_void_p)
    _decl("tpf_sim_world_destroy", c_int, c_void_p)
    _decl("tpf_sim_get_stats", c_int, c_void_p, POINTER(SimStats))

# Optional entry points another change may add; bound only when the library has them.
HAVE_COMM_SYNC = hasattr(lib, "tpf_comm_sync")
HAVE_COMM_ASYNC_ERROR = hasattr(lib, "tpf_comm_async_error")
HAVE_COMM_ABORT = hasattr(lib, "tpf_comm_abort")
HAVE_BACKEND_CAPS = hasattr(lib, "tpf_comm_backend_caps")
if HAVE_BACKEND_CAPS:
    _decl("tpf_comm_backend_caps", c_uint, c_void_p)
    _decl("tpf_comm_backend_name", c_char_p, c_void_p)
# TPF_BE_CAP_* (tpflex_backend.h)
CAP_HOST_MEMORY, CAP_OPTIONS = 2, 8
if HAVE_COMM_SYNC:
    _decl("tpf_comm_sync", c_int, c_void_p)
if HAVE_COMM_ASYNC_ERROR:
    _decl("tpf_comm_async_error", c_int, c_void_p, POINTER(c_int))
if HAVE_COMM_ABORT:
    _decl("tpf_comm_abort", c_int, c_void_p)


def last_error() -> str:
    s = lib.tpf_last_error()
    return s.decode("utf-8", "replace") if s else ""


def check(status: int, call: str = "") -> None:
    """Raises the exception class of `status` with tpf_last_error()'s text (read on the calling
    thread, right after the call) unless it is TPF_OK."""
    if status != TPF_OK:
        raise error_for(status, last_error(), call)


def status_name(status: int) -> str:
    return lib.tpf_status_name(status).decode()


def set_error(status: int, detail: str) -> int:
    """Records `detail` as the calling thread's tpf_last_error() and returns `status`."""
    lib.tpf_set_error(c_int(status), b"%s", detail.encode("utf-8", "replace"))
    return status


__all__ = ["lib", "check", "last_error", "status_name", "set_error", "Shape", "Matrix", "Operands",
           "SiteGeometry",
           "CommConfig", "SimConfig", "SimStats", "OpOptions", "op_options_default", "Bootstrap",
           "BOOT_ALLGATHER_FN", "BOOT_BARRIER_FN", "SIM_FN", "TpflexError", "LIBRARY_PATH"]
