"""Run a training step on the fake GPU, in a subprocess, and read PyTorch's own peaks.

>>> r = measure_step("/work/venv2/bin/python", "mymodels:mlp", kwargs={"B": 64})  # doctest: +SKIP
>>> r.max_allocated, r.max_reserved                                               # doctest: +SKIP

The target function (``"module:function"`` or ``"path/to/file.py:function"``, imported in
the child) returns ``(model, inputs, targets, loss_fn, optimizer_factory)``; see
:mod:`fxmem.validate.fakegpu._child` for their forms. The child moves model and batch to
``cuda``, runs ``steps`` warm-up steps, drops the gradients, then ``synchronize``,
``gc.collect``, ``empty_cache``, ``reset_peak_memory_stats`` and one measured step.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .build import HOOK_NAME, build
from .forkserver import popen

DEFAULT_BUILD_DIR = Path(tempfile.gettempdir()) / "fxmem_fakegpu"
TOTAL_BYTES = 85520809984  # the stub's device (stub.c FAKE_TOTAL_MEM: an H100 80GB's)
#: set in every fake-GPU process (:func:`stub_env`), so that fxmem there knows that no kernel
#: runs (a GradScaler's inf check computes nothing) and a report says where it was measured
MARK = "FXMEM_FAKE_GPU"

# variables that would change what the child's PyTorch sees or does
_DROP_ENV = ("CUDA_VISIBLE_DEVICES", "PYTORCH_NO_CUDA_MEMORY_CACHING",
             "PYTORCH_NVML_BASED_CUDA_CHECK", "CUDA_LAUNCH_BLOCKING")


class FakeGPUError(RuntimeError):
    """The child failed: its message, traceback and output are in the text."""


@dataclass(frozen=True)
class StepResult:
    """Bytes as the child's PyTorch reports them for the measured step."""

    max_allocated: int
    max_reserved: int
    baseline_allocated: int
    baseline_reserved: int
    end_allocated: int
    end_reserved: int
    torch_version: str
    device_name: str
    seconds: float
    raw: dict = field(default_factory=dict, repr=False)


def stub_env(lib: Path, base: dict | None = None) -> dict:
    """Environment for a process that should see the fake GPU: the stub preloaded (ahead of
    anything already in LD_PRELOAD), triton pointed at its folder and :data:`MARK` set."""
    env = dict(os.environ if base is None else base)
    for k in _DROP_ENV:
        env.pop(k, None)
    env[MARK] = "1"
    pre = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = str(lib) + (" " + pre if pre else "")
    env["TRITON_LIBCUDA_PATH"] = str(lib.parent)
    hook = lib.parent / HOOK_NAME  # _child.py zeroes each allocated block with it
    if hook.is_file():
        env["FAKEGPU_ALLOC_HOOK"] = str(hook)
    return env


def _run_child(python_exe, cfg: dict, build_dir, env, timeout) -> dict:
    lib = build(build_dir or DEFAULT_BUILD_DIR, python_exe)
    with tempfile.TemporaryDirectory(prefix="fxmem-fakegpu-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        proc = popen(python_exe, [json.dumps(cfg)], stub_env(lib, env), out, err)
        try:
            proc.wait(timeout)
        finally:  # (a timeout: killed, as subprocess.run kills it)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stdout, stderr = (f.read_text(errors="replace") for f in (out, err))
    line = next((ln for ln in reversed(stdout.splitlines())
                 if ln.startswith("FAKEGPU_RESULT ")), None)
    if line is None:
        raise FakeGPUError(
            f"the fake-GPU child produced no result (exit code {proc.returncode})\n"
            f"stdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}")
    res = json.loads(line[len("FAKEGPU_RESULT "):])
    if "error" in res:
        raise FakeGPUError(f"{res['error']}\n{res.get('traceback', '')}\nstderr:\n"
                           f"{stderr[-4000:]}")
    return res


def _paths(sys_path):
    return [str(Path(p).resolve()) for p in (sys_path or [os.getcwd()])]


def call(
    python_exe: str | os.PathLike,
    target: str,
    *,
    kwargs: dict | None = None,
    sys_path: list[str] | None = None,
    build_dir: str | os.PathLike | None = None,
    env: dict | None = None,
    timeout: float | None = 1800,
):
    """Call ``target(**kwargs)`` in ``python_exe`` on the fake GPU and return what it returns
    (JSON-able: numbers, strings, lists, dicts). For probes of single ops: what PyTorch's
    CUDA host code chooses or allocates, read with ``torch.cuda``'s own functions."""
    cfg = {"target": target, "kwargs": kwargs or {}, "call": True, "sys_path": _paths(sys_path)}
    return _run_child(python_exe, cfg, build_dir, env, timeout)["value"]


def measure_step(
    python_exe: str | os.PathLike,
    target: str,
    *,
    kwargs: dict | None = None,
    steps: int = 1,
    memory_bytes: int | None = None,
    sys_path: list[str] | None = None,
    build_dir: str | os.PathLike | None = None,
    env: dict | None = None,
    timeout: float | None = 1800,
) -> StepResult:
    """Run ``target``'s training step on the fake GPU in ``python_exe`` (a CUDA build of
    PyTorch); return the measured step's ``max_memory_allocated`` / ``max_memory_reserved``.

    ``kwargs``: JSON-able keyword arguments for the target function. ``steps``: warm-up
    steps before the measured one. ``memory_bytes``: what the caching allocator may take
    (``torch.cuda.set_per_process_memory_fraction`` of the 80 GB device): a step that needs
    more fails, as on a card of that size, with ``FakeGPUError`` naming
    ``OutOfMemoryError``. ``sys_path``: folders the child imports from (default:
    the current directory). ``build_dir``: where the stub is compiled and cached.
    """
    cfg = {**_job(target, kwargs, steps, memory_bytes), "sys_path": _paths(sys_path)}
    return _result(_run_child(python_exe, cfg, build_dir, env, timeout))


def measure_steps(
    python_exe: str | os.PathLike,
    jobs: list[dict],
    *,
    sys_path: list[str] | None = None,
    build_dir: str | os.PathLike | None = None,
    env: dict | None = None,
    timeout: float | None = 1800,
) -> list[StepResult]:
    """:func:`measure_step` for each of ``jobs`` (dicts of its arguments: ``target``, and
    optionally ``kwargs``, ``steps``, ``memory_bytes``), all in one child: a child's start
    (a CUDA build's import) costs more than most small steps. Between two steps the child
    is set back as a fresh one starts: the earlier step's tensors collected, the cuBLAS
    workspaces it kept let go, every cached segment returned, the peaks reset, the
    allocator's limit lifted (tests/test_fake_gpu_measure.py checks a step measured after
    others equals the same step measured alone)."""
    cfg = {"jobs": [_job(**job) for job in jobs], "sys_path": _paths(sys_path)}
    res = _run_child(python_exe, cfg, build_dir, env, timeout)
    common = {k: v for k, v in res.items() if k != "steps"}
    return [_result({**common, **step}) for step in res["steps"]]


def _job(target: str, kwargs: dict | None = None, steps: int = 1,
         memory_bytes: int | None = None) -> dict:
    return {"target": target, "kwargs": kwargs or {}, "steps": steps,
            "memory_fraction": None if memory_bytes is None else memory_bytes / TOTAL_BYTES}


def _result(res: dict) -> StepResult:
    return StepResult(
        max_allocated=res["max_allocated"],
        max_reserved=res["max_reserved"],
        baseline_allocated=res["baseline_allocated"],
        baseline_reserved=res["baseline_reserved"],
        end_allocated=res["end_allocated"],
        end_reserved=res["end_reserved"],
        torch_version=res["torch"],
        device_name=res["device_name"],
        seconds=res["seconds"],
        raw=res,
    )

