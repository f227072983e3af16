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

from dataclasses import dataclass, field, replace

from ..checkpoint.on_device import bisect_largest, largest_running
from ..errors import FxmemError, InfeasibleBudgetError, InputError
from .ahead import NICENESS
from .beside import Beside
from .precision import param_dtype_way
from .text import fmt_bytes
from .ways import (
    KINDS,
    Check,
    WayOut,
    cheapest_plan,
    choice_way,
    default_by,
    live_peak,
    rank_reports,
)
from .world_size import fewest_ranks

__all__ = ["KINDS", "Fit", "WayOut", "fit"]  # (WayOut, KINDS: fxmem.report.ways')

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
        ways: bool = True, reanalyze=None, progress=None, jobs: int = 1,
        ahead=None, meanwhile=None, ranks_ahead=None, idle=None) -> Fit:
    """The :class:`Fit` of ``report`` (a :class:`fxmem.Report` in B alone or a
    :class:`fxmem.ParallelReport`) at batch size ``B`` within ``budget_bytes``.
    ``named``: the report in named dims that ``report`` is at ``dims`` (the longest-length
    way needs it; ``limit``: the model's own maximum length). ``reanalyze(**options)``: the
    step analysed again with other :func:`fxmem.analyze` options (``parallel=``,
    ``checkpoint=``; and ``concrete_batch=B`` for a ``B`` below where the formulas hold:
    traced at that B alone), for the FSDP2 ways; :func:`fxmem.analyze` gives reports one
    (``Report.reanalyze``). ``ways=False``: only whether it fits. ``progress(what)``: called
    with what is being searched as each search starts (the CLI's status line). ``jobs=2``:
    under FSDP2, the plan and then the longest length searched in a forked child (the
    plan's way sent back first: :mod:`fxmem.report.beside`) while this process searches the
    largest B, FSDP2's mixed precision and then the fewest GPUs, which reads the child's
    plan once its own walk is made (the same ways, in the same order). ``ahead``: FSDP2's mixed
    precision searched ahead in a child (:func:`fxmem.report.ahead.param_dtype_ahead`), its
    answer taken where it searched this way, the child stopped otherwise; ``ranks_ahead``:
    likewise, FSDP2's fewest GPUs for a step on one GPU
    (:func:`fxmem.report.ranks_ahead.fewest_early`), given what it reads of the step before
    any way is searched here (the checkpoint way once it is), while this process searches
    the others. ``meanwhile()``:
    work the caller needs next (the CLI: the report's summary), done once this process has
    searched its own ways and read its child's, where a way searched ahead is not found yet
    (Llama-3.1-70B's command waited 9 s for the way searched ahead, then made its summary,
    3.4 s); not while it waits for its own child, whose longest length the summary reads.
    ``idle()``: work the caller needs later that reads no way (the CLI: the summary without
    the longest length's rows, whose formulas and replays the reports keep), done as this
    process, its own ways searched, begins to wait for its child's (Llama-3.1-8B over 8
    GPUs: the summary made after the ways in 0.09 s, not 1.09 s)."""
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise InputError(f"B must be a positive int, got {B!r}")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
        raise InputError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
    by = by or default_by(report)
    if by not in ("device", "live"):
        raise InputError(f"by is 'device' or 'live' (how the budget is checked), got {by!r}")
    check = Check(by, budget_bytes, cudnn_workspace)
    if named is not None and ways and len(named.dims) == 1:  # (the longest length reads it)
        in_dims_at(named, B)
    ok, oom = check.runs(report, B)
    out = Fit(B, budget_bytes, by, ok, check.need(report, B), dict(dims or {}), oom)
    if ahead is not None and (ok or not ways or not ahead.matches(
            report, B, dims or {}, check, reanalyze)):
        ahead.cancel()
        ahead = None
    elif ahead is not None:  # its way wanted: not stopped while a plan is traced here
        ahead.wanted()
    if ranks_ahead is not None and (ok or not ways or reanalyze is None or not ranks_ahead
                                    .matches(report, B, dims or {}, check)):
        ranks_ahead.cancel()
        ranks_ahead = None
    if ok or not ways:
        return out
    searches = (("the largest B", _largest_batch),
                (f"the cheapest checkpoint plan at B={B}", _plan_at),
                ("the fewest GPUs under FSDP2", fewest_ranks),
                ("FSDP2's own mixed precision", param_dtype_way),
                (f"the longest sequence at B={B}", _longest))

    def run(indices, tell=None, found=(), to_come=None) -> dict:  # way index -> its yield
        # (``to_come``: the fewest GPUs' later= and ready=, the checkpoint way to come)
        got, found = {}, list(found)
        for k in indices:
            what, way = searches[k]
            if tell is not None:
                tell(what)
            got[k] = list(way(check, report, B, named=named, dims=dims or {}, limit=limit,
                              reanalyze=reanalyze, found=tuple(found), jobs=jobs,
                              **(to_come if k == RANKS and to_come else {})))
            found += [w for w in got[k] if isinstance(w, WayOut)]
        return got
    # the plan and then the longest length in the child (the plan's way sent back as soon
    # as it is found), the others here, where the largest B's traces and replays (a rank at
    # a B below where the formulas hold) stay for the report's per-rank table, which reads
    # them again; the fewest GPUs last, reading the plan's way once its own walk is made
    # (the two searches had been one chain in the child, 12.8 s of Llama-3.1-8B's command
    # over 8 GPUs, this process idle for its last 7 s). On one GPU no such child: the other
    # ways are searches of formulas (Llama-3.1-8B's command took 2.7 s longer with one);
    # its fewest GPUs are searched by the child ranks_ahead started before the first
    # trace, where the CLI started one
    from ..trace.parallel import FSDP

    beside = None
    if jobs > 1 and isinstance(getattr(report, "strategy", None), FSDP):
        nice = NICENESS if ahead is not None and ahead.first else 0  # the way ahead longer
        beside = Beside(run, (PLAN,), (LONGEST,), niceness=nice, kept=lambda: _lengths(
            named, check, B, limit))  # (the longest length's answers, read again here)
        beside = beside if beside.child is not None else None
    mine = [k for k in range(len(searches)) if (beside is None or k not in BESIDE)
            and (ahead is None or k != AHEAD) and (ranks_ahead is None or k != RANKS)]
    if beside is not None and RANKS in mine:  # the fewest GPUs last (it waits for the plan)
        mine = [k for k in mine if k != RANKS] + [RANKS]
    theirs: dict = {}  # the child's ways, once read

    # the checkpoint way, the child's (searched here where the child failed); ``then``:
    # what the status line says again after it
    def plan_way(then=None):
        if beside is not None and PLAN not in theirs:
            if progress is not None:
                progress(f"{searches[PLAN][0]} (searched beside)")
            answer = beside.first()
            theirs.update(answer if answer is not None else run((PLAN,), progress))
            if progress is not None and then is not None:
                progress(then)
        return next((w for w in theirs.get(PLAN, ()) if isinstance(w, WayOut)
                     and w.kind == "checkpoint"), None)
    try:
        if ranks_ahead is None:
            got = run(mine, progress, to_come=None if beside is None else dict(
                later=lambda: plan_way(searches[RANKS][0]), ready=beside.first_ready))
        else:  # what the child searches from given first (it waits for it: its search is
            # the command's longest); the checkpoint way, which the child reads once its own
            # search is done, after the largest B and that way's walk
            if progress is not None:
                progress(searches[RANKS][0])
            _give(ranks_ahead, check, report, B, jobs)
            got = run([k for k in mine if k < PLAN], progress)
            got.update(run([k for k in mine if PLAN <= k < RANKS], progress))
            before = [w for k in sorted(got) for w in got[k] if isinstance(w, WayOut)]
            ranks_ahead.give_one(next((w for w in before if w.kind == "checkpoint"), None))
            got.update(run([k for k in mine if k > RANKS], progress, before))
        if beside is not None:  # (before meanwhile: the summary reads the longest length)
            if idle is not None:
                idle()
            plan_way()
            if progress is not None:
                progress(f"{searches[LONGEST][0]} (searched beside)")
            answer = beside.rest()
            if answer is not None and answer[1] is not None:  # its answer, as if found here
                named.__dict__.setdefault("_longest", {}).update(answer[1])
            theirs.update(answer[0] if answer is not None else run(BESIDE[1:], progress))
            got.update(theirs)
        if meanwhile is not None and any(c is not None and not c.ready()
                                         for c in (ahead, ranks_ahead)):
            meanwhile()
    except BaseException:
        for c in (beside, ahead, ranks_ahead):
            if c is not None:
                c.cancel()
        raise
    if ahead is not None:
        if progress is not None:
            progress(f"{searches[AHEAD][0]} (searched ahead)")
        theirs = ahead.take()
        got.update({AHEAD: theirs} if theirs is not None else run([AHEAD], progress))
    if ranks_ahead is not None:
        if progress is not None:
            progress(f"{searches[RANKS][0]} (searched ahead)")
        theirs = ranks_ahead.take()
        got[RANKS] = theirs if theirs is not None else run([RANKS], progress, before)[RANKS]
    ways = [w for k in sorted(got) for w in got[k]]
    return replace(out, ways=tuple(w for w in ways if isinstance(w, WayOut)),
                   none=tuple(str(w) for w in ways if not isinstance(w, WayOut)))


BESIDE = (1, 4)  # the ways fit's jobs=2 searches in a child, in order: the plan's (sent
# first: the fewest GPUs, searched here, reads it), the longest length; none of the others
# reads another's
LONGEST = 4  # the longest length
AHEAD = 3  # FSDP2's mixed precision: the way fxmem.report.ahead searches
RANKS = 2  # the fewest GPUs: the way fxmem.report.ranks_ahead searches, on one GPU
PLAN = 1  # the checkpoint way


def _give(ranks_ahead, check, report, b: int, jobs: int) -> None:
    """What the fewest GPUs' search reads of the step as asked given to the child searching
    it (:mod:`fxmem.report.ranks_ahead`), the checkpoint way to come
    (:meth:`~fxmem.report.ranks_ahead.RanksAhead.give_one`); where that fails, the child
    stopped (fit then searches the way itself)."""
    from .world_size import Asked

    try:
        asked = Asked(check, report, b).resolved()
    except FxmemError:
        asked = None
    if asked is None or not ranks_ahead.give(asked, jobs, later=True):
        ranks_ahead.cancel()


def _lengths(named, check, b: int, limit) -> dict | None:
    """What :func:`longest` answered of ``named`` (its memo), for a process that searched
    the length way in a child: by the allocator's replay, the answer by live bytes too (the
    CLI's setup rows read both: ``fxmem.cli.targets.longest_rows``), cheap where the
    search made its formula's answers."""
    if named is None:
        return None
    if check.by == "device" and len(named.dims) == 1:
        longest(Check("live", check.budget, 0), named, b, limit)
    return named.__dict__.get("_longest")


def in_dims_at(named, b: int) -> None:
    """The step at ``b`` in ``named``'s dims (a report in named dims, each rank group's) is
    the one its reports at the dims' values read where ``b`` is below where the formulas
    hold (:meth:`fxmem.Report.at`; else each traces ``b`` at its point): the longest length
    at ``b`` reads it too (Llama-3.1-70B over 64 GPUs asked at B=1 had traced both, 4.3 s
    at L=4096 and 5.5 s in L). Nothing is traced here."""
    for r in rank_reports(named):
        r._in_dims_at(b)


def _largest_batch(check, report, b, **_):
    try:
        most = int(report.max_batch_size(check.budget, by=check.by,
                                         cudnn_workspace=check.cudnn))
    except InfeasibleBudgetError:
        yield "no batch size fits, not even B=1"
        return
    what = "the largest B that fits"
    if (larger := most) >= b:  # not monotone in B (the allocator's blocks): b runs out
        what = (f"the largest B below B={b} that fits; B={larger} runs too: the caching "
                "allocator's blocks are not monotone in B")
        most = largest_running(lambda n: check.fits(report, n), 1, b - 1, b - 1)
        if most is None:
            yield (f"no batch size below B={b} fits (B={larger} runs: the caching "
                   "allocator's blocks are not monotone in B)")
            return
    yield WayOut("batch", most, check.need(report, most, True), f"B={most} ({what})",
                 beyond=f"B={most + 1} does not fit")


def _plan_at(check, report, b, **_):
    choice = cheapest_plan(check, report, b)
    if isinstance(choice, str):
        yield choice
        return
    yield choice_way(check, choice, b, "checkpoint", b,
                      f"{{doing}} at B={b} (re-running {{share}} of the FLOPs)")


def _longest(check, report, b, *, named=None, dims=None, limit=None, **_):
    """The longest named dim (one only) that fits at ``b``."""
    if named is None or len(named.dims) != 1:
        return
    (name,) = named.dims
    if rank_reports(report)[0].trace.compiled != rank_reports(named)[0].trace.compiled:
        yield f"the longest {name}: not searched (the step is compiled, its analysis in {name} not)"
        return
    most = longest(check, named, b, limit)
    if isinstance(most, NoLength):
        yield most.line
        return
    k = most.multiple
    at = named.at(**{name: most})
    yield WayOut("length", most, check.need(at, b, True), f"{name}={most} at B={b}",
                 beyond=f"{name}={most} is the model's limit" if most == limit
                 else f"the trace ends at {name}={most}" if most.beyond
                 else f"{name}={most + k} does not fit" + (
                     f" (the trace holds where {name} is a multiple of {k})" if k > 1
                     else ""))


@dataclass(frozen=True)
class NoLength:
    """:func:`longest`'s answer where no length fits (``runs``: by the live bytes, none
    fits; by the allocator's replay, some fits and none runs) from ``floor``, the least
    where the trace holds; ``line``: that said, as a way out's line."""

    name: str
    b: int
    floor: int
    runs: bool = False

    @property
    def line(self) -> str:
        # (a trace that holds from a longer L, Gemma 2's past its sliding window: shorter
        # ones run other code, which the search cannot see)
        where = f" from {self.name}={self.floor} on, where the trace holds (a shorter " \
            f"{self.name} is a step to analyse apart)" if self.floor > 2 else ""
        return f"no {self.name} {'runs' if self.runs else 'fits'} at B={self.b}{where}"


def longest(check, named, b: int, limit: int | None = None):
    """The longest value of ``named``'s one named dim at ``b`` within ``check``'s budget, as
    ``check`` answers (by the allocator's replay, from below the longest whose live bytes
    fit), a :class:`fxmem.memory.dims.Length`; a :class:`NoLength` where none does. Made
    once per question of ``named`` (the length way and the setup's row ask it alike)."""
    memo = named.__dict__.setdefault("_longest", {})
    key = (check, b, limit)
    if key not in memo:
        memo[key] = _searched(check, named, b, limit)
    return memo[key]


def _searched(check, named, b: int, limit: int | None):
    """:func:`longest`'s search."""
    from ..memory.dims import Length

    (name,) = named.dims
    floor = least_length(named, name)
    try:
        most = named.max_length(check.budget, b, limit=limit)
    except InfeasibleBudgetError:
        return NoLength(name, b, floor)
    if check.by != "device":
        return most
    k = most.multiple  # the trace holds at multiples of k alone (T5's 16)
    top = int(most) // k  # live bytes are at most what the allocator holds: from below
    m = _down(lambda m: check.fits(named, b, {name: k * m}), top, -(-floor // k),
              lambda: _scaled(_below_top(check, named, b, name, most, limit), k))
    if m is None:
        return NoLength(name, b, floor, runs=True)
    return most if m == top else Length(k * m, multiple=k)


def least_length(named, name: str) -> int:
    """The least value of the named dim ``name`` where the trace of ``named`` (a report in
    named dims, or a :class:`fxmem.ParallelReport` of such) holds, every rank's."""
    from ..formula.symbols import dim_symbol

    x = dim_symbol(name)
    return max(r.named.least_values[x] for r in rank_reports(named))


def _scaled(n: int | None, k: int) -> int | None:
    """``n`` as a count of ``k``'s (rounded down), or None."""
    return None if n is None else n // k


def _below_top(check, named, b: int, name: str, top: int, limit) -> int | None:
    """Where the search for the longest length that runs on the device starts below
    ``top`` (the longest whose live bytes fit, which does not run): the longest whose live
    peak fits the budget less the allocator's overhead at ``top`` (its replay with no limit
    over its live peak; within the budget the allocator frees its cache and needs less, so
    that one most often runs). None where no length is that short."""
    at = named.at(**{name: top})
    overhead = check.need(at, b) - live_peak(at, b)
    if overhead >= check.budget:
        return None
    try:
        return named.max_length(check.budget - overhead, b, limit=limit)
    except InfeasibleBudgetError:
        return None


def _down(fits, top: int, floor: int, below=None) -> int | None:
    """The largest n in [``floor``, ``top``] with ``fits(n)`` (monotone), stepping down
    from ``top`` by doubling steps; ``below()``: an n under ``top`` likely to fit (or None),
    asked where ``top`` does not fit: where it fits, the answer is bisected between them
    (Llama-3.1-8B over 8 GPUs at B=2: L=2,460 found in 12 replays within the budget,
    2,798, 1,843 and a bisection, and one with no limit for the guess, not 19 stepping down
    from 2,798); where it does not, the steps go down from it.

    >>> _down(lambda n: n <= 37, 100, 1), _down(lambda n: n <= 37, 100, 1, lambda: 30)
    (37, 37)
    """
    if fits(top):
        return top
    guess = below() if below is not None else None
    if guess is not None and floor <= guess < top:
        if fits(guess):
            return bisect_largest(fits, guess, top)
        top = guess
    step, hi = 1, top  # not fits(hi)
    while True:
        lo = top - step
        if lo <= floor:
            return bisect_largest(fits, floor, hi) if fits(floor) else None
        if fits(lo):
            return bisect_largest(fits, lo, hi)
        hi, step = lo, 2 * step
