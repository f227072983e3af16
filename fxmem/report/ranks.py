"""The result of a data-parallel analysis: one :class:`fxmem.Report` per group of alike
ranks (:meth:`fxmem.FSDP.rank_groups`), and the answers a user of many GPUs asks for: each
rank's peak, the largest per-rank batch that fits every rank, the parts per rank.

A report only reads the per-rank reports; the one exception is the checkpoint plan it
chooses (:meth:`ParallelReport.plan_for`), which it traces with the plan applied to confirm
it, when it was made by :func:`fxmem.analyze` (``retrace``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from ..checkpoint.confirm import without_selective
from ..errors import InputError
from .result import Report, _check_b
from .retrace import retrace_at


class RankGroup:
    """Ranks whose shards have the same shapes, so the same memory: ``report`` is each
    one's step, B its micro-batch. ``make`` (instead of ``report``): how that report is
    made, called when it is first read (a search over world sizes reads a world size's
    other groups only when its first group fits: :func:`fxmem.report.world_size.
    fewest_ranks`); ``derive``: how it is made without tracing, or None where it cannot be
    (:meth:`untraced`).

    >>> g = RankGroup((1, 2), make=lambda: "a report")
    >>> g.made, g.untraced(), g.report, g.made
    (False, None, 'a report', True)
    """

    __slots__ = ("ranks", "_report", "_make", "_derive")

    def __init__(self, ranks: tuple, report: Report | None = None, *, make=None, derive=None):
        if (report is None) == (make is None):
            raise TypeError("RankGroup takes a report or how to make it, one of them")
        self.ranks, self._report, self._make = tuple(ranks), report, make
        self._derive = derive

    @property
    def report(self) -> Report:
        if self._make is not None:
            self._report, self._make, self._derive = self._make(), None, None
        return self._report

    @property
    def made(self) -> bool:
        """Whether :attr:`report` is made (read, or given)."""
        return self._make is None

    def untraced(self) -> Report | None:
        """:attr:`report` when it is made or can be without a trace (derived from another
        group's: :mod:`fxmem.trace.parallel.other_ranks`), else None."""
        if not self.made and self._derive is not None:
            got, self._derive = self._derive(), None
            if got is not None:
                self._report, self._make = got, None
        return self._report if self.made else None

    def then(self, change) -> "RankGroup":
        """These ranks with ``change(report)`` as their report, made when first read
        (without a trace when this one's can be): a replay that runs out on one group does
        not derive the others (:func:`fxmem.checkpoint.on_device.device_run`)."""
        return RankGroup(self.ranks, make=lambda: change(self.report),
                         derive=lambda: None if (r := self.untraced()) is None else change(r))

    def __repr__(self) -> str:
        return f"RankGroup(ranks={self.ranks!r}, report={self._report if self.made else '...'})"

    @property
    def label(self) -> str:
        """``"0-2"``, ``"3"``, ``"0, 2"``: the ranks, compactly."""
        r = self.ranks
        if len(r) > 2 and r == tuple(range(r[0], r[-1] + 1)):
            return f"{r[0]}-{r[-1]}"
        return ", ".join(map(str, r))


@dataclass(frozen=True)
class RankRow:
    """One row of the per-rank table (:meth:`ParallelReport.per_rank`): a group of alike
    ranks, read from its :class:`fxmem.Report` at micro-batch ``B``.

    ``peak``: its peak, a formula in B, and ``peak_bytes`` at ``B``; ``readable``: the peak
    as one polynomial around ``B`` (or the least B its formulas hold for), a
    :class:`fxmem.formula.readable.Readable` (None: past reading); ``max_batch_size``:
    the largest B within the budget, as its report's ``max_batch_size`` answers (``None``
    without a budget or when none fits); ``tightest``: the group with the least room
    (:meth:`ParallelReport.tightest`); ``parts``/``parts_bytes``: its nonzero parts
    (sharded parameters, gradients, optimizer state, activations, ...) in B and at ``B``.
    """

    ranks: tuple
    label: str
    peak: sympy.Expr
    B: int
    peak_bytes: int
    max_batch_size: int | None
    tightest: bool
    parts: dict
    parts_bytes: dict
    readable: object = None

    def as_dict(self) -> dict:
        """The row as the JSON report's ``ranks`` entries carry it (formulas as text)."""
        read = self.readable
        return dict(ranks=list(self.ranks), label=self.label, peak_formula=str(self.peak),
                    peak_readable=str(read.formula) if read is not None else "",
                    readable_when=list(read.exact_when) if read is not None else [],
                    B=self.B, peak_bytes=self.peak_bytes, max_batch_size=self.max_batch_size,
                    tightest=self.tightest,
                    parts_formulas={k: str(v) for k, v in self.parts.items()},
                    parts_bytes=dict(self.parts_bytes))


@dataclass(frozen=True)
class ParallelReport:
    """Memory per rank of one data-parallel step (``fxmem.analyze(..., parallel=...)``),
    in bytes, as formulas in :data:`fxmem.B`, each rank's micro-batch.

    ``strategy``: what wraps the model (:class:`fxmem.FSDP`); ``groups``: one
    :class:`RankGroup` per set of ranks with alike shards, first rank first. The answers
    without ``rank=`` are the whole run's: the largest peak of any rank, the largest B
    that fits every rank.

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
    >>> r = fxmem.analyze(m, torch.randn(4, 16), loss=lambda o: o.sum(),
    ...                   optimizer=torch.optim.Adam, device="cpu", parallel=fxmem.FSDP(2))
    >>> r.world_size, [g.ranks for g in r.groups]
    (2, [(0, 1)])
    >>> r.peak_bytes(64) == r.rank(1).peak_bytes(64)
    True
    """

    strategy: object
    groups: tuple
    # (plan, defer=False, point=None) -> this step traced with the plan applied (fxmem.
    # analyze sets it; None: plans are derived only); ``point``: (B, {dim: size}), traced
    # there alone (no size a symbol: fxmem.report.ways.cheapest_plan's)
    retrace: object = field(default=None, repr=False, compare=False)

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def device(self) -> str:
        return self.groups[0].report.device

    @property
    def dims(self) -> tuple:
        """Names of the input dims beyond B that the formulas are in."""
        return self.groups[0].report.dims

    def at(self, **values) -> "ParallelReport":
        """Every rank's report in B alone with the named dims fixed, e.g. ``at(L=512)``."""
        return ParallelReport(self.strategy, tuple(g.then(lambda r: r.at(**values))
                                                   for g in self.groups),
                              retrace_at(self.retrace, values))

    def first_group(self) -> "ParallelReport":
        """This step with its first group of ranks alone (rank 0's; under FSDP2, the shards
        with the most rows): where it does not fit, the step on these GPUs does not. A part
        of the answer, for a search (:func:`fxmem.report.world_size.fewest_ranks`), which reads the
        other groups only where the first fits."""
        return ParallelReport(self.strategy, self.groups[:1])

    def tightest(self, B: int, budget_bytes: int | None = None, **options) -> RankGroup:  # noqa: N803
        """The group of ranks with the least room: with ``budget_bytes``, the one whose
        largest B is the smallest (nothing fitting is smallest of all); else the one with
        the largest peak at ``B``."""
        from ..errors import InfeasibleBudgetError

        if budget_bytes is None:
            return max(self.groups, key=lambda g: g.report.peak_bytes(B))

        def most(g):
            try:
                return int(g.report.max_batch_size(budget_bytes, **options))
            except InfeasibleBudgetError:
                return 0
        return min(self.groups, key=most)

    def rank(self, rank: int) -> Report:
        """The report of rank ``rank``'s step."""
        for g in self.groups:
            if rank in g.ranks:
                return g.report
        if isinstance(rank, int) and 0 <= rank < self.world_size:
            had = ", ".join(g.label for g in self.groups)
            raise InputError(f"rank {rank} is not in this report (ranks {had}: "
                             f"{self.strategy.name})")
        raise InputError(f"rank is an int from 0 to {self.world_size - 1}, got {rank!r}")

    @property
    def peaks(self) -> dict:
        """Each group's ranks (a tuple) -> its peak, a sympy expression in B."""
        return {g.ranks: g.report.peak for g in self.groups}

    @property
    def peak(self) -> sympy.Expr:
        """The largest peak of any rank, a sympy expression in B."""
        peaks = list(dict.fromkeys(g.report.peak for g in self.groups))
        return peaks[0] if len(peaks) == 1 else sympy.Max(*peaks)

    def peak_bytes(self, B: int, rank: int | None = None, **dims) -> int:  # noqa: N803
        """Peak bytes of rank ``rank`` at micro-batch ``B`` (and the named dims' values);
        without ``rank``, the largest of any rank."""
        if rank is not None:
            return self.rank(rank).peak_bytes(B, **dims)
        return max(g.report.peak_bytes(B, **dims) for g in self.groups)

    def readable_peak(self, B: int, **dims):  # noqa: N803
        """:attr:`peak` (the largest of any rank) around micro-batch ``B`` and the named dims'
        values, as one polynomial and where it equals the peak:
        :meth:`fxmem.Report.readable_peak`, over every group's peak.

        >>> import torch, fxmem
        >>> m = torch.nn.Sequential(*[torch.nn.Linear(30, 30) for _ in range(3)])
        >>> r = fxmem.analyze(m, torch.randn(4, 30), loss=lambda o: o.sum(),
        ...                   optimizer=torch.optim.Adam, parallel=fxmem.FSDP(4))
        >>> p = r.readable_peak(64)
        >>> p.holds(B=64), p.formula.subs(fxmem.B, 64) == r.peak_bytes(64)
        (True, True)
        """
        from ..formula.readable import readable_around

        reports = [g.report for g in self.groups]
        if len({r.peak for r in reports}) == 1 or any(r._small(B) for r in reports):
            # one formula, or B below where the formulas hold: the tightest rank's own
            return max(reports, key=lambda r: r.peak_bytes(B, **dims)).readable_peak(B, **dims)
        guards = tuple(dict.fromkeys(g for r in reports for g in r.valid_when))
        return readable_around(self.peak, guards, B, **dims)

    def max_batch_size(self, budget_bytes: int | None = None,
                       max_recompute: float | None = None, candidates=None, *,
                       rank: int | None = None, kinds=None, **options):
        """The largest micro-batch B per rank that fits every rank (or rank ``rank``), as
        :meth:`fxmem.Report.max_batch_size` answers for each (the same ``by``, ``gpu``,
        ``context_bytes``, ...): the smallest of the ranks' answers.

        With ``max_recompute`` (a fraction of the step's FLOPs): the largest B that fits
        every rank, as ``by`` answers (on CUDA by default every group's replay runs), with
        one checkpoint plan for all of them re-running at most that share: the same
        :class:`~fxmem.report.capacity.MaxBatchSize` carrying the plan (its ``choice`` a
        :class:`fxmem.PlanChoice` whose ``report`` is this step under the plan, traced with
        it when it can be: :meth:`plan_for`)."""
        if rank is not None:
            return self.rank(rank).max_batch_size(budget_bytes, max_recompute, candidates,
                                                  kinds=kinds, **options)
        if max_recompute is None:
            return min((g.report.max_batch_size(budget_bytes, **options)
                        for g in self.groups), key=int)
        from ..device.gpus import gpu as lookup_gpu
        from .capacity import MaxBatchSize, plan_by

        card, gpu = "", options.pop("gpu", None)
        if gpu is not None:
            if budget_bytes is not None:
                raise InputError("give either budget_bytes or gpu, not both")
            g = lookup_gpu(gpu)
            card, budget_bytes = g.name, g.usable_bytes(options.pop("context_bytes", None))
        by = plan_by(options.pop("by", None), self.device)
        cudnn = options.pop("cudnn_workspace", 0)
        if options:
            raise InputError(f"max_batch_size(max_recompute=...) of a parallel step takes no "
                             f"{sorted(options)[0]}")
        if kinds is not None and "compiled" in kinds:  # and torch.compile's budgets
            from ..checkpoint.compiled import max_batch_size as most

            return MaxBatchSize.with_plan(most(self, budget_bytes, max_recompute, candidates,
                                               kinds, by=by, cudnn_workspace=cudnn),
                                          budget_bytes, by=by, gpu=card)
        return MaxBatchSize.with_plan(without_selective(
            lambda k: self._most_with_plan(budget_bytes, max_recompute, candidates, k, by,
                                           cudnn), kinds), budget_bytes, by=by, gpu=card)

    # checkpoint plans: one for every rank ---------------------------------------------
    def with_plan(self, plan) -> "ParallelReport":
        """Every rank's step under checkpoint ``plan`` (module paths), derived from each
        group's trace without a plan (:meth:`fxmem.Report.with_plan`)."""
        return ParallelReport(self.strategy, tuple(g.then(lambda r: r.with_plan(plan))
                                                   for g in self.groups))

    @property
    def plan(self) -> tuple:
        """Module paths whose forward is checkpointed, on every rank."""
        return self.groups[0].report.plan

    @property
    def recompute_flops(self) -> sympy.Expr:
        """FLOPs a rank spends re-running checkpointed forwards (the largest group's)."""
        flops = list(dict.fromkeys(g.report.recompute_flops for g in self.groups))
        return flops[0] if len(flops) == 1 else sympy.Max(*flops)

    def _planner(self, candidates, kinds=None):
        reports = [g.report for g in self.groups]
        if reports[0].named is not None:
            example = ", ".join(f"{n}=..." for n in self.dims)
            raise InputError(f"checkpoint plans of a report in B and {', '.join(self.dims)}: "
                             f"ask report.at({example})")
        choosers = [r._chooser(candidates, kinds) for r in reports]
        return reports, choosers

    def frontier(self, B: int, candidates=None, *, kinds=None) -> tuple:  # noqa: N803
        """Pareto-optimal checkpoint plans at micro-batch ``B`` for every rank: a tuple of
        :class:`fxmem.FrontierPoint` (the largest rank's peak, recompute FLOPs, plan), from
        no plan to the smallest peak, over the plans of each group's own frontier
        (:meth:`fxmem.Report.frontier`); derived, not traced."""
        from ..checkpoint.compiled import frontier

        return frontier(self, _check_b(B), candidates, kinds)  # (torch.compile's budgets too)

    def plan_for(self, budget_bytes: int, B: int, candidates=None, *,  # noqa: N803
                 kinds=None, confirm: bool = True, by: str | None = None,
                 cudnn_workspace: int = 0):
        """The checkpoint plan with the least recompute FLOPs found whose step at micro-batch
        ``B`` fits ``budget_bytes`` on every rank (one plan for all: every rank runs the
        same code), as a :class:`fxmem.PlanChoice` whose ``report`` is this
        :class:`ParallelReport` under the plan and ``peak_bytes`` the largest rank's.
        ``by``: as :meth:`fxmem.Report.plan_for`'s: on CUDA (``"device"``, the default)
        every rank group's steps run within the budget in the caching allocator's replay.

        The plan is chosen on plans derived from each group's trace
        (:mod:`fxmem.checkpoint.ranks`), then, for a report made by :func:`fxmem.analyze`,
        traced with the plan applied: the choice's ``report`` and ``peak_bytes`` are the
        traced ones (``confirm=False``: the derived ones, a search's cheap answer). Such a
        report's first group (rank 0's: under FSDP2 its shards have the most rows) chooses
        first, alone: when its plan, traced on every group, runs on each, no plan fitting
        every group costs less (each fits the first), and the other groups are not traced
        without the plan (a search's deferred groups: :meth:`first_group`); a plan that,
        derived, does not run on every group is not traced (the choice is then made over
        every group, and only its plan traced). Should the
        traced peak not fit (a forward that changes state when it re-runs, e.g. a key/value
        cache), the budget is tightened by the excess and the plan chosen again; a plan
        checkpoint cannot run on fake tensors (``nn.MultiheadAttention`` alone) is returned
        derived, with ``exact=False``. Raises
        :class:`fxmem.InfeasibleBudgetError` when no plan fits.

        >>> import torch, fxmem
        >>> m = torch.nn.Sequential(*[torch.nn.Sequential(
        ...     torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16))
        ...     for _ in range(3)])
        >>> r = fxmem.analyze(m, torch.randn(4, 16), loss=lambda o: o.sum(), device="cpu",
        ...                   parallel=fxmem.FSDP(2))
        >>> c = r.plan_for(r.peak_bytes(256) * 7 // 8, B=256)
        >>> str(c.plan), c.peak_bytes == max(c.report.peak_bytes(256, rank=k) for k in (0, 1))
        ('0', True)
        """
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int):
            raise InputError(f"budget_bytes must be an int, got {budget_bytes!r}")
        from ..checkpoint.ranks import choose
        from .capacity import plan_by

        b, by, traced = _check_b(B), plan_by(by, self.device), {}
        if kinds is not None and "compiled" in kinds:  # and torch.compile's budgets
            from ..checkpoint.compiled import plan_for

            return plan_for(self, budget_bytes, b, candidates, kinds, by=by, confirm=confirm,
                            cudnn_workspace=cudnn_workspace)
        derived = self if confirm else replace(self, retrace=None)

        def pick(kinds):
            if confirm and self.retrace is not None and len(self.groups) > 1:
                got = self._first_chooses(budget_bytes, b, candidates, kinds, by,
                                          cudnn_workspace)
                if got is not None:
                    return got
            reports, choosers = self._planner(candidates, kinds)
            if by == "device":
                return derived._on_device(reports, choosers, b, budget_bytes, None, traced,
                                          cudnn_workspace)
            got = choose(reports, choosers, budget_bytes, b)
            return derived._confirmed(got, b, budget_bytes,
                                      lambda budget: choose(reports, choosers, budget, b),
                                      traced)

        return without_selective(pick, kinds)

    def _first_chooses(self, budget_bytes: int, b: int, candidates, kinds, by: str,
                       cudnn_workspace: int):
        """:meth:`plan_for`'s choice on the first group of ranks alone, or None
        (:func:`fxmem.report.first_group.first_chooses`)."""
        from .first_group import first_chooses

        return first_chooses(self, budget_bytes, b, candidates, kinds, by, cudnn_workspace)

    def _on_device(self, reports, choosers, b: int, budget_bytes: int, max_recompute,
                   traced: dict, cudnn_workspace: int, raises: bool = True,
                   also: tuple = ()):
        """The cheapest plan found at ``b`` whose steps run on every rank group in the
        allocator's replay, traced when it can be
        (:func:`fxmem.checkpoint.confirm.on_device`); None when none does and not
        ``raises``. ``reports`` and ``choosers``: the groups chosen over; ``also``: the
        ranks of this report's other groups, whose steps are replayed too."""
        from ..checkpoint.confirm import on_device
        from ..checkpoint.ranks import choice_at, smallest_choice
        from .forked import Ahead

        walks = choosers[0].__dict__.setdefault("walks", {}).setdefault(
            (tuple(choosers[1:]), max_recompute, also), {})  # one walk, derived then traced
        return on_device(
            lambda live: choice_at(reports, choosers, live, b, max_recompute),
            lambda: smallest_choice(reports, choosers, b, max_recompute), b, budget_bytes,
            lambda c: self.with_plan(c.plan) if c.plan else self, retrace=self.retrace,
            traced=traced, cudnn_workspace=cudnn_workspace, where=" on every rank",
            raises=raises, walks=walks, ahead=Ahead)

    def _confirmed(self, got, b: int, budget_bytes: int, again, traced_plans: dict):
        """The :class:`fxmem.PlanChoice` of ``got`` (plan, peak, cost, step FLOPs, exact),
        traced with its plan when ``retrace`` is set (:func:`fxmem.checkpoint.confirm.confirmed`;
        ``again(budget)``: choose with a smaller budget when the traced peak does not fit;
        ``traced_plans``: plan -> its traced report, filled here)."""
        from ..checkpoint.choose import PlanChoice
        from ..checkpoint.confirm import confirmed

        plan, peak, cost, step, exact = got
        if self.retrace is None:
            report = self.with_plan(plan) if plan else self
            return PlanChoice(b, plan, peak, cost, step, report, exact)
        return confirmed(got, b, budget_bytes, again,
                         lambda plan: self.retrace(plan) if plan else self, self.with_plan,
                         traced_plans, " on every rank")

    def _most_with_plan(self, budget_bytes, max_recompute, candidates, kinds=None,
                        by: str = "live", cudnn_workspace: int = 0):
        from ..checkpoint.ranks import choose, smallest
        from ..errors import InfeasibleBudgetError
        from ..formula.search import largest

        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) \
                or budget_bytes <= 0:
            raise InputError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
        if not 0 <= max_recompute:
            raise InputError(f"max_recompute is a fraction of the step's FLOPs, got "
                             f"{max_recompute!r}")
        reports, choosers = self._planner(candidates, kinds)
        memo: dict = {}

        def at(b):
            if b not in memo:
                memo[b] = choose(reports, choosers, budget_bytes, b, max_recompute)
            return memo[b]

        lo = max(r.min_batch_size for r in reports)
        if at(lo) is None:
            least = smallest(reports, choosers, lo)[1]
            raise InfeasibleBudgetError(
                f"budget {budget_bytes:,} B is below the smallest peak at B={lo} within "
                f"{max_recompute:.0%} recompute on every rank; the smallest with any plan is "
                f"{least:,} B", minimum_bytes=least)
        b = largest(lambda b: at(b) is not None, lo, limit=2**40)
        traced: dict = {}
        if by == "device":
            return self._most_on_device(reports, choosers, at, b, lo, budget_bytes,
                                        max_recompute, traced, cudnn_workspace)
        while True:  # the traced plan must fit; else one B less
            try:
                return self._confirmed(
                    at(b), b, budget_bytes,
                    lambda budget, b=b: choose(reports, choosers, budget, b, max_recompute),
                    traced)
            except InfeasibleBudgetError:
                if b == lo:
                    raise
                b -= 1
                if at(b) is None:
                    raise

    def _most_on_device(self, reports, choosers, at, top: int, lo: int, budget_bytes: int,
                        max_recompute: float, traced: dict, cudnn_workspace: int):
        """:meth:`_most_with_plan` by the replay: from ``top``, the largest B by live bytes
        (``at(b)``: the plan chosen there), the largest B whose plan runs on every rank
        (:func:`fxmem.checkpoint.confirm.most_on_device`)."""
        from ..checkpoint.choose import PlanChoice
        from ..checkpoint.confirm import most_on_device
        from ..errors import InfeasibleBudgetError

        plan, peak, cost, step, exact = at(top)
        first = PlanChoice(top, plan, peak, cost, step, self.with_plan(plan) if plan else self,
                           exact)
        memo: dict = {}

        def runs_at(b):
            if b not in memo:
                memo[b] = self._on_device(reports, choosers, b, budget_bytes, max_recompute,
                                          traced, cudnn_workspace, raises=False)
            return memo[b]

        got = most_on_device(first, lo, runs_at, budget_bytes, cudnn_workspace)
        if got is None:
            raise InfeasibleBudgetError(
                f"no checkpoint plan within {max_recompute:.0%} recompute runs within "
                f"{budget_bytes:,} bytes at B={lo} on every rank in the caching allocator's "
                "replay", minimum_bytes=budget_bytes + 1)
        return got

    def fits(self, B: int, budget_bytes: int | None = None, *, gpu=None,  # noqa: N803
             context_bytes: int | None = None, **options):
        """Whether every rank's step at micro-batch ``B`` fits, and the ways that make it fit
        (more ranks among them): :meth:`fxmem.Report.fits`, answered for the rank with the
        least room."""
        first = self.groups[0].report
        return first.fits(B, budget_bytes, gpu=gpu, context_bytes=context_bytes,
                          report=self, **options)

    def max_length(self, budget_bytes: int, B: int, name: str | None = None,  # noqa: N803
                   limit: int | None = None, **values) -> int:
        """The largest value of a named dim that fits every rank at micro-batch ``B``, as
        :meth:`fxmem.Report.max_length` answers for each: the smallest of their answers."""
        return min(g.report.max_length(budget_bytes, B, name, limit, **values)
                   for g in self.groups)

    def parts(self, rank: int = 0) -> dict:
        """Rank ``rank``'s parts (params, grads, optimizer_state, activations, ...), each a
        formula in B: its shards, and what the wrapping allocates (the gathered
        parameters and the collectives' buffers count as temporaries)."""
        return self.rank(rank).parts

    def per_rank(self, B: int, budget_bytes: int | None = None, **options) -> tuple:  # noqa: N803
        """The per-rank table at micro-batch ``B``: one :class:`RankRow` per group, first
        rank first, each read from the group's report; with ``budget_bytes``, its largest
        B (``options`` as for :meth:`fxmem.Report.max_batch_size`: ``by``,
        ``cudnn_workspace``, ...). The group :meth:`tightest` picks is marked. A report in
        named dims answers once they are fixed (``r.at(L=512).per_rank(8)``).

        >>> import torch, fxmem
        >>> m = torch.nn.Sequential(*[torch.nn.Linear(30, 30) for _ in range(3)])
        >>> r = fxmem.analyze(m, torch.randn(4, 30), loss=lambda o: o.sum(),
        ...                   optimizer=torch.optim.Adam, device="cpu", parallel=fxmem.FSDP(4))
        >>> rows = r.per_rank(64, 2**20)
        >>> [(row.label, row.tightest) for row in rows]
        [('0-2', True), ('3', False)]
        >>> rows[1].peak_bytes == r.peak_bytes(64, rank=3)
        True
        """
        from ..errors import InfeasibleBudgetError
        from ..formula.symbols import B as SYM_B
        from ..memory.liveness import PARTS

        if isinstance(B, bool) or not isinstance(B, int) or B < 1:
            raise InputError(f"B must be a positive int, got {B!r}")
        chosen = self.tightest(B, budget_bytes, **options)
        rows = []
        for g in self.groups:
            r = g.report
            most = None
            if budget_bytes is not None:
                try:
                    most = int(r.max_batch_size(budget_bytes, **options))
                except InfeasibleBudgetError:
                    pass
            parts = {p: r.parts[p] for p in PARTS if r.parts[p] != 0}
            rows.append(RankRow(g.ranks, g.label, r.peak, B, r.peak_bytes(B), most,
                                g is chosen, parts,
                                {p: int(e.subs(SYM_B, B)) for p, e in parts.items()},
                                r.readable_peak(max(B, r.min_batch_size))))
        return tuple(rows)

    def __str__(self) -> str:
        from .text import render_ranks

        return render_ranks(self)
