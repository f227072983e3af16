"""A report's confirmation trace (``retrace``: a checkpoint plan -> the step traced with it)
as a report at values of its named dims has it (:meth:`fxmem.Report.at`,
:meth:`fxmem.ParallelReport.at`): the step traced, then read at those values; a trace at one
point (``point=(B, {dim: size})``) made at those values too; a report given another
``retrace`` (:func:`retracing`)."""

from __future__ import annotations

from dataclasses import replace

from .recent import Recent

#: what a :class:`fxmem.Report` keeps of its trace alone (``fxmem.report.result``): its
#: planners, its plans' derived steps and their replays, its traces below the formulas
_OF_THE_TRACE = (("_choosers", dict), ("_with_plans", Recent), ("_plan_replays", dict),
                 ("_below_at", dict))


def retracing(report, retrace):
    """``report`` with ``retrace`` as its own (how a plan's step is traced, e.g. at one
    point: :func:`fxmem.report.ways.cheapest_plan`); a :class:`fxmem.Report` shares with it
    what it keeps of its trace alone (a way's search asks both, and a second planner of the
    same step cost Llama-3.1-8B's one-GPU command 0.4 s). A
    :class:`fxmem.ParallelReport`'s are its groups' reports', shared as they are.

    >>> import torch, fxmem
    >>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8),
    ...                   loss=lambda o: o.sum(), device="cpu")
    >>> other = retracing(r, None)
    >>> other.retrace is None, other.with_plan(()) is r.with_plan(())
    (True, True)
    """
    out = replace(report, retrace=retrace)
    if getattr(report, "groups", None) is None:
        for name, empty in _OF_THE_TRACE:
            out.__dict__[name] = report.__dict__.setdefault(name, empty())
    return out


def retrace_at(retrace, values: dict):
    """``retrace`` (``(plan, ..., point=None) -> a report in named dims``) as the report at
    ``values`` of them has it, or None.

    >>> class Traced:
    ...     def __init__(self, plan, point): self.plan, self.point = plan, point
    ...     def at(self, **values): return self.plan, self.point, values
    >>> at = retrace_at(lambda plan, point=None: Traced(plan, point), {"L": 64})
    >>> at("block"), at("block", point=(2, {}))
    (('block', None, {'L': 64}), ('block', (2, {'L': 64}), {'L': 64}))
    """
    if retrace is None:
        return None

    def at(plan, *args, point=None, **options):
        if point is not None:
            point = (point[0], {**point[1], **values})
        return retrace(plan, *args, point=point, **options).at(**values)
    return at
