"""The CUDA reductions' staging at one batch size: what the tracer keeps of a reduction op
(:func:`record`) and what the allocator replay evaluates from it (:func:`staging`).

The rules of :mod:`fxmem.trace.kernels.cuda.reductions` (``gpu_reduce_kernel``'s global-memory
staging and semaphores, make_reduction's dtype copy, logsumexp's temporaries) are piecewise in B: in
the symbolic formula they would make every CUDA report's peak unreadable. So the trace keeps,
per reduction op, its arguments by schema name with each tensor as its shape, strides, storage
offset and dtype (sympy expressions in B: :attr:`fxmem.trace.ledger.records.OpInfo.reduce`), and the
replay (:mod:`fxmem.device.allocator`) runs the rule with B substituted. ``Report.peak`` stays
live bytes; ``Report.cuda_memory`` and ``runs_on_device`` include the staging.

>>> import torch
>>> aten = torch.ops.aten
>>> from fxmem.formula.symbols import B
>>> g = torch.empty(4096, 96)
>>> spec = record(aten.sum.dim_IntList, (g, [0]), {}, lambda e: e)
>>> staging(str(aten.sum.dim_IntList), spec, 1)
[('Reduce.cuh global reduce staging (cta_buf)', 786432), ('Reduce.cuh semaphores', 8)]
>>> spec = (("self", (TENSOR, (B, 96), (96, 1), 0, torch.float32)), ("dim", (0,)),
...         ("keepdim", False), ("dtype", None))
>>> staging(str(aten.sum.dim_IntList), spec, 64), staging(str(aten.sum.dim_IntList), spec, 4096)[1]
([], ('Reduce.cuh semaphores', 8))
"""

from __future__ import annotations

import functools

import sympy
import torch

from ....formula.symbols import B
from .reductions import RULES

TENSOR = "<tensor>"  # marks a tensor argument: (TENSOR, shape, strides, offset, dtype)
_BY_NAME = {str(f): f for f in RULES}


def record(func, args, kwargs, sub) -> tuple | None:
    """The arguments by schema name of reduction op ``func`` as ``(name, value)`` pairs, or
    None for an op with no rule; ``sub`` maps a SymInt's sympy expression to one in B."""
    if func not in RULES:
        return None
    from .sdpa_memory import _by_name

    def conv(x):
        if isinstance(x, torch.Tensor):
            return (TENSOR, tuple(conv(d) for d in x.shape), tuple(conv(s) for s in x.stride()),
                    conv(x.storage_offset()), x.dtype)
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return sub(x.node.expr)
        if isinstance(x, (list, tuple)):
            return tuple(conv(v) for v in x)
        return x

    return tuple((k, conv(v)) for k, v in _by_name(func, args, kwargs).items())


class _Free(Exception):
    """A size still holds a symbol other than B (a named dim, a count the data sets)."""


def _at(x, b):
    if isinstance(x, sympy.Basic):
        v = x.xreplace({B: sympy.Integer(b)})
        if v.free_symbols:
            raise _Free
        return bool(v) if isinstance(v, sympy.logic.boolalg.Boolean) else (
            int(v) if v.is_integer else float(v))
    if type(x) is tuple:
        if x and x[0] == TENSOR:
            shape, strides, offset, dtype = (_at(v, b) for v in x[1:])
            return torch.empty(0, dtype=dtype, device="meta").as_strided(shape, strides, offset)
        return tuple(_at(v, b) for v in x)
    return x


@functools.lru_cache(maxsize=4096)
def staging(op: str, spec: tuple | None, b: int, capability=(9, 0),
            num_sms: int | None = None) -> list:
    """``[(what, nbytes)]``: the temporaries the CUDA kernel of reduction ``op`` (its name,
    e.g. ``"aten.sum.dim_IntList"``) allocates after its outputs, in that order, at batch
    size ``b``, freed when it returns; ``[]`` when it takes none (or its sizes hold a symbol
    other than B)."""
    func = _BY_NAME.get(op)
    if func is None or spec is None:
        return []
    from .workspaces import _sms

    try:
        a = {k: _at(v, b) for k, v in spec}
    except _Free:
        return []
    got = RULES[func](a, tuple(capability), _sms(capability, num_sms)[0])
    return [(what, int(n)) for what, n in got if int(n)]
