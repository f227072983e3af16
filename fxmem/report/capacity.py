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
which of them it is.

>>> b = MaxBatchSize(5, by="live", budget_bytes=2**20)
>>> b + 1, b.by, b.explain
(6, 'live', 'the largest B whose live tensors fit in 1.00 MiB')
"""

from __future__ import annotations

from ..errors import FxmemError, InfeasibleBudgetError, InputError
from ..formula.search import largest

BY = ("device", "allocated", "live")
_WHAT = {
    "device": "the largest B whose training steps, replayed through the CUDA caching "
              "allocator, run within {budget} of device memory",
    "allocated": "the largest B whose predicted max_memory_allocated() fits in {budget}",
    "live": "the largest B whose live tensors fit in {budget}",
}


class MaxBatchSize(int):
    """An ``int``: the largest batch size, with what it answers. ``by``: one of :data:`BY`;
    ``budget_bytes``: the bytes it was checked against (for ``"device"``, what the
    allocator can get); ``gpu``: the card's name when the budget came from one, else
    ``""``; ``limit``: ``True`` when B stopped at the formula's own upper limit (a
    ``B <= n`` in ``valid_when``) rather than at the budget."""

    by: str
    budget_bytes: int
    gpu: str
    limit: bool

    def __new__(cls, value: int, *, by: str, budget_bytes: int, gpu: str = "",
                limit: bool = False):
        self = super().__new__(cls, value)
        self.by, self.budget_bytes, self.gpu, self.limit = by, budget_bytes, gpu, limit
        return self

    def __setattr__(self, name, value):
        if hasattr(self, "limit"):
            raise AttributeError("MaxBatchSize is immutable")
        super().__setattr__(name, value)

    def __reduce__(self):
        return (_rebuild, (int(self), self.by, self.budget_bytes, self.gpu, self.limit))

    @property
    def explain(self) -> str:
        """One sentence: what this number answers."""
        from .text import fmt_bytes

        where = f"{fmt_bytes(self.budget_bytes)}" + (f" ({self.gpu})" if self.gpu else "")
        text = _WHAT[self.by].format(budget=where)
        return text + (" (B stops at the formula's upper limit)" if self.limit else "")


def _rebuild(value, by, budget, gpu, limit):
    return MaxBatchSize(value, by=by, budget_bytes=budget, gpu=gpu, limit=limit)


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


def device_max_batch_size(report, budget_bytes: int, *, config=None, compute_capability=None,
                          cudnn_workspace: int = 0, gpu: str = "") -> MaxBatchSize:
    """The ``"device"`` answer of :meth:`fxmem.Report.max_batch_size` (a report in B alone).
    Raises :class:`fxmem.InfeasibleBudgetError` naming where the smallest B runs out."""
    lo = report.min_batch_size

    def run(b):
        return report.runs_on_device(b, budget_bytes, config, compute_capability,
                                     cudnn_workspace=cudnn_workspace)

    first = run(lo)
    if not first.fits:
        from .text import fmt_bytes

        step, at, op, phase, module = first.oom
        where = ("while placing the parameters, buffers and batch" if at < 0 else
                 f"at {op} in {module or '(root)'} ({phase}, step {step})")
        least = report.peak_bytes(lo)
        raise InfeasibleBudgetError(
            f"B={lo} does not run within {fmt_bytes(budget_bytes)} of device memory: the "
            f"caching allocator runs out {where}; its live tensors alone peak at "
            f"{fmt_bytes(least)} ({least:,} B)", minimum_bytes=max(first.max_reserved, least))
    hint = None
    try:  # live bytes never exceed what the allocator holds: a B past their answer fails
        hint = int(report.max_batch_size(budget_bytes, by="live")) + 1
    except FxmemError:
        hint = None
    b, limit = search(lambda x: run(x).fits, lo, hint, report.max_valid_batch_size)
    return MaxBatchSize(b, by="device", budget_bytes=budget_bytes, gpu=gpu, limit=limit)
