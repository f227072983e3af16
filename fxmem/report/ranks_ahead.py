"""FSDP2's fewest GPUs for a step asked on one GPU, searched by a child forked before the
step's first trace.

The way (:func:`fxmem.report.world_size.fewest_ranks`) traces the step under FSDP2 over each
world size it tries, and that trace costs more than the step's own on one GPU (Llama-3.1-8B:
about 4 s against 2.6 s); it began only once the step's trace, its formulas and the
checkpoint way were made, while the machine's second core sat idle. Rank 0's step over one
world size is derived from its trace over another
(:func:`fxmem.trace.parallel.other_ranks.at_world_size`), so which world size the child
traces does not matter: it traces the step over :data:`WORLD_SIZE` GPUs while this process
traces it on one (at the B and dims' values asked alone, where the search reads it, as
:func:`fxmem.report.world_size.search_ranks` traces each world size from a one-GPU step:
2.5 s beside this process's trace, against 5.9 s in B and L), then waits for what the
search reads of the step as asked (:class:`fxmem.report.world_size.Asked`, resolved here
before fit searches any way: :meth:`RanksAhead.give`), and searches from it with the
analyses its own trace makes cheaper; the checkpoint way, found here after that, follows
(:meth:`RanksAhead.give_one`), read once the search has found its world size (on
Llama-3.1-8B the child had waited 0.7 to 1.2 s for this process's walk over the one-GPU
plans). Where its trace cannot be derived from (a world size's rule not holding), the
search traces each world size itself, as this process would have.

:func:`fxmem.report.fit.fit` takes the child's answer only where it asked what the child
assumed (the same B, dims and check, and the step on one GPU); anything else stops the
child, and fit searches the way itself: a guess that does not hold costs time, never the
answer. So does a child that fails.

>>> import torch, fxmem
>>> from fxmem.analyze import analyzer
>>> from fxmem.trace.engine import Step
>>> step = Step(loss=lambda o: o.sum(), device="cpu")
>>> again = analyzer(torch.nn.Linear(8, 8), torch.randn(4, 8), step=step)
>>> fewest_early(again, step=step, parallel=fxmem.FSDP(2), B=4,
...              budget_bytes=1000) is None  # asked under FSDP2 already: no such way
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import FxmemError
from .forked import ChildWay, cpus, forked, readable, receive, send
from .ways import Check, at_point, default_by

WORLD_SIZE = 8  # the world size the child traces first (any other is derived from it)


@dataclass
class RanksAhead(ChildWay):
    """The child searching the way and what it assumed: ``B``, ``dims`` and ``check``;
    ``fd``: the pipe :meth:`give` writes what the search reads to (None once written, or
    closed when the child is taken or stopped)."""

    fd: int | None
    B: int
    dims: dict
    check: Check

    def matches(self, report, B: int, dims: dict, check: Check) -> bool:  # noqa: N803
        """Whether fit's way at ``B`` is the one the child searches (``report`` on one GPU)."""
        return (getattr(report, "strategy", None) is None and B == self.B
                and dict(dims) == self.dims and check == self.check)

    def give(self, asked, jobs: int, later: bool = False) -> bool:
        """``asked`` (a resolved :class:`fxmem.report.world_size.Asked`) sent to the child,
        which searches from it (``jobs``: fit's); ``later``: its checkpoint way to come
        (:meth:`give_one`). False where it could not be (the child gone: :meth:`take` then
        gives None)."""
        if self.fd is None or self.child is None:
            self._release()
            return False
        sent = self._send((asked, jobs, later))
        if not later or not sent:
            self._release()
        return sent

    def give_one(self, way) -> None:
        """The checkpoint way (a :class:`fxmem.report.ways.WayOut`, or None) sent after what
        :meth:`give` sent with ``later``: the child reads it once its search needs it."""
        if self.fd is not None:
            self._send(way)
            self._release()

    def _send(self, value) -> bool:
        return send(self.fd, value)  # (False: the child ended, its trace failed)

    def _release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def fewest_early(analyze_with, *, step, parallel, B: int, budget_bytes: int | None,  # noqa: N803
                 cudnn_workspace: int = 0, at_dims: dict | None = None,
                 jobs: int = 2) -> RanksAhead | None:
    """FSDP2's fewest GPUs started in a forked child before the step's first trace
    (``analyze_with(defer=..., **changes)``: the step as asked, as
    :func:`fxmem.analyze.analyzer` gives it), for a step asked on one GPU (``parallel``
    None), trained, not compiled, within ``budget_bytes`` at ``B`` (and ``at_dims``).
    None where the way is not searched so, where this process has one CPU (the child would
    slow its trace, for a way not wanted where the step fits), or nothing can be forked."""
    if budget_bytes is None or jobs < 2 or parallel is not None or not step.train \
            or step.compile is not None or cpus() < 2:
        return None
    from ..trace.parallel import FSDP
    from .world_size import search_ranks

    at_dims = dict(at_dims or {})
    check = Check(default_by(step), budget_bytes, cudnn_workspace)  # (its device, as a report's)
    r, w = os.pipe()

    def way():
        os.close(w)
        first = analyze_with(parallel=FSDP(WORLD_SIZE), defer=True, **at_point(B, at_dims))
        _meanwhile(first, at_dims, r)
        with os.fdopen(r, "rb") as f:
            got = receive(f)
            if got is None:  # not wanted
                return None
            asked, fit_jobs, later = got
            if later:  # the checkpoint way, read when the search needs it
                asked.later(lambda: receive(f, EOFError))
            again = first.groups[0].report.reanalyze  # its step kept: ranks derived from it
            return list(search_ranks(check, asked, B, reanalyze=again, dims=at_dims,
                                     jobs=fit_jobs))
    child = forked(way)
    os.close(r)
    if child is None:
        os.close(w)
        return None
    return RanksAhead(child, w, B, at_dims, check)


def _meanwhile(first, at_dims: dict, fd: int) -> None:
    """While nothing has come on the pipe ``fd`` yet (this process's parent still making it),
    the planner of ``first``'s rank 0 built (``Report._chooser``; ``first`` at the dims'
    values ``at_dims``, as the search reads it): the world sizes the search derives from
    that trace share its candidates' numbers
    (:func:`fxmem.checkpoint.plans.derive_numbers`), so each planner the search builds
    there costs a third (Llama-3.1-8B over 5 GPUs: 0.13 s against 0.43 s). A planner the
    step cannot have is left to the search, which says why."""
    if readable(fd):
        return
    try:
        (first.at(**at_dims) if at_dims else first).groups[0].report._chooser()
    except FxmemError:
        pass


