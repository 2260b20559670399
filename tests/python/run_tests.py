"""CTest driver for the Python tests: fails loudly (not a silent skip) when torch is missing,
then runs test_sim.py with pytest if available, else unittest."""
import os
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"tpflex python tests: FAIL: torch is not importable ({e}).\n"
          "Install it: python3 -m pip install torch --index-url https://download.pytorch.org/whl/cpu",
          file=sys.stderr)
    sys.exit(1)

here = os.path.dirname(os.path.abspath(__file__))
target = os.path.join(here, sys.argv[1] if len(sys.argv) > 1 else "test_sim.py")
try:
    import pytest  # noqa: F401
    cmd = [sys.executable, "-m", "pytest", "-q", target]
except ImportError:
    cmd = [sys.executable, "-m", "unittest", "-v", os.path.splitext(os.path.basename(target))[0]]
sys.exit(subprocess.call(cmd, cwd=here))
