"""FLOPs of a traced step, as sympy expressions in B.

PyTorch's own formulas (``torch.utils.flop_counter.flop_registry``: matmuls, convolutions,
attention) are applied to the shapes recorded in the traced graph, so they come out symbolic.
Three extensions, in one place here:

- ``ALIASES``: kernels that have a registered twin with the same leading arguments
  (the CPU flash-attention kernels PyTorch picks for SDPA on CPU, which have formulas of
  their own from torch 2.15 on: then those are used).
- ``OWN_FORMULAS``: formulas of ops PyTorch's registry lacks (a release that has one uses its
  own): ``aten._grouped_mm`` (transformers' MoE experts, :func:`grouped_mm_flop`).
- Pointwise ops (``torch.Tag.pointwise``): one FLOP per output element.

Ops that create no storage and write none (views, metadata) cost nothing. Every other op
without a formula is *uncounted*: listed in :attr:`FlopCount.uncounted`, never taken as zero.

>>> import torch, fxmem
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), train=False, device="cpu")
>>> r.flop_count.total          # addmm: 2 * B * 8 * 2
32*B
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod

import sympy
import torch
from torch.utils.flop_counter import flop_registry

from ..memory.dims import Specialized, args_in, nodes_and_values, value_in
from ..trace.blocks import Spliced
from ..trace.ledger import TensorDesc, Trace

aten = torch.ops.aten

ALIASES = {
    aten._scaled_dot_product_flash_attention_for_cpu:
        aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        aten._scaled_dot_product_flash_attention_backward,
}


def grouped_mm_flop(a_shape, b_shape, offs=None, *args, out_val=None, **kwargs):
    """FLOPs of ``aten._grouped_mm`` (``F.grouped_mm``): ``2 * M * K * N`` over its groups,
    every row of the dim the offsets split in some group (``offs[-1]`` that dim's size, as
    transformers' experts without expert parallelism route every token; a row past it is
    not computed). The four layouts (torch/_meta_registrations.py ``_meta_grouped_mm_common``):

    >>> grouped_mm_flop((64, 8), (4, 8, 16), (4,))       # (M, K) @ (G, K, N): rows split
    16384
    >>> grouped_mm_flop((8, 64), (64, 16), (4,))         # (K, M) @ (M, N): the sum split
    16384
    >>> grouped_mm_flop((4, 64, 8), (8, 16), (4,))       # (G, M, K) @ (K, N): columns split
    16384
    >>> grouped_mm_flop((4, 64, 8), (4, 8, 16))          # (G, M, K) @ (G, K, N): batched
    65536
    """
    if len(a_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[-1]
    if len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]


OWN_FORMULAS = {aten._grouped_mm: grouped_mm_flop}


@dataclass(frozen=True)
class FlopCount:
    """Floating-point operations of one step, sympy expressions in B.

    ``total``: every counted op; ``recompute``: the part spent re-running checkpointed
    forwards in backward; ``by_phase``: forward / backward / optimizer / ...;
    ``uncounted``: ``(op, times)`` for ops that do arithmetic but have no formula;
    ``from_pytorch``: the part counted by PyTorch's own formulas (what
    ``torch.utils.flop_counter.FlopCounterMode`` reports for the same step: not the CPU
    flash-attention kernels of ``ALIASES`` before torch 2.15, which it did not count).
    """

    total: sympy.Expr
    recompute: sympy.Expr
    by_phase: dict
    uncounted: tuple
    from_pytorch: sympy.Expr = sympy.Integer(0)


def _shape(v, reshaped: dict):
    if isinstance(v, TensorDesc):
        return reshaped.get(tuple(v.shape), tuple(v.shape))
    if isinstance(v, tuple):
        return tuple(_shape(x, reshaped) for x in v)
    return v


def _node_flops(node, values: dict, reshaped: dict | None = None) -> tuple[sympy.Expr | None,
                                                                          bool]:
    """FLOPs of one graph node with ``values`` put in its shapes and arguments (None: no
    formula), and whether PyTorch's formula gave them; ``reshaped``: graph shapes ->
    the shapes they have instead (see :func:`_reshaped`)."""
    func = node.target
    own = getattr(func, "overloadpacket", None)
    packet = own if own in flop_registry else ALIASES.get(own, own)  # torch 2.15 has its own
    formula = flop_registry.get(packet) or OWN_FORMULAS.get(packet)
    reshaped = reshaped or {}

    def arg(a):
        return _shape(value_in(a.meta.get("val"), values), reshaped) \
            if isinstance(a, torch.fx.Node) else a

    out = _shape(value_in(node.meta.get("val"), values), reshaped)
    if formula is not None:
        args = tuple(torch.fx.node.map_arg(a, arg) for a in args_in(node.args, values))
        kwargs = {k: torch.fx.node.map_arg(v, arg)
                  for k, v in args_in(node.kwargs, values).items()}
        try:  # FlopCounterMode counts an op of the registry, not its twin nor our own
            return (sympy.sympify(formula(*args, out_val=out, **kwargs)),
                    packet is own and packet in flop_registry)
        except Exception:  # noqa: BLE001 - a formula that cannot take these args
            return None, False
    if isinstance(func, torch._ops.OpOverload) and torch.Tag.pointwise in func.tags:
        outs = out if isinstance(out, tuple) and out and isinstance(out[0], tuple) else (out,)
        return sum((sympy.Mul(*s) for s in outs if isinstance(s, tuple)), sympy.Integer(0)), False
    return None, False


def op_flops(trace: Trace) -> dict:
    """FLOPs of each traced op with a formula: ``{op index in trace.graph: (expr, from
    PyTorch's registry)}``; ops missing from it have no formula. (A trace with its named
    dims fixed: its original's nodes, with their values put in.)"""
    source, values = trace.graph_source, {}
    if isinstance(source, Specialized):
        source, values = source.original.graph_source, source.values
    if isinstance(source, Spliced):  # copied blocks: each op costs what its pattern's does,
        # read from the recorded graph (the whole step's is not built for it)
        graph, at = source.old, source.source_of
        recorded = _graph_flops(graph, values)
        out = {j: recorded[i] for j, i in enumerate(at) if i in recorded}
    else:
        graph, values = nodes_and_values(trace)
        at, out = None, _graph_flops(graph, values)
    return _reshaped(trace, out, graph, values, at)


def _reshaped(trace: Trace, out: dict, graph, values: dict, at) -> dict:
    """``out`` with the FLOPs counted on this rank's shapes where a derivation changed them
    (a rank's trace derived from another's, whose graph it shares:
    :mod:`fxmem.trace.parallel.other_ranks`): of each op writing a storage given another
    shape (``trace.shaped_as``: FSDP2's buffers over another world size, the optimizer's
    state), and of the optimizer's ops and the gradients' sums on the rank's own rows
    (``trace.reshaped``, flat too: gradient accumulation adds flat views). ``at``: op
    index -> the index of the graph node it costs as (a spliced trace's), else its own; an
    op derived from another (a plan's step: ``op.source``) is that op, a re-run costs what
    the op it repeats costs."""
    was, rows = dict(trace.shaped_as), dict(trace.reshaped)
    if not was and not rows:
        return out
    rows.update({(prod(g),): (prod(t),) for g, t in trace.reshaped if len(g) > 1})
    nodes = {n.meta["index"]: n for n in graph.nodes
             if n.op == "call_function" and "index" in n.meta}
    storages = trace.storages
    for op in trace.ops:
        if op.recompute:
            continue
        key = op.index if op.source is None else op.source
        sids = {*op.out_sids, *op.new_sids, *op.written_sids}
        own = op.phase == "optimizer" or any(storages[s].category == "grad"
                                             for s in op.written_sids)
        shapes = {**(rows if own else {}),
                  **{was[s]: tuple(storages[s].shape) for s in sids if s in was}}
        node = nodes.get(key if at is None else at[key]) if shapes else None
        if node is not None:
            f, registered = _node_flops(node, values, shapes)
            if f is None:
                out.pop(key, None)
            else:
                out[key] = (f, registered)
    return out


def _graph_flops(graph, values: dict) -> dict:
    """``{node's op index: (FLOPs, from PyTorch's registry)}`` of ``graph``'s op nodes."""
    out = {}
    for node in graph.nodes:
        if node.op == "call_function" and "index" in node.meta:
            f, registered = _node_flops(node, values)
            if f is not None:
                out[node.meta["index"]] = (f, registered)
    return out


def count_flops(trace: Trace, per_op: dict | None = None) -> FlopCount:
    """Count the FLOPs of every op of ``trace`` (see the module docstring). An op derived
    from another (``op.source``, e.g. a recomputation) costs what that op costs."""
    per_op = op_flops(trace) if per_op is None else per_op
    by_phase: dict = {}  # terms, summed once (a sum grown a term at a time is quadratic)
    recompute, from_pytorch = [], []
    uncounted: Counter = Counter()
    for op in trace.ops:
        got = per_op.get(op.index if op.source is None else op.source)
        if got is None:
            if op.new_sids or op.written_sids:
                uncounted[op.op] += 1
            continue
        f, registered = got
        by_phase.setdefault(op.phase, []).append(f)
        if op.recompute:
            recompute.append(f)
        if registered:
            from_pytorch.append(f)
    phases = {k: sympy.expand(sympy.Add(*v)) for k, v in by_phase.items()}
    total = sympy.Add(*(t for v in by_phase.values() for t in v))
    return FlopCount(sympy.expand(total), sympy.expand(sympy.Add(*recompute)), phases,
                     tuple(sorted(uncounted.items())), sympy.expand(sympy.Add(*from_pytorch)))
