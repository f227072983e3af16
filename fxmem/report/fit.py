"""Whether a step fits a budget at batch size B and, when it does not, by how much and the
ways that make it fit, each computed, not suggested: the largest B that fits, the cheapest
checkpoint plan at B, the fewest GPUs under FSDP2 (with and without a plan), the longest
sequence at B. Every way is checked the way the headline is answered (``by``: for a CUDA
step, the caching allocator's replay within the budget, :meth:`fxmem.Report.runs_on_device`;
on the CPU, live bytes): the step fits there, and one step beyond it, it does not.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
...                                               torch.nn.Linear(256, 64)) for _ in range(4)])
>>> r = fxmem.analyze(m, torch.randn(4, 64), loss=lambda o: o.sum(), device="cpu",
...                   optimizer=torch.optim.Adam)
>>> f = r.fits(512, 4_000_000)
>>> bool(f), f.over_bytes > 0, [w.kind for w in f.ways]
(False, True, ['batch', 'checkpoint', 'fsdp+checkpoint'])
>>> f.way("batch").line, f.way("batch").beyond
('B=229 (the largest B that fits)', 'B=230 does not fit')
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..checkpoint.on_device import oom_phrase
from ..errors import FxmemError, InfeasibleBudgetError, InputError
from ..formula.symbols import B as SYM_B
from .recent import Recent
from .text import fmt_bytes, plan_text
from .world_size import MAX_WORLD_SIZE, fewest, towards

KINDS = ("batch", "checkpoint", "fsdp", "fsdp+checkpoint", "length")


@dataclass(frozen=True)
class WayOut:
    """One change that makes the step fit, checked.

    ``kind``: one of :data:`KINDS`; ``value``: the batch size (``"batch"``), the number of
    GPUs (``"fsdp"``, ``"fsdp+checkpoint"``), the sequence length (``"length"``), or the
    asked B (``"checkpoint"``); ``need_bytes``: what the step takes there, answered as the
    budget is (``Fit.by``: for ``"device"``, ``max_memory_reserved()`` within the budget);
    ``plan``: the checkpoint plan it takes (a :class:`fxmem.Plan`, for ``analyze(...,
    checkpoint=plan)``; empty: none) and ``recompute_share``: the FLOPs that plan re-runs,
    as a share of the step's; ``beyond``: what one step beyond gives (the next B, one GPU
    fewer, the next length, or that no cheaper plan fits); ``line``: the way, for people;
    ``compiled``: the ``torch.compile`` budget that takes the place of a plan (a compiled
    step's plans, :mod:`fxmem.checkpoint.compiled`), else None."""

    kind: str
    value: int
    need_bytes: int
    line: str
    plan: tuple = ()
    recompute_share: float = 0.0
    beyond: str = ""
    compiled: float | None = None

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**d, "plan": [str(e) for e in self.plan]}


@dataclass(frozen=True)
class Fit:
    """Whether the step at batch size ``B`` (and ``dims``, the named dims' values) fits
    ``budget_bytes``, answered ``by`` ``"device"`` (a CUDA step: the caching allocator's
    replay runs) or ``"live"`` (live bytes). ``need_bytes``: what it needs at ``B``
    (``"device"``: the replay's ``max_memory_reserved()`` with no limit; ``"live"``: the
    peak); ``oom``: where the replay within the budget runs out, a phrase ("at aten.mm in
    fc (forward, step 1)"; ``""`` when it fits or on the CPU); ``ways``: :class:`WayOut`
    s, empty when it fits; ``none``: one line for each way searched that found nothing
    (e.g. no plan fits at ``B``). ``bool(fit)`` is ``fits``."""

    B: int
    budget_bytes: int
    by: str
    fits: bool
    need_bytes: int
    dims: dict = field(default_factory=dict)
    oom: str = ""
    ways: tuple = ()
    none: tuple = ()

    def __bool__(self) -> bool:
        return self.fits

    @property
    def over_bytes(self) -> int:
        """How far ``need_bytes`` is over the budget (negative: the room left)."""
        return self.need_bytes - self.budget_bytes

    def way(self, kind: str) -> WayOut | None:
        """The way of ``kind`` (one of :data:`KINDS`), or None when none was found."""
        return next((w for w in self.ways if w.kind == kind), None)

    @property
    def line(self) -> str:
        """One line: whether it fits and, when not, the ways (long plans summarised)."""
        at = ", ".join(f"{k}={v}" for k, v in {"B": self.B, **self.dims}.items())
        need = fmt_bytes(self.need_bytes)
        if self.fits:
            return f"{at} fits {fmt_bytes(self.budget_bytes)} ({need} needed)"
        head = (f"{at} does not fit {fmt_bytes(self.budget_bytes)}: it needs {need}, "
                f"{fmt_bytes(self.over_bytes)} over")
        if not self.ways:
            return head + "; nothing fxmem searched makes it fit"
        return head + "; it fits with " + "; or ".join(w.line for w in self.ways)

    def as_dict(self) -> dict:
        return {"B": self.B, "dims": dict(self.dims), "budget_bytes": self.budget_bytes,
                "by": self.by, "fits": self.fits, "need_bytes": self.need_bytes,
                "over_bytes": self.over_bytes, "oom": self.oom,
                "ways": [w.as_dict() for w in self.ways], "none": list(self.none)}


def fit(report, B: int, budget_bytes: int, *, by: str | None = None,  # noqa: N803
        cudnn_workspace: int = 0, named=None, dims=None, limit: int | None = None,
        ways: bool = True, reanalyze=None, progress=None) -> Fit:
    """The :class:`Fit` of ``report`` (a :class:`fxmem.Report` in B alone or a
    :class:`fxmem.ParallelReport`) at batch size ``B`` within ``budget_bytes``.
    ``named``: the report in named dims that ``report`` is at ``dims`` (the longest-length
    way needs it; ``limit``: the model's own maximum length). ``reanalyze(**options)``: the
    step analysed again with other :func:`fxmem.analyze` options (``parallel=``,
    ``checkpoint=``; and ``concrete_batch=B`` for a ``B`` below where the formulas hold:
    traced at that B alone), for the FSDP2 ways; :func:`fxmem.analyze` gives reports one
    (``Report.reanalyze``). ``ways=False``: only whether it fits. ``progress(what)``: called
    with what is being searched as each search starts (the CLI's status line)."""
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise InputError(f"B must be a positive int, got {B!r}")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
        raise InputError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
    by = by or ("device" if report.device == "cuda" else "live")
    if by not in ("device", "live"):
        raise InputError(f"by is 'device' or 'live' (how the budget is checked), got {by!r}")
    check = _Check(by, budget_bytes, cudnn_workspace)
    ok, oom = check.runs(report, B)
    out = Fit(B, budget_bytes, by, ok, check.need(report, B), dict(dims or {}), oom)
    if ok or not ways:
        return out
    found, none = [], []
    for what, way in (("the largest B", _largest_batch),
                      (f"the cheapest checkpoint plan at B={B}", _plan_at),
                      ("the fewest GPUs under FSDP2", _fewest_ranks),
                      (f"the longest sequence at B={B}", _longest)):
        if progress is not None:
            progress(what)
        for w in way(check, report, B, named=named, dims=dims or {}, limit=limit,
                     reanalyze=reanalyze, found=tuple(found)):
            found.append(w) if isinstance(w, WayOut) else none.append(str(w))
    return replace(out, ways=tuple(found), none=tuple(none))


class _Check:
    """Runs and needs at one budget, answered ``by`` one kind."""

    def __init__(self, by: str, budget: int, cudnn_workspace: int):
        self.by, self.budget, self.cudnn = by, budget, cudnn_workspace

    def runs(self, report, b: int) -> tuple:
        """(whether the step at ``b`` fits, where it runs out or ``""``)."""
        for r in _reports(report):
            if self.by == "live":
                if r.peak_bytes(b) > self.budget:
                    return False, ""
                continue
            run = r.runs_on_device(b, self.budget, cudnn_workspace=self.cudnn)
            if not run.fits:
                return False, oom_phrase(run)
        return True, ""

    def fits(self, report, b: int) -> bool:
        return self.runs(report, b)[0]

    def need(self, report, b: int, within: bool = False) -> int:
        """What the step at ``b`` needs, the largest rank's: live bytes, or for ``"device"``
        ``max_memory_reserved()``, replayed with no limit or (``within``, a step that fits)
        within the budget, where the allocator frees its cache and retries rather than
        fail."""
        if self.by == "live":
            return max(r.peak_bytes(b) for r in _reports(report))
        if within:
            return max(r.runs_on_device(b, self.budget, cudnn_workspace=self.cudnn).max_reserved
                       for r in _reports(report))
        return max(r.cuda_memory(b, cudnn_workspace=self.cudnn).max_reserved
                   for r in _reports(report))

    def floor(self, report, b: int) -> int:
        """Bytes the step at ``b`` cannot run in, the largest rank's: its live peak, or for
        ``"device"`` the allocator's ``max_memory_allocated()``, which no budget lowers (a
        budget only makes the allocator free its cache and retry)."""
        if self.by == "live":
            return _live(report, b)
        return max(r.cuda_memory(b, cudnn_workspace=self.cudnn).max_allocated
                   for r in _reports(report))


def _largest_batch(check, report, b, **_):
    try:
        most = int(report.max_batch_size(check.budget, by=check.by,
                                         cudnn_workspace=check.cudnn))
    except InfeasibleBudgetError:
        yield "no batch size fits, not even B=1"
        return
    if most >= b:  # the asked B fits by the search yet not by the check: a defect
        raise FxmemError(f"the largest B within the budget is {most}, yet B={b} does not fit")
    yield WayOut("batch", most, check.need(report, most, True),
                 f"B={most} (the largest B that fits)", beyond=f"B={most + 1} does not fit")


def _checked(check, choice, b: int) -> bool:
    """Whether ``choice`` (a :class:`fxmem.PlanChoice` at ``b``) fits as the budget is
    checked: said by the choice when it was chosen that way (no second replay)."""
    return choice.by == check.by or check.fits(choice.report, b)


def _choice_way(check, choice, b: int, kind: str, value: int, line: str) -> WayOut | str:
    """A plan choice as a way, once its report fits at ``b`` as the budget is checked."""
    if not _checked(check, choice, b):
        return (f"the cheapest plan by live bytes ({plan_text(choice.plan)}) does not run "
                f"within the budget at B={b}")
    share = choice.recompute_fraction
    need = choice.run.max_reserved if choice.run is not None and check.by == "device" \
        else check.need(choice.report, b, True)
    budget, exact = getattr(choice, "compiled", None), getattr(choice, "exact", True)
    text = line.format(doing=_doing(choice.plan, budget), share=f"{share:.1%}")
    return WayOut(kind, value, need, text, plan=choice.plan, recompute_share=share,
                  compiled=budget, beyond="the cheapest such plan" if exact else
                  "a plan found by a heuristic: a cheaper one may fit")


def _doing(plan, compiled=None) -> str:
    """A way's action in its line: checkpointing ``plan``, or the compile budget in its place."""
    return f"checkpointing {plan_text(plan)}" if compiled is None else \
        f"torch.compile's budget activation_memory_budget={compiled:g}"


class _NoPlan(str):
    """Why no plan fits (a line), with the smallest peak a plan reaches."""

    def __new__(cls, line: str, minimum_bytes: int):
        self = super().__new__(cls, line)
        self.minimum_bytes = minimum_bytes
        return self


def _cheapest_plan(check, report, b: int, confirm: bool = True):
    """The :class:`fxmem.PlanChoice` at ``b``, or the line saying why there is none;
    ``confirm=False``: the plan's step derived, not traced (a search's cheap answer)."""
    if report.plan:
        return "the step has a checkpoint plan already"
    try:
        return report.plan_for(check.budget, b, by=check.by, cudnn_workspace=check.cudnn,
                               confirm=confirm)
    except InfeasibleBudgetError as e:
        what = "need, replayed with no limit," if "allocator's replay" in str(e) else "peak"
        return _NoPlan(f"no checkpoint plan fits at B={b}: the smallest {what} is "
                       f"{fmt_bytes(e.minimum_bytes)}", e.minimum_bytes)
    except FxmemError as e:  # no blocks to checkpoint, ...
        return f"no checkpoint plan at B={b}: {e}"


def _plan_at(check, report, b, **_):
    choice = _cheapest_plan(check, report, b)
    if isinstance(choice, str):
        yield choice
        return
    yield _choice_way(check, choice, b, "checkpoint", b,
                      f"{{doing}} at B={b} (re-running {{share}} of the FLOPs)")


def _fewest_ranks(check, report, b, *, reanalyze=None, dims=None, found=(), **_):
    """FSDP2's fewest GPUs at ``b``, without a plan then with the cheapest one (``found``:
    the ways found before, the plan on one GPU among them)."""
    from ..trace.parallel import FSDP

    strategy = getattr(report, "strategy", None)
    if reanalyze is None:
        yield "the fewest GPUs under FSDP2: not searched (the report cannot analyse again)"
        return
    if strategy is not None and not (isinstance(strategy, FSDP) and strategy.replicate == 1):
        yield f"the fewest GPUs under FSDP2: not searched for {strategy.name}"
        return
    if _reports(report)[0].trace.compiled:
        yield "the fewest GPUs under FSDP2: not searched for a compiled step"
        return
    base = strategy or FSDP(1)
    plan = report.plan
    memo = Recent()
    # a B below where the formulas hold is traced as an int (Report._small): on other numbers
    # of GPUs too, where the search asks for it alone, so the formula's trace is not made
    changes = {"checkpoint": plan} if plan else {}
    if b < min(r.min_batch_size for r in _reports(report)):
        changes["concrete_batch"] = b

    def at(w):
        if w not in memo:
            r = reanalyze(parallel=replace(base, world_size=w), **changes)
            memo[w] = r.at(**dims) if dims else r
        return memo[w]

    start = base.world_size + 1 if strategy is not None else 2
    seen = []
    least = _batch_floor(report, b)
    w = None if least >= check.budget else fewest(
        lambda w: check.fits(at(w), b), start, need=lambda w: check.need(at(w), b),
        budget=check.budget, seen=seen, floor=lambda w: check.floor(at(w), b),
        guess=_guess(report, b, check.budget, start))
    if w is None:
        yield (f"no number of GPUs under FSDP2 fits B={b} without a checkpoint plan: "
               + (towards(seen, check.by) if least < check.budget else _grows(least)))
    else:
        yield WayOut("fsdp", w, check.need(at(w), b, True), f"FSDP2 over {w} GPUs",
                     plan=plan, beyond=_gpus(w - 1) + " not fit")
    if plan:
        return
    smallest = _smallest_plan(report, b)
    if smallest is None:
        yield "the fewest GPUs under FSDP2 with a checkpoint plan: the model has none to choose"
        return
    planned = Recent()

    def under(w):  # FSDP2 over w GPUs under its own plan of smallest peak, derived (one
        if w not in planned:  # GPU's can keep far more: docs/concepts.md, "the ways out")
            planned[w] = at(w).with_plan(_smallest_plan(at(w), b) or smallest)
        return planned[w]

    choices = Recent()

    def choice(w, confirm=False):  # the cheapest plan that runs on w GPUs (derived while
        if (w, confirm) not in choices:  # searching), or the line saying why none does
            choices[w, confirm] = _cheapest_plan(check, at(w), b, confirm)
        return choices[w, confirm]

    if check.by == "live":  # the plan of smallest live peak fits when any plan does
        fits, need = (lambda w: check.fits(under(w), b)), (lambda w: check.need(under(w), b))
    else:  # not by the allocator: a plan of larger live peak can fragment less
        def fits(w):  # some plan runs: first its plan of smallest peak (one replay), else
            if check.fits(under(w), b):  # the planner's walk; the cheapest, at the answer
                return True
            c = choice(w)
            return not isinstance(c, str) and _checked(check, c, b)

        def need(w):
            c = choice(w)
            return c.minimum_bytes if isinstance(c, _NoPlan) else check.need(under(w), b)
    seen, top = [], MAX_WORLD_SIZE if w is None else w - 1
    least = _plan_floor(report, b)
    w2 = None if least >= check.budget else fewest(
        fits, start, top, need=need, budget=check.budget, seen=seen,
        floor=lambda w: _live(under(w), b),  # no plan's peak is under it
        guess=_guess(report.with_plan(smallest), b, check.budget, start))
    if w2 is None:
        yield ("FSDP2 with a checkpoint plan needs as many GPUs as without one" if w else
               f"no number of GPUs under FSDP2 fits B={b} with a checkpoint plan either "
               f"({plan_text(smallest)}, the smallest peak on one GPU): "
               + (towards(seen, "live") if least < check.budget else _grows(least, True)))
        return
    # one GPU fewer than the search's start is the step as asked: its plan is the checkpoint way
    one = next((f for f in found if f.kind == "checkpoint"), None) if w2 == start else None
    n = f"{w2 - 1} GPU{'s' if w2 > 2 else ''}"
    if one is not None and not isinstance(derived := choice(w2), str) and \
            one.recompute_share <= derived.recompute_fraction:  # that plan derived, not traced
        yield (f"FSDP2 with a checkpoint plan: on {n} a plan re-running no more fits "
               "(the checkpoint way)")
        return
    picked = choice(w2, True)  # the cheapest plan there, traced (the search derived it)
    while check.by == "device" and w2 < top and (isinstance(picked, str)
                                                 or not _checked(check, picked, b)):
        w2 += 1  # traced, it runs out (a forward that changes state when it re-runs)
        picked = choice(w2, True)
    line = f"FSDP2 over {w2} GPUs {{doing}} (re-running {{share}})"
    if isinstance(picked, str) or not _checked(check, picked, b):
        r = under(w2)
        flops = _reports(r)[0].flop_count
        redo = int(flops.recompute.subs(SYM_B, b))
        share = redo / (int(flops.total.subs(SYM_B, b)) - redo)
        way = WayOut("fsdp+checkpoint", w2, check.need(r, b, True), line.format(
            doing=_doing(r.plan), share=f"{share:.1%}"), plan=r.plan, recompute_share=share)
    else:
        way = _choice_way(check, picked, b, "fsdp+checkpoint", w2, line)
    if one is None:
        yield replace(way, beyond=_gpus(w2 - 1) + " not fit with any plan")
    elif one.recompute_share <= way.recompute_share:
        yield (f"FSDP2 with a checkpoint plan: on {n} a plan re-running no more fits "
               "(the checkpoint way)")
    else:
        yield replace(way, beyond=f"on {n} the cheapest plan re-runs "
                                  f"{one.recompute_share:.1%} (the checkpoint way)")


def _guess(report, b: int, budget: int, start: int) -> int | None:
    """The fewest GPUs from ``start`` whose estimated rank peak (the largest rank's live
    bytes, its shards scaled from its world size: :func:`fxmem.memory.liveness.sharded_peak`,
    which falls as GPUs are added) is within ``budget``, bisected: where the world-size
    search looks first. None when no world size is."""
    from ..memory.liveness import sharded_peak

    w0 = getattr(getattr(report, "strategy", None), "world_size", 1)
    peaks = [sharded_peak((r._small(b) or r).liveness, b) for r in _reports(report)]
    if not peaks:
        return None
    lo, hi = start, MAX_WORLD_SIZE + 1  # hi: known within the budget (or past the search)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if max(p(w0 / mid) for p in peaks) <= budget else (mid + 1, hi)
    return lo if lo <= MAX_WORLD_SIZE else None


def _gpus(n: int) -> str:
    return f"{n} GPUs do" if n > 1 else "1 GPU does"


def _smallest_plan(report, b: int):
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
    growing`, a bound over every plan the planner can choose): as :func:`_batch_floor`
    without a plan, no number of GPUs runs a plan's step in fewer. 0 where no planner over
    a chain of blocks bounds them, or B is traced as an int."""
    from ..checkpoint.options import Planner

    out = 0
    for r in _reports(report):
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


def _reports(report) -> tuple:
    """Each rank group's report of a :class:`fxmem.ParallelReport`, or ``(report,)``."""
    groups = getattr(report, "groups", None)
    return tuple(g.report for g in groups) if groups is not None else (report,)


def _live(report, b: int) -> int:
    """The live bytes' peak at ``b`` of the rank with the most: what the step needs under
    any allocator."""
    return max(r.peak_bytes(b) for r in _reports(report))


def _batch_floor(report, b: int) -> int:
    """The largest rank's peak at ``b`` of the live bytes of storages whose size grows with
    B (activations, their gradients, the batch): FSDP2 shards none of them, so they are the
    same on any number of GPUs, and no world size runs the step in fewer bytes. 0 where B
    is traced as an int (below :attr:`fxmem.Report.min_batch_size`).

    >>> import torch, fxmem
    >>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
    ...                   device="cpu")
    >>> _batch_floor(r, 4) < r.peak_bytes(4), _batch_floor(r, 8) - _batch_floor(r, 4)
    (True, 160)
    """
    from ..memory.liveness import no_bytes, timeline

    out = 0
    for r in _reports(report):
        if r._small(b) is not None:
            continue
        lv = r.liveness
        sizes = [s if SYM_B in s.expr.free_symbols else no_bytes for s in lv.sizes]
        out = max(out, max(timeline(lv.graph.storages, sizes, len(lv.graph.ops), b),
                           default=0))
    return out


def _grows(least: int, planned: bool = False) -> str:
    """Why no world size fits: what grows with B alone is over the budget (``planned``:
    under any plan, :func:`_plan_floor`)."""
    if planned:
        return (f"under any plan, the tensors that grow with B alone peak at no less than "
                f"{fmt_bytes(least)} on a rank, on any number of GPUs")
    return (f"the tensors that grow with B alone peak at {fmt_bytes(least)} on a rank, "
            "on any number of GPUs")


def _longest(check, report, b, *, named=None, dims=None, limit=None, **_):
    """The longest named dim (one only) that fits at ``b``."""
    if named is None or len(named.dims) != 1:
        return
    (name,) = named.dims
    if _reports(report)[0].trace.compiled != _reports(named)[0].trace.compiled:
        yield f"the longest {name}: not searched (the step is compiled, its analysis in {name} not)"
        return
    try:
        most = named.max_length(check.budget, b, limit=limit)
    except InfeasibleBudgetError:
        yield f"no {name} fits at B={b}"
        return
    if check.by == "device":  # live bytes are at most what the allocator holds
        from ..formula.guards import lower_bounds
        from ..formula.symbols import dim_symbol

        x = dim_symbol(name)
        floor = max(lower_bounds(r.valid_when, [x])[x] for r in _reports(named))
        most = _down(lambda n: check.fits(named.at(**{name: n}), b), most, floor)
        if most is None:
            yield f"no {name} runs at B={b}"
            return
    at = named.at(**{name: most})
    yield WayOut("length", most, check.need(at, b, True), f"{name}={most} at B={b}",
                 beyond=f"{name}={most + 1} does not fit" if most != limit
                 else f"{name}={most} is the model's limit")


def _down(fits, top: int, floor: int) -> int | None:
    """The largest n in [``floor``, ``top``] with ``fits(n)`` (monotone), stepping down
    from ``top`` by doubling steps."""
    if fits(top):
        return top
    step, hi = 1, top  # not fits(hi)
    while True:
        lo = top - step
        if lo <= floor:
            return _bisect(fits, floor, hi) if fits(floor) else None
        if fits(lo):
            return _bisect(fits, lo, hi)
        hi, step = lo, 2 * step


def _bisect(fits, lo: int, hi: int) -> int:
    """fits(lo), not fits(hi): the largest that fits."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
