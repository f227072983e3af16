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

On CUDA the budget is checked as the headline answers it (``by="device"``): each candidate
plan's steps replayed through the caching allocator within the budget
(:mod:`fxmem.checkpoint.on_device`), the derived plan first and, once it runs, the traced one
(:func:`on_device`, :func:`most_on_device`).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import InfeasibleBudgetError, InputError, TraceError
from .choose import MAX_TIGHTENINGS, PlanChoice
from .on_device import Walked, below, device_run, largest_running, no_plan_runs, walk


class NotReplayable(Exception):
    """A selective plan whose re-run forward calls other ops than its forward did."""


def not_replayable(error, plan) -> bool:
    """Whether tracing ``plan`` failed because selective checkpointing found, in the re-run,
    an op call it had not kept in the forward: PyTorch raises it for real too, as for a
    forward that appends to a key/value cache each time it runs."""
    return "not found in storage" in str(error) and any(
        r.save for r in getattr(plan, "regions", ()))


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


def accepting(b: int, budget_bytes: int, derived_of, retrace=None, traced=None,
              cudnn_workspace: int = 0):
    """``accept(c)`` for :func:`fxmem.checkpoint.on_device.walk`: ``c`` (a
    :class:`PlanChoice`, derived) replayed within the budget (``derived_of(c)``: its report);
    when it runs and ``retrace(plan)`` is given, the step traced with the plan (``traced``:
    plan -> report, filled here) and replayed too: ``(the traced choice, its run)``, or
    ``(None, run)`` when a replay runs out. A plan checkpoint cannot run on fake tensors stays
    derived (``exact=False``); one selective checkpointing cannot re-run raises
    :class:`NotReplayable`."""
    traced = {} if traced is None else traced

    def accept(c):
        derived = derived_of(c)
        run = device_run(derived, b, budget_bytes, cudnn_workspace)
        if not run.fits:
            return None, run
        if retrace is None or not c.plan:
            return replace(c, report=derived, by="device", run=run), run
        try:
            if c.plan not in traced:
                traced[c.plan] = retrace(c.plan)
            report = traced[c.plan]
        except TraceError as e:
            if not_replayable(e, c.plan):
                raise NotReplayable(c.plan) from e
            return replace(c, report=derived, exact=False, by="device", run=run), run
        run = device_run(report, b, budget_bytes, cudnn_workspace)
        if not run.fits:
            return None, run
        peak = report.peak_bytes(b)
        return replace(c, peak_bytes=peak, report=report, exact=c.exact and peak == c.peak_bytes,
                       by="device", run=run), run

    return accept


def on_device(choose, smallest, b: int, budget_bytes: int, derived_of, *, retrace=None,
              traced=None, cudnn_workspace: int = 0, where: str = "", raises: bool = True,
              walks: dict | None = None, ahead=None):
    """The cheapest plan at ``b`` whose steps run within ``budget_bytes`` in the caching
    allocator's replay (:func:`fxmem.checkpoint.on_device.walk` over ``choose(live)`` ->
    a derived :class:`PlanChoice` or None, ``smallest()`` likewise; :func:`accepting`), as
    a :class:`PlanChoice` with ``by="device"``. None when no plan runs and not ``raises``;
    else :class:`fxmem.InfeasibleBudgetError` saying where the last plan tried runs out,
    with its need replayed with no limit as ``minimum_bytes``.

    With ``retrace``, the walk is first made on the derived steps alone and only the plan
    it finds is traced: when that runs with the derived peak, the walk over traced plans
    would have found it too (each plan it accepts is the derived one, traced); else that
    walk is made (the plans a derivation cannot see, e.g. a forward that changes state).
    ``walks``: the walks on derived steps made already over the same planners, by ``(b,
    budget_bytes, cudnn_workspace)`` (a search asks rank 0's plan derived, then traced).
    ``ahead``: makes an :class:`fxmem.report.forked.Ahead` (the report layer's), with which
    a copy of this process traces a plan the walk found while it searches on (:func:`_walked`)."""
    traced = {} if traced is None else traced

    def need(c):
        return reserved_need(derived_of(c), b, cudnn_workspace)
    key = (b, budget_bytes, cudnn_workspace)
    walked = None if walks is None else walks.get(key)
    ahead = ahead() if ahead is not None and walked is None and retrace is not None else None
    if walked is None:
        walked = _walked(ahead, choose, accepting(b, budget_bytes, derived_of, None, None,
                                                  cudnn_workspace), budget_bytes, smallest,
                         need)
        if walks is not None:  # what ran out kept only where nothing ran (the error's)
            walks[key] = walked if walked.choice is None else replace(walked, ran_out=())
    c = walked.choice
    if ahead is not None and not ahead.is_copy:  # the copy on c answers, where one went on
        ahead.hand_over(None if c is None else c.plan)
    if retrace is not None and c is not None and c.plan:
        got, _ = _then_wait(ahead, lambda: accepting(b, budget_bytes, derived_of, retrace,
                                                      traced, cudnn_workspace)(c))
        walked = replace(walked, choice=got) if got is not None and \
            got.peak_bytes == c.peak_bytes else \
            walk(choose, accepting(b, budget_bytes, derived_of, retrace, traced,
                                   cudnn_workspace), budget_bytes, smallest, need)
    if ahead is not None:  # (a copy whose guess had nothing to trace waits here)
        ahead.wait()
    if walked.choice is not None:
        return replace(walked.choice, exact=walked.exact)
    if not raises:
        return None
    need = None
    if walked.ran_out:
        need = reserved_need(derived_of(walked.ran_out[-1][0]), b, cudnn_workspace)
    raise no_plan_runs(b, budget_bytes, walked, where, need)


class _Guessed(BaseException):  # noqa: N818 - not an error: a copy going ahead
    """Raised in the copy :class:`fxmem.report.forked.Ahead` forked as the walk accepted
    ``choice``, to go on from there as if the walk had ended on it."""

    def __init__(self, choice):
        super().__init__()
        self.choice = choice


def _walked(ahead, choose, accept, budget_bytes: int, smallest, need) -> Walked:
    """:func:`fxmem.checkpoint.on_device.walk`; with ``ahead`` (an
    :class:`fxmem.report.forked.Ahead`: a plan to trace once found), each plan the walk's
    way back accepts while it searches on for a cheaper one is a guess a copy of this
    process goes on with (where one can: :func:`fxmem.report.forked.can_go_ahead`), tracing
    it while the walk ends (Llama-3.1-8B's one-GPU command, its fewest GPUs' walk over 5
    GPUs' plans: the last plan found at the 6th of 9 replays). The walk ends on the last
    plan it accepted (:func:`fxmem.checkpoint.on_device.walk`), so the copy on it is the one
    :func:`on_device` hands over to; in the copy the walk ends on its guess (``exact``
    False: the way back follows a jump)."""
    def guess(c):
        if ahead.guess(c.plan):
            raise _Guessed(c)
    try:
        return walk(choose, accept, budget_bytes, smallest, need,
                    ahead=None if ahead is None else guess)
    except _Guessed as g:
        return Walked(g.choice, False, 0, ())
    except BaseException:
        if ahead is not None:
            ahead.stop()
        raise


def _then_wait(ahead, work):
    """``work()``; in a copy gone ahead (:class:`fxmem.report.forked.Ahead`), returned or
    raised once the walk it went ahead of has ended on its guess."""
    if ahead is None or not ahead.is_copy:
        return work()
    try:
        got, failed = work(), None
    except Exception as e:  # noqa: BLE001 - raised once told to go on
        got, failed = None, e
    ahead.wait()
    if failed is not None:
        raise failed
    return got


def reserved_need(report, b: int, cudnn_workspace: int = 0) -> int:
    """``max_memory_reserved()`` of ``report`` at ``b`` replayed with no limit, a
    :class:`fxmem.ParallelReport`'s largest rank group's."""
    groups = getattr(report, "groups", None)
    reports = [g.report for g in groups] if groups is not None else [report]
    return max(r.cuda_memory(b, cudnn_workspace=cudnn_workspace).max_reserved
               for r in reports)


def most_on_device(top, lo: int, runs_at, budget_bytes: int, cudnn_workspace: int = 0):
    """The choice at the largest B in [``lo``, ``top.B``] whose plan runs in the replay
    (``runs_at(b)`` -> a :class:`PlanChoice` with ``by="device"``, or None), ``top`` the
    choice at the largest B by live bytes (no larger B runs: the allocator holds at least
    the live bytes). The search starts where the plan of ``top``, with the allocator's
    overhead over its live peak at ``top.B`` (one replay with no limit), fits by its
    formula (:func:`fxmem.checkpoint.on_device.largest_running`); None when none runs."""
    if runs_at(top.B) is not None:
        return runs_at(top.B)
    overhead = reserved_need(top.report, top.B, cudnn_workspace) - top.peak_bytes
    guess = below(top.report.peak_bytes, lo, top.B - 1, budget_bytes - overhead)
    b = largest_running(lambda x: runs_at(x) is not None, lo, top.B - 1, guess)
    return None if b is None else runs_at(b)


def plan_for(report, budget_bytes: int, b: int, candidates=None, kinds=None, *,
             confirm: bool = True, by: str = "live", cudnn_workspace: int = 0) -> PlanChoice:
    """:meth:`fxmem.Report.plan_for` (a single device's step): the solver's choice at ``b``,
    traced (:func:`confirm_choice`) unless ``confirm`` is False, or with ``by="device"``
    the cheapest plan that runs in the caching allocator's replay (:func:`on_device`);
    without selective plans when the chosen one cannot re-run."""
    traced: dict = {}
    retrace = getattr(report, "retrace", None) if confirm else None

    def pick(kinds):
        ch = report._chooser(candidates, kinds)
        if by == "device":
            return on_device(lambda live: ch.choose(live, b), lambda: ch.smallest(b), b,
                             budget_bytes, lambda c: c.report, retrace=retrace, traced=traced,
                             cudnn_workspace=cudnn_workspace)
        choice = ch.choose(budget_bytes, b)
        if not confirm:
            return choice
        return confirm_choice(report, choice, budget_bytes, lambda budget: ch.choose(budget, b),
                              traced)

    return without_selective(pick, kinds) if confirm else pick(kinds)


def max_batch_size(report, budget_bytes: int, max_recompute: float, candidates=None,
                   kinds=None, by: str = "live", confirm: bool = True,
                   cudnn_workspace: int = 0) -> PlanChoice:
    """:func:`fxmem.checkpoint.choose.max_batch_size` with the plan traced at its B
    (:func:`confirm_choice`; not when ``confirm`` is False or the report cannot retrace),
    one B less while the traced peak is over the budget; without selective plans when the
    chosen one cannot re-run. ``by="device"``: the largest B whose plan runs in the
    caching allocator's replay (:func:`most_on_device`)."""
    if by == "device":
        return without_selective(lambda k: _most_on_device(
            report, budget_bytes, max_recompute, candidates, k, confirm, cudnn_workspace), kinds)
    if not confirm or getattr(report, "retrace", None) is None:
        from .choose import max_batch_size as derived

        return derived(report, budget_bytes, max_recompute, candidates, kinds)
    return without_selective(lambda k: _most(report, budget_bytes, max_recompute, candidates,
                                             k), kinds)


def _most_on_device(report, budget_bytes, max_recompute, candidates, kinds, confirm,
                    cudnn_workspace) -> PlanChoice:
    from .choose import most

    top, _ = most(report, budget_bytes, max_recompute, candidates, kinds)
    ch, traced, memo = report._chooser(candidates, kinds), {}, {}
    retrace = getattr(report, "retrace", None) if confirm else None

    def runs_at(b):
        if b not in memo:
            share = int(max_recompute * ch.step_flops(b))

            def smallest():
                c = ch.smallest(b)
                return c if c.recompute_flops <= share else None
            memo[b] = on_device(lambda live: ch.choose(live, b, share), smallest, b,
                                budget_bytes, lambda c: c.report, retrace=retrace,
                                traced=traced, cudnn_workspace=cudnn_workspace,
                                raises=False)
        return memo[b]

    lo = report.min_batch_size
    got = most_on_device(top, lo, runs_at, budget_bytes, cudnn_workspace)
    if got is None:
        low = ch.smallest(lo)
        need = max(reserved_need(low.report, lo, cudnn_workspace), budget_bytes + 1)
        raise InfeasibleBudgetError(
            f"no checkpoint plan within {max_recompute:.0%} recompute runs within "
            f"{budget_bytes:,} bytes at B={lo} in the caching allocator's replay; the plan of "
            f"the smallest peak needs {need:,} bytes there with no limit", minimum_bytes=need)
    return got


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
           "confirm_choice", "as_tuple", "plan_for", "accepting", "on_device", "most_on_device"]
