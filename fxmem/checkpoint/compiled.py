"""``torch.compile``'s partitioner budgets as a plan kind (``kinds=[..., "compiled"]``).

A compiled step recomputes in backward what AOTAutograd's partitioner chooses under
``torch._functorch.config.activation_memory_budget``: lower budgets save less for backward
and recompute more. Each budget is a candidate beside the eager checkpoint plans, judged by
the same two numbers:

- **peak**: the live bytes of the step compiled under that budget, a formula in B, from
  ``fxmem.analyze(..., compile={"activation_memory_budget": b})`` (inductor's own code run on
  the trace's fake tensors: :mod:`fxmem.trace.compiled.inductor`);
- **recompute FLOPs**: that step's FLOPs minus the step's compiled under budget 1.0 (the
  partition that saves what the min-cut saves), both counted as
  :mod:`fxmem.checkpoint.flops` counts any trace (PyTorch's formulas). Inductor's fused
  kernels are not ops of the trace: the pointwise work they recompute is not counted, while
  an eager plan's recomputed pointwise ops count one FLOP per element. Matmuls, convolutions
  and attention, where recompute costs, count on both sides alike.

Compiled candidates need a CUDA build of PyTorch with a device (a GPU or the fake GPU), and
one analysis per budget: they are considered only when asked for (``"compiled"`` in
``kinds``), so an eager analysis and its planner cost nothing more.

Under FSDP2, HSDP, DDP or TP (a :class:`fxmem.ParallelReport`) a budget's step is the one
``compile=`` makes there: each of the model's repeated blocks compiled in place under the
budget (:meth:`fxmem.trace.compiled.Compile.blocks`), the eager plans' the strategy's own
planner's; each number is the largest rank's, and a step runs where every rank's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ..errors import InputError
from ..formula.symbols import B

BUDGETS = (1.0, 0.7, 0.5, 0.3)  # activation_memory_budget values tried, 1.0 the reference


@dataclass(frozen=True)
class CompiledPlan:
    """The step compiled with ``torch.compile`` under partitioner budget ``budget``.

    ``peak``: its live bytes at the peak, a sympy expression in B; ``step_flops`` /
    ``recompute_flops``: its FLOPs / those over the step compiled under budget 1.0, sympy
    expressions in B; ``report``: its :class:`fxmem.Report` (``cuda_memory``,
    ``breakdown``, ...)."""

    budget: float
    peak: sympy.Expr
    step_flops: sympy.Expr
    recompute_flops: sympy.Expr
    report: object = field(repr=False)

    def peak_bytes(self, b: int) -> int:
        """Live bytes at the peak at batch size ``b``."""
        return self.report.peak_bytes(b)

    def recompute_flops_at(self, b: int) -> int:
        """Recompute FLOPs at batch size ``b``."""
        return int(self.recompute_flops.subs(B, b))

    def step_flops_at(self, b: int) -> int:
        """The compiled step's FLOPs at batch size ``b``."""
        return int(self.step_flops.subs(B, b))

    @property
    def option(self) -> dict:
        """What ``fxmem.analyze`` / ``fxmem.measure`` take as ``compile=`` for this step."""
        return {"activation_memory_budget": self.budget}


def check_budgets(budgets) -> tuple:
    """``budgets`` as a tuple of floats in (0, 1], 1.0 included (the reference)."""
    out = []
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 1:
            raise InputError(f"a compile budget is a fraction in (0, 1], got {b!r}")
        out.append(float(b))
    return tuple(dict.fromkeys([1.0, *out]))


def compiled_plans(report, budgets=BUDGETS) -> tuple:
    """A :class:`CompiledPlan` per budget (1.0 first), the step analysed again compiled
    (``report.reanalyze``, which :func:`fxmem.analyze` sets); memoized on ``report``."""
    again = getattr(_first(report), "reanalyze", None)
    if again is None:
        raise InputError("compiled plans analyse the step again compiled: use a report made "
                         "by fxmem.analyze")
    if report.device != "cuda":
        raise InputError("compiled plans are for device='cuda' (inductor's CPU code is not "
                         "modelled)")
    parts = getattr(_first(report).trace, "compiled_parts", ())
    if parts:  # analysed again with compile=, the model would be compiled whole
        from ..trace.compiled import named_parts

        raise InputError(f"{named_parts(list(parts))}: plans over parts compiled on their own "
                         "(checkpoint plans, the partitioner's activation_memory_budget) are "
                         "not modelled yet")
    memo = report.__dict__.setdefault("_compiled_plans", {})
    for b in check_budgets(budgets):
        if b not in memo:
            memo[b] = again(compile={"activation_memory_budget": b})
    reference = _flops(memo[1.0])
    out = []
    for b in check_budgets(budgets):
        r = memo[b]
        total = _flops(r)
        out.append(CompiledPlan(b, r.peak, total, sympy.expand(total - reference), r))
    return tuple(out)


def _first(report):
    """``report``, or a :class:`fxmem.ParallelReport`'s first group's (rank 0's) report."""
    groups = getattr(report, "groups", None)
    return groups[0].report if groups is not None else report


def _flops(report) -> sympy.Expr:
    """The step's FLOPs, a parallel step's the largest rank's (each rank runs its own
    micro-batch of B)."""
    groups = getattr(report, "groups", None)
    if groups is None:
        return report.flop_count.total
    totals = list(dict.fromkeys(g.report.flop_count.total for g in groups))
    return totals[0] if len(totals) == 1 else sympy.Max(*totals)


def _eager_plan_for(report, budget_bytes: int, b: int, candidates, kinds, **options):
    """The eager plans' choice (:func:`fxmem.checkpoint.confirm.plan_for`); a parallel
    step's by its own planner, one plan for every rank (``ParallelReport.plan_for``)."""
    if getattr(report, "groups", None) is not None:
        return report.plan_for(budget_bytes, b, candidates, kinds=kinds, **options)
    from .confirm import plan_for

    return plan_for(report, budget_bytes, b, candidates, kinds, **options)


def _eager_most(report, budget_bytes: int, max_recompute: float, candidates, kinds,
                **options):
    """The eager plans' largest B (:func:`fxmem.checkpoint.confirm.max_batch_size`), a
    :class:`fxmem.PlanChoice`; a parallel step's by its own planner
    (``ParallelReport.max_batch_size``)."""
    if getattr(report, "groups", None) is not None:
        return report.max_batch_size(budget_bytes, max_recompute, candidates, kinds=kinds,
                                     **options).choice
    from .confirm import max_batch_size

    return max_batch_size(report, budget_bytes, max_recompute, candidates, kinds, **options)


def split_kinds(kinds, report=None) -> tuple:
    """``(eager kinds or None for none, whether "compiled" is asked)``; ``kinds`` None: the
    eager kinds (:data:`fxmem.checkpoint.options.KINDS`), no compiled ones, or for a
    ``report`` of a compiled step, its budgets alone (eager plans of a compiled step's trace
    are refused: its ops are inductor's kernels, not the modules' forwards)."""
    from .options import KINDS

    step_compiled = report is not None and getattr(_first(report).trace, "compiled", False)
    if kinds is None:
        kinds = ("compiled",) if step_compiled else KINDS
    kinds = tuple(dict.fromkeys(kinds))
    unknown = [k for k in kinds if k not in (*KINDS, "compiled")]
    if unknown:
        raise InputError(f"plan kinds are among {', '.join((*KINDS, 'compiled'))}; got "
                         f"{', '.join(map(repr, unknown))}")
    eager = tuple(k for k in kinds if k != "compiled")
    if eager and step_compiled:
        raise InputError(f"a compiled step's plans are its torch.compile budgets "
                         f"(kinds=['compiled']), not {', '.join(eager)}: to compare them with "
                         "eager checkpoint plans, analyse the step without compile= and ask "
                         "for kinds=[..., 'compiled']")
    return (eager or None), "compiled" in kinds


def frontier(report, b: int, candidates=None, kinds=None, budgets=BUDGETS) -> tuple:
    """:meth:`fxmem.Report.frontier` with compiled budgets among the kinds: the eager plans'
    Pareto points (as their planner orders them) and each compiled budget's
    (``FrontierPoint.compiled``: its budget), less the points another of the other side
    dominates (no higher peak and no more recompute FLOPs; at a tie the eager plan stays),
    peak descending."""
    from .choose import FrontierPoint

    eager, compiled = split_kinds(kinds, report)
    if not eager:
        pts = ()
    elif getattr(report, "groups", None) is not None:  # one plan for every rank
        from .ranks import frontier as every_rank

        pts = every_rank(*report._planner(candidates, eager), b)
    else:
        pts = tuple(report._chooser(candidates, eager).frontier(b))
    if not compiled:
        return pts
    ours = []
    for p in compiled_plans(report, budgets):
        q = FrontierPoint(p.peak_bytes(b), p.recompute_flops_at(b), (), p.budget)
        if not any(_covers(o, q) for o in (*pts, *ours)):
            ours.append(q)
    ours = [q for q in ours if not any(_covers(o, q) and o != q for o in ours)]
    kept = [p for p in pts if not any(_covers(q, p) and _key(q) != _key(p) for q in ours)]
    return tuple(sorted((*kept, *ours), key=lambda p: (-p.peak_bytes, p.recompute_flops)))


def _key(p) -> tuple:
    return p.peak_bytes, p.recompute_flops


def _covers(a, b) -> bool:
    """``a`` has no higher peak and no more recompute FLOPs than ``b``."""
    return a.peak_bytes <= b.peak_bytes and a.recompute_flops <= b.recompute_flops


def plan_for(report, budget_bytes: int, b: int, candidates=None, kinds=None, *,
             by: str = "live", budgets=BUDGETS, **options):
    """:meth:`fxmem.Report.plan_for` with compiled budgets among the kinds: the eager
    choice (:func:`fxmem.checkpoint.confirm.plan_for`) and every compiled budget whose step
    fits (``by="live"``: its peak; ``"device"``: its steps run in the caching allocator's
    replay within ``budget_bytes``), the one with the least recompute FLOPs (then the lower
    peak). A compiled choice is a :class:`fxmem.PlanChoice` with no plan and ``compiled``
    its budget. Raises :class:`fxmem.InfeasibleBudgetError` when nothing fits."""
    from ..errors import InfeasibleBudgetError
    from .choose import PlanChoice
    from .confirm import reserved_need
    from .on_device import device_run

    eager, compiled = split_kinds(kinds, report)
    if not compiled:
        return _eager_plan_for(report, budget_bytes, b, candidates, eager, by=by, **options)
    choices, least = [], None
    if eager:
        try:
            choices.append(_eager_plan_for(report, budget_bytes, b, candidates, eager, by=by,
                                           **options))
        except InfeasibleBudgetError as e:
            least = e.minimum_bytes
    ws = options.get("cudnn_workspace", 0)
    plans = compiled_plans(report, budgets)
    step = plans[0].step_flops_at(b)  # the step without recomputation: budget 1.0's
    for p in plans:
        peak = p.peak_bytes(b)
        run = device_run(p.report, b, budget_bytes, ws) if by == "device" else None
        if (run.fits if run is not None else peak <= budget_bytes):
            choices.append(PlanChoice(b, (), peak, p.recompute_flops_at(b), step, p.report,
                                      by=by, run=run, compiled=p.budget))
            continue  # else what it needs: its peak, or its replay's with no limit
        need = peak if by == "live" else reserved_need(p.report, b, ws)
        least = need if least is None else min(least, need)
    if not choices:
        how = " in the caching allocator's replay" if by == "device" else ""
        raise InfeasibleBudgetError(
            f"no plan of the kinds asked fits {budget_bytes:,} bytes at B={b}{how}",
            minimum_bytes=least if least is not None else budget_bytes + 1)
    return min(choices, key=lambda c: (c.recompute_flops, c.peak_bytes))


def max_batch_size(report, budget_bytes: int, max_recompute: float, candidates=None,
                   kinds=None, *, by: str = "live", **options):
    """:meth:`fxmem.Report.max_batch_size` with ``max_recompute`` and compiled budgets among
    the kinds: the largest B of the eager plans' answer
    (:func:`fxmem.checkpoint.confirm.max_batch_size`) and of each compiled budget whose
    recompute FLOPs, as a share of budget 1.0's step, are at most ``max_recompute`` at that
    B (its own :meth:`~fxmem.Report.max_batch_size` by ``by``), as a
    :class:`fxmem.PlanChoice`; the cheaper at equal B."""
    from ..errors import InfeasibleBudgetError
    from .choose import PlanChoice

    eager, compiled = split_kinds(kinds, report)
    if not compiled:
        return _eager_most(report, budget_bytes, max_recompute, candidates, eager, by=by,
                           **options)
    choices, least = [], []
    if eager:
        try:
            choices.append(_eager_most(report, budget_bytes, max_recompute, candidates, eager,
                                      by=by, **options))
        except InfeasibleBudgetError as e:
            least.append(e.minimum_bytes)
    plans = compiled_plans(report, BUDGETS)
    reference = plans[0]
    for p in plans:
        try:
            b = int(p.report.max_batch_size(budget_bytes, by=by, cudnn_workspace=options.get(
                "cudnn_workspace", 0)))
        except InfeasibleBudgetError as e:
            least.append(e.minimum_bytes)
            continue
        cost, step = p.recompute_flops_at(b), reference.step_flops_at(b)
        if cost <= max_recompute * step:
            choices.append(PlanChoice(b, (), p.peak_bytes(b), cost, step, p.report, by=by,
                                      compiled=p.budget))
    if not choices:
        raise InfeasibleBudgetError(
            f"no plan of the kinds asked within {max_recompute:.0%} recompute fits "
            f"{budget_bytes:,} bytes", minimum_bytes=min(least, default=budget_bytes + 1))
    return max(choices, key=lambda c: (c.B, -c.recompute_flops))
