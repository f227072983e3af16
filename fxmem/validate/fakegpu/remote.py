"""fxmem itself on the fake GPU: :func:`fxmem.measure` and ``fxmem validate`` run in a CUDA build
of PyTorch (another Python, named by the user) with the stub preloaded.

``fxmem.measure(model, ..., device="cuda", fake_gpu="/path/to/cuda-venv/bin/python")`` sends
the model, the batch and the step to that Python (pickled: the model's class, the loss and
an optimizer factory must be importable there, i.e. defined at a module's top level, not in
``__main__`` or as a lambda), runs the same :func:`fxmem.measure` there on ``"cuda"`` and
returns its :class:`fxmem.validate.measure.Measurement` (``torch_version`` says which release
measured it: compare it with a prediction made under the same release).
``fxmem validate --device cuda --fake-gpu PYTHON`` runs the whole harness in that Python, so
that prediction and measurement use one release.

The child imports this same fxmem source (its folder goes first on ``PYTHONPATH``) with the
other Python's torch; fxmem's own requirements (sympy, networkx, click, rich, jinja2,
matplotlib) must be installed there.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from ...errors import InputError
from .build import build
from .forkserver import CHILD
from .run import DEFAULT_BUILD_DIR, MARK, FakeGPUError, call, stub_env

FXMEM_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds the fxmem package


def on_fake_gpu() -> bool:
    """Whether this process runs on the fake GPU (started by this module)."""
    return bool(os.environ.get(MARK))


def user_paths() -> list[str]:
    """This process's import folders that are not an installation's (the user's sources, the
    current directory): the child needs them to import the model's class, never this
    Python's site-packages, whose torch is another build."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = [str(FXMEM_ROOT)]
    for p in sys.path:
        real = os.path.realpath(p or os.getcwd())
        if not os.path.isdir(real) or any(real == q or real.startswith(q + os.sep)
                                          for q in prefixes):
            continue
        if "site-packages" in real.split(os.sep) or real in out:
            continue
        out.append(real)
    return out


def _pickled(what: dict) -> bytes:
    try:
        return pickle.dumps(what)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise InputError(f"measure(fake_gpu=...) sends the step to another Python, and it "
                         f"cannot be pickled ({e}): define the model's class, the loss and "
                         f"the optimizer factory at a module's top level") from None


def send(python_exe, target: str, what: dict, *, build_dir=None,
         timeout: float | None = 1800) -> dict:
    """Pickle ``what`` to a file and call ``target(path=...)`` (``"module:function"``, which
    unpickles it) in ``python_exe`` on the fake GPU, with this fxmem and the user's folders
    importable; what it returns (JSON). ``{"error": [class name, message]}`` from the child
    is raised here as that :mod:`fxmem.errors` class."""
    blob = _pickled(what)
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        f.write(blob)
    try:
        got = call(python_exe, target, kwargs={"path": f.name}, sys_path=user_paths(),
                   build_dir=build_dir, env={**os.environ, MARK: "1"}, timeout=timeout)
    finally:
        os.unlink(f.name)
    if isinstance(got, dict) and "error" in got:
        from ... import errors

        raise getattr(errors, got["error"][0], FakeGPUError)(got["error"][1])
    return got


def run_module(python_exe, module: str, args: list[str], build_dir=None) -> int:
    """``python_exe -m module *args`` on the fake GPU, its output passed through; its exit
    code."""
    lib = build(build_dir or DEFAULT_BUILD_DIR, python_exe)
    env = stub_env(lib)
    env[MARK] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(FXMEM_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([str(python_exe), str(CHILD), "--module", module, *args],
                          env=env).returncode
