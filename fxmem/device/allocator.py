"""What the target device adds on top of live bytes, at one batch size.

The formula of ``Report.peak`` counts each storage as the block it takes
(:mod:`fxmem.memory.sizes`: 512-byte blocks on CUDA). What ``torch.cuda.max_memory_allocated()``
and ``max_memory_reserved()`` report on top is a replay of the step's allocations through
the caching allocator (:mod:`fxmem.device.caching_allocator`: segments, block splitting and
the slack of unsplit large blocks) with the cuBLAS workspaces: kept per thread up to torch
2.14, taken and freed by every matmul from 2.15 (:mod:`fxmem.trace.kernels.cuda.blas`), and the CUDA
reductions' staging buffers, sized at that B (:mod:`fxmem.trace.kernels.cuda.reduce_replay`):
:func:`cuda_memory` (``Report.cuda_memory(B)``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..memory.sizes import _host_resident
from ..trace.kernels.cuda import blas, call_order, reduce_replay

# --- the caching allocator, replayed over a step -------------------------------------------

# ops that run through cuBLAS (up to 2.14 each thread's handle gets its own workspace on first
# use; from 2.15 each call takes one while it runs)
CUBLAS_OPS = blas.OP_NAMES


# ops that run through cuDNN on CUDA: each call allocates a workspace through the caching
# allocator and frees it when the call returns (convolution_backward: one call for the input's
# gradient, then one for the weight's; never both at once)
CONV_BACKWARD = call_order.CONV_BACKWARD
CUDNN_CONV_OPS = call_order.CUDNN_CONV_FORWARD | {CONV_BACKWARD}


def cublas_workspace_bytes(compute_capability=(9, 0), env: str | None = None) -> int:
    """PyTorch's cuBLAS workspace (``parseChosenWorkspaceSize`` in
    ``aten/src/ATen/cuda/CublasHandlePool.cpp``): ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT``
    pairs, SIZE in KiB; ``env``, default the environment's) summed, else 32 MiB on compute
    capability 9.x (Hopper), 10.x and 12.x (Blackwell), else 4096 KiB x 2 + 16 KiB x 8. Up to
    2.14 cuBLASLt shares it by default (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``); from 2.15 a
    cuBLASLt call takes its own (:func:`fxmem.trace.kernels.cuda.blas.lt_workspace_bytes`).

    >>> cublas_workspace_bytes((9, 0)), cublas_workspace_bytes((8, 0))
    (33554432, 8519680)
    >>> cublas_workspace_bytes((8, 0), ":4096:8")
    33554432
    """
    import re

    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if env is None else env
    if env:
        pairs = re.findall(r":([0-9]+):([0-9]+)", env)
        if pairs:
            return sum(int(s) * int(c) * 1024 for s, c in pairs)
    major = compute_capability[0] if compute_capability else 0
    return 4096 * 8 * 1024 if major in (9, 10, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8


@dataclass(frozen=True)
class DeviceMemory:
    """What ``torch.cuda`` reports for one steady-state step at batch size ``B``, predicted
    by replaying the step's allocations through the caching allocator (bytes).

    ``max_allocated`` / ``max_reserved``: ``max_memory_allocated()`` /
    ``max_memory_reserved()`` over the step, after ``fxmem.measure``'s protocol (a warm-up
    step, ``empty_cache()``, ``reset_peak_memory_stats()``); ``baseline_*``: before the
    step; ``phase_max_*``: per phase. ``workspaces``: library buffers that go through the
    allocator and stay (what, bytes). The CUDA context is in neither figure.
    """

    B: int
    max_allocated: int
    max_reserved: int
    baseline_allocated: int
    baseline_reserved: int
    phase_max_allocated: dict
    phase_max_reserved: dict
    workspaces: tuple


def cuda_memory(liveness, B: int, config=None, compute_capability=(9, 0),  # noqa: N803
                cublas_workspace: int | None = None, cudnn_workspace: int = 0) -> DeviceMemory:
    """Replay ``liveness``'s step at batch size ``B`` through
    :class:`fxmem.device.caching_allocator.CachingAllocator`, as ``fxmem.measure`` runs it on a GPU:
    parameters, buffers and the batch first, then a warm-up step in which the optimizer
    state appears at the optimizer phase and (up to torch 2.14) each thread's cuBLAS
    workspace at its first matmul (forward: the main thread; backward: autograd's; from
    2.15 every matmul takes its workspace after its output and frees it), then
    ``empty_cache()``, a reset of the peaks, and the measured step. Storages keep the order
    of the trace, each allocated on the stream the trace saw it made on
    (``StorageInfo.stream``: FSDP2's all-gather and reduce-scatter outputs on its streams,
    whose blocks and segments the allocator keeps apart from the default stream's). A CUDA
    reduction that splits its outputs across blocks takes its staging buffer and semaphores
    (:mod:`fxmem.trace.kernels.cuda.reduce_replay`, sized at ``B``) after its outputs and frees them
    before the op's inputs go.

    cuDNN's convolution workspaces are not in the trace: their size is the algorithm's that
    cuDNN picks. ``cudnn_workspace`` (bytes) allocates that much at every convolution, after
    its outputs, and frees it when the op ends; in ``convolution_backward``, after the input's
    gradient and again after the weight's (one cuDNN call each), the bias gradient after both
    (:mod:`fxmem.trace.kernels.cuda.call_order`). Under ``CUDNN_CONV_WSCAP_DBG=N`` (MiB), cuDNN
    offers no configuration with a larger workspace, so ``N * 2**20`` bounds what each call
    adds; 0 (the default) leaves the workspaces out."""
    return _replayed(_memory, liveness, B, config, compute_capability, cublas_workspace,
                     cudnn_workspace)


def _memory(liveness, B, config, compute_capability, cublas_workspace,  # noqa: N803
            cudnn_workspace) -> DeviceMemory:
    r = _Replay(liveness, B, config, compute_capability, cublas_workspace, cudnn_workspace)
    r.start()
    r.step(warm_up=True)
    r.end_step()
    a = r.allocator
    a.empty_cache()
    a.reset_peak()
    base_alloc, base_res = a.allocated, a.reserved
    phase_alloc, phase_res = r.step(by_phase=True)
    return DeviceMemory(B, max(phase_alloc.values(), default=base_alloc),
                        max(phase_res.values(), default=base_res), base_alloc, base_res,
                        phase_alloc, phase_res, tuple(r.workspaces))


@dataclass(frozen=True)
class DeviceRun:
    """Whether training at batch size ``B`` runs within ``capacity_bytes`` of device memory
    (what the caching allocator can get: the card's capacity minus the CUDA context).

    ``fits``: no step ran out of memory. ``steps``: steps replayed (the warm-up, then steps
    until one needed no new device memory, at most :data:`MAX_STEPS`). ``max_allocated`` /
    ``max_reserved``: the peaks over those steps, bytes. ``oom``: for a run that does not
    fit, where the allocator gave up: ``(step, op index, op, phase, module)`` of the op
    whose allocation failed (op index -1: before the first op), and ``message``: the
    allocator's out-of-memory message. ``num_alloc_retries``: the times the allocator
    freed its cache and tried again, as ``torch.cuda.memory_stats()`` counts them.
    """

    B: int
    capacity_bytes: int
    fits: bool
    steps: int
    max_allocated: int
    max_reserved: int
    num_alloc_retries: int
    oom: tuple | None = None
    message: str = ""


MAX_STEPS = 6
STATE = ("param", "buffer", "optimizer_state")


def state_bytes(liveness) -> int:
    """Bytes of the parameters, buffers and optimizer state on the device that no step
    frees and whose sizes do not depend on B: the same in a trace at any B, and all held at
    once from the first step's optimizer phase on (:func:`run_on_device` allocates the
    optimizer state there, beside the rest). Block rounding only adds to them, so a device
    whose allocator cannot get this many bytes runs no B."""
    from ..memory.liveness import _events

    graph = liveness.graph
    freed = {sid for sids in _events(graph)[1] for sid in sids}
    return sum(int(s.size.expr) for s in graph.storages
               if s.created_by < 0 and s.category in STATE and s.sid not in freed
               and not _host_resident(s) and not s.size.expr.free_symbols)


def run_on_device(liveness, B: int, capacity_bytes: int, config=None,  # noqa: N803
                  compute_capability=(9, 0), cublas_workspace: int | None = None,
                  cudnn_workspace: int = 0) -> DeviceRun:
    """Train at batch size ``B`` on a device whose allocator can get ``capacity_bytes``:
    the parameters, buffers and batch, then step after step with no ``empty_cache()`` in
    between, as a training loop runs, through the caching allocator with its out-of-memory
    path (``malloc``: on a failed cudaMalloc, free the cached blocks that are whole segments
    and retry, then raise: ``c10/cuda/CUDACachingAllocator.cpp``, see
    :mod:`fxmem.device.caching_allocator`). The loop stops after the first step that
    needed no new device memory (the next ones replay it) or after :data:`MAX_STEPS`.

    >>> import torch, fxmem
    >>> r = fxmem.analyze(torch.nn.Linear(1024, 1024), torch.randn(4, 1024),
    ...                   loss=lambda o: o.sum(), optimizer=torch.optim.SGD)
    >>> ok = r.runs_on_device(64, 2**30)
    >>> ok.fits, ok.max_reserved <= 2**30
    (True, True)
    >>> r.runs_on_device(64, 40 * 2**20).fits  # cuBLAS's 32 MiB beside the weight's segment
    False
    """
    config = _capped(config, capacity_bytes)
    return _replayed(_run, liveness, B, config, compute_capability, cublas_workspace,
                     cudnn_workspace)


def _run(liveness, B, config, compute_capability, cublas_workspace,  # noqa: N803
         cudnn_workspace) -> DeviceRun:
    return _steps(_Replay(liveness, B, config, compute_capability, cublas_workspace,
                          cudnn_workspace), B, config.capacity_bytes)


def run_at_dims(named, B: int, values: dict, capacity_bytes, config=None,  # noqa: N803
                compute_capability=None, cudnn_workspace: int = 0) -> DeviceRun | None:
    """:meth:`fxmem.Report.runs_on_device` of a report in named dims (``named``: its
    :class:`fxmem.memory.dims.DimsFormula`) at ``B`` and the dims' ``values``, replayed
    from its trace at that point (:meth:`~fxmem.memory.dims.DimsFormula.point`), or None:
    not on CUDA, a capacity that is no positive int, or no such point (the report at the
    values answers then: it says why, or traces ``B``)."""
    if named.device != "cuda" or isinstance(capacity_bytes, bool) or \
            not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
        return None
    point = named.point(B, values)
    if point is None:
        return None
    graph, sizes, ops = point
    return run_at_point(graph, B, sizes, ops, capacity_bytes, config,
                        compute_capability or named.trace.compute_capability, cudnn_workspace)


def run_at_point(graph, B: int, sizes: list, ops: tuple, capacity_bytes: int,  # noqa: N803
                 config=None, compute_capability=(9, 0), cudnn_workspace: int = 0) -> DeviceRun:
    """:func:`run_on_device` of a step whose storages' bytes at ``B`` are given: ``sizes``
    (one per storage of ``graph``, by sid) and ``ops`` (``graph``'s, with the named dims'
    values in: :func:`fxmem.memory.dims._ops_at`), for a trace in named dims replayed at a
    point without its report there (the longest length's search,
    :meth:`fxmem.memory.dims.DimsFormula.point`); ``graph`` keeps what the replays at
    every point share (each op's allocations and frees, its call order). Not kept: each
    call replays."""
    return _steps(_Replay(graph, B, _capped(config, capacity_bytes), compute_capability, None,
                          cudnn_workspace, sizes=sizes, ops=ops), B, capacity_bytes)


def _capped(config, capacity_bytes: int):
    """``config`` (default: :data:`~fxmem.device.allocator_config.DEFAULT_CONFIG`) with the
    device's ``capacity_bytes``."""
    import dataclasses

    from .allocator_config import DEFAULT_CONFIG

    return dataclasses.replace(config or DEFAULT_CONFIG, capacity_bytes=capacity_bytes)


def _steps(r, B, capacity_bytes) -> DeviceRun:  # noqa: N803
    """:func:`_run`'s steps over the replay ``r`` made at ``B``."""
    from .caching_allocator import OutOfMemory

    a, steps = r.allocator, 0
    try:
        r.start()
        while steps < MAX_STEPS:
            before = a.num_device_alloc
            r.step(warm_up=steps == 0)
            r.end_step()
            steps += 1
            if steps > 1 and a.num_device_alloc == before:
                break
    except OutOfMemory as e:
        op = r.ops[r.at] if r.at >= 0 else None
        where = (steps + 1, r.at, op.op if op else "(start)", op.phase if op else "start",
                 op.module if op else "")
        return DeviceRun(B, capacity_bytes, False, steps + 1, a.max_allocated, a.max_reserved,
                         a.num_alloc_retries, where, str(e))
    return DeviceRun(B, capacity_bytes, True, steps, a.max_allocated, a.max_reserved,
                     a.num_alloc_retries)


def _replayed(replay, liveness, B, config, cc, ws, cudnn):  # noqa: N803
    """``replay(liveness, B, config, cc, ws, cudnn)``, once per question for ``liveness``: a
    replay is a function of the step and of these numbers alone (the cuBLAS workspaces'
    sizes, read from the environment when not given, are in the key), and a report asks
    for the same one many times (its headline, the ways out, the batch-size answers, the
    planner's walk)."""
    from ..trace.kernels.cuda import blas

    key = (replay, B, config, tuple(cc) if cc else cc,
           cublas_workspace_bytes(cc) if ws is None else ws, blas.lt_workspace_bytes(), cudnn)
    kept = liveness.__dict__.setdefault("_replays", {})
    if key not in kept:
        kept[key] = replay(liveness, B, config, cc, ws, cudnn)
    return kept[key]


def _flat(replay) -> list:
    """A step's allocations and frees as ``(op index, event)``: ``sid`` made, ``~sid``
    freed, None where the op does more than make its storages in order (its call order,
    a matmul's workspace, a reduction's staging, the optimizer state made at its phase's
    first op) and :meth:`_Replay._op` runs it. The frees before the first op are not in
    it (:meth:`_Replay.start` leaves them to the step's end)."""
    out, prev = [], None
    calls, allocs, frees, add = replay.calls, replay.allocs, replay.frees, out.append
    for i, op in enumerate(replay.ops):
        phase = op.phase
        if i in calls or op.op in CUBLAS_OPS or op.reduce is not None or (
                phase == "optimizer" and prev != "optimizer"):
            add((i, None))
        else:
            for sid in allocs[i]:
                add((i, sid))
        for sid in frees[i + 1]:
            add((i, ~sid))
        prev = phase
    return out


def _per_graph(graph, key: str, make):
    """``make()`` once per step graph, kept in its ``__dict__`` as ``cached_property`` keeps
    its values: a step is replayed at many B and budgets (a search's walks and bisections),
    and its ops' call orders are the same each time."""
    d = graph.__dict__
    if key not in d:
        d[key] = make()
    return d[key]


def _call_orders(graph, allocs) -> dict:
    """Op index -> its call order (:func:`fxmem.trace.kernels.cuda.call_order.steps`) where
    that is more than its storages made in order (``allocs[i]``, by
    :func:`fxmem.memory.liveness._events`): a few ops of a step, kept small."""
    out = {}
    for i, (op, made) in enumerate(zip(graph.ops, allocs)):
        if len(made) < 2 and op.op not in CUDNN_CONV_OPS:
            continue  # its storage, if any, is all it makes (call_order.steps)
        steps = call_order.steps(op, graph.storages, made)
        if len(steps) != len(made) or any(k != "alloc" or s != m
                                          for (k, s), m in zip(steps, made)):
            out[i] = steps
    return out


class _Replay:
    """The step's allocations and frees, in trace order, through one
    :class:`fxmem.device.caching_allocator.CachingAllocator`."""

    def __init__(self, liveness, B, config, compute_capability, cublas_workspace,  # noqa: N803
                 cudnn_workspace, sizes=None, ops=None):
        # (``liveness``: a step's liveness, or its graph; ``sizes``, ``ops``: run_at_point's)
        from ..memory.liveness import _events
        from .caching_allocator import CachingAllocator

        graph = getattr(liveness, "graph", liveness)
        self.storages, self.ops = graph.storages, graph.ops if ops is None else ops
        self.allocs, self.frees = _per_graph(graph, "_events", lambda: _events(graph))
        self.calls = _per_graph(graph, "_call_orders", lambda: _call_orders(graph, self.allocs))
        self.events = _per_graph(graph, "_replay_events", lambda: _flat(self))
        if sizes is not None:
            self.size = [0 if _host_resident(s) else n for s, n in zip(self.storages, sizes)]
        else:
            self.size, at = [], {}  # at: Size -> its bytes at B (storages share them)
            for s in self.storages:
                v = 0 if _host_resident(s) else at.get(s.size)
                if v is None:
                    v = at[s.size] = s.size(B)
                self.size.append(v)
        self.stream = [s.stream for s in self.storages]  # each stream's blocks kept apart
        self.ws = cublas_workspace_bytes(compute_capability) if cublas_workspace is None \
            else cublas_workspace
        self.lt_ws = blas.lt_workspace_bytes()
        self.cudnn_workspace = cudnn_workspace
        # the CUDA reductions' staging (and dtype copies) at this B, in the order the kernel
        # allocates them after its outputs (fxmem.trace.kernels.cuda.reduce_replay)
        cap = tuple(compute_capability or (9, 0))
        self.staging = {i: st for i, op in enumerate(self.ops) if op.reduce is not None
                        and (st := reduce_replay.staging(op.op, op.reduce, B, cap))}
        self.allocator = CachingAllocator(config)
        self.handles: dict = {}
        self.workspaces: list = []
        # parameters and buffers first, in the order model.to(device) makes them
        # (Trace.placement), then the rest (the batch, optimizer state) in trace order
        placed = {n: k for k, n in enumerate(getattr(graph.trace, "placement", ()))}
        self.before = sorted(
            (s for s in self.storages if s.created_by < 0),
            key=lambda s: (0, placed[s.name]) if s.category in ("param", "buffer")
            and s.name in placed else (1, s.sid))
        # what the step frees of what was there before it: the previous step's gradients
        # under a late zero_grad (zero_grad_at="backward") are freed there and made again
        freed = {sid for sids in self.frees for sid in sids}
        self.remade = [s for s in self.before if s.sid in freed and s.category == "grad"]
        self.at = -1  # the op running (-1: before the first)

    def alloc(self, key, n, stream=0):
        self.handles[key] = self.allocator.malloc(n, stream)

    def free(self, key):
        h = self.handles.pop(key, None)
        if h is not None:
            self.allocator.free(h)

    def start(self):
        """The parameters, buffers and batch (optimizer state and gradients come later),
        and a wrapper's own storages (DDP's gradient buckets, ``<DDP reducer>[i]``): made
        with the model when DDP is constructed, and made again where the constructor's were
        freed when its buckets are rebuilt (``Reducer::initialize_buckets`` clears the old
        ones first), before any step's blocks are cached: a large bucket keeps the segment
        made for it, not a cached 32 MiB cuBLAS workspace's (tests/test_fake_gpu_parallel.py
        ``ddp-wide``: 123,731,968 B reserved predicted at B=4 with the buckets made at the
        warm-up's optimizer phase, 104,857,600 B measured and now predicted)."""
        late = {"optimizer_state", "grad"}
        for s in self.before:
            if s.category not in late or s.name.startswith(("grad_scaler.", "<")):
                self.alloc(s.sid, self.size[s.sid], s.stream)

    def step(self, warm_up: bool = False, by_phase: bool = False):
        """One step. ``warm_up``: the first, where the optimizer state appears at the
        optimizer phase and each thread's cuBLAS workspace at its first matmul.
        ``by_phase``: reset the peaks at each phase and return the phases' peaks
        (allocated, reserved)."""
        a, ops = self.allocator, self.ops
        phase_alloc, phase_res, phase = {}, {}, None
        if not by_phase:
            self._events(warm_up)
        for i, op in enumerate(ops if by_phase else ()):
            self.at = i
            if op.phase != phase:
                if phase is not None:
                    phase_alloc[phase] = max(phase_alloc.get(phase, 0), a.max_allocated)
                    phase_res[phase] = max(phase_res.get(phase, 0), a.max_reserved)
                a.reset_peak()
                phase = op.phase
            self._op(i, op, warm_up)
            for sid in self.frees[i + 1]:
                self.free(sid)
        if warm_up and self.cudnn_workspace and any(op.op in CUDNN_CONV_OPS for op in ops):
            self.workspaces.append(("cuDNN workspace per convolution call (freed after it)",
                                    self.cudnn_workspace))
        if warm_up and blas.PER_CALL:
            used = {op.blas for op in ops if op.op in CUBLAS_OPS}
            for lib, what, n in (("cublas", "cuBLAS", self.ws), ("cublaslt", "cuBLASLt",
                                                                 self.lt_ws)):
                if n and lib in used:
                    self.workspaces.append((f"{what} workspace per call (freed after it)", n))
        if warm_up and self.staging:
            what, n = max((w for st in self.staging.values() for w in st), key=lambda w: w[1])
            self.workspaces.append((f"{what} (the largest of a CUDA reduction; freed after it)",
                                    n))
        if phase is not None:
            phase_alloc[phase] = max(phase_alloc.get(phase, 0), a.max_allocated)
            phase_res[phase] = max(phase_res.get(phase, 0), a.max_reserved)
        return phase_alloc, phase_res

    def _events(self, warm_up: bool) -> None:
        """The loop of :meth:`step` over :func:`_flat`'s events: what it does per op, the
        ops with nothing but their storages made and freed in order (most of a step) run
        as those events alone, the rest as :meth:`_op` runs them."""
        handles, size, stream = self.handles, self.size, self.stream
        malloc, release = self.allocator.malloc, self.allocator.free
        ops, at = self.ops, -1
        try:
            for at, ev in self.events:
                if ev is None:
                    self._op(at, ops[at], warm_up)
                elif ev >= 0:
                    handles[ev] = malloc(size[ev], stream[ev])
                else:
                    h = handles.pop(~ev, None)
                    if h is not None:
                        release(h)
        finally:
            self.at = at

    def _op(self, i, op, warm_up: bool) -> None:
        """Op ``i``'s own allocations in :meth:`step`, its frees after it left out."""
        a = self.allocator
        self.at = i
        if warm_up:
            self._first_use(i, op)
        self._call(i, op)
        if warm_up:
            self._first_workspace(op)
        if blas.PER_CALL and op.op in CUBLAS_OPS:  # 2.15: taken and freed by each call
            n = self.lt_ws if op.blas == "cublaslt" else self.ws
            if n:
                a.free(a.malloc(n))
        if i in self.staging:  # freed when the launch returns, the last first
            held = [a.malloc(n) for _, n in self.staging[i]]
            for h in reversed(held):
                a.free(h)

    def _call(self, i, op):
        """Op ``i``'s own allocations, in the order its kernel makes them
        (:func:`fxmem.trace.kernels.cuda.call_order.steps`): its storages, the temporaries it frees
        before it returns, and each cuDNN call's workspace (``cudnn_workspace`` bytes, held
        while the call runs: a convolution's, after its output; ``convolution_backward``'s
        two calls, after the input's gradient and after the weight's)."""
        a = self.allocator
        steps = self.calls.get(i)
        if steps is None:  # its storages, in order
            for sid in self.allocs[i]:
                self.alloc(sid, self.size[sid], self.stream[sid])
            return
        for kind, sid in steps:
            if kind == "alloc":
                self.alloc(sid, self.size[sid], self.stream[sid])
            elif kind == "free":
                self.free(sid)
            elif self.cudnn_workspace:
                a.free(a.malloc(self.cudnn_workspace))

    def _first_use(self, i, op):
        ops = self.ops
        if op.phase == "optimizer" and (i == 0 or ops[i - 1].phase != "optimizer"):
            remade = {s.sid for s in self.remade}  # this step made them already
            for s in self.before:
                if s.sid not in self.handles and s.sid not in remade:
                    self.alloc(s.sid, self.size[s.sid], s.stream)

    def _first_workspace(self, op):
        """Up to 2.14, a thread's first matmul gets its cuBLAS workspace, after the op's
        output (``getCurrentCUDABlasHandle`` runs inside the kernel: seen on 2.14.1's
        binary on the fake GPU, ``at::cuda::getNewWorkspace`` after the output's block)."""
        if op.op in CUBLAS_OPS and self.ws and not blas.PER_CALL:
            thread = "backward" if op.phase == "backward" else "main"
            if ("ws", thread) not in self.handles:
                self.alloc(("ws", thread), self.ws)
                self.workspaces.append((f"cuBLAS workspace ({thread} thread)", self.ws))

    def end_step(self):
        """The step's leftovers (the output, set_to_none gradients) are freed; gradients the
        next step frees late (``zero_grad_at="backward"``) stay: the blocks of this step's are
        taken again for them, as the same sizes are asked for right after the frees."""
        self.at = len(self.ops)
        for s in self.storages:
            if s.created_by >= 0:
                self.free(s.sid)
        for s in self.remade:
            if s.sid not in self.handles:
                self.alloc(s.sid, self.size[s.sid], s.stream)
