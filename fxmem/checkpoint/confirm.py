"""A chosen plan confirmed by tracing the step with it.

The planner chooses on peaks derived from the trace without a plan. A step whose forward
changes state when it re-runs (a key/value cache appended to, a counter) has a different
peak under the plan than the derived one, and PyTorch refuses to re-run a selective plan
whose re-run calls other ops than its forward did (``_CachedTorchDispatchMode`` in
``torch/utils/checkpoint.py``: "... encountered during backward but not found in
storage"). So a report made by :func:`fxmem.analyze` (``report.retrace``) traces the chosen
plan (:func:`confirmed`): when the traced peak is over the budget the budget is tightened by
the excess and the plan chosen again; a selective plan that cannot re-run makes the
choice start over without selective plans (:func:`without_selective`).
"""

from __future__ import annotations

from ..errors import InfeasibleBudgetError, InputError, TraceError
from .choose import MAX_TIGHTENINGS, PlanChoice


class NotReplayable(Exception):
    """A selective plan whose re-run forward calls other ops than its forward did."""


def not_replayable(error, plan) -> bool:
    """Whether tracing ``plan`` failed because selective checkpointing found, in the re-run,
    an op call it had not kept in the forward: PyTorch raises it for real too, as for a
    forward that appends to a key/value cache each time it runs."""
    return "not found in storage" in str(error) and any(r.save for r in getattr(plan, "regions", ()))


def without_selective(pick, kinds):
    """``pick(kinds)``; when its plan keeps op outputs the step's re-run cannot find (see
    :func:`not_replayable`), ``pick`` again with whole modules and groups only."""
    from .options import KINDS

    kinds = KINDS if kinds is None else tuple(kinds)
    try:
        return pick(kinds)
    except NotReplayable:
        fewer = tuple(k for k in kinds if k != "selective")
        if not fewer:
            raise InputError("no checkpoint plan of the kinds asked can run: selective "
                             "checkpointing's re-run calls other ops than the forward did "
                             "(a forward that changes state, e.g. a key/value cache)") from None
        return pick(fewer)


def confirmed(first, b: int, budget_bytes: int, again, retrace, derived, traced: dict,
              where: str = "") -> PlanChoice:
    """The :class:`PlanChoice` for ``first`` = ``(plan, peak, cost, step FLOPs, exact)``
    (derived figures) at batch ``b``, its plan traced: ``retrace(plan)`` -> the step's
    report under it (``traced``: plan -> report, filled here), ``derived(plan)`` -> the
    derived one, taken when the plan cannot run on fake tensors (``exact=False``).
    ``again(budget)`` chooses again with a smaller budget (a tuple like ``first``, or None)
    when the traced peak is over ``budget_bytes``. Raises :class:`NotReplayable` (see
    :func:`without_selective`) and :class:`fxmem.InfeasibleBudgetError`."""
    plan, peak, cost, step, exact = first
    budget = budget_bytes
    for _ in range(MAX_TIGHTENINGS):
        try:
            if plan not in traced:
                traced[plan] = retrace(plan)
            report = traced[plan]
        except TraceError as e:
            if not_replayable(e, plan):
                raise NotReplayable(plan) from e
            # a plan checkpoint cannot run on fake tensors (an nn.MultiheadAttention
            # alone: docs/checkpointing.md): the derived one
            report = derived(plan)
            return PlanChoice(b, plan, report.peak_bytes(b), cost, step, report, False)
        real = report.peak_bytes(b)
        if real <= budget_bytes:
            return PlanChoice(b, plan, real, cost, step, report, exact and real == peak)
        budget -= real - budget_bytes
        try:
            got = again(budget)
        except InfeasibleBudgetError:
            got = None
        if got is None:
            break
        plan, peak, cost, step, exact = got
    raise InfeasibleBudgetError(
        f"no checkpoint plan found fits {budget_bytes:,} bytes at B={b}{where} when traced "
        f"(plan {list(plan)} peaks at {real:,} bytes)", minimum_bytes=real)


def as_tuple(choice: PlanChoice | None):
    """``(plan, peak, cost, step FLOPs, exact)`` of a choice (None stays None)."""
    if choice is None:
        return None
    return (choice.plan, choice.peak_bytes, choice.recompute_flops, choice.step_flops,
            choice.exact)


def confirm_choice(report, choice: PlanChoice, budget_bytes: int, again,
                   traced: dict | None = None) -> PlanChoice:
    """``choice`` (a plan for ``report``, a single device's step) confirmed by tracing when
    the report can retrace (:func:`confirmed`); ``again(budget)`` -> a :class:`PlanChoice`
    or None."""
    if getattr(report, "retrace", None) is None or not choice.plan:
        return choice
    return confirmed(as_tuple(choice), choice.B, budget_bytes,
                     lambda budget: as_tuple(again(budget)), report.retrace,
                     lambda plan: choice.report if plan == choice.plan else
                     report.with_plan(plan), {} if traced is None else traced)


def max_batch_size(report, budget_bytes: int, max_recompute: float, candidates=None,
                   kinds=None) -> PlanChoice:
    """:func:`fxmem.checkpoint.choose.max_batch_size` with the plan traced at its B
    (:func:`confirm_choice`), one B less while the traced peak is over the budget; without
    selective plans when the chosen one cannot re-run."""
    return without_selective(lambda k: _most(report, budget_bytes, max_recompute, candidates,
                                             k), kinds)


def _most(report, budget_bytes, max_recompute, candidates, kinds) -> PlanChoice:
    from .choose import most

    choice, at = most(report, budget_bytes, max_recompute, candidates, kinds)
    ch, traced, b = report._chooser(candidates, kinds), {}, choice.B
    while True:
        try:
            if at(b) is not None:
                return confirm_choice(report, at(b), budget_bytes, lambda budget, b=b: ch.choose(
                    budget, b, int(max_recompute * ch.step_flops(b))), traced)
        except InfeasibleBudgetError:
            if b <= report.min_batch_size:
                raise
        if b <= report.min_batch_size:
            raise InfeasibleBudgetError(f"no checkpoint plan fits {budget_bytes:,} bytes when "
                                        "traced", minimum_bytes=choice.peak_bytes)
        b -= 1


__all__ = ["max_batch_size", "NotReplayable", "not_replayable", "without_selective", "confirmed",
           "confirm_choice", "as_tuple"]
