"""What the framework integrations share: the optimizer step with gradient clipping, the
search for the largest batch (with a checkpoint plan confirmed by tracing it), and the
measured peak of a framework's real steps (:class:`StepMemory`, :func:`cpu_tracker`).

>>> import torch
>>> from fxmem.integrations.common import clipping
>>> SGD = clipping(torch.optim.SGD, max_norm=1.0)
>>> p = torch.nn.Parameter(torch.ones(4))
>>> p.grad = torch.full((4,), 10.0)
>>> SGD([p], lr=0.0).step()
>>> round(float(p.grad.norm()), 4)
1.0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from ..errors import InfeasibleBudgetError, TraceError
from ..trace.ledger import StorageTracker


def clipping(cls, max_norm: float | None = None, foreach=None, *, max_value: float | None = None):
    """``cls`` whose ``step`` first clips the gradients of its parameters: to the norm
    ``max_norm`` (``torch.nn.utils.clip_grad_norm_``; ``math.inf`` still measures the norm)
    or to the value ``max_value`` (``clip_grad_value_``), as the Hugging Face Trainer and
    Lightning do before each optimizer step. ``foreach``: the clipping's ``foreach`` (None:
    PyTorch's default for the device, on CUDA its foreach kernels)."""
    if max_norm is None and max_value is None:
        return cls

    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]]
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)
        else:
            torch.nn.utils.clip_grad_value_(params, max_value, foreach=foreach)
        return cls.step(self, closure)

    return type(cls.__name__, (cls,), {"step": step, "__module__": cls.__module__})


def largest(report, budget: dict):
    """The largest B fitting (a :class:`fxmem.report.capacity.MaxBatchSize`), or None when
    even the smallest does not. ``budget``: keywords of :meth:`fxmem.Report.max_batch_size`."""
    try:
        return report.max_batch_size(**budget)
    except InfeasibleBudgetError:
        return None


def live_budget(budget: dict) -> int:
    """The byte count a checkpoint plan must fit (plans are chosen by live bytes): the
    budget, or the card's usable memory when given by ``gpu``."""
    if budget.get("budget_bytes") is not None:
        return budget["budget_bytes"]
    from ..device.gpus import gpu as lookup

    return lookup(budget["gpu"]).usable_bytes(budget.get("context_bytes"))


def device_budget(context_bytes: int | None = None) -> int:
    """The current CUDA device's total memory less the CUDA context (``context_bytes``,
    default :data:`fxmem.device.gpus.DEFAULT_CONTEXT_BYTES`): the budget when none is given."""
    from ..device.gpus import DEFAULT_CONTEXT_BYTES
    from ..errors import InputError

    if not torch.cuda.is_available():
        raise InputError("give budget_bytes (or gpu=): there is no CUDA device to read the "
                         "memory of")
    context = DEFAULT_CONTEXT_BYTES if context_bytes is None else context_bytes
    return torch.cuda.mem_get_info()[1] - context


def confirmed_plan(report, retrace, live: int, max_recompute: float, b: int | None = None):
    """A checkpoint plan for batch ``b`` (None: the largest batch with one) within ``live``
    bytes, re-running at most ``max_recompute`` of the step's FLOPs, confirmed by tracing
    the step with it (``retrace(plan)`` -> its :class:`fxmem.Report`): a plan's derived
    peak can differ from its traced one, and PyTorch may refuse to re-run a selective plan,
    so plans of whole blocks are tried next. ``(batch, choice, traced report)`` or None."""
    if b is not None and b < report.min_batch_size:
        return None
    for kinds in (None, ("module", "group")):  # then without selective plans
        try:
            # confirmed here, by the caller's retrace (its module prepared as it runs)
            # by live bytes, as the traced plan is checked below (and as the fit reports it)
            choice = report.max_batch_size(live, max_recompute=max_recompute, kinds=kinds,
                                           confirm=False, by="live") if b is None else \
                report.plan_for(live, b, kinds=kinds, confirm=False, by="live")
        except InfeasibleBudgetError:
            return None
        if b is not None and choice.recompute_fraction > max_recompute:
            return None
        try:
            traced = retrace(choice.plan)
        except TraceError:
            continue
        most = largest(traced, dict(budget_bytes=live, by="live"))
        if most is not None and (b is None or most >= b):
            return (int(most) if b is None else b), choice, traced
    return None


def least_peak_message(report, what: str, live: int) -> tuple[str, int]:
    """The message and the least peak for a budget nothing fits, even with a plan."""
    least = report.frontier(report.min_batch_size)[-1].peak_bytes
    return (f"{what} fits {live:,} B: the smallest peak any checkpoint plan reaches at "
            f"B={report.min_batch_size} is {least:,} B (derived; plans are confirmed by "
            f"tracing)"), least


@dataclass(frozen=True)
class StepMemory:
    """One optimizer step of a framework's run: its ``global_step`` (1 for the first),
    ``batch_size`` (dim 0 of the batch the model was called with), fxmem's
    ``predicted_peak_bytes`` at that batch size and the ``measured_peak_bytes`` (None when
    the step was not measured), ``how`` it was measured (``"cuda max_memory_allocated"``,
    ``"cpu live bytes"``)."""

    global_step: int
    batch_size: int | None
    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    how: str


def tensors_in(obj) -> list:
    """The tensors inside nested dicts, lists and tuples (a batch, optimizer state)."""
    return [x for x in tree_leaves(obj) if isinstance(x, torch.Tensor)]


def cpu_tracker(live) -> StorageTracker:
    """A storage tracker (the one :func:`fxmem.measure` uses) entered, with the tensors
    ``live`` before the step registered: parameters, buffers, gradients, optimizer state,
    the batch. Stop it with :func:`tracked_peak`."""
    tracker = StorageTracker()
    for t in live:
        tracker.register(t)
    tracker.__enter__()
    return tracker


def tracked_peak(tracker: StorageTracker) -> int:
    """Leave ``tracker``; the peak live bytes from its events, as :func:`fxmem.measure`
    replays them: what was registered before the step, then each allocation and free."""
    tracker.__exit__(None, None, None)
    tracker.close()
    live = sum(int(s.nbytes) for s in tracker.storages if s.created_by < 0)
    peak = live
    for ev in tracker.events:
        n = int(tracker.storages[ev.sid].nbytes)
        live += n if ev.kind == "alloc" else -n
        peak = max(peak, live)
    return peak


__all__ = ["clipping", "largest", "live_budget", "device_budget", "confirmed_plan", "StepMemory",
           "tensors_in", "cpu_tracker", "tracked_peak"]
