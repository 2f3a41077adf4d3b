"""The reference scripts' local launcher (--nproc N): N copies of a script on loopback with the
torchrun environment, because Debian's torchrun 1.13 does not start on Python 3.11."""

import os
import socket
import subprocess
import sys
import time




def free_port():
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """preexec_fn: the child gets SIGTERM when its parent dies (Linux PR_SET_PDEATHSIG), so a
    killed launcher never leaves workers behind (they would hold the port and the CPU)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass  # not Linux/glibc: workers still exit once their collectives fail


def spawn(script, nproc, argv):
    """Runs nproc copies of `script` (a Python file) as the ranks of one job; returns the job's
    exit code.

    Once a worker fails, the others get 10 s to notice (their collectives fail), then SIGTERM.
    """
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCH_DDP_REFERENCE_WORKER="1",
        )
        # As torchrun (and ddp-run, and ddp-bench --nproc) do for more than one local worker: one
        # OpenMP / OpenBLAS thread each unless the caller chose. Without it the workers' BLAS ran
        # on every core, with other GEMM kernels than ddp-bench's single-threaded workers: the same
        # step differed in the last bit of most gradient elements, which Adam amplified to 1e-3.
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen([sys.executable, script] + argv, env=env,
                                      preexec_fn=die_with_parent))
    code = 0
    failed_at = None
    try:
        while any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                rc = p.poll()
                if rc not in (None, 0) and code == 0:
                    code = rc if rc > 0 else 1
                    failed_at = time.monotonic()
                    print(f"{os.path.basename(script)}: rank {rank} exited with code {rc}", file=sys.stderr)
            if failed_at is not None and time.monotonic() - failed_at > 10:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        raise
    for rank, p in enumerate(procs):
        if p.returncode != 0 and code == 0:
            code = p.returncode if p.returncode > 0 else 1
            print(f"{os.path.basename(script)}: rank {rank} exited with code {p.returncode}", file=sys.stderr)
    return code
