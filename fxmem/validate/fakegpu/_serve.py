"""The fork server of :mod:`fxmem.validate.fakegpu.forkserver`, run by a CUDA build's Python
with the stub preloaded.

It imports the modules named (a CUDA build's torch and its distributed and inductor
packages: seconds of every child's start), then forks one process per request. That process
takes the request's arguments, environment, folder and output files and runs ``_child.py``'s
work (:func:`_child.dispatch`); it ends as ``python _child.py ARGS`` would, by the
interpreter's own exit (threads joined, atexit handlers run, the exit code or the signal).
Nothing touches CUDA before a fork: the device, the caching allocator and the stub's state are
each child's own from its start.

Kept free of fxmem imports, as ``_child.py`` is. ``argv[1]``: a JSON list of modules to
import. On stdin, one JSON request a line: ``{"id", "args", "env", "cwd", "stdout",
"stderr"}`` (the two output files' paths). On stdout, one JSON reply a line: ``{"ready":
true}`` or ``{"error", "traceback"}`` once, then ``{"id", "pid"}`` when a child is forked and
``{"id", "code"}`` when it has ended (``-N``: ended by signal N). At the end of stdin, every
child still running is killed and the server exits.
"""

import gc
import importlib
import json
import os
import select
import signal
import sys
import traceback

POLL_SECONDS = 0.02


def _reply(obj) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())  # unbuffered: nothing left for a fork


def _code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _preload(names) -> bool:
    try:
        for name in names:
            importlib.import_module(name)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError(f"importing {names} initialised CUDA: a child could not")
    except BaseException as e:
        _reply({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return False
    gc.collect()
    gc.freeze()  # what the imports made, out of each child's collections and copies
    _reply({"ready": True})
    return True


def serve(preload):
    """Fork a child per request until stdin ends; returns a request only in the child."""
    if not _preload(preload):
        return None
    running, buf = {}, b""
    while True:
        if select.select([0], [], [], POLL_SECONDS)[0]:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    return req
                running[pid] = req["id"]
                _reply({"id": req["id"], "pid": pid})
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in running:
                _reply({"id": running.pop(pid), "code": _code(status)})
    for pid in running:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    return None


def become(req) -> None:
    """In the forked child: the request's folder, environment (the C library's too: the stub
    and PyTorch read it with ``getenv``), stdin from ``/dev/null``, stdout and stderr to its
    files, and ``sys.argv`` as ``python _child.py ARGS`` has it."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py"),
                *req["args"]]


if __name__ == "__main__":
    request = serve(json.loads(sys.argv[1]))
    if request is None:
        sys.exit(0)
    become(request)
    del request
    import _child

    _child.dispatch(sys.argv[1:])
