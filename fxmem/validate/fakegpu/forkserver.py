"""Fake-GPU children forked from a process that has already imported torch.

Each fake-GPU child (:func:`fxmem.validate.fakegpu.measure_step`, ``call``, ``call_ranks``'
ranks) is a new CUDA-build Python, and its imports cost more than most steps: on a 2-core
machine, torch 2.15's ``import torch`` takes about 3 s, with its distributed packages 4 s,
with inductor's ``compile_fx`` 6 s. Within ``with forkserver():`` the first child of a Python
(and of an environment) starts a server there (``_serve.py``) that imports those once; every
child after is a fork of it that runs as a fresh process would from there on: its own
environment, folder, arguments and output files, CUDA first initialised in it (the server
never touches the device), its exit as the interpreter's own.

>>> from fxmem.validate.fakegpu.forkserver import forkserver
>>> with forkserver():                                                     # doctest: +SKIP
...     measure_step("/path/to/cuda-venv/bin/python", "mymodels:mlp", kwargs={"B": 64})

Outside such a block every child is started afresh, as before. A step measured in a forked
child gives the figures of one started afresh (``tests/test_fake_gpu_forkserver.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

SERVER = Path(__file__).with_name("_serve.py")
CHILD = Path(__file__).with_name("_child.py")
#: what a server imports once
PRELOAD = ("torch", "torch.distributed.fsdp", "torch.distributed.tensor",
           "torch._inductor.compile_fx")
#: variables PyTorch and the stub read when they use them, never as they are imported: a
#: child's may differ from its server's (a rank's number, its NCCL folder, the test pytest
#: runs). Every other one is its server's: inductor's cache folder, say, is read as dynamo
#: is imported.
PER_CHILD = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                       "FAKEGPU_NCCL_DIR", "PYTEST_CURRENT_TEST"})
START_TIMEOUT_SECONDS = 600
#: servers kept at once (each holds hundreds of MB): the oldest with no child running ends
MAX_SERVERS = 3

_pool: _Pool | None = None  # the innermost open forkserver() block's


class ForkServerError(RuntimeError):
    """A fork server could not start (its preloads failed) or ended under its children."""


@contextlib.contextmanager
def forkserver(preload=PRELOAD, enabled: bool = True):
    """Within the block, fake-GPU children are forked from a server per Python and
    environment that imported ``preload`` first (``enabled=False``: started afresh, as
    outside any block). The servers end, their children killed, as the block ends."""
    global _pool
    outer, _pool = _pool, (_Pool(tuple(preload)) if enabled else None)
    try:
        yield
    finally:
        if _pool is not None:
            _pool.close()
        _pool = outer


def popen(python_exe, args: list[str], env: dict, stdout: Path, stderr: Path):
    """``python_exe _child.py *args`` with ``env``, its output written to the files
    ``stdout`` and ``stderr``: a :class:`subprocess.Popen`, or within :func:`forkserver` a
    forked child with the methods the callers use (``pid``, ``returncode``, ``poll``,
    ``wait``, ``kill``)."""
    if _pool is None:
        with open(stdout, "w") as out, open(stderr, "w") as err:
            return subprocess.Popen([str(python_exe), str(CHILD), *args], env=env,
                                    stdout=out, stderr=err)
    return _pool.spawn(str(python_exe), args, env, stdout, stderr)


class _Pool:
    def __init__(self, preload):
        self.preload = preload
        self.servers: dict = {}
        self.lock = threading.Lock()

    def spawn(self, python_exe, args, env, stdout, stderr):
        key = (python_exe, frozenset((k, v) for k, v in env.items() if k not in PER_CHILD))
        with self.lock:
            server = self.servers.pop(key, None)  # (put back last: the newest)
            if server is not None and server.ended:
                server.close()  # (its pipes and log; the process is gone)
                server = None
            if server is None:
                for old in [k for k, s in self.servers.items() if not s.busy()]:
                    if len(self.servers) < MAX_SERVERS:
                        break
                    self.servers.pop(old).close()
                server = _Server(python_exe, env, self.preload)
            self.servers[key] = server
        return server.spawn(args, env, stdout, stderr)

    def close(self):
        for server in self.servers.values():
            server.close()
        self.servers.clear()


class _Server:
    def __init__(self, python_exe, env, preload):
        self.log = tempfile.NamedTemporaryFile(prefix="fxmem-forkserver-", suffix=".log")
        self.proc = subprocess.Popen(
            [python_exe, str(SERVER), json.dumps(list(preload))],
            env={k: v for k, v in env.items() if k not in PER_CHILD},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self.lock = threading.RLock()
        self.buf, self.ended, self.ids = b"", False, 0
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        first = self._first(time.monotonic() + START_TIMEOUT_SECONDS)
        if first is None or "ready" not in first:
            self.close()
            why = (first or {}).get("traceback") or Path(self.log.name).read_text()[-4000:]
            raise ForkServerError(f"the fork server in {python_exe} did not start:\n{why}")

    def spawn(self, args, env, stdout, stderr):
        with self.lock:
            self.ids += 1
            ident = self.ids
            req = {"id": ident, "args": list(args), "env": dict(env), "cwd": os.getcwd(),
                   "stdout": str(stdout), "stderr": str(stderr)}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            while ident not in self.pids:
                if self.ended:
                    raise ForkServerError("the fork server ended before it forked a child")
                self.pump(1.0)
        return _Forked(self, ident, self.pids[ident])

    def busy(self) -> bool:
        """Whether a child of this server may still run."""
        self.pump(0)
        return not self.ended and any(i not in self.codes for i in self.pids)

    def _first(self, deadline):
        """The server's first reply (ready, or why not), None if it ended or is late."""
        while (left := deadline - time.monotonic()) > 0:
            replies = self._replies(left)
            if replies is None:
                return None
            if replies:
                return replies[0]
        return None

    def _replies(self, timeout: float) -> list[dict] | None:
        """The whole reply lines that arrive within ``timeout`` seconds (None: the server's
        output has ended)."""
        if select.select([self.proc.stdout], [], [], timeout)[0]:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines]

    def pump(self, timeout: float) -> None:
        """Read the replies that arrive within ``timeout`` seconds."""
        with self.lock:
            if self.ended:
                return
            replies = self._replies(timeout)
            if replies is None:
                self._end()
                return
            for reply in replies:
                (self.pids if "pid" in reply else self.codes)[reply["id"]] = \
                    reply.get("pid", reply.get("code"))

    def _end(self):
        """The server ended: its children were killed (or will be: it is gone)."""
        self.ended = True
        for ident, pid in self.pids.items():
            if ident not in self.codes:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                self.codes[ident] = -signal.SIGKILL

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._end()
        self.proc.stdout.close()
        self.log.close()


class _Forked:
    """A child forked by a server: the part of :class:`subprocess.Popen` callers use."""

    def __init__(self, server: _Server, ident: int, pid: int):
        self.server, self.ident, self.pid = server, ident, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(0)
            self.returncode = self.server.codes.get(self.ident)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(CHILD), timeout)
            self.server.pump(min(left, 1.0))
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
