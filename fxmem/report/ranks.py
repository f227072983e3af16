"""The result of a data-parallel analysis: one :class:`fxmem.Report` per group of alike
ranks (:meth:`fxmem.FSDP.rank_groups`), and the answers a user of many GPUs asks for: each
rank's peak, the largest per-rank batch that fits every rank, the parts per rank.

A report only reads the per-rank reports; it never re-traces."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..errors import InputError
from .result import Report


@dataclass(frozen=True)
class RankGroup:
    """Ranks whose shards have the same shapes, so the same memory: ``report`` is each
    one's step, B its micro-batch."""

    ranks: tuple
    report: Report

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

    ``peak``: its peak, a formula in B, and ``peak_bytes`` at ``B``; ``max_batch_size``:
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

    def as_dict(self) -> dict:
        """The row as the JSON report's ``ranks`` entries carry it (formulas as text)."""
        return dict(ranks=list(self.ranks), label=self.label, peak_formula=str(self.peak),
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
        return ParallelReport(self.strategy, tuple(RankGroup(g.ranks, g.report.at(**values))
                                                   for g in self.groups))

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

    def peak_bytes(self, B: int, rank: int | None = None) -> int:  # noqa: N803
        """Peak bytes of rank ``rank`` at micro-batch ``B``; without ``rank``, the
        largest of any rank."""
        if rank is not None:
            return self.rank(rank).peak_bytes(B)
        return max(g.report.peak_bytes(B) for g in self.groups)

    def max_batch_size(self, budget_bytes: int | None = None, *, rank: int | None = None,
                       **options):
        """The largest micro-batch B per rank that fits every rank (or rank ``rank``), as
        :meth:`fxmem.Report.max_batch_size` answers for each (the same ``by``, ``gpu``,
        ``context_bytes``, ...): the smallest of the ranks' answers."""
        if rank is not None:
            return self.rank(rank).max_batch_size(budget_bytes, **options)
        return min((g.report.max_batch_size(budget_bytes, **options) for g in self.groups),
                   key=int)

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
                                {p: int(e.subs(SYM_B, B)) for p, e in parts.items()}))
        return tuple(rows)

    def __str__(self) -> str:
        from .text import render_ranks

        return render_ranks(self)
