"""`python -m tpflex`: what this installation is: the package version, the C library it loaded
(and why that one), the backends compiled into it, and whether a GPU is usable from here.

The C API has no version or capability query: the backends are read from the entry points the
library exports (tpf_sim_world_create, tpf_cuda_backend_create), the GPU from the CUDA driver
(libcuda.so.1: cuInit, cuDeviceGetCount) and, where torch is installed, torch.cuda."""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from typing import List, Optional, Tuple

from . import __version__, _lib


def _mapped_path(name: str) -> Optional[str]:
    """The file this process mapped for a library whose name contains `name` (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and name in os.path.basename(parts[5].strip()):
                    return parts[5].strip()
    except OSError:
        pass
    return None


def _library() -> Tuple[str, str]:
    path = _lib.LIBRARY_PATH
    here = os.path.dirname(os.path.abspath(_lib.__file__))
    if os.environ.get("TPFLEX_LIBRARY"):
        how = "TPFLEX_LIBRARY"
    elif os.path.abspath(path) == os.path.join(here, "lib", "libtpflex.so"):
        how = "bundled with the package"
    elif os.path.isabs(path):
        how = "the source tree's build"
    else:
        how = "the system's (dynamic loader search)"
    real = _mapped_path("libtpflex") or path
    return real, how


def _driver_gpus() -> Tuple[Optional[int], str]:
    """(device count, detail) from the CUDA driver; (None, why) when it cannot be asked."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "no CUDA driver (libcuda.so.1 not found)"
    rc = cuda.cuInit(0)
    if rc != 0:
        return 0, f"CUDA driver present, cuInit failed (CUresult {rc})"
    n = ctypes.c_int(0)
    rc = cuda.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0:
        return 0, f"cuDeviceGetCount failed (CUresult {rc})"
    return n.value, f"{n.value} device(s) (CUDA driver)"


def report() -> List[str]:
    path, how = _library()
    backends = [b for b, on in (("sim", _lib.HAVE_SIM), ("cuda", _lib.HAVE_CUDA)) if on]
    lines = [f"tpflex {__version__}",
             f"library   {path} ({how})",
             f"backends  {', '.join(backends) or 'none'}"]
    count, detail = _driver_gpus()
    if not _lib.HAVE_CUDA:
        usable = "no: the CUDA backend is not compiled into this library"
        if count:
            usable += f" ({detail})"
    elif count:
        usable = f"yes: {detail}"
    else:
        usable = f"no: {detail}"
    lines.append(f"gpu       {usable}")
    if importlib.util.find_spec("torch") is None:
        lines.append("torch     not installed (tpflex.torch needs it; tpflex.sim does not)")
    else:
        import torch
        cuda = torch.cuda.is_available()
        lines.append(f"torch     {torch.__version__} (cuda available: {'yes' if cuda else 'no'}; "
                     f"imported before the library: {'yes' if _lib.TORCH_IMPORTED_FIRST else 'no'})")
        if importlib.util.find_spec("numpy") is None:
            lines.append("numpy     not installed: torch warns 'Failed to initialize NumPy' on "
                         "import (pip install numpy, or install './python[torch]')")
    return lines


TOOL_COMMANDS = ("plan", "demo", "bench", "calibrate", "version")
USAGE = ("usage: python -m tpflex   (no arguments: this installation's version, library, backends "
         "and GPU)")


def refusal(args: List[str]) -> str:
    """What `python -m tpflex ARGS` says instead of ignoring ARGS."""
    cmd = args[0]
    line = " ".join(args)
    if cmd in TOOL_COMMANDS:
        return (f"python -m tpflex: '{cmd}' is a command of the C tool `tpflex`, which pip does "
                f"not install. Build it from the checkout: cmake -S . -B build && cmake --build "
                f"build --target tpflex_cli, then run: build/tpflex {line}\n{USAGE}")
    return f"python -m tpflex: unknown argument {cmd!r}\n{USAGE}"


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args:
        print(refusal(args), file=sys.stderr)
        return 2
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
