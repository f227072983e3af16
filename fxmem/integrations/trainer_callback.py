"""A ``transformers.TrainerCallback`` that logs fxmem's prediction beside the peak the
Trainer's real steps reach (:class:`FxmemCallback`; imported as
``fxmem.integrations.hf.FxmemCallback``).

What is measured: on CUDA, ``torch.cuda.max_memory_allocated()`` over each optimizer step
(peak stats reset at its start); on the CPU, the live bytes of a storage tracker (the one
:func:`fxmem.measure` uses, :class:`fxmem.trace.ledger.tracking.StorageTracker`) over the steps
after the first (the first creates the optimizer state), ``cpu_steps`` of them since the
tracker slows every op: what was live at the step's start (parameters, buffers, gradients,
optimizer state, the batch the model is called with) plus every storage the step makes,
until it is freed.
"""

from __future__ import annotations

import torch

from ..errors import FxmemError
from .common import StepMemory, cpu_tracker, tensors_in, tracked_peak

try:
    from transformers import TrainerCallback
except ImportError:  # the class still imports; the Trainer needs transformers anyway
    TrainerCallback = object


class FxmemCallback(TrainerCallback):
    """Logs fxmem's predicted peak for each optimizer step beside the measured one.

    ``prediction``: a :class:`fxmem.integrations.hf.TrainerFit`, a :class:`fxmem.Report` of
    the step (its peak taken at the batch size the model is called with) or a byte count.
    Each step's :class:`StepMemory` is kept in :attr:`steps`; at each of the Trainer's log
    calls the last one is added to the logged dict and to ``state.log_history`` as
    ``fxmem_batch_size``, ``fxmem_predicted_peak_bytes`` and ``fxmem_measured_peak_bytes``
    (those known; reporting callbacks the Trainer calls before this one, such as wandb's, do not see
    them). ``cpu_steps``: how many steps after the first to measure on the CPU.

    >>> cb = FxmemCallback(123_456)
    >>> cb.predicted(8), cb.steps
    (123456, [])
    """

    def __init__(self, prediction, *, cpu_steps: int = 1):
        from ..errors import InputError

        if not (isinstance(prediction, int) or hasattr(prediction, "peak_bytes")):
            raise InputError("prediction must be a TrainerFit, a fxmem.Report or a byte count, "
                             f"got {type(prediction).__name__}")
        self.prediction, self.cpu_steps = prediction, cpu_steps
        self.steps: list[StepMemory] = []
        self._hook = self._tracker = None
        self._batch = None
        self._cuda = False

    def predicted(self, b: int | None) -> int | None:
        """The predicted peak at batch size ``b``."""
        p = self.prediction
        if isinstance(p, int):
            return p
        report = p if callable(getattr(p, "peak_bytes", None)) else p.report
        if b is None:
            return None if report is p else p.peak_bytes
        try:
            return int(report.peak_bytes(b))
        except FxmemError:  # a batch size the formula does not hold at: no prediction
            return None

    # Trainer events ------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.close()
        self._cuda = any(p.is_cuda for p in model.parameters())

        def seen(module, a, kw):
            for t in list(a) + list(kw.values()):
                if isinstance(t, torch.Tensor):
                    if self._batch is None and t.dim():
                        self._batch = int(t.shape[0])
                    if self._tracker is not None:
                        self._tracker.register(t)  # the batch: live before the step
        self._hook = model.register_forward_pre_hook(seen, with_kwargs=True)

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._batch = None
        if self._cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        measured = sum(s.measured_peak_bytes is not None for s in self.steps)
        if state.global_step < 1 or measured >= self.cpu_steps:
            return
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
        state_tensors = tensors_in(opt.state) if opt is not None else []
        self._tracker = cpu_tracker([
            *model.parameters(), *model.buffers(), *state_tensors,
            *(p.grad for p in model.parameters() if p.grad is not None)])

    def on_step_end(self, args, state, control, **kwargs):
        peak, how = None, "not measured"
        if self._cuda:
            torch.cuda.synchronize()
            peak, how = torch.cuda.max_memory_allocated(), "cuda max_memory_allocated"
        elif self._tracker is not None:
            peak, how = self._stop(), "cpu live bytes"
        self.steps.append(StepMemory(state.global_step, self._batch, self.predicted(self._batch),
                                     peak, how))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.steps or logs is None:
            return
        last = self.steps[-1]
        extra = {"fxmem_batch_size": last.batch_size,
                 "fxmem_predicted_peak_bytes": last.predicted_peak_bytes,
                 "fxmem_measured_peak_bytes": last.measured_peak_bytes}
        extra = {k: v for k, v in extra.items() if v is not None}  # reporters take numbers
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    # ---------------------------------------------------------------------------------
    def _stop(self) -> int:
        """Leave the tracker; the step's peak from its events (as :func:`fxmem.measure`)."""
        tracker, self._tracker = self._tracker, None
        return tracked_peak(tracker)

    def close(self) -> None:
        """Remove the hook and leave a tracker still active (a step that raised)."""
        if self._tracker is not None:
            self._stop()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
