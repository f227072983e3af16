"""What the target device adds on top of live bytes, at one batch size.

The formula of ``Report.peak`` counts each storage as the block it takes
(:mod:`fxmem.memory.sizes`: 512-byte blocks on CUDA). What ``torch.cuda.max_memory_allocated()``
and ``max_memory_reserved()`` report on top is a replay of the step's allocations through
the caching allocator (:mod:`fxmem.device.caching_allocator`: segments, block splitting and
the slack of unsplit large blocks) with the cuBLAS workspaces that PyTorch keeps:
:func:`cuda_memory` (``Report.cuda_memory(B)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.sizes import _host_resident

# --- the caching allocator, replayed over a step -------------------------------------------

# ops that run through cuBLAS (each thread's handle gets its own workspace on first use)
CUBLAS_OPS = frozenset(f"aten.{n}.default" for n in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
    "_addmm_activation"))


# ops that run through cuDNN on CUDA: each call allocates a workspace through the caching
# allocator and frees it when the call returns (convolution_backward: one call for the input's
# gradient, then one for the weight's; never both at once)
CUDNN_CONV_OPS = frozenset(f"aten.{n}.default" for n in (
    "convolution", "convolution_backward", "_convolution", "cudnn_convolution",
    "cudnn_convolution_transpose"))


def cublas_workspace_bytes(compute_capability=(9, 0), env: str | None = None) -> int:
    """PyTorch's cuBLAS workspace (``parseChosenWorkspaceSize`` in
    ``aten/src/ATen/cuda/CublasHandlePool.cpp``): ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT``
    pairs, SIZE in KiB) summed, else 32 MiB on compute capability 9.x (Hopper), 10.x and
    12.x (Blackwell), else 4096 KiB x 2 + 16 KiB x 8. cuBLASLt shares it by default
    (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``).

    >>> cublas_workspace_bytes((9, 0)), cublas_workspace_bytes((8, 0))
    (33554432, 8519680)
    >>> cublas_workspace_bytes((8, 0), ":4096:8")
    33554432
    """
    import re

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
    state appears at the optimizer phase and each thread's cuBLAS workspace at its first
    matmul (forward: the main thread; backward: autograd's), then ``empty_cache()``, a reset
    of the peaks, and the measured step. Storages keep the order of the trace.

    cuDNN's convolution workspaces are not in the trace: their size is the algorithm's that
    cuDNN picks. ``cudnn_workspace`` (bytes) allocates that much at every convolution, after
    its outputs, and frees it when the op ends. Under ``CUDNN_CONV_WSCAP_DBG=N`` (MiB), cuDNN
    offers no configuration with a larger workspace, so ``N * 2**20`` bounds what each call
    adds; 0 (the default) leaves the workspaces out."""
    from ..memory.liveness import _events
    from .caching_allocator import CachingAllocator

    graph = liveness.graph
    storages, ops = graph.storages, graph.ops
    allocs, frees = _events(graph)
    on_device = [not _host_resident(s) for s in storages]
    size = [s.size(B) if on_device[s.sid] else 0 for s in storages]
    ws = cublas_workspace_bytes(compute_capability) if cublas_workspace is None \
        else cublas_workspace
    a = CachingAllocator(config)
    handles: dict = {}

    def alloc(key, n):
        handles[key] = a.malloc(n)

    def free(key):
        h = handles.pop(key, None)
        if h is not None:
            a.free(h)

    def run_op(i, op):
        for sid in allocs[i]:
            alloc(sid, size[sid])
        if cudnn_workspace and op.op in CUDNN_CONV_OPS:  # held while the kernel runs
            a.free(a.malloc(cudnn_workspace))
        for sid in frees[i + 1]:
            free(sid)

    before = [s for s in storages if s.created_by < 0]
    late = {"optimizer_state", "grad"}
    for s in before:
        if s.category not in late or s.name.startswith("grad_scaler."):
            alloc(s.sid, size[s.sid])
    workspaces = []
    # warm-up step
    for i, op in enumerate(ops):
        if op.phase == "optimizer" and (i == 0 or ops[i - 1].phase != "optimizer"):
            for s in before:
                if s.sid not in handles:
                    alloc(s.sid, size[s.sid])
        if op.op in CUBLAS_OPS and ws:
            thread = "backward" if op.phase == "backward" else "main"
            if ("ws", thread) not in handles:
                alloc(("ws", thread), ws)
                workspaces.append((f"cuBLAS workspace ({thread} thread)", ws))
        run_op(i, op)
    if cudnn_workspace and any(op.op in CUDNN_CONV_OPS for op in ops):
        workspaces.append(("cuDNN workspace per convolution call (freed after it)",
                           cudnn_workspace))
    for s in storages:  # the step's leftovers: the output, set_to_none gradients
        if s.created_by >= 0:
            free(s.sid)
    a.empty_cache()
    a.reset_peak()
    base_alloc, base_res = a.allocated, a.reserved
    phase_alloc, phase_res, phase = {}, {}, None
    for i, op in enumerate(ops):
        if op.phase != phase:
            if phase is not None:
                phase_alloc[phase] = max(phase_alloc.get(phase, 0), a.max_allocated)
                phase_res[phase] = max(phase_res.get(phase, 0), a.max_reserved)
            a.reset_peak()
            phase = op.phase
        run_op(i, op)
    if phase is not None:
        phase_alloc[phase] = max(phase_alloc.get(phase, 0), a.max_allocated)
        phase_res[phase] = max(phase_res.get(phase, 0), a.max_reserved)
    return DeviceMemory(B, max(phase_alloc.values(), default=base_alloc),
                        max(phase_res.values(), default=base_res), base_alloc, base_res,
                        phase_alloc, phase_res, tuple(workspaces))
