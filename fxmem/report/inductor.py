"""Inductor's own estimate of each compiled graph's peak, beside fxmem's for the same
bytes (issue 39): a compiled step's report says both.

Inductor weighs its schedules by ``torch._inductor.memory``: over the graph's steps, the
bytes of the buffers it has allocated and of the graph inputs it frees (those live from the
start until their last use), at its size hints (here the trace's batch hint). fxmem's figure
counts the same storages in its trace of that graph's run: made by the run, or made before
it and freed by it, at their sizes (no allocator rounding), the most live at once.

>>> e = GraphEstimate("forward", 3, 9, 64, 1_000_000, 1_050_000)
>>> e.line()
'forward graph at B=64: inductor 976.56 KiB, fxmem 1.00 MiB'
"""

from __future__ import annotations

from dataclasses import dataclass

from .text import fmt_bytes


@dataclass(frozen=True)
class GraphEstimate:
    """One run of a compiled graph: its ops ``first_op..last_op`` in ``phase``; at batch size
    ``B`` (the trace's hint, where inductor sized it), ``inductor_bytes`` (its estimate of
    the graph's peak, None when it gave none) and ``fxmem_bytes`` (the same bytes in fxmem's
    trace, see the module docstring)."""

    phase: str
    first_op: int
    last_op: int
    B: int  # noqa: N815
    inductor_bytes: int | None
    fxmem_bytes: int

    def line(self) -> str:
        theirs = "none" if self.inductor_bytes is None else fmt_bytes(self.inductor_bytes)
        return (f"{self.phase} graph at B={self.B}: inductor {theirs}, "
                f"fxmem {fmt_bytes(self.fxmem_bytes)}")


def summary_line(estimates) -> str:
    """The estimates by phase, for a report's setup: one run's, or the largest of several
    runs' (a model compiled block by block runs a graph per block)."""
    parts = []
    for phase in dict.fromkeys(e.phase for e in estimates):
        runs = [e for e in estimates if e.phase == phase]
        if len(runs) == 1:
            parts.append(runs[0].line())
            continue
        theirs = [e.inductor_bytes for e in runs if e.inductor_bytes is not None]
        top = fmt_bytes(max(theirs)) if theirs else "none"
        parts.append(f"{phase} graphs ({len(runs)} runs) at B={runs[0].B}: inductor up to "
                     f"{top}, fxmem up to {fmt_bytes(max(e.fxmem_bytes for e in runs))}")
    return "; ".join(parts)


def graph_estimates(trace) -> tuple:
    """A :class:`GraphEstimate` per run of a compiled graph in ``trace`` (none for an eager
    step), at its batch hint."""
    b = trace.batch_hint
    out = []
    for run in trace.graph_runs:
        out.append(GraphEstimate(run.phase, run.first_op, run.last_op, b, run.inductor_bytes,
                                 _own_peak(trace.storages, run.first_op, run.last_op, b)))
    return tuple(out)


def _own_peak(storages, first: int, last: int, b: int) -> int:
    """The most bytes live at once, from just before op ``first`` to op ``last``, of the
    storages the run makes (made at ``first..last``) or frees (made before, freed after
    one of its ops)."""
    delta = [0] * (last - first + 2)  # index 0: just before the run
    for s in storages:
        made, gone = s.created_by, s.freed_after
        mine = first <= made <= last or (made < first and gone is not None
                                         and first <= gone <= last)
        if not mine:
            continue
        v = s.size(b)
        delta[max(made - first + 1, 0)] += v
        if gone is not None and gone < last:
            delta[gone - first + 2] -= v
    live, most = 0, 0
    for d in delta:
        live += d
        most = max(most, live)
    return most
