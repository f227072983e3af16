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

    def __str__(self) -> str:
        from .text import render_ranks

        return render_ranks(self)
