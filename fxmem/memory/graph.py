"""Stage 2: the step as a ``networkx.DiGraph`` of ops and the storages they create.

One node per aten op, in execution order (node key = op index), with attributes ``op``,
``phase``, ``module``, ``creates`` (storage ids) and ``bytes`` (sympy, in B, of what it
creates). An edge u -> v means op v reads a storage that op u created or last wrote. Views
and in-place results create nothing: they alias the storage they came from (``alias_of``).

>>> import torch
>>> from fxmem.trace import trace
>>> g = build_graph(trace(torch.nn.Linear(8, 2), torch.randn(4, 8),
...                       loss=lambda o: o.sum(), device="cpu"))
>>> [g.nx.nodes[i]["op"] for i in g.nx.successors(g.creator[3])][:1]
['aten.sum.default']
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import sympy

from ..trace.ledger import Trace


@dataclass(frozen=True)
class StorageGraph:
    """Result of :func:`build_graph`. ``creator[sid]`` is the op index that made storage
    sid; ``nx``, the ``networkx.DiGraph``, is built when first read (the liveness pass and
    the allocator's replay read the trace's storages and ops alone: a plan's derived step
    is replayed dozens of times in a search and never asked for its graph)."""

    trace: Trace
    creator: dict

    @property
    def storages(self):
        return self.trace.storages

    @property
    def ops(self):
        return self.trace.ops

    @cached_property
    def nx(self) -> nx.DiGraph:
        trace, g = self.trace, nx.DiGraph()
        last_writer: dict[int, int] = dict(self.creator)
        for op in trace.ops:
            g.add_node(op.index, op=op.op, phase=op.phase, module=op.module,
                       creates=op.new_sids, alias_of=tuple(s for s in op.out_sids
                                                           if s not in op.new_sids),
                       bytes=sum((trace.storages[s].size.expr for s in op.new_sids),
                                 sympy.Integer(0)))
            for s in op.in_sids:
                w = last_writer.get(s)
                if w is not None and w != op.index:
                    g.add_edge(w, op.index, sid=s)
            for s in op.written_sids:
                last_writer[s] = op.index  # in-place: later readers depend on this write
        return g


def build_graph(trace: Trace) -> StorageGraph:
    return StorageGraph(trace, {s.sid: s.created_by for s in trace.storages
                                if s.created_by >= 0})
