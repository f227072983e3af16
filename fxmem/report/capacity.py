"""The largest batch size, and which question it answers.

"Largest B within 8 GiB" has three answers for a CUDA step, and they differ by gigabytes:

* ``"device"`` — the step *runs*: trained step after step through the caching allocator
  (:func:`fxmem.device.allocator.run_on_device`), no allocation fails once the allocator has
  freed its cache and retried. The budget is what the allocator can get: a card's capacity
  minus the CUDA context (:mod:`fxmem.device.gpus`). This is the answer for a CUDA step.
* ``"allocated"`` — ``torch.cuda.max_memory_allocated()`` stays within the budget (blocks
  and their slack, the library workspaces; nothing of what the allocator caches).
* ``"live"`` — the peak formula, the bytes of live tensors: the answer on the CPU, which
  has no caching allocator.

:meth:`fxmem.Report.max_batch_size` returns a :class:`MaxBatchSize`, an ``int`` that says
which of them it is, and with ``max_recompute`` carries the checkpoint plan that gets there
(``.plan``, ``.choice``); without, its plan is empty.

>>> b = MaxBatchSize(5, by="live", budget_bytes=2**20)
>>> b + 1, b.by, b.explain, b.plan
(6, 'live', 'the largest B whose live tensors fit in 1.00 MiB', <Plan: (no checkpoint)>)
"""

from __future__ import annotations

import functools

from ..errors import FxmemError, InfeasibleBudgetError, InputError
from ..formula.search import largest

BY = ("device", "allocated", "live")
_WHAT = {
    "device": "the largest B whose steps, replayed through the CUDA caching "
              "allocator, run within {budget} of device memory",
    "allocated": "the largest B whose predicted max_memory_allocated() fits in {budget}",
    "live": "the largest B whose live tensors fit in {budget}",
}


def _of_choice(name: str, doc: str) -> property:
    """A :class:`MaxBatchSize` attribute read from its plan choice (``_chosen``)."""
    return property(lambda self: self._chosen(name), doc=doc)


class MaxBatchSize(int):
    """An ``int``: the largest batch size, with what it answers. ``by``: one of :data:`BY`;
    ``budget_bytes``: the bytes it was checked against (for ``"device"``, what the
    allocator can get); ``gpu``: the card's name when the budget came from one, else
    ``""``; ``limit``: ``True`` when B stopped at the formula's own upper limit (a
    ``B <= n`` in ``valid_when``) rather than at the budget; ``choice``: with
    ``max_recompute``, the :class:`fxmem.PlanChoice` at this B (its ``plan``,
    ``peak_bytes``, ``recompute_flops``, ``recompute_fraction``, ``report`` read through
    here too), else None and ``plan`` empty."""

    by: str
    budget_bytes: int
    gpu: str
    choice: object
    limit: bool

    def __new__(cls, value: int, *, by: str, budget_bytes: int, gpu: str = "",
                limit: bool = False, choice=None):
        self = super().__new__(cls, value)
        self.by, self.budget_bytes, self.gpu, self.choice = by, budget_bytes, gpu, choice
        self.limit = limit
        return self

    @classmethod
    def with_plan(cls, choice, budget_bytes: int, by: str = "live",
                  gpu: str = "") -> "MaxBatchSize":
        """The answer of ``max_batch_size(..., max_recompute=)``: ``choice.B`` as ``by``
        answers (``"live"`` or ``"device"``), with the plan ``choice`` that gets there."""
        return cls(choice.B, by=by, budget_bytes=budget_bytes, gpu=gpu, choice=choice)

    def __setattr__(self, name, value):
        if hasattr(self, "limit"):
            raise AttributeError("MaxBatchSize is immutable")
        super().__setattr__(name, value)

    def __reduce__(self):
        return (_rebuild, (int(self), self.by, self.budget_bytes, self.gpu, self.limit,
                           self.choice))

    @property
    def B(self) -> int:  # noqa: N802 - the batch size is B everywhere
        """The batch size, a plain int."""
        return int(self)

    @property
    def plan(self):
        """The checkpoint plan that makes this B fit (a :class:`fxmem.Plan`; empty when
        none was asked for or needed)."""
        from ..trace.plans import Plan

        return self.choice.plan if self.choice is not None else Plan(())

    def _chosen(self, what: str):
        if self.choice is None:
            raise AttributeError(f"{what}: this answer has no checkpoint plan (ask "
                                 "max_batch_size(..., max_recompute=0.25) for one)")
        return getattr(self.choice, what)

    peak_bytes = _of_choice("peak_bytes", "The peak under the plan at this B (bytes).")
    recompute_flops = _of_choice("recompute_flops", "FLOPs the plan re-runs at this B.")
    step_flops = _of_choice("step_flops", "FLOPs of the step without the plan at this B.")
    recompute_fraction = _of_choice("recompute_fraction", "recompute_flops / step_flops.")
    report = _of_choice("report", "The :class:`fxmem.Report` of the step under the plan.")
    exact = _of_choice("exact", "The solver proved the plan the cheapest that fits.")

    @property
    def explain(self) -> str:
        """One sentence: what this number answers."""
        from .text import fmt_bytes, fmt_share

        where = f"{fmt_bytes(self.budget_bytes)}" + (f" ({self.gpu})" if self.gpu else "")
        text = _WHAT[self.by].format(budget=where)
        if self.choice is not None:
            text += (f" with checkpoint plan {self.plan}, re-running "
                     f"{fmt_share(self.recompute_fraction)} of the step's FLOPs")
        return text + (" (B stops at the formula's upper limit)" if self.limit else "")


def _rebuild(value, by, budget, gpu, limit, choice=None):
    return MaxBatchSize(value, by=by, budget_bytes=budget, gpu=gpu, limit=limit, choice=choice)


def check_by(by, device: str) -> str:
    """``by`` checked against the step's device (default: ``"device"`` on CUDA, ``"live"``
    on the CPU)."""
    if by is None:
        return "device" if device == "cuda" else "live"
    if by not in BY:
        raise InputError(f"by must be one of {', '.join(map(repr, BY))}, got {by!r}")
    if by != "live" and device != "cuda":
        raise InputError(f"by={by!r} answers for the CUDA caching allocator: analyse the step "
                         "with device='cuda'")
    return by


def plan_by(by, device: str) -> str:
    """``by`` for a checkpoint plan (:func:`check_by`): ``"device"`` or ``"live"``; a plan
    is not chosen by ``max_memory_allocated()``."""
    by = check_by(by, device)
    if by == "allocated":
        raise InputError("checkpoint plans are chosen by='device' (the allocator's replay "
                         "runs) or by='live' (the peak fits), not by='allocated'")
    return by


def search(fits, lo: int, hi_hint: int | None, upper: int | None) -> tuple:
    """The largest B in [lo, upper] with ``fits(B)``, as ``(B, stopped_at_upper)``; ``fits``
    true at ``lo``. ``hi_hint``: a B believed not to fit (checked), which saves the doubling.
    """
    if upper is not None and fits(upper):
        return upper, True
    if hi_hint is not None and hi_hint > lo and not fits(hi_hint):
        a, b = lo, hi_hint  # fits(a), not fits(b)
        while b - a > 1:
            mid = (a + b) // 2
            a, b = (mid, b) if fits(mid) else (a, mid)
        return a, False
    return largest(fits, lo, limit=10**12), False


def allocated_max_batch_size(report, budget_bytes: int, config=None, compute_capability=None,
                             cudnn_workspace: int = 0) -> int:
    """:meth:`fxmem.Report.cuda_max_batch_size` (a report in B alone): the largest B whose
    predicted ``max_memory_allocated()`` fits ``budget_bytes``."""
    @functools.cache
    def allocated(b):  # one replay per B
        return report.cuda_memory(b, config, compute_capability,
                                  cudnn_workspace=cudnn_workspace).max_allocated

    def fits(b):
        return allocated(b) <= budget_bytes

    lo = _start(report, fits, budget_bytes)
    if lo is None:
        least = allocated(report.least_batch_size)
        raise InfeasibleBudgetError(
            f"budget {budget_bytes:,} B is below the smallest max_memory_allocated "
            f"{least:,} B (at B={report.least_batch_size})", minimum_bytes=least)
    if lo < report.min_batch_size:  # traced at lo; lo + 1 does not fit
        return lo
    live = report.max_batch_size(budget_bytes, by="live")  # also: a peak that grows with B
    return search(fits, lo, int(live) + 1, report.max_valid_batch_size)[0]


def device_max_batch_size(report, budget_bytes: int, *, config=None, compute_capability=None,
                          cudnn_workspace: int = 0, gpu: str = "") -> MaxBatchSize:
    """The ``"device"`` answer of :meth:`fxmem.Report.max_batch_size` (a report in B alone).
    Raises :class:`fxmem.InfeasibleBudgetError` naming where the smallest B runs out."""
    runs: dict = {}

    def run(b):  # one replay per B
        if b not in runs:
            runs[b] = report.runs_on_device(b, budget_bytes, config, compute_capability,
                                            cudnn_workspace=cudnn_workspace)
        return runs[b]

    lo = _start(report, lambda b: run(b).fits, budget_bytes)
    if lo is None:
        lo = report.least_batch_size
        first = run(lo)
        from .text import fmt_bytes

        step, at, op, phase, module = first.oom
        where = ("while placing the parameters, buffers and batch" if at < 0 else
                 f"at {op} in {module or '(root)'} ({phase}, step {step})")
        least = report.peak_bytes(lo)
        raise InfeasibleBudgetError(
            f"B={lo} does not run within {fmt_bytes(budget_bytes)} of device memory: the "
            f"caching allocator runs out {where}; its live tensors alone peak at "
            f"{fmt_bytes(least)} ({least:,} B)", minimum_bytes=max(first.max_reserved, least))
    if lo < report.min_batch_size:  # traced at lo; lo + 1 does not run
        return MaxBatchSize(lo, by="device", budget_bytes=budget_bytes, gpu=gpu)
    hint = None
    try:  # live bytes never exceed what the allocator holds: a B past their answer fails
        hint = int(report.max_batch_size(budget_bytes, by="live")) + 1
    except FxmemError:
        hint = None
    b, limit = search(lambda x: run(x).fits, lo, hint, report.max_valid_batch_size)
    return MaxBatchSize(b, by="device", budget_bytes=budget_bytes, gpu=gpu, limit=limit)


def _start(report, fits, budget_bytes: int, live: bool = False) -> int | None:
    """Where the search for the largest B with ``fits(B)`` starts
    (:meth:`fxmem.Report.start_batch_size`), once :func:`_no_state_room` has said that no B
    runs (``live``: fits by its live bytes) when the state alone is over ``budget_bytes``:
    before a smaller B is traced to find out."""
    if report.min_batch_size > 1 and not fits(report.min_batch_size):
        _no_state_room(report, budget_bytes, live)
    return report.start_batch_size(fits)


def _no_state_room(report, budget_bytes: int, live: bool = False) -> None:
    """Raise :class:`fxmem.InfeasibleBudgetError` when the parameters, buffers and
    optimizer state alone (:func:`fxmem.device.allocator.state_bytes`, the same at every B
    and live throughout the step) are over ``budget_bytes``: then no B runs (``live``: no
    B's live bytes fit), and no smaller B need be traced to say so."""
    from ..device.allocator import state_bytes
    from .text import fmt_bytes

    state = state_bytes(report.liveness)
    if state > budget_bytes:
        b = report.least_batch_size
        within = f"budget {budget_bytes:,} B is below the smallest peak" if live else \
            f"B={b} does not run within {fmt_bytes(budget_bytes)} of device memory"
        raise InfeasibleBudgetError(
            f"{within}: the parameters, buffers and optimizer state alone take {fmt_bytes(state)} "
            f"({state:,} B), whatever the batch size", minimum_bytes=state)

