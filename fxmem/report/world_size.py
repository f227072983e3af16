"""The fewest GPUs under FSDP2, :func:`fxmem.report.fit.fit`'s way of that name
(:func:`fewest_ranks`, without a checkpoint plan and with the cheapest one): what the
search reads of the step as asked (:class:`Asked`) and each world size's analysis, over
which :func:`fxmem.report.world_search.fewest` searches."""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import cached_property

from ..errors import FxmemError, InputError
from ..formula.symbols import B as SYM_B
from .recent import Recent
from .text import fmt_share, plan_text
from .ways import (
    INFERENCE,
    NoPlan,
    WayOut,
    as_asked,
    at_point,
    batch_floor,
    cheapest_plan,
    checked,
    choice_way,
    doing,
    grows,
    live_peak,
    rank_reports,
)
from .world_search import MAX_WORLD_SIZE, fewest, towards

# what one GPU more must save of the step's FLOPs, over the checkpoint way's plan, to be a
# way out of its own: a point (Llama-3.1-8B over 8 GPUs re-runs 13.3 %; on 9, 13.1 % had
# been printed as a way, a GPU for 0.2 % of the FLOPs, after a 3 s trace confirming it)
WORTH = 0.01


class Asked:
    """What :func:`fewest_ranks`' search (:func:`search_ranks`) reads of the step as asked
    (``report``, a one-GPU or FSDP2 report, at ``b``): its strategy, plan, options kept at
    ``b`` (:func:`fxmem.report.ways.as_asked`), the bytes that grow with B, the world-size
    guesses, the checkpoint way (of ``found``) and the plan of smallest peak, each made
    when the search first reads it. :meth:`resolved` makes them all and drops the report:
    what a process that has not the report searches with (:mod:`fxmem.report.ranks_ahead`)."""

    def __init__(self, check, report, b: int, found=()):
        self.strategy = getattr(report, "strategy", None)
        self.compiled = rank_reports(report)[0].trace.compiled
        self.train = rank_reports(report)[0].trace.train
        self.plan = report.plan
        self.changes = as_asked(report, b)  # (a B below the formulas' traced as an int there too)
        self._one = next((f for f in found if f.kind == "checkpoint"), None)
        self._later = None  # () -> the checkpoint way, where it comes after the rest
        self._ready = None  # () -> whether reading it would not wait (None: it would)
        self.start = self.strategy.world_size + 1 if self.strategy is not None else 2
        self.report, self._b, self._budget = report, b, check.budget

    @property
    def one(self):
        """The checkpoint way (of ``found``, or given :meth:`later`), or None."""
        if self._later is not None:
            self._one, self._later = self._later(), None
        return self._one

    @property
    def one_later(self) -> bool:
        """Whether the checkpoint way is still to come (:meth:`later`)."""
        return self._later is not None

    @property
    def one_ready(self) -> bool:
        """Whether reading :attr:`one` would not wait (it is not to come, or has come)."""
        return self._later is None or self._ready is not None and self._ready()

    def later(self, read, ready=None) -> None:
        """The checkpoint way read by ``read()`` when first asked for: what a process given
        the rest before that way was found (:mod:`fxmem.report.ranks_ahead`) waits for only
        once its search needs it. ``ready()``: whether ``read()`` would not wait."""
        self._later, self._ready = read, ready

    @cached_property
    def least(self) -> int:
        """:func:`fxmem.report.ways.batch_floor` at B."""
        return batch_floor(self.report, self._b)

    @cached_property
    def guess(self) -> int | None:
        """:func:`_guess` without a plan."""
        return _guess(self.report, self._b, self._budget, self.start)

    @cached_property
    def smallest(self):
        """:func:`smallest_plan` of the step as asked, or None."""
        return smallest_plan(self.report, self._b)

    @cached_property
    def plan_least(self) -> int:
        """:func:`_plan_floor` at B."""
        return _plan_floor(self.report, self._b)

    @cached_property
    def plan_guess(self) -> int | None:
        """:func:`_guess` under :attr:`smallest`."""
        return _guess(self.report.with_plan(self.smallest), self._b, self._budget, self.start)

    def resolved(self) -> Asked:
        """This (a one-GPU step's), with every figure made that the search may read and no
        report: it pickles.

        >>> import torch, fxmem
        >>> from fxmem.report.ways import Check
        >>> r = fxmem.analyze(torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)]),
        ...                   torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
        >>> a = Asked(Check("live", 1000, 0), r, 64).resolved()
        >>> a.report is None, a.least == batch_floor(r, 64), a.smallest is not None
        (True, True, True)
        """
        out = copy.copy(self)  # (with the figures made so far)
        names = ["least", "guess"]
        if not self.plan and not self.compiled and self.train and out.smallest is not None:
            names += ["plan_least", "plan_guess"]
        for name in names:  # each made, and kept in ``out`` (cached_property)
            getattr(out, name)
        out.report = None
        return out


def fewest_ranks(check, report, b, *, reanalyze=None, dims=None, found=(), jobs=1,
                 later=None, ready=None, **_):
    """FSDP2's fewest GPUs at ``b``, without a plan then with the cheapest one (``found``:
    the ways found before, the plan on one GPU among them). The searches ask rank 0's step
    of each world size tried (derived from one trace: its shards have the most rows); a
    world size's groups of ranks after the first are traced only where it may be the
    answer (:func:`fewest`'s ``every``): where rank 0's does not fit, the step on those
    GPUs does not (Llama-3.2-3B at B=4, L=8192, 39 GPUs with a plan: 101 s when every
    world size tried whose rank 0 fits had its groups traced, seven traces on 134 GPUs; 72
    s). Under FSDP2 the world size asked (``report``'s, which does not fit) is the
    searches' first point, and so twice it their first guess when the estimate
    from ``report``'s shards (:func:`_guess`) finds none (:func:`fewest`): Llama-3.1-70B over
    64 GPUs, whose need falls towards a limit over the budget, is told so from 64 and 128
    GPUs, one trace (65 and 130 had been traced). ``jobs=2``: a world size's neighbour
    below, where both are asked, searched in a child while the world size's plan is traced
    (:func:`fewest`'s ``fork``). ``later()``: the checkpoint way, where it is still being
    searched (beside, by fit's child): read once the search needs it (:meth:`Asked.later`;
    ``ready()``: whether it has come)."""
    line = not_searched(report, reanalyze)
    if line:
        yield line
        return
    asked = Asked(check, report, b, found)
    if later is not None:
        asked.later(later, ready)
    yield from search_ranks(check, asked, b, reanalyze=reanalyze, dims=dims, jobs=jobs)


def not_searched(report, reanalyze) -> str:
    """Why :func:`fewest_ranks` searches nothing for ``report``, or ``""``."""
    from ..trace.parallel import FSDP

    strategy = getattr(report, "strategy", None)
    if reanalyze is None:
        return "the fewest GPUs under FSDP2: not searched (the report cannot analyse again)"
    if strategy is not None and not (isinstance(strategy, FSDP) and strategy.replicate == 1):
        return f"the fewest GPUs under FSDP2: not searched for {strategy.name}"
    return ""


def search_ranks(check, asked: Asked, b, *, reanalyze, dims=None, jobs=1):
    """:func:`fewest_ranks`' search from what it reads of the step as asked (``asked``;
    under FSDP2, its report too: the world size asked is the report)."""
    from ..trace.parallel import FSDP

    strategy, dims = asked.strategy, dims or {}
    # a compiled step: its parts compiled on their own are traced on each rank as on one
    # GPU; what is not modelled under FSDP2 (a model compiled whole) says so when analysed
    compiled = asked.compiled
    base = strategy or FSDP(1)
    plan = asked.plan
    memo = Recent()
    # one GPU as asked: every world size tried is read at b and the dims' values alone, so
    # each is traced there (Llama-3.1-8B over 8 GPUs: 2.10 s against 2.61 s in B and L); a
    # world size asked under FSDP2 is its report in B, which the others derive from
    changes = asked.changes if strategy is not None or compiled else \
        {**asked.changes, **at_point(b, dims)}

    def at(w):  # the other groups of ranks traced where the first fits (where it does not,
        if strategy is not None and w == base.world_size:  # the step on w GPUs does not:
            return asked.report  # ``lead``); the world size asked: the report itself
        if w not in memo:
            r = reanalyze(parallel=replace(base, world_size=w), defer=True, **changes)
            memo[w] = r.at(**dims) if dims else r
        return memo[w]

    def lead(w):
        return at(w).first_group()

    start = asked.start
    # the needs and floors of world sizes that do not fit: rank 0's, which guide the search
    # (its shards have the most rows, and no other rank holds more at once); the world size
    # asked is the first when its rank 0 does not fit (FSDP2's: one GPU's step has no shards)
    w0 = base.world_size if strategy is not None else None
    seen = [] if w0 is None or check.fits(lead(w0), b) else \
        [(w0, check.need(lead(w0), b), check.floor(lead(w0), b))]
    least = asked.least
    try:
        w = None if least >= check.budget else fewest(
            lambda w: check.fits(lead(w), b), start,
            need=lambda w: check.need(lead(w), b), budget=check.budget, seen=seen,
            floor=lambda w: check.floor(lead(w), b), guess=asked.guess, fork=jobs > 1,
            every=lambda w: check.fits(at(w), b))  # (the other groups: at the answer alone)
    except InputError as e:
        if not compiled:
            raise
        yield f"the fewest GPUs under FSDP2: not searched: {e}"
        return
    if w is None:
        yield (f"no number of GPUs under FSDP2 fits B={b} without a checkpoint plan: "
               + (towards(seen, check.by) if least < check.budget else grows(least)))
    else:
        yield WayOut("fsdp", w, check.need(at(w), b, True), f"FSDP2 over {w} GPUs",
                     plan=plan, beyond=_gpus(w - 1) + " not fit")
    if plan:
        return
    if compiled:
        yield ("the fewest GPUs under FSDP2 with a checkpoint plan: not searched for a "
               "compiled step (a plan over its compiled blocks is traced when given, not "
               "chosen)")
        return
    if not asked.train:
        yield f"the fewest GPUs under FSDP2 with a checkpoint plan: {INFERENCE}"
        return
    smallest = asked.smallest
    if smallest is None:
        yield "the fewest GPUs under FSDP2 with a checkpoint plan: the model has none to choose"
        return
    planned, choices = Recent(), Recent()

    def under(w, part=at):  # FSDP2 over w GPUs (``part``: its ranks, or rank 0's ``lead``)
        key = w, part is lead  # under its own plan of smallest peak, derived (one GPU's can
        if key not in planned:  # keep far more: docs/concepts.md, "the ways out")
            planned[key] = part(w).with_plan(smallest_plan(part(w), b) or smallest)
        return planned[key]

    def choice(w, confirm=False, part=at):  # the cheapest plan that runs on w GPUs (derived
        key = w, confirm, part is lead  # while searching), or the line saying why none does
        if key not in choices:
            choices[key] = cheapest_plan(check, part(w), b, confirm)
        return choices[key]

    def runs(w, part):  # some plan runs: first its plan of smallest peak (one replay), else
        if check.fits(under(w, part), b):  # the planner's walk; the cheapest, at the answer
            return True
        if check.by == "live":  # the plan of smallest live peak fits when any plan does
            return False
        c = choice(w, part=part)  # (by the allocator, a plan of larger live peak can
        return not isinstance(c, str) and checked(check, c, b)  # fragment less)

    def fits(w):  # rank 0's plans derived (the search's question; the others at an answer)
        return runs(w, lead)

    def every(w):  # where a plan runs on rank 0 and there are other groups, the cheapest
        if len(at(w).groups) == 1:  # traced on every group (ParallelReport.plan_for: chosen
            return True  # on rank 0, so the others are traced with it alone)
        c = choice(w, True)
        return not isinstance(c, str) and checked(check, c, b)

    def need(w):  # of a w that does not fit, rank 0's (as without a plan); where no plan
        c = None if check.by == "live" or check.fits(under(w, lead), b) else \
            choice(w, part=lead)  # runs there, the least a plan's step needs
        return c.minimum_bytes if isinstance(c, NoPlan) else check.need(under(w, lead), b)
    # a plan fits the step as asked (the checkpoint way): one GPU more is a way where a plan
    # runs there re-running a point (WORTH) less. None that runs on every rank re-runs less
    # than the cheapest that runs on rank 0 (derived): when that one does not, the other
    # ranks there are not traced. A checkpoint way still to come is read once the search
    # below is done (one GPU as asked: the process searching ahead is given it later,
    # fxmem.report.ranks_ahead), or under FSDP2 once the walk its line reads is made (fit's
    # child searches it beside: the walk here while that search goes on, then the way
    # waited for)
    def as_asked_line(one):
        first = None if one is None else choice(start, part=lead)
        if first is not None and not isinstance(first, str):
            return _not_worth(one.recompute_share, first.recompute_fraction, start)
    if asked.one_later and w0 is not None and not asked.one_ready:
        choice(start, part=lead)  # (where the way is there, read first: no walk in vain)
    one = None if asked.one_later and w0 is None else asked.one
    if line := as_asked_line(one):
        yield line
        return
    top = MAX_WORLD_SIZE if w is None else w - 1
    seen = [] if w0 is None or one is not None else \
        [(w0, need(w0), live_peak(under(w0, lead), b))]  # no plan runs as asked
    least = asked.plan_least
    w2 = None if least >= check.budget else fewest(
        fits, start, top, need=need, budget=check.budget, seen=seen,
        floor=lambda w: live_peak(under(w, lead), b),  # no plan's peak is under it
        guess=asked.plan_guess, fork=jobs > 1, every=every)
    if asked.one_later:  # (one GPU as asked: no world size of the search read it)
        if line := as_asked_line(one := asked.one):
            yield line
            return
    if w2 is None:
        yield ("FSDP2 with a checkpoint plan needs as many GPUs as without one" if w else
               f"no number of GPUs under FSDP2 fits B={b} with a checkpoint plan either "
               f"({plan_text(smallest)}, the smallest peak on one GPU): "
               + (towards(seen, "live") if least < check.budget else grows(least, True)))
        return
    # one GPU fewer than the search's start is the step as asked: its plan is the checkpoint way
    one = one if w2 == start else None
    n = _n_gpus(w2 - 1)
    # (at ``start``, rank 0's cheapest plan, derived, re-runs less than the checkpoint way:
    # ``first`` above; the plan over every rank is compared once traced, below: no other
    # rank is traced without a plan for it)
    picked = choice(w2, True)  # the cheapest plan there, traced (the search derived it)
    while check.by == "device" and w2 < top and (isinstance(picked, str)
                                                 or not checked(check, picked, b)):
        w2 += 1  # traced, it runs out (a forward that changes state when it re-runs)
        picked = choice(w2, True)
    template = f"FSDP2 over {w2} GPUs {{doing}} (re-running {{share}})"
    if isinstance(picked, str) or not checked(check, picked, b):
        r = under(w2)
        flops = rank_reports(r)[0].flop_count
        redo = int(flops.recompute.subs(SYM_B, b))
        share = redo / (int(flops.total.subs(SYM_B, b)) - redo)
        way = WayOut("fsdp+checkpoint", w2, check.need(r, b, True), template.format(
            doing=doing(r.plan), share=fmt_share(share)), plan=r.plan, recompute_share=share)
    else:
        way = choice_way(check, picked, b, "fsdp+checkpoint", w2, template)
    if one is None:
        yield replace(way, beyond=_gpus(w2 - 1) + " not fit with any plan")
    elif line := _not_worth(one.recompute_share, way.recompute_share, w2):
        yield line
    else:
        yield replace(way, beyond=f"on {n} the cheapest plan re-runs "
                                  f"{fmt_share(one.recompute_share)} (the checkpoint way)")




def _not_worth(asked: float, more: float, w: int) -> str | None:
    """The line saying one GPU more is no way out, where its cheapest plan (re-running
    ``more`` of the FLOPs on ``w`` GPUs) re-runs under :data:`WORTH` (a point of the step's
    FLOPs) less than the checkpoint way's (``asked``, on ``w - 1``); else None.

    >>> _not_worth(0.133, 0.131, 9)
    'FSDP2 with a checkpoint plan: on 9 GPUs the cheapest plan re-runs 13.1%, under a point \
less than the checkpoint way on 8 GPUs (13.3%)'
    >>> _not_worth(0.133, 0.12, 9) is None
    True
    """
    if asked <= more:
        return (f"FSDP2 with a checkpoint plan: on {_n_gpus(w - 1)} a plan re-running no more "
                "fits (the checkpoint way)")
    if asked < more + WORTH:
        return (f"FSDP2 with a checkpoint plan: on {_n_gpus(w)} the cheapest plan re-runs "
                f"{fmt_share(more)}, under a point less than the checkpoint way on "
                f"{_n_gpus(w - 1)} ({fmt_share(asked)})")
    return None


def _guess(report, b: int, budget: int, start: int) -> int | None:
    """The fewest GPUs from ``start`` whose estimated rank peak (the largest rank's live
    bytes, its shards scaled from its world size: :func:`fxmem.memory.liveness.sharded_peak`,
    which falls as GPUs are added) is within ``budget``, bisected: where the world-size
    search looks first. None when no world size is."""
    from ..memory.liveness import sharded_peak

    w0 = getattr(getattr(report, "strategy", None), "world_size", 1)
    peaks = [sharded_peak((r._small(b) or r).liveness, b) for r in rank_reports(report)]
    if not peaks:
        return None
    lo, hi = start, MAX_WORLD_SIZE + 1  # hi: known within the budget (or past the search)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if max(p(w0 / mid) for p in peaks) <= budget else (mid + 1, hi)
    return lo if lo <= MAX_WORLD_SIZE else None


def _n_gpus(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}"


def _gpus(n: int) -> str:
    return f"{n} GPUs do" if n > 1 else "1 GPU does"


def smallest_plan(report, b: int):
    """The checkpoint plan with the smallest peak at ``b`` (the frontier's last; of a
    :class:`fxmem.ParallelReport`, the largest rank's), or None."""
    from ..checkpoint.options import Planner
    from ..checkpoint.ranks import smallest

    try:
        if getattr(report, "groups", None) is not None:
            return smallest(*report._planner(None), b)[0] or None
        if getattr(report, "named", True) is None and not report._small(b):
            planner = report._chooser()
            if isinstance(planner, Planner):  # its last point alone, not the frontier's
                return planner.smallest(b, report=False).plan or None
        points = report.frontier(b)
    except FxmemError:
        return None
    return points[-1].plan if points and points[-1].plan else None


def _plan_floor(report, b: int) -> int:
    """Bytes of the storages that grow with B that no checkpoint plan's step at ``b`` holds
    fewer of at once, the largest rank's (:meth:`fxmem.checkpoint.options.Planner.least_
    growing`, a bound over every plan the planner can choose): as :func:`batch_floor`
    without a plan, no number of GPUs runs a plan's step in fewer. 0 where no planner over
    a chain of blocks bounds them, or B is traced as an int."""
    from ..checkpoint.options import Planner

    out = 0
    for r in rank_reports(report):
        if r._small(b) is not None:
            continue
        try:
            planner = r._chooser()
        except FxmemError:
            return 0
        if not isinstance(planner, Planner):
            return 0
        out = max(out, planner.least_growing(b))
    return out
