"""CTest driver for the Python tests: fails loudly (not a silent skip) when torch is missing,
then runs the test files named (default test_sim.py) with pytest if available, else unittest."""
import os
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"tpflex python tests: FAIL: torch is not importable ({e}).\n"
          f"Install it for this interpreter: {sys.executable} -m pip install torch (or: make pydeps)",
          file=sys.stderr)
    sys.exit(1)

here = os.path.dirname(os.path.abspath(__file__))
targets = sys.argv[1:] or ["test_sim.py"]
try:
    import pytest  # noqa: F401
    cmd = [sys.executable, "-m", "pytest", "-q"] + [os.path.join(here, t) for t in targets]
except ImportError:
    cmd = [sys.executable, "-m", "unittest", "-v"] + [os.path.splitext(t)[0] for t in targets]
sys.exit(subprocess.call(cmd, cwd=here))
