"""Another rank's step under FSDP2, derived from one rank's trace of the same world size.

Ranks of one world size run the same ops on storages of the same sizes, but for what each
rank's own rows of a parameter size. ``fully_shard`` pads every rank's shard to the largest
(``ceil(rows / world_size)`` rows: ``FSDPParam._init_sharded_param``), so the shards, the
gathered parameters, the all-gather and reduce-scatter buffers and the gradients (views of
the padded reduce-scatter output) are alike on every rank; the optimizer's state
(``zeros_like`` of the rank's unpadded shard) and the optimizer step's temporaries (each the
shape of the parameter it updates) have the rank's own rows. So :func:`other_rank` takes
the trace of the first group of ranks (:meth:`fxmem.FSDP.rank_groups`) and gives those
storages the other rank's rows: the same ops, the same storages, the others' sizes.

Only where that holds for certain (``None`` otherwise, and the rank is traced): a plain
:class:`fxmem.FSDP` (no CPU offload, no HSDP), every parameter sharded on dim 0 with rows on
both ranks, and no two parameters of one shape on the first rank with unlike shapes on the
other (a storage is matched to its parameter by its shape). Checked against the traced
rank, storage by storage, on CPU and CUDA kernels (``tests/test_other_ranks.py``).

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 3))
>>> r = fxmem.analyze(m, torch.randn(4, 8), loss=torch.sum, optimizer=torch.optim.Adam,
...                   device="cpu", parallel=fxmem.FSDP(4))
>>> [(g.ranks, g.report.trace.derived_from) for g in r.groups]  # rank 3 has no rows of 1.
[((0, 1), None), ((2,), 0), ((3,), None)]
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from ...formula.symbols import Size
from .fsdp import FSDP, _unique


def other_rank(trace, parallel, model, rank: int, first: int):
    """The trace of ``rank`` derived from ``trace``, rank ``first``'s step under
    ``parallel`` of ``model`` (its parameters' whole shapes), or None where the module
    docstring's conditions fail."""
    shapes = _local_shapes(parallel, model, first, rank)
    if shapes is None or trace.compiled or trace.compiled_parts:
        return None
    ops, out = trace.ops, []
    for s in trace.storages:
        mine = s.category == "optimizer_state" or (
            s.created_by >= 0 and ops[s.created_by].phase == "optimizer")
        to = shapes.get(tuple(s.shape)) if mine else None
        if to is None:
            out.append(s)
            continue
        was, now = prod(s.shape), prod(to)
        if not s.size.expr.is_Integer or s.dtype is None or \
                int(s.size.expr) != was * s.dtype.itemsize:
            return None  # not a whole tensor of that shape: not what the module docstring says
        out.append(replace(s, shape=to, size=Size.of(now * s.dtype.itemsize)))
    return replace(trace, storages=tuple(out), derived_from=first)


def _local_shapes(parallel, model, first: int, rank: int) -> dict | None:
    """Each parameter's shard shape on ``first`` -> on ``rank`` (those that differ), or None
    where the ranks cannot be told apart by it."""
    if type(parallel) is not FSDP or parallel.offload or parallel.replicate != 1:
        return None
    out: dict = {}
    for p in _unique(model.parameters()):
        if p.dim() == 0:
            return None
        rows = p.shape[0]
        a, b = parallel.shard_rows(rows, first), parallel.shard_rows(rows, rank)
        if a == 0 or b == 0:
            return None
        was, now = (a, *p.shape[1:]), (b, *p.shape[1:])
        if out.setdefault(was, now) != now:
            return None  # two parameters alike on ``first``, unlike on ``rank``
    return {k: v for k, v in out.items() if k != v}
