"""Where a prediction and a real CUDA step part ways: the first allocation that differs.

When a validation case misses, the peak alone does not say why. ``fxmem.measure(...,
record_history=True)`` on CUDA records the measured step with
``torch.cuda.memory._record_memory_history`` and keeps, from the allocator's snapshot, every
allocation the step made (its requested bytes and the innermost Python frame that made it).
:func:`predicted_allocations` lists what fxmem expects the same step to allocate, op by op, in
the trace's order, and :func:`first_divergence` walks both lists to the first allocation whose
size differs (or that one of them lacks), naming the op, its module and the user's frame.

>>> import torch, fxmem
>>> r = fxmem.analyze(torch.nn.Linear(8, 4), torch.randn(2, 8), loss=lambda o: o.sum())
>>> want = [a for a in predicted_allocations(r, B=3) if not a.what]  # from 2.15, workspaces too
>>> [a.nbytes for a in want][:2], want[0].op
([48, 4], 'aten.addmm.default')
>>> real = [(a.nbytes, "train.py:10") for a in want]
>>> first_divergence(want, real) is None
True
>>> real[1] = (8, "train.py:11")
>>> first_divergence(want, real).describe()
'allocation 1: predicted 4 B in aten.sum.default (<loss>), measured 8 B at train.py:11'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    """One allocation fxmem predicts: ``nbytes`` requested (before the allocator's rounding)
    by op ``op_index`` (``op``, in ``module``, ``phase``). ``what``: ``""`` for a storage of
    the trace, else the library buffer the op takes for its call (``"reduction staging"``,
    ``"cuBLAS workspace"``, ``"cuBLASLt workspace"``)."""

    nbytes: int
    op_index: int
    op: str
    module: str
    phase: str
    what: str = ""


@dataclass(frozen=True)
class Divergence:
    """The first allocation where prediction and measurement differ. ``index``: its position
    in both lists; ``predicted``: fxmem's :class:`Allocation` there (None: the step made more
    allocations than predicted); ``measured_bytes`` and ``measured_frame`` (None: fewer)."""

    index: int
    predicted: Allocation | None
    measured_bytes: int | None
    measured_frame: str | None

    def describe(self) -> str:
        """One line for a table."""
        p = self.predicted
        want = ("nothing more" if p is None else
                f"{p.nbytes:,} B{f' ({p.what})' if p.what else ''} in {p.op} "
                f"({p.module or '(root)'})")
        got = ("nothing more" if self.measured_bytes is None else
               f"{self.measured_bytes:,} B at {self.measured_frame or '(no Python frame)'}")
        return f"allocation {self.index}: predicted {want}, measured {got}"


def predicted_allocations(report, B: int) -> list[Allocation]:  # noqa: N803
    """What the measured step allocates on the device at batch size ``B``, in order: each
    op's new storages with a non-zero device size (host tensors and empty ones take no
    block), the step's storages only (not those live before it), then the staging a CUDA
    reduction takes after its outputs (:mod:`fxmem.trace.kernels.cuda.reduce_replay`). Below the
    report's :attr:`~fxmem.report.result.Report.min_batch_size`, the step traced at ``B``
    (as ``cuda_memory(B)`` has it)."""
    from ..memory.sizes import device_sizes
    from ..trace.kernels.cuda import reduce_replay

    report = report._small(B) or report
    graph = report.liveness.graph
    cap = tuple(graph.trace.compute_capability)
    storages = graph.storages
    sizes = device_sizes(storages, "cuda")
    out = []
    for op in graph.ops:
        for sid in _in_call_order(op, storages):
            s = storages[sid]
            if s.created_by != op.index or sizes[sid].expr == 0:
                continue
            n = s.size(B)
            if n:
                out.append(Allocation(n, op.index, op.op, op.module, op.phase))
        for _, n in reduce_replay.staging(op.op, op.reduce, B, cap):
            out.append(Allocation(n, op.index, op.op, op.module, op.phase,
                                  "reduction staging"))
        n = _per_call_workspace(op, graph.trace.compute_capability)
        if n:
            lib = "cuBLASLt" if op.blas == "cublaslt" else "cuBLAS"
            out.append(Allocation(n, op.index, op.op, op.module, op.phase,
                                  f"{lib} workspace"))
    return out


def _in_call_order(op, storages):
    """The op's new storages in the order its CUDA kernel makes them
    (:func:`fxmem.trace.kernels.cuda.call_order.steps`: a dropout's mask first; a cuDNN convolution
    backward's gradient copy first, its bias gradient last)."""
    from ..trace.kernels.cuda import call_order

    return [sid for kind, sid in call_order.steps(op, storages, op.new_sids)
            if kind == "alloc"]


def _per_call_workspace(op, capability) -> int:
    """From 2.15 a matmul takes its cuBLAS (or cuBLASLt) workspace from the caching allocator
    for the call, after its output (:mod:`fxmem.trace.kernels.cuda.blas`), as the replay does."""
    from ..device.allocator import CUBLAS_OPS, cublas_workspace_bytes
    from ..trace.kernels.cuda import blas

    if not blas.PER_CALL or op.op not in CUBLAS_OPS:
        return 0
    return blas.lt_workspace_bytes() if op.blas == "cublaslt" else \
        cublas_workspace_bytes(capability)


def first_divergence(predicted, measured, ordered: bool = False) -> Divergence | None:
    """The first position where ``predicted`` (:class:`Allocation` s) and ``measured``
    (``(nbytes, frame)`` pairs, in the order the device made them) differ in size, or where
    one list ends before the other; None when they agree throughout. The allocations of one
    op may come in any order (a kernel may allocate its second output first): each op's are
    compared as a multiset, and a mismatch is reported at its first differing position.
    ``ordered``: one op's allocations must come in the predicted order too (where the caching
    allocator puts each block depends on it: a dropout's mask before its output, say).

    >>> want = [Allocation(4096, 0, "aten.native_dropout.default", "drop", "forward"),
    ...         Allocation(1024, 0, "aten.native_dropout.default", "drop", "forward")]
    >>> first_divergence(want, [(1024, None), (4096, None)]) is None
    True
    >>> first_divergence(want, [(1024, None), (4096, None)], ordered=True).index
    0
    """
    i = 0
    for group in _by_op(predicted):
        got = list(measured[i:i + len(group)])
        key = (lambda x: x) if ordered else sorted
        if key([n for n, _ in got]) != key([a.nbytes for a in group]):
            for j, p in enumerate(group):
                m = got[j] if j < len(got) else (None, None)
                if m[0] != p.nbytes:
                    return Divergence(i + j, p, m[0], m[1])
        i += len(group)
    if i < len(measured):
        return Divergence(i, None, *measured[i])
    return None


def _by_op(predicted):
    group = []
    for a in predicted:
        if group and group[-1].op_index != a.op_index:
            yield group
            group = []
        group.append(a)
    if group:
        yield group


def snapshot_allocations(snapshot: dict, device: int = 0) -> list[tuple[int, str | None]]:
    """``(nbytes, frame)`` of each ``alloc`` event in a ``torch.cuda.memory._snapshot()``'s
    trace for ``device``: the requested size (the allocator's ``orig_size``) and the innermost
    Python frame recorded with it (``file:line in function``)."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    out = []
    for e in events:
        if e.get("action") != "alloc":
            continue
        frame = None
        for f in e.get("frames") or ():
            name = f.get("filename", "")
            if name.endswith(".py") and "/torch/" not in name:
                frame = f"{name}:{f.get('line')} in {f.get('name')}"
                break
        out.append((int(e["size"]), frame))
    return out
