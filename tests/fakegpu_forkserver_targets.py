"""Targets of tests/test_fake_gpu_forkserver.py: what a fake-GPU child sees of its process."""

import os
import signal
import sys
import time


def seen(names: list) -> dict:
    """The variables ``names``, the folder, ``sys.argv``'s first entry, ``sys.path``, what
    the standard input reads and the device's name."""
    import torch

    return {"env": {n: os.environ.get(n) for n in names}, "cwd": os.getcwd(),
            "argv0": sys.argv[0], "path": sys.path, "stdin": os.readlink("/proc/self/fd/0"),
            "device": torch.cuda.get_device_name()}


def ends(how: str, pid_file: str = ""):
    """Ends this process: ``"exit 5"`` (``os._exit``), ``"segv"`` (the signal), ``"hang"``
    (sleeps, its pid written to ``pid_file`` first)."""
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "hang":
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    os._exit(int(how.split()[1]))


def server_pid() -> int:
    """The process this child was forked from (a fork server's, or the caller's)."""
    return os.getppid()
