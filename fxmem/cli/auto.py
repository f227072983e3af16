"""``--checkpoint auto``: the plan the command's report is given under.

With ``--compile`` too, the step is analysed eager and ``torch.compile``'s partitioner
budgets join its checkpoint plans as candidates (:mod:`fxmem.checkpoint.compiled`), judged
by the same two numbers (peak, recompute FLOPs): the answer is either a budget the step is
compiled under or an eager plan, whichever re-runs less. And ``--compile``'s options.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InfeasibleBudgetError, InputError
from ..report.text import frontier_plan


@dataclass(frozen=True)
class Auto:
    """What ``--checkpoint auto`` chose: ``report``, the step under it; ``frontier``, the
    Pareto points it chose among; ``compiled``, the ``activation_memory_budget`` the step is
    compiled under (``None``: not compiled)."""

    report: object
    frontier: tuple
    compiled: float | None = None

    def setup_line(self, asked_compile: bool, each_block: bool = False) -> str | None:
        """The report's "compiled" setup row with ``--compile`` (None without it): the budget
        chosen, or that an eager plan was (it re-runs less within the budget, or, with no
        budget, it has the smallest peak); ``each_block``: under ``--fsdp``, ``--ddp`` or
        ``--tp``, where a budget's step compiles each repeated block (:func:`compiled_line`).

        >>> Auto(None, (), 0.5).setup_line(True)
        'torch.compile, activation_memory_budget 0.5 (--checkpoint auto)'
        """
        if not asked_compile:
            return None
        if self.compiled is None:
            return "no: eager, under the checkpoint plan chosen (--checkpoint auto)"
        from ..trace.compiled import Compile

        return compiled_line(Compile(self.compiled), each_block) + " (--checkpoint auto)"


def check(compile_budget) -> None:
    """``--checkpoint auto --compile``'s refusal: a budget given (auto chooses it)."""
    if compile_budget is not None:
        raise InputError("--checkpoint auto chooses the torch.compile budget itself: drop "
                         "--compile-budget, or give a plan instead of auto")


def choose(report, batch: int, budget_bytes: int | None, cudnn_workspace: int = 0,
           compiled: bool = False, jobs: int = 1) -> Auto:
    """The cheapest plan whose step at ``batch`` fits ``budget_bytes`` (on CUDA: runs in the
    caching allocator's replay); no budget: the plan of the smallest peak. When no plan
    fits, the step as asked (the ways out say why). ``compiled``: ``report`` is the eager
    step of a ``--compile`` command, and the compile budgets are candidates too (the step as
    asked is then the one compiled under budget 1.0). ``jobs``: 2, the frontier of an eager
    step is computed in a forked child while the plan chosen is traced, where one is."""
    from ..checkpoint.compiled import compiled_plans
    from ..checkpoint.options import KINDS
    from ..report.forked import meanwhile

    kinds = (*KINDS, "compiled") if compiled else None
    if budget_bytes is not None:
        # the frontier, for the report: where a plan is traced, in a child meanwhile (a
        # child searching a way ahead is stopped then: fxmem.report.forked), else here
        with meanwhile(lambda: report.frontier(batch, kinds=kinds),
                       fork=jobs > 1 and not compiled) as work:  # (compile's candidates: here)
            try:
                c = report.plan_for(budget_bytes, batch, kinds=kinds,
                                    cudnn_workspace=cudnn_workspace)
            except InfeasibleBudgetError:
                c = None
            frontier = work.result()
        if c is not None:
            return Auto(c.report, frontier, c.compiled)
        if compiled:
            return Auto(compiled_plans(report, (1.0,))[0].report, frontier, 1.0)
        return Auto(report, frontier)
    frontier = report.frontier(batch, kinds=kinds)
    if not frontier:
        return Auto(report, frontier)
    last = frontier[-1]
    if last.compiled is not None:
        return Auto(compiled_plans(report, (last.compiled,))[-1].report, frontier,
                    last.compiled)
    traced = getattr(report, "retrace", None)  # a parallel step: traced with its plan
    plan = last.plan
    return Auto(traced(plan) if traced and plan else report.with_plan(plan), frontier)


def unplanned_peak(named, batch: int, sizes: dict) -> str:
    """The setup's "peak in B, L" where the report leads with a chosen plan's peak: the
    step without it (``named``, in B and the dims of ``sizes``) as its readable peak at the
    point and where that is exact; its exact expression, at LLM scale a Max of many
    branches, where none reads (and behind ``--exact-formula``)."""
    from ..report.text import exact_when_of

    r = named.readable_peak(batch, **sizes)
    if r is None:
        return str(named.peak)
    return f"{r.formula} without the plan ({exact_when_of(r.exact_when, r.error)})"


def compile_option(compiled: bool, budget: float | None):
    """``Step.compile`` from ``--compile`` and ``--compile-budget``."""
    if budget is not None and not compiled:
        raise InputError("--compile-budget is the partitioner's budget of a compiled step: "
                         "give --compile too")
    if not compiled:
        return None
    return {"activation_memory_budget": budget} if budget is not None else True


def compiled_line(c, each_block: bool = False) -> str | None:
    """The setup's "compiled" row of ``Step.compile`` ``c`` (None: not compiled, no row): its
    budget as a frontier point names one (:func:`fxmem.report.text.frontier_plan`), or
    ``torch.compile`` alone;
    ``each_block``: under ``--fsdp``, ``--ddp`` or ``--tp``, where each of the model's
    repeated blocks is compiled on its own (:meth:`fxmem.trace.compiled.Compile.blocks`).

    >>> from fxmem.trace.compiled import Compile
    >>> compiled_line(Compile(0.5), each_block=True)
    'torch.compile of each block, activation_memory_budget 0.5'
    """
    if c is None:
        return None
    budget = c.activation_memory_budget
    line = frontier_plan((), budget) if budget else "torch.compile"
    return line.replace("torch.compile", "torch.compile of each block", 1) if each_block \
        else line
