"""A rank's step under FSDP2 derived from another rank's trace: of the same world size, or
of another.

Ranks run the same ops on storages of the same sizes, but for what the world size and each
rank's own rows of a parameter size. ``fully_shard`` pads every rank's shard to the largest
(``ceil(rows / world_size)`` rows: ``FSDPParam._init_sharded_param``), so within a world
size the shards, the gathered parameters, FSDP2's all-gather and reduce-scatter buffers and
the gradients (views of the padded reduce-scatter output) are alike on every rank; the
optimizer's state (``zeros_like`` of the rank's unpadded shard) and the optimizer step's
temporaries (each the shape of the parameter it updates) have the rank's own rows. Over
another world size the padded shards and FSDP2's buffers (told apart while the step was
traced: :mod:`fxmem.trace.parallel.fsdp_buffers`) change too, and so does what CUDA's copy
kernels pack for them (``fsdp.split_with_sizes_copy``, ``fsdp.chunk_cat``: sized by
fxmem's own rule). So :func:`other_rank` and :func:`at_world_size` take one trace and
give those storages the other rank's sizes: the same ops, the same storages, the others'
sizes. The derived trace keeps the traced one's graph, with the shapes it changed
(``Trace.shaped_as``, ``Trace.reshaped``), so that the ops writing those storages and the
optimizer's on the rank's own rows count their FLOPs on the rank's shapes
(:mod:`fxmem.checkpoint.flops`): a plan's recompute share is the traced rank's.

Only where that holds for certain (``None`` otherwise, and the rank is traced): a plain
:class:`fxmem.FSDP` (no CPU offload, no HSDP; over another world size, the same options
over two ranks or more), no compiled code, every parameter sharded on dim 0 with rows on
both ranks, every one of FSDP2's buffers and shards of the size its rule gives, and no two
parameters of one shape on the first rank with unlike shapes on the other (a storage is
matched to its parameter by its shape). Checked against the traced rank, storage by
storage and FLOPs by phase, on CPU and CUDA kernels (``tests/test_other_ranks.py``).

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 3))
>>> r = fxmem.analyze(m, torch.randn(4, 8), loss=torch.sum, optimizer=torch.optim.Adam,
...                   device="cpu", parallel=fxmem.FSDP(4))
>>> [(g.ranks, g.report.trace.derived_from) for g in r.groups]  # rank 3 has no rows of 1.
[((0, 1), None), ((2,), 0), ((3,), None)]
>>> t = at_world_size(r.groups[0].report.trace, fxmem.FSDP(4), fxmem.FSDP(3), m)
>>> t.derived_from, t.derived_world_size
(0, 4)
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import sympy
import torch

from ...formula.symbols import Size
from ..plans.checkpointing import user_path
from .fsdp import FSDP, _unique
from .fsdp_buffers import padded_rows

COPY_KERNELS = ("fsdp.split_with_sizes_copy.default", "fsdp.chunk_cat.default")


def other_rank(trace, parallel, model, rank: int, first: int):
    """The trace of ``rank`` derived from ``trace``, rank ``first``'s step under
    ``parallel`` of ``model`` (its parameters' whole shapes), or None where the module
    docstring's conditions fail."""
    return _derived(trace, model, (parallel, first), (parallel, rank))


def at_world_size(trace, was, parallel, model):
    """Rank 0's trace under ``parallel`` derived from ``trace``, rank 0's step under
    ``was`` (``parallel`` over another world size), or None where the module docstring's
    conditions fail."""
    if type(was) is not FSDP or replace(was, world_size=parallel.world_size) != parallel \
            or min(was.world_size, parallel.world_size) < 2:
        return None
    k = was.reshard_after_forward  # an int: shards kept after the forward over k ranks,
    if not isinstance(k, bool) and not all(  # or at k = the world size, FSDP2's True
            1 < k < w and w % k == 0 for w in (was.world_size, parallel.world_size)):
        return None
    return _derived(trace, model, (was, 0), (parallel, 0))


def _derived(trace, model, was: tuple, now: tuple):
    """``trace``, the step of rank ``was[1]`` under ``was[0]``, as rank ``now[1]`` under
    ``now[0]``'s, or None."""
    shapes = _local_shapes(model, was, now)
    if shapes is None or trace.compiled or trace.compiled_parts:
        return None
    (a, _), (b, _) = was, now
    whole = {user_path(n): tuple(p.shape) for n, p in model.named_parameters()}  # (as named)
    ops, out = trace.ops, []
    for s in trace.storages:
        if a.world_size != b.world_size and (s.fsdp_buffer is not None or s.category == "param"):
            s = _rescaled(s, whole, a.world_size, b.world_size)
            if s is None:
                return None
            out.append(s)
            continue
        mine = s.category == "optimizer_state" or (
            s.created_by >= 0 and ops[s.created_by].phase == "optimizer")
        to = shapes.get(tuple(s.shape)) if mine else None
        if to is None:
            out.append(s)
            continue
        if not _whole(s, prod(s.shape)):
            return None  # not a whole tensor of that shape: not what the module docstring says
        out.append(replace(s, shape=to, size=Size.of(prod(to) * s.dtype.itemsize)))
    if a.world_size != b.world_size:
        out = _packed(trace, out, b.world_size)
        if out is None:
            return None
    moved = {"derived_world_size": a.world_size} if a.world_size != b.world_size else {}
    graph = dict(trace.shaped_as)  # (a trace derived already: the graph is its source's)
    shaped = tuple((s.sid, graph.get(s.sid, tuple(o.shape))) for o, s in zip(trace.storages, out)
                   if graph.get(s.sid, tuple(o.shape)) != tuple(s.shape))
    rows = {g: shapes.get(t, t) for g, t in trace.reshaped}  # the graph's -> this rank's
    rows.update((k, v) for k, v in shapes.items() if k not in rows)
    return replace(trace, storages=tuple(out), derived_from=was[1], shaped_as=shaped,
                   reshaped=tuple((g, t) for g, t in rows.items() if g != t), **moved)


def _whole(s, numel: int) -> bool:
    """Is storage ``s`` of ``numel`` elements of its dtype, an int of bytes?"""
    return s.size.expr.is_Integer and s.dtype is not None and \
        int(s.size.expr) == numel * s.dtype.itemsize


def _rescaled(s, whole: dict, w: int, to: int):
    """Storage ``s`` (one of FSDP2's buffers, or a parameter's padded shard) over ``to``
    ranks, given its step over ``w``; None when its size is not the rule's."""
    buf = s.fsdp_buffer
    if buf is not None:
        if not (buf.holds_at(w) and buf.holds_at(to)) or not s.size.expr.is_Integer \
                or int(s.size.expr) != buf.nbytes(w):
            return None
        n = buf.nbytes(to)
        return replace(s, size=Size.of(n), shape=_flat(s, n))
    shape = whole.get(s.name)
    if not shape or s.dtype is None:
        return None
    cols = prod(shape[1:])
    if not _whole(s, padded_rows(shape[0], w) * cols):
        return None
    rows = padded_rows(shape[0], to)
    return replace(s, size=Size.of(rows * cols * s.dtype.itemsize),
                   shape=(rows, *s.shape[1:]) if s.shape and s.shape[0] == padded_rows(
                       shape[0], w) else (rows * cols,))


def _flat(s, nbytes: int) -> tuple:
    """The shape of buffer ``s`` at ``nbytes`` (its first tensor's, flat or not: the
    leading dim takes the change)."""
    n = nbytes // (s.dtype.itemsize if s.dtype is not None else 1)
    return (n,) if len(s.shape) <= 1 else (n // prod(s.shape[1:]), *s.shape[1:])


def _packed(trace, storages: list, world_size: int):
    """``storages`` with what CUDA's copy kernels of FSDP2 pack for the device
    (:data:`COPY_KERNELS`) sized for ``world_size`` by fxmem's rule
    (:func:`fxmem.trace.kernels.cuda.workspaces.workspace_bytes`), or None."""
    from ..kernels.cuda.workspaces import workspace_bytes

    out = list(storages)
    for op in trace.ops:
        if op.op not in COPY_KERNELS:
            continue
        packs = [s for s in op.new_sids if "pack_vecs" in out[s].name]
        if not packs:
            continue
        buf = next((out[s].fsdp_buffer for s in op.in_sids if out[s].fsdp_buffer is not None
                    and out[s].fsdp_buffer.kind in ("all_gather_output",
                                                    "reduce_scatter_input")), None)
        if buf is None or len(packs) != 1:
            return None
        got = workspace_bytes(*_copy_call(op.op, buf, world_size),
                              capability=trace.compute_capability)
        if len(got) != 1:
            return None
        out[packs[0]] = replace(out[packs[0]], size=Size.of(sympy.Integer(got[0][1])))
    return out


def _copy_call(name: str, buf, world_size: int) -> tuple:
    """``(func, args, kwargs, out)`` of FSDP2's copy kernel ``name`` over ``buf``'s
    parameters at ``world_size``, on meta tensors (as ``foreach_all_gather_copy_out`` and
    ``foreach_reduce`` call them)."""
    dtype = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[
        buf.itemsize]
    shards = buf.shards(world_size)

    def meta(*shape):
        return torch.empty(shape, dtype=dtype, device="meta")
    func = getattr(getattr(torch.ops.fsdp, name.split(".")[1]), "default")
    gathered = meta(world_size, sum(shards))
    if name == COPY_KERNELS[0]:
        return func, (gathered, shards), {"dim": 1, "out": [meta(world_size, n)
                                                           for n in shards]}, None
    return func, ([meta(*s) for s in buf.shapes],), {"dim": 0, "num_chunks": world_size,
                                                    "out": gathered}, None


def _local_shapes(model, was: tuple, now: tuple) -> dict | None:
    """Each parameter's shard shape on rank ``was[1]`` of ``was[0]`` -> on rank ``now[1]``
    of ``now[0]`` (those that differ), or None where the ranks cannot be told apart by it."""
    parallels = was[0], now[0]
    if any(type(p) is not FSDP or p.offload or p.replicate != 1 for p in parallels):
        return None
    out: dict = {}
    for p in _unique(model.parameters()):
        if p.dim() == 0:
            return None
        rows = p.shape[0]
        a, b = was[0].shard_rows(rows, was[1]), now[0].shard_rows(rows, now[1])
        if a == 0 or b == 0:
            return None
        x, y = (a, *p.shape[1:]), (b, *p.shape[1:])
        if out.setdefault(x, y) != y:
            return None  # two parameters alike on ``was``, unlike on ``now``
    return {k: v for k, v in out.items() if k != v}
