"""A way out of :func:`fxmem.report.fit.fit` and how it is checked: :class:`WayOut`, the
budget's :class:`Check` (by the caching allocator's replay or by live bytes), the cheapest
checkpoint plan a way takes, and the bounds the ways share (each rank group's report, the
bytes that grow with B).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial

from ..checkpoint.on_device import oom_phrase
from ..errors import FxmemError, InfeasibleBudgetError
from ..formula.symbols import B as SYM_B
from .retrace import retracing
from .text import fmt_bytes, fmt_share, plan_text

KINDS = ("batch", "checkpoint", "fsdp", "fsdp+checkpoint", "param_dtype",
         "param_dtype+checkpoint", "length")
# why no checkpoint plan is searched for an inference step (the ways with one say so)
INFERENCE = "not searched for an inference step (no backward: a plan keeps nothing less)"


@dataclass(frozen=True)
class WayOut:
    """One change that makes the step fit, checked.

    ``kind``: one of :data:`KINDS`; ``value``: the batch size (``"batch"``), the number of
    GPUs (``"fsdp"``, ``"fsdp+checkpoint"``; ``"param_dtype"``, ``"param_dtype+checkpoint"``:
    the step's own, FSDP2's ``param_dtype`` set, :mod:`fxmem.report.precision`), the
    sequence length (``"length"``), or the asked B (``"checkpoint"``); ``need_bytes``: what
    the step takes there, answered as the budget is (``Fit.by``: for ``"device"``,
    ``max_memory_reserved()`` within the budget); ``plan``: the checkpoint plan it takes (a
    :class:`fxmem.Plan`, for ``analyze(..., checkpoint=plan)``; empty: none) and
    ``recompute_share``: the FLOPs that plan re-runs, as a share of the step's; ``beyond``:
    what one step beyond gives (the next B, one GPU fewer, the next length, or that no
    cheaper plan fits); ``line``: the way, for people; ``compiled``: the ``torch.compile``
    budget that takes the place of a plan (a compiled step's plans,
    :mod:`fxmem.checkpoint.compiled`), else None."""

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


def default_by(report) -> str:
    """How a budget is checked when not said: a CUDA step by the allocator's replay
    (``"device"``), else by live bytes (``"live"``)."""
    return "device" if report.device == "cuda" else "live"


@dataclass(frozen=True)
class Check:
    """Runs and needs at one budget, answered ``by`` one kind (``cudnn``: the cuDNN
    workspace's bytes); equal when all three are."""

    by: str
    budget: int
    cudnn: int

    def runs(self, report, b: int, dims: dict | None = None) -> tuple:
        """(whether the step at ``b`` fits, where it runs out or ``""``); ``dims``: the
        named dims' values of a report in them (by the allocator's replay, each rank's step
        replayed there from its trace in them: :meth:`fxmem.Report.runs_on_device`)."""
        if dims and self.by == "live":
            report, dims = report.at(**dims), None
        for r in rank_reports(report):
            if self.by == "live":
                if r.peak_bytes(b) > self.budget:
                    return False, ""
                continue
            run = r.runs_on_device(b, self.budget, cudnn_workspace=self.cudnn, **(dims or {}))
            if not run.fits:
                return False, oom_phrase(run)
        return True, ""

    def fits(self, report, b: int, dims: dict | None = None) -> bool:
        return self.runs(report, b, dims)[0]

    def need(self, report, b: int, within: bool = False) -> int:
        """What the step at ``b`` needs, the largest rank's: live bytes, or for ``"device"``
        ``max_memory_reserved()``, replayed with no limit or (``within``, a step that fits)
        within the budget, where the allocator frees its cache and retries rather than
        fail."""
        if self.by == "live":
            return max(r.peak_bytes(b) for r in rank_reports(report))
        if within:
            return max(r.runs_on_device(b, self.budget, cudnn_workspace=self.cudnn).max_reserved
                       for r in rank_reports(report))
        return max(r.cuda_memory(b, cudnn_workspace=self.cudnn).max_reserved
                   for r in rank_reports(report))

    def floor(self, report, b: int) -> int:
        """Bytes the step at ``b`` cannot run in, the largest rank's: its live peak, or for
        ``"device"`` the allocator's ``max_memory_allocated()``, which no budget lowers (a
        budget only makes the allocator free its cache and retry)."""
        if self.by == "live":
            return live_peak(report, b)
        return max(r.cuda_memory(b, cudnn_workspace=self.cudnn).max_allocated
                   for r in rank_reports(report))


def checked(check, choice, b: int) -> bool:
    """Whether ``choice`` (a :class:`fxmem.PlanChoice` at ``b``) fits as the budget is
    checked: said by the choice when it was chosen that way (no second replay)."""
    return choice.by == check.by or check.fits(choice.report, b)


def choice_way(check, choice, b: int, kind: str, value: int, line: str) -> WayOut | str:
    """A plan choice as a way, once its report fits at ``b`` as the budget is checked."""
    if not checked(check, choice, b):
        return (f"the cheapest plan by live bytes ({plan_text(choice.plan)}) does not run "
                f"within the budget at B={b}")
    share = choice.recompute_fraction
    need = choice.run.max_reserved if choice.run is not None and check.by == "device" \
        else check.need(choice.report, b, True)
    budget, exact = getattr(choice, "compiled", None), getattr(choice, "exact", True)
    text = line.format(doing=doing(choice.plan, budget), share=fmt_share(share))
    return WayOut(kind, value, need, text, plan=choice.plan, recompute_share=share,
                  compiled=budget, beyond="the cheapest such plan" if exact else
                  "a plan found by a heuristic: a cheaper one may fit")


def doing(plan, compiled=None) -> str:
    """A way's action in its line: checkpointing ``plan``, or the compile budget in its place."""
    return f"checkpointing {plan_text(plan)}" if compiled is None else \
        f"torch.compile's budget activation_memory_budget={compiled:g}"


class NoPlan(str):
    """Why no plan fits (a line), with the smallest peak a plan reaches."""

    def __new__(cls, line: str, minimum_bytes: int):
        self = super().__new__(cls, line)
        self.minimum_bytes = minimum_bytes
        return self

    def __reduce__(self):  # a way's line sent back from a forked child (fxmem.report.forked)
        return NoPlan, (str(self), self.minimum_bytes)


def cheapest_plan(check, report, b: int, confirm: bool = True):
    """The :class:`fxmem.PlanChoice` at ``b``, or the line saying why there is none;
    ``confirm=False``: the plan's step derived, not traced (a search's cheap answer). The
    plan is confirmed by its step traced at ``b`` alone (B and the named dims plain ints,
    the choice's ``report`` holding there only): a way is read at ``b``, and such a trace
    costs less than one in symbols."""
    if report.plan:
        return "the step has a checkpoint plan already"
    if not rank_reports(report)[0].trace.train:
        return f"the cheapest checkpoint plan at B={b}: {INFERENCE}"
    if getattr(report, "groups", None) is not None and rank_reports(report)[0].trace.compiled:
        return (f"no checkpoint plan at B={b}: not searched for a compiled step under "
                f"{report.strategy.name} (a plan over its compiled blocks is traced when "
                "given, not chosen)")
    if confirm and getattr(report, "retrace", None) is not None:
        report = retracing(report, partial(report.retrace, point=(b, {})))
    try:
        return report.plan_for(check.budget, b, by=check.by, cudnn_workspace=check.cudnn,
                               confirm=confirm)
    except InfeasibleBudgetError as e:
        what = "need, replayed with no limit," if "allocator's replay" in str(e) else "peak"
        return NoPlan(f"no checkpoint plan fits at B={b}: the smallest {what} is "
                       f"{fmt_bytes(e.minimum_bytes)}", e.minimum_bytes)
    except FxmemError as e:  # no blocks to checkpoint, ...
        return f"no checkpoint plan at B={b}: {e}"


def as_asked(report, b: int) -> dict:
    """The :func:`fxmem.analyze` options a way's ``reanalyze`` keeps from the step as asked
    at ``b``: its checkpoint plan, and B traced as the int ``b`` when ``b`` is below where
    the formulas hold (``Report._small``), so that no formula's trace is made."""
    changes = {"checkpoint": report.plan} if report.plan else {}
    if b < min(r.min_batch_size for r in rank_reports(report)):
        changes["concrete_batch"] = b
    return changes


def at_point(b: int, dims: dict | None = None) -> dict:
    """The :func:`fxmem.analyze` options of a step traced at ``b`` and the named ``dims``'
    values alone (B and those dims plain ints: no formula's trace, which costs more), for a
    way that reads its step there and nowhere else.

    >>> at_point(2, {"L": 8192})
    {'concrete_batch': 2, 'concrete_dims': {'L': 8192}}
    """
    return {"concrete_batch": b, **({"concrete_dims": dict(dims)} if dims else {})}


def rank_reports(report) -> tuple:
    """Each rank group's report of a :class:`fxmem.ParallelReport`, or ``(report,)``."""
    groups = getattr(report, "groups", None)
    return tuple(g.report for g in groups) if groups is not None else (report,)


def live_peak(report, b: int) -> int:
    """The live bytes' peak at ``b`` of the rank with the most: what the step needs under
    any allocator."""
    return max(r.peak_bytes(b) for r in rank_reports(report))


def batch_floor(report, b: int) -> int:
    """The largest rank's peak at ``b`` of the live bytes of storages whose size grows with
    B (activations, their gradients, the batch): FSDP2 shards none of them, so they are the
    same on any number of GPUs, and no world size runs the step in fewer bytes. 0 where B
    is traced as an int (below :attr:`fxmem.Report.min_batch_size`).

    >>> import torch, fxmem
    >>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
    ...                   device="cpu")
    >>> batch_floor(r, 4) < r.peak_bytes(4), batch_floor(r, 8) - batch_floor(r, 4)
    (True, 160)
    """
    from ..memory.liveness import no_bytes, timeline

    out = 0
    for r in rank_reports(report):
        if r._small(b) is not None:
            continue
        lv = r.liveness
        sizes = [s if SYM_B in s.expr.free_symbols else no_bytes for s in lv.sizes]
        out = max(out, max(timeline(lv.graph.storages, sizes, len(lv.graph.ops), b),
                           default=0))
    return out


def grows(least: int, planned: bool = False) -> str:
    """Why no world size fits: what grows with B alone is over the budget (``planned``:
    under any plan, :func:`_plan_floor`)."""
    if planned:
        return (f"under any plan, the tensors that grow with B alone peak at no less than "
                f"{fmt_bytes(least)} on a rank, on any number of GPUs")
    return (f"the tensors that grow with B alone peak at {fmt_bytes(least)} on a rank, "
            "on any number of GPUs")
