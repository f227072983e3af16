"""Choosing a plan of whole modules (``kinds=["module"]``, and any candidates that are not a chain
of blocks): the solver's numbers from one trace, and the checks after it.

At one batch size, for each candidate segment j (:func:`default_candidates`), the plan ``{j}``
is derived from the base trace (:mod:`fxmem.checkpoint.plans`) and its live bytes compared with
the base step's, op by op:

- ``released[j]``: the least drop in live bytes from the end of j's forward until its
  recomputation starts (its *window*); every point in the window is lowered by it;
- spike points (``only_if=j``): live bytes during j's recomputation;
- outside its window (j's own forward and backward), where ``{j}`` differs from the base
  step (checkpoint keeps j's inputs until j's backward is done; recomputed tensors die when
  backward drops them, earlier than saved ones), the point is split in two: the base bytes
  ``unless=j``, the bytes under ``{j}`` ``only_if=j``;
- ``cost[j]``: FLOPs of the recomputed ops (:mod:`fxmem.checkpoint.flops`).

That is the :class:`fxmem.checkpoint.solve.Problem`: plain numbers, solved exactly on chains by
dynamic programming. Segments interact a little (a storage made in one and read by the next), so
the solver's peak is a model; the plan it returns is derived exactly, and if it does not fit the
budget is tightened (below its model peak, by the excess) and the solver asked again.

>>> import torch, fxmem
>>> blocks = [torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(),
...                               torch.nn.Linear(256, 32)) for _ in range(4)]
>>> m = torch.nn.Sequential(*blocks)
>>> r = fxmem.analyze(m, torch.randn(8, 32), loss=lambda o: o.square().mean(), device="cpu")
>>> choice = r.plan_for(budget_bytes=r.peak_bytes(512) * 3 // 4, B=512, kinds=["module"])
>>> choice.plan, choice.peak_bytes <= r.peak_bytes(512) * 3 // 4
(<Plan: 0, 1>, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InfeasibleBudgetError, InputError
from ..formula.symbols import B, Size
from ..memory.liveness import start_bytes, timeline
from ..memory.sizes import device_sizes
from ..trace.plans import Plan
from . import solve as S
from .plans import derive
from .schedules import schedule

MAX_TIGHTENINGS = 6  # re-solves with a smaller budget when the exact peak is over it
LIMIT_B = 2**40  # a batch size past this fits: the peak does not grow with B
MAX_FRONTIER = 256  # Pareto points asked of the solver (each is then derived exactly)
FRONTIER_SAMPLES = 64  # budgets sampled down to the smallest peak beyond MAX_FRONTIER


@dataclass(frozen=True)
class PlanChoice:
    """A checkpoint plan chosen for batch size ``B``.

    ``peak_bytes``: the exact peak under the plan, live bytes (derived from the trace, or
    traced); ``recompute_flops`` / ``step_flops``: FLOPs re-run by the plan / of the step
    without it; ``report``: the :class:`fxmem.Report` under the plan; ``exact``: the solver
    proved this plan the cheapest that fits (False after a heuristic, a tightened budget or
    plans passed over unreplayed). ``by``: how the budget was checked, as
    :meth:`fxmem.Report.max_batch_size` says it: ``"live"`` (the peak fits) or
    ``"device"`` (a CUDA step: the plan's steps run through the caching allocator's replay
    within the budget, :mod:`fxmem.checkpoint.on_device`); ``run``: for ``"device"``, that
    replay (a :class:`fxmem.device.allocator.DeviceRun`, the rank group's that reserved the
    most under a parallel step), else None. ``compiled``: for a compiled candidate
    (``kinds=[..., "compiled"]``, :mod:`fxmem.checkpoint.compiled`), the partitioner budget
    of ``torch.compile`` it is (``plan`` empty: ``compile={"activation_memory_budget":
    compiled}``), else None.
    """

    B: int
    plan: tuple
    peak_bytes: int
    recompute_flops: int
    step_flops: int
    report: object = field(repr=False)
    exact: bool = True
    by: str = "live"
    run: object = field(default=None, repr=False)
    compiled: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "plan", Plan.of(self.plan))

    @property
    def recompute_fraction(self) -> float:
        """Recompute FLOPs as a fraction of the step's FLOPs."""
        return self.recompute_flops / self.step_flops if self.step_flops else 0.0


@dataclass(frozen=True)
class FrontierPoint:
    """A Pareto-optimal plan at one batch size: no plan has a lower peak for fewer FLOPs.
    ``compiled``: for a compiled candidate, its ``torch.compile`` partitioner budget (``plan``
    empty), else None."""

    peak_bytes: int
    recompute_flops: int
    plan: tuple
    compiled: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "plan", Plan.of(self.plan))


def default_candidates(report) -> tuple:
    """Module paths the solver chooses from: the valid segments (:attr:`Report.segments`)
    that release memory and are blocks of a stack (an ``nn.Sequential`` / ``nn.ModuleList``
    child, i.e. a numbered path such as ``layer1.0`` or ``transformer.h.3``), outermost
    first; without any, the valid segments that release memory and contain no other."""
    b = report.trace.batch_hint
    good = [s for s in report.segments if s.valid and s.released_bytes.subs(B, b) > 0]
    stacked = [s.path for s in good if s.path.rsplit(".", 1)[-1].isdigit()]
    out = [p for p in stacked if not any(p.startswith(q + ".") for q in stacked)]
    if not out:
        paths = [s.path for s in good]
        out = [p for p in paths if not any(q.startswith(p + ".") for q in paths)]
    return tuple(out)


class Chooser:
    """The solver's problem for one report and candidate list, per batch size."""

    def __init__(self, report, candidates=None):
        from ..trace.plans import check_plan

        if report.plan:
            raise InputError("choose a plan from a report without one (this one has "
                             f"{list(report.plan)})")
        self.report = report
        trace = report.trace
        cands = default_candidates(report) if candidates is None else \
            check_plan({c.path for c in trace.calls}, candidates)
        scheds = {p: schedule(trace, p) for p in cands}
        # segments whose checkpoint changes nothing are not choices
        self.candidates = tuple(sorted((p for p in cands if scheds[p] is not None
                                        and scheds[p].recompute_at is not None),
                                       key=lambda p: scheds[p].first_op))
        self.scheds = [scheds[p] for p in self.candidates]
        self.derived = [derive(trace, (p,)) for p in self.candidates]
        self._flops = {i: Size.of(f) for i, (f, _) in report._op_flops.items()}
        self._step = Size.of(report.flop_count.total)
        self._sizes = [device_sizes(t.storages, report.device) for t in self.derived]
        self._peaks: dict = {}

    # numbers at one batch size --------------------------------------------------------
    def step_flops(self, b: int) -> int:
        return self._step(b)

    def cost(self, j: int, b: int) -> int:
        sc = self.scheds[j]
        return sum(self._flops[i](b) for i in range(sc.first_op, sc.stop) if i in self._flops)

    def problem(self, b: int) -> S.Problem:
        base = self.report.liveness.timeline(b)
        n = len(self.candidates)
        window = [(sc.last_op + 1, sc.recompute_at) for sc in self.scheds]  # [lo, hi)
        released, spikes = [], []
        differs: dict = {}  # base op -> [(bytes under {j}, j)] outside j's window
        for j in range(n):
            t = self.derived[j]
            tl = timeline(t.storages, self._sizes[j], len(t.ops), b)
            lo, hi = window[j]
            drop = [base[op.source] - v for op, v in zip(t.ops, tl)
                    if not op.recompute and lo <= op.source < hi]
            released.append(max(0, min(drop, default=0)))
            for op, v in zip(t.ops, tl):
                if op.recompute:
                    spikes.append((v, window[j][1], j))
                elif v != base[op.source] and not lo <= op.source < hi:
                    differs.setdefault(op.source, []).append((v, j))
        points: dict = {}

        def add(v, t, only_if=-1, unless=-1):
            cov = tuple(k for k in range(n) if window[k][0] <= t < window[k][1])
            key = (cov, only_if, unless)
            if v > points.get(key, -1):
                points[key] = v

        add(start_bytes(self.report.trace.storages, self.report.liveness.sizes, b), 0)
        for t, v in enumerate(base):
            devs = sorted(differs.get(t, ()), key=lambda d: (-abs(d[0] - v), d[1]))
            if not devs:
                add(v, t)
                continue
            # exact for the segment that changes this point most: v unless it is
            # checkpointed, its own value if it is; the others only where they add bytes
            add(v, t, unless=devs[0][1])
            add(devs[0][0], t, only_if=devs[0][1])
            for w, j in devs[1:]:
                if w > v:
                    add(w, t, only_if=j)
        for v, t, j in spikes:
            add(v, t, only_if=j)
        pts = tuple(S.Point(v, cov, only, unless)
                    for (cov, only, unless), v in sorted(points.items()))
        return S.Problem(tuple(released), tuple(self.cost(j, b) for j in range(n)), pts,
                         self.candidates)

    # choices -----------------------------------------------------------------------
    def choose(self, budget_bytes: int, b: int, max_recompute_flops: int | None = None):
        """The cheapest plan whose exact peak at ``b`` fits, as a :class:`PlanChoice`."""
        problem = self.problem(b)

        def solve(budget):
            sol = S.solve(problem, budget)
            return sol.plan, sol.exact, sol.peak_bytes, sol.cost_flops

        got = tightened(solve, lambda idx: (self.peak(idx, b), self.costs(idx, b)),
                        budget_bytes, max_recompute_flops)
        if got is not None:
            return self._choice(got[0], b, got[1]) if got[0] is not None else None
        if max_recompute_flops is not None:
            return None
        low = self.smallest(b)
        raise InfeasibleBudgetError(
            f"no checkpoint plan over {len(self.candidates)} candidate segments fits "
            f"{budget_bytes:,} bytes at B={b}: the smallest peak is {low.peak_bytes:,} bytes "
            f"(plan {list(low.plan)})", minimum_bytes=low.peak_bytes)

    def smallest(self, b: int) -> PlanChoice:
        """The plan of the smallest peak at ``b`` (the solver's
        :func:`fxmem.checkpoint.solve.min_peak`, derived exactly)."""
        return self._choice(S.min_peak(self.problem(b)).plan, b, False)

    def frontier(self, b: int) -> tuple:
        """Pareto-optimal (exact peak, recompute FLOPs, plan) at ``b``, peak descending.

        Complete when the solver's frontier has at most ``MAX_FRONTIER`` points; beyond, those
        from the cheap end, plus the cheapest plans at ``FRONTIER_SAMPLES`` budgets evenly
        spaced down to the smallest peak, and the smallest peak's plan."""
        problem = self.problem(b)
        sols = list(S.frontier(problem, max_points=MAX_FRONTIER))
        if len(sols) == MAX_FRONTIER:
            low = S.min_peak(problem)
            top = sols[-1].peak_bytes
            for k in range(1, FRONTIER_SAMPLES):
                sols.append(S.solve(problem, top - (top - low.peak_bytes) * k // FRONTIER_SAMPLES))
            sols.append(low)
        pts = sorted({(self.costs(s.plan, b), self.peak(s.plan, b), s.plan) for s in sols})
        out = []
        for cost, peak, idx in pts:  # keep those no cheaper plan beats on peak
            if not out or peak < out[-1].peak_bytes:
                out.append(FrontierPoint(peak, cost, self.paths(idx)))
        return tuple(out)

    def numbers(self, plan, b: int) -> tuple:
        """(exact peak, recompute FLOPs) of ``plan`` (candidate paths) at ``b``."""
        idx = self._index(plan)
        return self.peak(idx, b), self.costs(idx, b)

    def choice_of(self, plan, b: int) -> PlanChoice:
        """``plan`` at ``b`` as a :class:`PlanChoice` (not proven the cheapest)."""
        return self._choice(self._index(plan), b, False)

    def _index(self, plan) -> tuple:
        return tuple(sorted(self.candidates.index(p) for p in Plan.of(plan)))

    def paths(self, idx) -> tuple:
        return tuple(sorted(self.candidates[i] for i in idx))

    def costs(self, idx, b: int) -> int:
        return sum(self.cost(i, b) for i in idx)

    def peak(self, idx, b: int) -> int:
        """Exact peak bytes at ``b`` of the plan of candidates ``idx`` (derived, numeric)."""
        key = (tuple(idx), b)
        if key not in self._peaks:
            t = derive(self.report.trace, self.paths(idx)) if idx else self.report.trace
            sizes = device_sizes(t.storages, self.report.device)
            self._peaks[key] = max([start_bytes(t.storages, sizes, b),
                                    *timeline(t.storages, sizes, len(t.ops), b)])
        return self._peaks[key]

    def _choice(self, idx, b: int, exact: bool) -> PlanChoice:
        plan = self.paths(idx)
        rep = self.report.with_plan(plan) if plan else self.report
        return PlanChoice(b, plan, rep.peak_bytes(b), self.costs(idx, b), self.step_flops(b),
                          rep, exact)


def tightened(solve, numbers, budget_bytes: int, max_recompute_flops: int | None,
              dearer: int | None = None):
    """The solver's answer checked exactly, the budget tightened while the model was short.

    ``solve(budget)`` -> ``(plan, exact, model peak, model cost)`` (raises
    :class:`fxmem.InfeasibleBudgetError`); ``numbers(plan)`` -> its exact ``(peak,
    recompute FLOPs)``. A plan over the budget by ``over`` bytes was ``over`` plus what its
    model peak left of the budget short, so the next budget is its model peak less
    ``over``: where the model is short by more than the excess, a budget lowered by the
    excess alone gave the same plan again (Llama-3.1-70B's walk: 25 of 65 solves; 0.25 s
    each). ``dearer``: a model cost some plan that fits has already (a solver exact for its
    model): a plan past it ends the search, since a smaller budget costs no less.
    Returns ``(plan, exact)`` for a plan that fits, ``(None, False)`` when it costs more
    than ``max_recompute_flops``, and ``None`` when nothing was found within
    ``MAX_TIGHTENINGS`` solves or past ``dearer``."""
    budget, exact = budget_bytes, True
    for _ in range(MAX_TIGHTENINGS):
        try:
            plan, solved_exactly, model_peak, model_cost = solve(budget)
        except InfeasibleBudgetError:
            return None
        if dearer is not None and model_cost > dearer:
            return None
        peak, cost = numbers(plan)
        if peak <= budget_bytes:
            if max_recompute_flops is not None and cost > max_recompute_flops:
                return None, False
            return plan, exact and solved_exactly
        budget = min(budget, model_peak) - (peak - budget_bytes)  # the model was short
        exact = False
    return None


def max_batch_size(report, budget_bytes: int, max_recompute: float,
                   candidates=None, kinds=None) -> PlanChoice:
    """The largest B whose peak fits ``budget_bytes`` with a plan re-running at most
    ``max_recompute`` of the step's FLOPs, with that plan (see :meth:`Report.max_batch_size`;
    derived: :func:`fxmem.checkpoint.confirm.max_batch_size` traces it)."""
    return most(report, budget_bytes, max_recompute, candidates, kinds)[0]


def most(report, budget_bytes, max_recompute, candidates=None, kinds=None):
    """``(the choice at the largest B, at(b) -> the choice at b)`` for
    :func:`max_batch_size`.

    :func:`fxmem.formula.search.largest` over the batch sizes where a plan is chosen, its
    ``advance`` following the plan found at one B up to the largest B it still fits within
    the recompute share (its exact numbers, no solve). A plan found at one B is also tried
    at a B where the solver finds none."""
    if not 0 <= max_recompute:
        raise InputError(f"max_recompute is a fraction of the step's FLOPs, got {max_recompute!r}")
    from ..formula.search import largest

    ch = report._chooser(candidates, kinds)
    choices: dict = {}
    found: dict = {}  # plans that fit somewhere, in the order found

    def share(b) -> int:  # recompute FLOPs allowed at b
        return int(max_recompute * ch.step_flops(b))

    def fits(plan, b) -> bool:
        peak, cost = ch.numbers(plan, b)
        return peak <= budget_bytes and cost <= share(b)

    def at(b):
        if b not in choices:
            c = ch.choose(budget_bytes, b, share(b))
            if c is None:
                c = next((ch.choice_of(p, b) for p in found if fits(p, b)), None)
            if c is not None:
                found.setdefault(c.plan)
            choices[b] = c
        return choices[b]

    def reach(b) -> int:  # the largest B >= b at which the plan found at b fits
        return largest(lambda x: x == b or fits(at(b).plan, x), b, limit=LIMIT_B)

    lo = report.min_batch_size
    if at(lo) is None:
        low = ch.smallest(lo)
        raise InfeasibleBudgetError(
            f"budget {budget_bytes:,} B is below the smallest peak at B={lo} within "
            f"{max_recompute:.0%} recompute; the smallest with any plan is "
            f"{low.peak_bytes:,} B", minimum_bytes=low.peak_bytes)
    lo = largest(lambda b: at(b) is not None, lo, limit=LIMIT_B, advance=reach)
    return at(lo), at
