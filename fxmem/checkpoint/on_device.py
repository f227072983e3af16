"""Choosing a checkpoint plan against the caching allocator's replay: the plan the card
can run.

On CUDA the headline answer (:meth:`fxmem.Report.max_batch_size`, :meth:`fxmem.Report.fits`)
is whether the step's allocations, replayed through the caching allocator within the budget,
run (:meth:`fxmem.Report.runs_on_device`), not whether its live bytes fit: the allocator's
blocks, their slack and the segments it cannot release take more. A plan chosen by live bytes
alone can run out there, so plans are chosen against the replay too, by the formulas first:

1. the cheapest plan whose live peak fits the budget (the solver, formulas only) is
   replayed within the budget; when it runs, it is the answer (one replay);
2. when it runs out, the step goes down the Pareto frontier by what that plan needs over
   the budget (replayed with no limit): the allocator's overhead over the live bytes
   changes little between plans close on the frontier, so a plan whose live peak is lower
   by less than that rarely runs. Then the distance below the first plan that ran out
   doubles at each step (a plan with a lower live peak rarely needs more of the
   allocator). (The walk had first replayed the next two plans of the frontier: on
   Llama-3.1-8B over 8 GPUs each went 33 MB down while the first plan needed 20 GB more
   than the budget, a replay each for nothing. Where the next plans do run, the bisection
   below finds them, with ``exact=False``: tests/test_plan_on_device.py's stack, its first
   plan 15 % over, finds the cheapest so);
3. once a plan runs after such a jump, the live budgets between it and the lowest plan
   that ran out above it are bisected: a plan the solver finds there is replayed, so the
   answer is the cheapest plan that runs among those the search saw, with ``exact=False``;
   when none ran (the jump went below every plan that runs), those between the lowest plan
   that ran out and the one before it. The bisection ends once no plan between can re-run
   a :data:`CLOSE` part less than the one found does (the solver's cheapest plan within a
   budget costs no more than within a smaller one, so a plan between re-runs at least what
   the lowest plan that ran out above does): on Llama-3.1-8B over 8 GPUs, a plan
   re-running 13.31 % of the FLOPs where one re-running 13.24 % ran out above it, not
   bisected on to 13.29 %. Where a bisection step finds nothing cheaper, the
   cheapest plan below the interval's top (``choose(hi - 1)``) says whether any is left to
   find: none, and the bisection ends rather than halving to a byte; one, and it is
   replayed (when it runs, it is the answer; when it runs out, the interval's new top);
4. the plan with the smallest live peak is the last one tried.

At most :data:`MAX_REPLAYS` candidate plans are replayed per answer. Plain functions of
callables: nothing here traces or knows the report's type (:mod:`fxmem.checkpoint.confirm`
gives them a report, traced plans and rank groups).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InfeasibleBudgetError

MAX_REPLAYS = 12  # candidate plans replayed per answer (the smallest peak's among them)
MAX_BISECT = 16  # solver calls bisecting back after a jump
CLOSE = 0.01  # the part of the found plan's recompute a bisection step must be able to save


def device_run(report, b: int, budget_bytes: int, cudnn_workspace: int = 0):
    """The replay within ``budget_bytes`` of ``report`` at ``b`` (each rank group's of a
    :class:`fxmem.ParallelReport`): the first group's that runs out, else the one that
    reserved the most (a :class:`fxmem.device.allocator.DeviceRun`)."""
    groups = getattr(report, "groups", None)
    worst = None
    # each group's report made as it is read: none after the first that runs out
    for r in (g.report for g in groups) if groups is not None else [report]:
        run = r.runs_on_device(b, budget_bytes, cudnn_workspace=cudnn_workspace)
        if not run.fits:
            return run
        if worst is None or run.max_reserved > worst.max_reserved:
            worst = run
    return worst


def oom_phrase(run) -> str:
    """Where a replay that does not fit runs out, a phrase: "at aten.mm in fc (forward, step
    1)", or "while placing the parameters, buffers and batch"."""
    step, at, op, phase, module = run.oom
    if at < 0:
        return "while placing the parameters, buffers and batch"
    return f"at {op} in {module or '(root)'} ({phase}, step {step})"


@dataclass(frozen=True)
class Walked:
    """What :func:`walk` found: ``choice``, the accepted plan (None: none ran); ``exact``:
    every plan cheaper than it that the solver offers was replayed and ran out (no jump);
    ``replays``: candidate plans replayed; ``ran_out``: ``(candidate, run)`` of each that
    ran out, in the order tried."""

    choice: object
    exact: bool
    replays: int
    ran_out: tuple


def walk(choose, accept, budget_bytes: int, smallest, need, ahead=None) -> Walked:
    """The cheapest plan that runs, searched as the module docstring says.

    ``choose(live)``: the cheapest plan whose live peak is at most ``live`` bytes, an object
    with ``plan``, ``peak_bytes`` and ``exact`` (None, or :class:`fxmem.InfeasibleBudgetError`:
    none; raised from the first call, at the budget: no plan's live peak fits);
    ``accept(c)``: ``(choice, run)``, ``c`` checked as the headline answers (the
    replay, the plan traced), ``choice`` None when it runs out; ``smallest()``: the plan of
    the smallest live peak (or None), tried when the walk ends without one (``smallest``
    itself may be None: none is); ``need(c)``: what ``c``'s step needs replayed with no
    limit (asked of the first that runs out); ``ahead(choice)``: told of each plan the way
    back accepts while it searches on for a cheaper one (the walk ends on the last)."""
    ran_out: list = []
    seen: dict = {}  # plan -> its choice, accepted or None

    def attempt(c):
        if c.plan not in seen:
            ok, run = accept(c)
            seen[c.plan] = ok
            if ok is None:
                ran_out.append((c, run))
        return seen[c.plan]

    live, found, jumped, at = budget_bytes, None, False, budget_bytes
    while len(seen) < MAX_REPLAYS - (smallest is not None):
        c = choose(live) if not seen else _choose(choose, live)  # the first raises
        if c is None or c.plan in seen:
            break
        found, at = attempt(c), live
        if found is not None:
            break
        gap = max(1, ran_out[0][0].peak_bytes - c.peak_bytes,
                  need(ran_out[0][0]) - budget_bytes if len(ran_out) == 1 else 0)
        jumped |= gap > 1
        live = c.peak_bytes - gap
    if found is None and smallest is not None:
        c = smallest()
        if c is not None and c.plan not in seen:
            jumped = jumped or bool(ran_out) and c.peak_bytes < ran_out[-1][0].peak_bytes - 1
            found, at = attempt(c), c.peak_bytes
    if jumped and found is not None:
        found = _back(choose, attempt, found, at, ran_out, seen, ahead=ahead)
    elif jumped and ran_out:  # the jump went past every plan that runs: back above the lowest
        low = min((c for c, _ in ran_out), key=lambda c: c.peak_bytes)
        found = _back(choose, attempt, None, low.peak_bytes, ran_out, seen, low.plan, ahead)
    exact = found is not None and not jumped and bool(getattr(found, "exact", False))
    return Walked(found, exact, len(seen), tuple(ran_out))


def _back(choose, attempt, found, lo: int, ran_out: list, seen: dict, floor=None,
          ahead=None):
    """After a jump: bisect the live budgets between ``lo`` (where ``found`` was chosen) and
    the lowest live peak that ran out above it for a cheaper plan that runs. With none found
    (``found`` None), from the live peak ``lo`` of ``floor``, the lowest plan that ran out:
    a plan between it and the jump's start may run where both ran out (Llama's blocks
    saving an op output each, replayed on 3 GPUs: the jump by the first plan's need went
    below every plan, the smallest ran out, and the one between them that runs was never
    tried)."""
    floor = found.plan if found is not None else floor
    above = min((c for c, _ in ran_out
                 if c.peak_bytes > (found.peak_bytes if found is not None else lo)),
                key=lambda c: c.peak_bytes, default=None)  # the lowest that ran out above
    hi, checked = above.peak_bytes if above is not None else lo + 1, None
    for _ in range(MAX_BISECT):
        if hi - lo <= 1 or len(seen) >= MAX_REPLAYS or _close(found, above):
            break
        mid = (lo + hi) // 2
        c = _choose(choose, mid)
        if c is None or c.plan == floor:
            lo = mid  # nothing cheaper has a live peak at most mid
            if checked != hi:  # is any plan cheaper below hi? (else bisect to a byte)
                checked, top = hi, _choose(choose, hi - 1)
                if top is None or top.plan == floor:
                    break
                if (ok := attempt(top)) is not None:
                    return ok  # the cheapest plan below hi: none between is cheaper
                hi, above = top.peak_bytes, top  # it ran out; no plan lies between
            continue
        if c.plan in seen and seen[c.plan] is None:
            hi, above = c.peak_bytes, c
            continue
        ok = attempt(c)
        if ok is not None:
            found, lo, floor = ok, mid, ok.plan
            if ahead is not None:
                ahead(ok)
        else:
            hi, above = c.peak_bytes, c
    return found


def _close(found, above) -> bool:
    """Whether no plan costing between ``found`` (it runs) and ``above`` (the lowest plan
    that ran out above it) can re-run a :data:`CLOSE` part less than ``found`` does (no:
    either is missing, or says no ``recompute_fraction``)."""
    share, least = (getattr(c, "recompute_fraction", None) for c in (found, above))
    return share is not None and least is not None and share - least <= CLOSE * share


def _choose(choose, live: int):
    if live < 1:
        return None
    try:
        return choose(live)
    except InfeasibleBudgetError:
        return None


def largest_running(runs, lo: int, top: int, guess: int) -> int | None:
    """The largest b in [``lo``, ``top``] with ``runs(b)`` (monotone), starting at ``guess``:
    from there up by doubling steps while it runs, or down while it does not, then
    bisection; None when not even ``lo`` runs. With a guess near the answer, a few calls."""
    if top < lo:
        return None
    b = min(max(guess, lo), top)
    if runs(b):
        good, step = b, 1
        while good < top:
            nxt = min(top, good + step)
            if not runs(nxt):
                return bisect_largest(runs, good, nxt)
            good, step = nxt, 2 * step
        return good
    bad, step = b, 1
    while bad > lo:
        nxt = max(lo, bad - step)
        if runs(nxt):
            return bisect_largest(runs, nxt, bad)
        bad, step = nxt, 2 * step
    return None


def bisect_largest(runs, good: int, bad: int) -> int:
    """``runs(good)``, not ``runs(bad)`` (``runs`` monotone between them): the largest that
    runs, bisected (here and in :func:`fxmem.report.fit.fit`'s length search).

    >>> bisect_largest(lambda n: n <= 37, 1, 100)
    37
    """
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if runs(mid) else (good, mid)
    return good


def below(live, lo: int, top: int, room: int) -> int:
    """The largest b in [``lo``, ``top``] with ``live(b) <= room`` (a peak formula, growing
    with b; cheap), else ``lo``: where a search by the replay starts."""
    if live(lo) > room:
        return lo
    return bisect_largest(lambda b: live(b) <= room, lo, top + 1) if live(top) > room else top


def no_plan_runs(b: int, budget_bytes: int, walked: Walked, where: str = "",
                 need: int | None = None) -> InfeasibleBudgetError:
    """The error when no plan ran within the budget at ``b``: where the last one tried
    ran out; ``minimum_bytes`` its need with no limit (``need``) when given."""
    if not walked.ran_out:
        return InfeasibleBudgetError(
            f"no checkpoint plan fits {budget_bytes:,} bytes at B={b}{where}",
            minimum_bytes=need or budget_bytes + 1)
    last, run = walked.ran_out[-1]
    plan, peak = last.plan, last.peak_bytes
    needs = f", {need:,} bytes with no limit" if need is not None else ""
    return InfeasibleBudgetError(
        f"no checkpoint plan runs within {budget_bytes:,} bytes at B={b}{where} in the "
        f"caching allocator's replay: {len(walked.ran_out)} tried, the last (plan "
        f"{list(plan)}, live peak {peak:,} bytes{needs}) runs out {oom_phrase(run)}",
        minimum_bytes=max(need or 0, peak, budget_bytes + 1))


__all__ = ["MAX_REPLAYS", "device_run", "oom_phrase", "Walked", "walk",
           "largest_running", "bisect_largest", "below", "no_plan_runs"]
