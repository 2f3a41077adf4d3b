"""What the tests of bench/reference share: the paths, the reference's directory on sys.path, a
run of torch_ddp.py, the relative difference."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REF_DIR = os.path.join(ROOT, "bench", "reference")
SCRIPT = os.path.join(REF_DIR, "torch_ddp.py")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, REF_DIR)


def run_reference(*flags, timeout=300):
    proc = subprocess.run([sys.executable, SCRIPT, *flags], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"torch_ddp.py {' '.join(flags)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def rel_diff(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()
