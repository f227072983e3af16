"""Checkpoint candidates: the modules whose forward could be a segment of a chain.

A module call is a forward range of ops (``Trace.calls``). It is a *valid segment* when
exactly one activation tensor enters it and exactly one leaves it in the forward graph
(parameters and buffers do not count, nor masks and indices: bool or integer tensors such
as the attention mask every Hugging Face layer receives), and the module runs once per step
— the blocks of an ``nn.Sequential`` / ``nn.ModuleList`` stack or a Hugging Face layer list.
The crossings are the edge boundary of the call's ops in the storage graph
(``networkx.edge_boundary``), plus tensors that existed before the step (the batch) read
inside it.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> r = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
>>> [(s.path, s.valid) for s in r.segments]
[('0', True), ('1', True), ('2', True)]
>>> r.segments
3 of 3 modules are valid checkpoint segments (released_bytes: what a checkpoint frees):
  0  released_bytes = 0
  1  released_bytes = -32*B
  2  released_bytes = 0
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import networkx as nx
import sympy

from ..memory.graph import StorageGraph

_STATIC = ("param", "buffer", "grad", "optimizer_state")


@dataclass(frozen=True)
class Segment:
    """One submodule as a checkpoint candidate.

    ``saved_bytes``: bytes (sympy, in B) its forward creates and saves for backward with no
    module outside it saving them too — what a checkpoint of it stops keeping between its
    forward and its backward.
    ``released_bytes``: what a checkpoint of it frees at the end of the forward:
    ``saved_bytes`` less its input when nothing saved that input (checkpoint keeps it for the
    recomputation).
    ``inputs`` / ``outputs``: storage ids of the activation tensors crossing its boundary.
    ``reason``: why it is not a valid segment (empty when ``valid``).
    """

    path: str
    calls: int
    first_op: int
    last_op: int
    inputs: tuple
    outputs: tuple
    saved_bytes: sympy.Expr
    released_bytes: sympy.Expr
    valid: bool
    reason: str

    def __repr__(self) -> str:
        state = (f"valid, released_bytes = {self.released_bytes}" if self.valid else
                 f"not a segment: {self.reason}")
        return f"<Segment {self.path or '(root)'}: {state}>"


class Segments(tuple):
    """The checkpoint candidates (:class:`Segment` s, in call order): a tuple that prints
    one line per module, valid ones first with the bytes a checkpoint of each frees at the
    end of its forward (negative: it would hold more), then the others with why not."""

    def __repr__(self) -> str:
        if not self:
            return "Segments(): no module ran in the forward"
        good = [s for s in self if s.valid]
        lines = [f"{len(good)} of {len(self)} modules are valid checkpoint segments "
                 "(released_bytes: what a checkpoint frees):"]
        width = max(len(s.path or "(root)") for s in self)
        lines += [f"  {s.path or '(root)':<{width}}  released_bytes = {s.released_bytes}"
                  for s in good]
        lines += [f"  {s.path or '(root)':<{width}}  not a segment: {s.reason}"
                  for s in self if not s.valid]
        return "\n".join(lines)


def segments(graph: StorageGraph) -> Segments:
    """Every submodule that ran in the forward, as a :class:`Segment`, in call order."""
    trace = graph.trace
    storages = trace.storages
    # the forward's graph copied once: each call's edge boundary read through a subgraph
    # view filters every edge it visits (a 70B Llama's planner: 5 s of views, 80 layers)
    forward = graph.nx.subgraph(o.index for o in trace.ops if o.phase == "forward").copy()
    reverse = forward.reverse(copy=False)
    n_calls = Counter(c.path for c in trace.calls)
    out, seen = [], set()
    for call in trace.calls:
        if call.path in seen:
            continue
        seen.add(call.path)
        ops = range(call.first_op, call.last_op + 1)
        inside = set(ops)
        entering = {d["sid"] for _, _, d in nx.edge_boundary(reverse, inside, data=True)}
        entering |= {s for i in ops for s in trace.ops[i].in_sids
                     if storages[s].created_by < 0}  # the batch: no op created it
        leaving = {d["sid"] for _, _, d in nx.edge_boundary(forward, inside, data=True)}
        if not leaving and call.last_op >= call.first_op:  # the model's output: read by nothing
            leaving = {s for i in ops for s in trace.ops[i].out_sids} & _used_later(trace, call)
        entering = tuple(sorted(s for s in entering if _activation(storages[s])))
        leaving = tuple(sorted(s for s in leaving if _activation(storages[s])))
        saved = sum((storages[s].size.expr for i in ops for s in trace.ops[i].new_sids
                     if storages[s].saved_by and all(_within(m, call.path)
                                                     for m in storages[s].saved_by)),
                    sympy.Integer(0))
        kept = sum((storages[s].size.expr for s in entering
                    if not storages[s].saved and storages[s].category != "input"),
                   sympy.Integer(0))
        reason = _why_not(n_calls[call.path], len(entering), len(leaving), len(ops))
        out.append(Segment(call.path, n_calls[call.path], call.first_op, call.last_op,
                           entering, leaving, saved, saved - kept, not reason, reason))
    return Segments(out)


def _activation(storage) -> bool:
    """A tensor of the activation chain: made or fed during the step, and floating point
    (masks and indices, bool or integer, carry no gradient: side inputs, not the chain)."""
    return (storage.category not in _STATIC
            and (storage.dtype is None or storage.dtype.is_floating_point
                 or storage.dtype.is_complex))


def _within(module: str, path: str) -> bool:
    return module == path or module.startswith(path + ".")


def _used_later(trace, call) -> set:
    return {s for o in trace.ops[call.last_op + 1:] for s in o.in_sids}


def _why_not(calls: int, n_in: int, n_out: int, n_ops: int) -> str:
    if n_ops == 0:
        return "runs no ops"
    if calls > 1:
        return f"runs {calls} times in one step"
    if n_in != 1:
        return f"{n_in} activation tensors enter it"
    if n_out != 1:
        return f"{n_out} activation tensors leave it"
    return ""
