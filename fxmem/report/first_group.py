"""A parallel step's checkpoint plan chosen on its first group of ranks
(:meth:`fxmem.ParallelReport.plan_for`).

Every rank runs the same code, so a plan fitting every group of ranks fits the first (rank
0's: under FSDP2 its shards have the most rows), and the cheapest plan of the first group
that, traced, runs on every group is the answer: the other groups are traced only with that
plan (a search's deferred groups: :meth:`fxmem.ParallelReport.first_group`), and the
planner's choices are made on one group's formulas, not on every group's. By the caching
allocator's replay, the walk over the first group's plans (:func:`first_walk`) accepts a plan
where it runs, derived, on the first group and on each other group derived without a trace
(:meth:`fxmem.report.ranks.RankGroup.untraced`); a walk a search made on the first group
alone is read instead (:func:`first_walked`), its plan taken when it runs, derived, on the
other groups (:func:`derived_runs`).
"""

from __future__ import annotations

from dataclasses import replace

from ..checkpoint.on_device import device_run
from ..errors import FxmemError


class NotEveryGroup(Exception):
    """The first group's plan, derived, does not run on another group."""


def first_chooses(report, budget_bytes: int, b: int, candidates, kinds, by: str,
                  cudnn_workspace: int):
    """``report``'s choice (a :class:`fxmem.ParallelReport`) on its first group of ranks,
    its plan traced on every group (the others when first read), when its steps run there
    as ``by`` checks them (the choice's ``report``, ``peak_bytes`` and ``run`` then every
    group's); else None (no plan fits the first group, one that is not traced, or one
    another group does not run: :meth:`fxmem.ParallelReport.plan_for` then chooses over
    every group)."""
    others = None if by != "device" or first_walked(
        report, b, budget_bytes, candidates, kinds, cudnn_workspace) else derived_others(report)
    if others is not None:
        return first_walk(report, others, budget_bytes, b, candidates, kinds, cudnn_workspace)
    whole: dict = {}

    def retrace(plan):  # every group traced with ``plan``; the first read here
        if plan not in whole:
            if not derived_runs(report, plan, b, budget_bytes, by, cudnn_workspace):
                raise NotEveryGroup(plan)  # not traced: the choice over every group
            whole[plan] = report.retrace(plan, defer=True)
        return whole[plan].first_group()
    try:
        got = replace(report.first_group(), retrace=retrace).plan_for(
            budget_bytes, b, candidates, kinds=kinds, by=by, cudnn_workspace=cudnn_workspace)
    except (FxmemError, NotEveryGroup):
        return None
    if got.plan and got.plan not in whole:
        return None  # derived: a plan checkpoint cannot run on fake tensors
    return _on_every_group(got, whole[got.plan] if got.plan else report, b, budget_bytes, by,
                           cudnn_workspace)


def _on_every_group(got, traced, b: int, budget_bytes: int, by: str, cudnn_workspace: int):
    """``got`` with ``traced`` (every group's report under its plan) as its report and
    peak, when every group runs within the budget as ``by`` checks it; else None."""
    if by == "device":
        run = device_run(traced, b, budget_bytes, cudnn_workspace)
        if not run.fits:
            return None
        return replace(got, report=traced, peak_bytes=traced.peak_bytes(b), run=run)
    if traced.peak_bytes(b) > budget_bytes:
        return None
    return replace(got, report=traced, peak_bytes=traced.peak_bytes(b))


def first_walked(report, b: int, budget_bytes: int, candidates, kinds,
                 cudnn_workspace: int) -> bool:
    """Whether a search walked the first group's plans by the replay already (derived, on
    that group alone: :meth:`fxmem.ParallelReport._on_device`), so that its plan is read,
    not walked again."""
    _, (chooser,) = report.first_group()._planner(candidates, kinds)
    walks = chooser.__dict__.get("walks", {}).get(((), None, ()), {})
    return (b, budget_bytes, cudnn_workspace) in walks


def derived_others(report) -> tuple | None:
    """``report``'s groups of ranks after the first, each derived without a trace
    (:meth:`fxmem.report.ranks.RankGroup.untraced`), or None where one cannot be (a
    compiled step's: the walk over the first group's plans alone, as a search's)."""
    others = tuple(type(g)(g.ranks, r) for g in report.groups[1:]
                   if (r := g.untraced()) is not None)
    return others if len(others) == len(report.groups) - 1 else None


def first_walk(report, others: tuple, budget_bytes: int, b: int, candidates, kinds,
               cudnn_workspace: int):
    """:func:`first_chooses` by the replay where no search walked the first group's plans
    and the ``others`` groups derive without a trace (:func:`derived_others`): the walk
    over the first group's plans (its planner alone) accepts a plan where it runs, derived,
    on the first group and on each of the others; the plan found is traced on every group
    (the others when first read) and replayed. None where no plan runs so. (Walked on rank
    0 alone, Llama-3.1-8B's plan over 5 GPUs ran out on rank 4, derived, and the walk over
    both groups' planners that followed took 6.6 s more.)"""
    reports, choosers = report.first_group()._planner(candidates, kinds)
    whole: dict = {}

    def retrace(plan):  # every group traced with ``plan``
        if plan not in whole:
            whole[plan] = report.retrace(plan, defer=True)
        return whole[plan]
    every = type(report)(report.strategy, (report.groups[0], *others), retrace)
    try:
        got = every._on_device(reports, choosers, b, budget_bytes, None, {}, cudnn_workspace,
                               also=tuple(g.ranks for g in others))
    except FxmemError:
        return None
    if not got.plan:  # (the step without a plan, replayed on every group)
        return _on_every_group(got, report, b, budget_bytes, "device", cudnn_workspace)
    # traced and replayed on every group by the walk's acceptance; else derived (a plan
    # checkpoint cannot run on fake tensors): chosen over every group
    return got if got.plan in whole else None


def derived_runs(report, plan, b: int, budget_bytes: int, by: str,
                 cudnn_workspace: int) -> bool:
    """Whether ``plan`` derived on every group of ``report`` made or derived without a trace
    (:meth:`fxmem.report.ranks.RankGroup.untraced`) runs within the budget as ``by`` checks
    it: where it does not on some group, the first group's choice is not traced (the plan
    chosen over every group would be another)."""
    derived = type(report)(report.strategy, tuple(  # a group only a trace makes: unchecked
        type(g)(g.ranks, r.with_plan(plan)) for g in report.groups
        if (r := g.untraced()) is not None))
    if by == "device":
        return device_run(derived, b, budget_bytes, cudnn_workspace).fits
    return derived.peak_bytes(b) <= budget_bytes
