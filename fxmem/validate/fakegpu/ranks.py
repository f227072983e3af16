"""Parallel steps on the fake GPU: ``world_size`` processes of a CUDA build of PyTorch, each
with the stub preloaded and its own fake device 0, joined in one NCCL process group whose
NCCL is the stub's (``nccl_stub.c``, built into the same library when the venv's NCCL wheel
has ``nccl.h``).

PyTorch's ``ProcessGroupNCCL`` then runs as on a GPU cluster: the rendezvous through a file
store, a communicator per group, each collective on its NCCL stream with its events, the
tensors it keeps until the work is waited, the outputs and flat buffers it allocates,
all through each rank's own caching allocator, so ``max_memory_allocated`` /
``max_memory_reserved`` of each rank are PyTorch's own figures for FSDP2, DDP and tensor
parallelism. The stub's collectives move no data between processes (each rank sees what it
would if every rank held what it holds) and NCCL's own device buffers, outside PyTorch's
allocator, do not exist (see ``nccl_stub.c``).

>>> from fxmem.validate.fakegpu.ranks import call_ranks
>>> call_ranks("/work/venv2/bin/python", "mytargets.py:step", 2, kwargs={"B": 8})  # doctest: +SKIP
[{...rank 0's value...}, {...rank 1's...}]

The target runs in each rank's process after ``init_process_group``; to measure a step
there, it calls :func:`measure_rank` (the model wrapped by an :class:`fxmem.FSDP`,
:class:`fxmem.DDP`, :class:`fxmem.TP` or :class:`fxmem.Parallel` on a CUDA device mesh, and
:func:`fxmem.measure`'s CUDA protocol).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from .build import build
from .forkserver import popen
from .run import DEFAULT_BUILD_DIR, FakeGPUError, _paths, stub_env

POLL_SECONDS = 0.05
# ProcessGroupNCCL's watchdog thread looks at its collectives every 100 ms
# (kWatchdogThreadSleepMillis) and lets go of what a finished one held: up to 2.14 the
# inputs stashed for the allocator's safety go then, not when the future is waited. A rank
# waits this long after its warm-up steps, so that the measured step starts with them gone
# whatever the timing (a real loop's data loading gives the watchdog the same time).
WATCHDOG_SETTLE_SECONDS = 0.5


def settle_watchdog() -> None:
    """Wait until ProcessGroupNCCL's watchdog has seen this rank's finished collectives
    (:data:`WATCHDOG_SETTLE_SECONDS` after the device's work). Up to 2.14 a collective whose
    work is not waited (DDP's all-reduce of a bucket: the Reducer waits its future) keeps
    the tensors it stashed for the allocator's safety until the watchdog hands them back to
    the process group, which lets go of them at its next collective (``workEnqueue``): DDP
    then rebuilds its buckets (in the forward after the first backward, after its
    broadcast of the buckets' order) with the constructor's freed only if the watchdog
    came first; else the new buckets go after the old (2.14.1, each compiled DDP case
    before this wait after the compiled first step: a 4,215,296 B hole before the bucket,
    a 2 MiB activation at B=512 put into the 2,118,144 B rest, 20,992 B more allocated)."""
    import torch

    torch.cuda.synchronize()
    time.sleep(WATCHDOG_SETTLE_SECONDS)


def let_go_of_collectives() -> None:
    """After a rank's measured step, the process group holding nothing of it, as in a
    fresh process: the watchdog's wait (:func:`settle_watchdog`), then an all-reduce of a
    tensor of one element, whose enqueue lets go of the tensors the watchdog handed back (up
    to 2.14 the last bucket of a DDP step outlived the model until the next collective:
    ``ddp-wide``'s next batch size, B=16, found the old 12 MiB bucket in its 14 MiB segment
    and reserved another), then the wait again for that all-reduce's own work. (Not a barrier:
    2.15's process group keeps the barrier's tensor, 512 B left allocated.)"""
    import torch
    import torch.distributed as dist

    settle_watchdog()
    one = torch.zeros(1, device="cuda")
    dist.all_reduce(one)
    del one
    settle_watchdog()


def call_ranks(python_exe, target: str, world_size: int, *, kwargs: dict | None = None,
               sys_path: list[str] | None = None, build_dir=None, env: dict | None = None,
               timeout: float = 600) -> list:
    """Call ``target(**kwargs)`` in ``world_size`` processes of ``python_exe`` on the fake
    GPU, each one rank of an NCCL process group (the stub's NCCL; ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK=0`` set); return what each returned (JSON-able), rank 0 first. A rank that
    fails, or ranks still running after ``timeout`` seconds, raise :class:`FakeGPUError`
    (every process is killed first: nothing outlives the call), naming a rank that ended of
    itself before one this call killed (the others, waiting for it, are killed: the cause is
    the rank that failed)."""
    lib = build(build_dir or DEFAULT_BUILD_DIR, python_exe)
    with tempfile.TemporaryDirectory(prefix="fxmem-fakegpu-ranks-") as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs, killed = [], set()
        try:
            for rank in range(world_size):
                cfg = {"target": target, "kwargs": kwargs or {}, "call": True,
                       "sys_path": _paths(sys_path), "rank": rank, "world_size": world_size,
                       "init_method": init, "timeout": timeout}
                e = stub_env(lib, env)
                e.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                         LOCAL_WORLD_SIZE="1", FAKEGPU_NCCL_DIR=tmp)  # (split communicators)
                procs.append(popen(python_exe, [json.dumps(cfg)], e, *_files(tmp, rank)))
            timed_out = _wait(procs, time.monotonic() + timeout)
        finally:
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    killed.add(rank)
                p.wait()
        results = {}
        for rank in sorted(range(len(procs)), key=lambda r: r in killed):  # the cause first
            out, err = (f.read_text(errors="replace") for f in _files(tmp, rank))
            results[rank] = _result(rank, procs[rank].returncode, out, err, timed_out,
                                    rank in killed)
    return [results[rank] for rank in range(len(procs))]


def _files(folder, rank: int) -> tuple[Path, Path]:
    return Path(folder) / f"rank{rank}.out", Path(folder) / f"rank{rank}.err"


def _wait(procs, deadline: float) -> bool:
    """Until every process ends, one fails (the others, waiting for it, are then killed) or
    the deadline passes (True)."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(POLL_SECONDS)


def _result(rank, code, stdout, stderr, timed_out, killed=False):
    line = next((ln for ln in reversed(stdout.splitlines())
                 if ln.startswith("FAKEGPU_RESULT ")), None)
    if line is None:
        why = "timed out (killed)" if timed_out else \
            "killed: another rank failed" if killed else f"exit code {code}"
        raise FakeGPUError(f"rank {rank} of the fake-GPU run produced no result ({why})\n"
                           f"stdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}")
    res = json.loads(line[len("FAKEGPU_RESULT "):])
    if "error" in res:
        raise FakeGPUError(f"rank {rank}: {res['error']}\n{res.get('traceback', '')}\n"
                           f"stderr:\n{stderr[-4000:]}")
    return res["value"]


def _no_value_checks() -> None:
    """DDP's check that every rank has the same parameters compares numbers a kernel writes
    on the device (2.15: the parameter count, filled by a kernel, then broadcast), which
    the fake GPU's kernels never write: in this rank's process it is skipped. The
    broadcast of rank 0's parameters and buffers that follows still runs."""
    import torch.nn.parallel.distributed as ddp

    ddp._verify_param_shape_across_processes = lambda *args, **kwargs: None


def measure_rank(model, inputs, targets=(), *, parallel, B: int, step=None,  # noqa: N803
                 batch_dim=0, record_history: bool = False, compile_at_example: bool = False,
                 **options) -> dict:
    """In one rank's process (a :func:`call_ranks` target): ``model`` wrapped by
    ``parallel`` on a CUDA device mesh over the process group, and its step at batch size
    ``B`` measured as :func:`fxmem.measure` measures a CUDA step (warm-up steps, then
    ``empty_cache``, ``reset_peak_memory_stats`` and the measured step). The step is
    ``step`` with ``options`` (``loss``, ``optimizer``, ...) as for :func:`fxmem.measure`;
    the device is ``"cuda"``. Returns the :class:`fxmem.validate.measure.Measurement` as a
    JSON-able dict, with ``rank`` and ``torch_version``.

    Under FSDP2 the model is handed to ``fully_shard`` as it comes (on the CPU): it moves
    each rank's shards to the device; the model of any other strategy (DDP, TP) is moved
    to ``cuda`` first. The batch is made after the wrapping. ``compile_at_example``: a step
    at the example's batch size, its batch dimensions marked dynamic, runs before the
    warm-up steps at ``B`` (as :func:`fxmem.measure` runs ``compile=``): parts of the model
    compiled on their own (``torch.compile(block)``) compile there with B a symbol, as
    fxmem's trace at that batch size lowers them, and that code runs at ``B``. ``compile=``
    (in ``step`` or ``options``): each of the model's repeated blocks compiled in place before
    the wrapping, as fxmem's trace compiles a rank's model
    (:meth:`fxmem.trace.compiled.Compile.blocks`), then compiled at the example's batch size
    under its partitioner budget."""
    import dataclasses

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ...trace.engine import Step, make_grad_scaler, make_optimizer, make_spec
    from ...trace.parallel import FSDP, Parallel
    from ..measure import batch_of

    step = Step.of(step, device="cuda", **options)
    spec = make_spec(model, inputs, targets, step, batch_dim)
    mesh = init_device_mesh("cuda", parallel.mesh_shape, mesh_dim_names=parallel.mesh_dim_names)
    if not isinstance(parallel, (FSDP, Parallel)):  # fully_shard moves every parameter
        model = model.to("cuda")
    if spec.compile is not None:
        spec.compile.blocks(model, parallel.compile_blocks(model))
        compile_at_example = True
    _no_value_checks()
    model = parallel.apply(model, mesh) or model
    n_in = len(spec.inputs)
    ins = [batch_of(t, B, "cuda", d) for t, d in zip(spec.inputs, spec.batch_dims)]
    tgs = [batch_of(t, B, "cuda", d) for t, d in zip(spec.targets, spec.batch_dims[n_in:])]
    params = list(model.parameters())
    factory = parallel.optimizer(spec.optimizer)
    opt = make_optimizer(factory, params, "cuda", spec) if factory else None
    scaler = make_grad_scaler(spec, "cuda")
    budget = spec.compile.settings() if spec.compile is not None else contextlib.nullcontext()
    with budget:  # (compile='s partitioner budget while its blocks compile)
        m = _steps(model, spec, parallel, ins, tgs, params, opt, B, scaler, record_history,
                   compile_at_example)
    got = dataclasses.asdict(m)
    got["allocations"] = [list(a) for a in m.allocations]
    got["torch_version"] = torch.__version__
    got["rank"] = dist.get_rank()
    return got


def _steps(model, spec, parallel, ins, tgs, params, opt, B, scaler,  # noqa: N803
           record_history, compile_at_example):
    """:func:`measure_rank`'s steps: the compiling one at the example's batch size, the
    strategy's warm-up steps, then the measured one (its Measurement)."""
    from ...trace.engine import run_step
    from ..measure import _compile_at_example, _measure_cuda

    if compile_at_example:  # B marked dynamic: the graphs compiled there serve every B
        _compile_at_example(model, spec, params, opt, scaler)
        settle_watchdog()  # before the next step, which may rebuild DDP's buckets
    for _ in range(parallel.warmup_steps - 1):  # the measure's own warm-up is the last
        out = run_step(model, spec, ins, tgs, params, opt, lambda phase: None, scaler=scaler)
        del out
    settle_watchdog()
    return _measure_cuda(model, spec, ins, tgs, params, opt, B, scaler, record_history)
