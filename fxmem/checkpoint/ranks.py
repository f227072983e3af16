"""One checkpoint plan for every rank of a parallel step.

Every rank runs the same code, so a plan is one set of module paths for all of them; the ranks
differ only by what they hold (their shards), one :class:`fxmem.Report` per group of alike
ranks. A plan fits when it fits every group: its peak is the largest group's, its recompute
FLOPs the largest group's (equal under FSDP2 and DDP, whose ranks run the same ops).

Each group's own cheapest fitting plan comes from its :class:`~fxmem.checkpoint.choose.Chooser`
(derived from that group's trace without a plan, as for one GPU). The first group's is the
answer when it fits every group (the others' are then not made); else the dearest of them
that fits every group: any plan fitting every group fits that group too, so it costs at
least as much. Otherwise, the cheapest plan fitting every group among the groups' Pareto
frontiers. Plain functions of the groups' reports and choosers; nothing is traced
here (:class:`fxmem.report.ranks.ParallelReport` confirms a chosen plan by tracing it).
"""

from __future__ import annotations

from ..errors import InfeasibleBudgetError
from ..formula.symbols import B
from .choose import FrontierPoint, PlanChoice


def _indices(chooser, plan) -> tuple | None:
    where = {p: i for i, p in enumerate(chooser.candidates)}
    if all(p in where for p in plan):
        return tuple(sorted(where[p] for p in plan))
    return None


def _numbers(chooser) -> dict:
    """Options asking ``chooser`` for a choice's numbers alone, not its report (a
    :class:`fxmem.checkpoint.options.Planner` derives that again for each plan)."""
    return {"report": False} if hasattr(chooser, "exact_numbers") else {}


def evaluate(reports, choosers, plan, b: int) -> tuple:
    """``(peak, recompute FLOPs, step FLOPs)`` of ``plan`` at ``b``: each the largest over
    the groups (peaks derived exactly from each group's trace)."""
    peaks, costs, steps = [], [], []
    for rep, ch in zip(reports, choosers):
        if hasattr(ch, "exact_numbers"):  # fxmem.checkpoint.options.Planner
            peak, cost, _ = ch.exact_numbers(plan, b)
            peaks.append(peak)
            costs.append(cost)
            steps.append(ch.step_flops(b))
            continue
        idx = _indices(ch, plan)
        if idx is not None:
            peaks.append(ch.peak(idx, b))
            costs.append(ch.costs(idx, b))
        else:
            planned = rep.with_plan(plan) if plan else rep
            peaks.append(planned.peak_bytes(b))
            costs.append(int(planned.recompute_flops.subs(B, b)))
        steps.append(ch.step_flops(b))
    return max(peaks), max(costs), max(steps)


def choose(reports, choosers, budget_bytes: int, b: int,
           max_recompute: float | None = None):
    """``(plan, peak, recompute FLOPs, step FLOPs, exact)`` of the cheapest plan found that
    fits ``budget_bytes`` on every group at ``b`` (within ``max_recompute`` of the step's
    FLOPs, if given: else None when none does). Raises :class:`fxmem.InfeasibleBudgetError`
    (without ``max_recompute``) when no plan fits every group.

    Without ``max_recompute``, the first group's own plan is the answer when it fits every
    group, and the other groups' choices are not made (each a solve or more: the walk over
    Llama-3.1-8B's plans over 5 GPUs, two groups, had solved each budget twice). The
    dearest of the groups' own plans that fits every group, the answer otherwise, costs as
    much at least (of equally dear ones the first group's comes first); proven the
    cheapest for the first group (``exact``), it is the cheapest for all, as any plan
    fitting every group fits the first."""
    first = None  # the first group's own plan, made and found not to fit every group
    if max_recompute is None and len(choosers) > 1:
        c = choosers[0].choose(budget_bytes, b, None, **_numbers(choosers[0]))  # raises
        if c is None:
            return None
        peak, cost, step = evaluate(reports, choosers, c.plan, b)
        if peak <= budget_bytes:
            return c.plan, peak, cost, step, c.exact
        first = c
    own = [] if first is None else [first]
    for ch in choosers[len(own):]:
        limit = None if max_recompute is None else int(max_recompute * ch.step_flops(b))
        c = ch.choose(budget_bytes, b, limit, **_numbers(ch))  # raises: none fits this group
        if c is None:
            return None
        own.append(c)
    for k, c in enumerate(sorted(own, key=lambda c: -c.recompute_flops)):
        if c is first:
            continue  # (evaluated above)
        peak, cost, step = evaluate(reports, choosers, c.plan, b)
        if peak <= budget_bytes:
            return c.plan, peak, cost, step, c.exact and k == 0
    fits = [(cost, peak, plan, step) for plan, peak, cost, step in _pooled(reports, choosers, b)
            if peak <= budget_bytes and (max_recompute is None or cost <= max_recompute * step)]
    if fits:
        cost, peak, plan, step = min(fits)
        return plan, peak, cost, step, False
    if max_recompute is not None:
        return None
    low = smallest(reports, choosers, b)
    raise InfeasibleBudgetError(
        f"no checkpoint plan fits {budget_bytes:,} bytes at B={b} on every rank: the smallest "
        f"peak is {low[1]:,} bytes (plan {list(low[0])})", minimum_bytes=low[1])


def choice_at(reports, choosers, budget_bytes: int, b: int,
              max_recompute: float | None = None) -> PlanChoice | None:
    """:func:`choose` as a :class:`fxmem.PlanChoice` without a report (None, or
    :class:`fxmem.InfeasibleBudgetError`, as :func:`choose`)."""
    got = choose(reports, choosers, budget_bytes, b, max_recompute)
    if got is None:
        return None
    plan, peak, cost, step, exact = got
    return PlanChoice(b, plan, peak, cost, step, None, exact)


def smallest_choice(reports, choosers, b: int,
                    max_recompute: float | None = None) -> PlanChoice | None:
    """:func:`smallest` as a :class:`fxmem.PlanChoice` without a report; None when it
    re-runs more than ``max_recompute`` of the step's FLOPs."""
    plan = smallest(reports, choosers, b)[0]
    peak, cost, step = evaluate(reports, choosers, plan, b)
    if max_recompute is not None and cost > max_recompute * step:
        return None
    return PlanChoice(b, plan, peak, cost, step, None, False)


def _pooled(reports, choosers, b: int) -> list:
    """``(plan, peak, cost, step)`` of every plan on any group's frontier, on every group."""
    plans = dict.fromkeys(p.plan for ch in choosers for p in ch.frontier(b))
    return [(plan, *evaluate(reports, choosers, plan, b)) for plan in plans]


def smallest(reports, choosers, b: int) -> tuple:
    """``(plan, peak)``: of the groups' smallest-peak plans, the one whose largest peak
    over the groups is the smallest."""
    plans = dict.fromkeys(ch.smallest(b, **_numbers(ch)).plan for ch in choosers)
    return min(((p, evaluate(reports, choosers, p, b)[0]) for p in plans),
               key=lambda pp: (pp[1], len(pp[0])))


def frontier(reports, choosers, b: int) -> tuple:
    """Pareto-optimal :class:`fxmem.FrontierPoint` at ``b`` over the plans of the groups'
    frontiers, each point's peak the largest group's; peak descending."""
    out = []
    for plan, peak, cost, _ in sorted(_pooled(reports, choosers, b),
                                      key=lambda r: (r[2], r[1], len(r[0]))):
        if not out or peak < out[-1].peak_bytes:
            out.append(FrontierPoint(peak, cost, plan))
    return tuple(out)
