"""A way out searched ahead: FSDP2's ``param_dtype`` way (:func:`fxmem.report.precision.
param_dtype_way`), started in a forked child as soon as the step's first trace is made,
while this process does the rest of a command (the length search, the retrace at a B below
the formulas, the ``--checkpoint auto`` choice) and then the other ways. The way traces the
step again under FSDP2's mixed precision, walks its plans and traces the one found: on
Llama-3.1-70B over 64 GPUs (``--batch 1 --seq 4096 --checkpoint auto``) about 45 s, which
the command waited for after everything else (docs/concepts.md, "the ways out"). The
command line starts it sooner still, before the step's first trace
(:func:`param_dtype_early`: the way needs the step as asked, not its trace), and
:func:`param_dtype_ahead` takes that child where its guesses hold.

:func:`fxmem.report.fit.fit` takes the child's answer only where the child searched what fit
would have: the same report analysed again (``reanalyze``), the same options kept from the
step as asked at B (:func:`fxmem.report.ways.as_asked`: its plan, B as an int), the same
dims and check. Anything else (a plan ``--checkpoint auto`` chose, another budget) cancels
the child, and fit searches the way itself, so a guess that does not hold costs time, never
the answer.

>>> import torch, fxmem
>>> r = fxmem.analyze(torch.nn.Linear(8, 8), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   device="cpu")
>>> param_dtype_ahead(r, 64, 10_000) is None  # one GPU: FSDP2's mixed precision is no way
True
"""

from __future__ import annotations

from dataclasses import dataclass

from .forked import ChildWay, forked
from .precision import param_dtype_at, param_dtype_way, policy_of, searched
from .ways import Check, as_asked, at_point, default_by, rank_reports

# the child runs at a lower priority (os.nice) unless ``first``: where the command's own
# searches are the longer (Llama-3.1-8B over 8 GPUs), three processes sharing two cores at
# one priority slowed this process's plan search 13.6 s to 25.8 s while the child's way was
# done before it was needed. Under --checkpoint auto the way is the longer (fit's plan way
# reads the walk the choice made; Llama-3.1-70B over 64 GPUs: 59.5 s with the child niced,
# 54.1 and 54.8 s with fit's child niced instead, one run each: docs/concepts.md)
NICENESS = 10


@dataclass
class Ahead(ChildWay):
    """The child searching the way (:meth:`take` its answer, or :meth:`cancel` it) and
    what it searched: ``reanalyze``, the report's own (:attr:`fxmem.Report.reanalyze`); ``B``;
    ``asked``, the options kept at ``B``; ``dims``; ``check``. ``first``: the child runs at
    this process's priority, its search expected the longest (fit's own child is niced)."""

    reanalyze: object
    B: int
    asked: dict
    dims: dict
    check: Check
    first: bool = False

    def matches(self, report, B: int, dims: dict, check: Check, reanalyze) -> bool:  # noqa: N803
        """Whether fit's way at ``B`` is the one searched (the same report analysed again)."""
        return (reanalyze is self.reanalyze and B == self.B
                and as_asked(report, B) == self.asked and dict(dims) == self.dims
                and check == self.check)


@dataclass
class Early(ChildWay):
    """The way started before the step's first trace (:func:`param_dtype_early`): the child
    and what it assumed of the step (FSDP2's ``parallel`` as asked, ``B``, ``dims``,
    ``check``), which :func:`param_dtype_ahead` holds against the step traced (and
    :meth:`cancel` stops the child, once: nothing after that took it)."""

    parallel: object
    B: int
    dims: dict
    check: Check
    first: bool


def param_dtype_early(analyze_with, *, step, parallel, B: int,  # noqa: N803
                      budget_bytes: int | None, cudnn_workspace: int = 0,
                      at_dims: dict | None = None, jobs: int = 2,
                      first: bool = False) -> Early | None:
    """FSDP2's ``param_dtype`` way started in a forked child before the step's first trace
    (``analyze_with(**changes)``: the step as asked, ``step`` under ``parallel`` with no
    checkpoint plan, analysed with those request fields changed, as
    :func:`fxmem.analyze.analyzer` gives it): the way needs the step as asked, not its
    trace, and on Llama-3.1-70B over 64 GPUs it is the longest search, which began 11 s
    later when it waited for that trace. Its guesses (an FSDP2 step under autocast without a
    ``param_dtype``, not compiled, checked as the step's device has it) are held against
    the trace by :func:`param_dtype_ahead` (``early=``), which stops a child whose guess
    does not hold. None where the way is not guessed to search anything."""
    from ..trace.parallel import FSDP

    if budget_bytes is None or jobs < 2 or type(parallel) is not FSDP or \
            parallel.param_dtype is not None or step.amp is None or step.compile is not None:
        return None
    at_dims = dict(at_dims or {})
    check = Check(default_by(step), budget_bytes, cudnn_workspace)  # (its device, as a report's)

    def way():  # as param_dtype_way, with the step's reanalyze at the same options
        again = analyze_with(parallel=policy_of(parallel, step.amp), **at_point(B, at_dims))
        return list(param_dtype_at(check, again.at(**at_dims) if at_dims else again, B,
                                   again.plan))  # no plan: the trace's own empty one
    child = forked(way, niceness=0 if first else NICENESS)
    return None if child is None else \
        Early(child.background(), parallel, B, at_dims, check, first)


def param_dtype_ahead(base, B: int, budget_bytes: int | None, cudnn_workspace: int = 0,  # noqa: N803
                      dims: dict | None = None, jobs: int = 2, by: str | None = None,
                      first: bool = False, early: Early | None = None):
    """FSDP2's ``param_dtype`` way at ``B`` within ``budget_bytes`` for ``base`` (a report in
    B, and in ``dims``' names when given: the way is searched at those values) started in a
    forked child, as :func:`fxmem.report.fit.fit` would check it (``by``, its default);
    ``first``: at this process's priority (see :class:`Ahead`), else niced;
    None where nothing is to be searched (no budget, one job, a way that searches nothing:
    :func:`fxmem.report.precision.searched`, or a compiled step's one line) or nothing can
    be forked. ``early``: the way started before the trace (:func:`param_dtype_early`),
    taken where its guesses hold (the same way, B, dims and check; no plan), else stopped."""
    try:
        return _ahead(base, B, budget_bytes, cudnn_workspace, dims, jobs, by, first, early)
    finally:
        if early is not None:  # not taken: stopped (its cancel does nothing once taken)
            early.cancel()


def _ahead(base, B, budget_bytes, cudnn_workspace, dims, jobs, by, first, early):  # noqa: N803
    if budget_bytes is None or jobs < 2:
        return None
    dims = dict(dims or {})
    at = base.at(**dims) if dims else base
    if not searched(at) or rank_reports(at)[0].trace.compiled:
        return None
    check = Check(by or default_by(at), budget_bytes, cudnn_workspace)
    again = reanalyze_of(base)
    if early is not None and early.child is not None and not at.plan and \
            (early.parallel, early.B, early.dims, early.check) == (at.strategy, B, dims, check):
        early.child, child = None, early.child  # taken
        return Ahead(child, again, B, as_asked(at, B), dims, check, early.first)
    child = forked(lambda: list(param_dtype_way(check, at, B, reanalyze=again, dims=dims)),
                   niceness=0 if first else NICENESS)
    if child is None:
        return None
    # stopped while this process traces a plan (the one --checkpoint auto chose, which,
    # where it fits, leaves the way unwanted): fxmem.report.forked.foreground
    return Ahead(child.background(), again, B, as_asked(at, B), dims, check, first)


def reanalyze_of(report):
    """``Report.reanalyze`` of ``report`` (a parallel one's through its first rank)."""
    groups = getattr(report, "groups", None)
    return (groups[0].report if groups else report).reanalyze
