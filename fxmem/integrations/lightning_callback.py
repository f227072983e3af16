"""The Lightning callback's work, for either package: :class:`BatchSizeFromFxmem` is mixed
with ``lightning.pytorch.Callback`` in :mod:`fxmem.integrations.lightning` and with
``pytorch_lightning.Callback`` in :mod:`fxmem.integrations.pytorch_lightning`.

At ``fit`` start (``on_fit_start``: the Trainer has called ``setup`` and
``configure_optimizers`` and applied its precision; the train dataloader is not made yet)
it takes the first batch of the train dataloader, traces the step on fake tensors
(:func:`fxmem.integrations.lightning_step.lightning_step`), finds the largest batch size
that fits the budget, with a checkpoint plan if allowed or needed, applies the plan and
sets the batch size where Lightning's ``BatchSizeFinder`` sets it (``lightning_setattr``:
the module, its ``hparams``, the datamodule or its ``hparams``), so the dataloader the loop
then makes has it. During training it keeps each optimizer step's predicted and measured
peak (:class:`fxmem.integrations.common.StepMemory`) and logs them.
"""

from __future__ import annotations

import logging

import torch

from ..errors import FxmemError, InputError
from ..report.text import fmt_share
from .common import StepMemory, cpu_tracker, device_budget, tensors_in, tracked_peak
from .lightning_step import batch_size_for, lightning_package, lightning_step

log = logging.getLogger("fxmem.integrations.lightning")


class BatchSizeFromFxmem:
    """Sets the batch size at ``fit`` start to the largest whose training step fits
    ``budget_bytes`` (or ``gpu="H100-80GB"``: that card's memory less the CUDA context;
    neither, on a CUDA device: its total memory less ``context_bytes``), as fxmem predicts
    it; logs the prediction, and the peak each step reaches beside it.

    ``device``: the device to predict for (default: the Trainer's, ``"cuda"`` or ``"cpu"``;
    ``"cuda"`` on a CPU machine plans a GPU job). ``by``: how the fit is answered
    (:meth:`fxmem.Report.max_batch_size`). ``batch_arg_name``: the attribute to set, found
    as Lightning's ``BatchSizeFinder`` finds it. ``max_recompute``: allow a checkpoint plan
    re-running at most this share of the step's FLOPs, for a larger batch (a plan is also
    looked for when no batch fits without one); the plan is applied to the module.
    ``example_batch``: the batch to trace (default: the train dataloader's first).
    ``set_batch_size=False``: predict and log only. ``cpu_steps``: how many steps after the
    first to measure on the CPU (the storage tracker slows every op).

    After ``on_fit_start``: :attr:`fit` (a :class:`fxmem.integrations.lightning_step.LightningFit`)
    and :attr:`report`; during training: :attr:`steps`, and ``fxmem/batch_size``,
    ``fxmem/predicted_peak_bytes`` and ``fxmem/measured_peak_bytes`` logged per step.
    """

    def __init__(self, budget_bytes: int | None = None, *, gpu=None,
                 context_bytes: int | None = None, device: str | None = None,
                 by: str | None = None, batch_arg_name: str = "batch_size",
                 max_recompute: float | None = None, example_batch=None,
                 set_batch_size: bool = True, cpu_steps: int = 1):
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(
                budget_bytes, int) or budget_bytes < 1):
            raise InputError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
        if device not in (None, "cpu", "cuda"):
            raise InputError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.budget_bytes, self.gpu, self.context_bytes = budget_bytes, gpu, context_bytes
        self.device, self.by, self.batch_arg_name = device, by, batch_arg_name
        self.max_recompute, self.example_batch = max_recompute, example_batch
        self.set_batch_size, self.cpu_steps = set_batch_size, cpu_steps
        self.fit = self.report = None
        self.steps: list[StepMemory] = []
        self._tracker = None
        self._batch = None
        self._cuda = False

    # Lightning's hooks ---------------------------------------------------------------
    def setup(self, trainer, pl_module, stage=None):
        if stage not in (None, "fit") or not self.set_batch_size:
            return
        parsing = lightning_package(trainer, "utilities.parsing")
        if not parsing.lightning_hasattr(pl_module, self.batch_arg_name):
            raise InputError(f"{self.batch_arg_name!r} is not an attribute of the module, its "
                             "hparams, the datamodule or its hparams: fxmem sets the batch size "
                             "there (pass batch_arg_name=, or set_batch_size=False)")

    def on_fit_start(self, trainer, pl_module):
        batch = self.example_batch if self.example_batch is not None else _first_batch(trainer)
        step = lightning_step(trainer, pl_module, batch, device=self.device)
        self.report = step.analyze()
        self._cuda = trainer.strategy.root_device.type == "cuda"
        budget, gpu = self.budget_bytes, self.gpu
        if budget is None and gpu is None:
            budget = device_budget(self.context_bytes)
        if budget is not None or gpu is not None:
            self.fit = batch_size_for(step, budget, by=self.by, gpu=gpu,
                                      context_bytes=self.context_bytes,
                                      max_recompute=self.max_recompute, report=self.report)
            if self.fit.checkpoint is not None:
                self.fit.apply_checkpoint(pl_module)
                self.report = self.fit.report
            if self.set_batch_size:
                lightning_package(trainer, "utilities.parsing").lightning_setattr(
                    pl_module, self.batch_arg_name, self.fit.batch_size)
            fit = self.fit
            log.info("fxmem: batch size %d (predicted peak %s B within %s B, by %s%s)",
                     fit.batch_size, f"{fit.peak_bytes:,}", f"{fit.budget_bytes:,}", fit.by,
                     "" if fit.checkpoint is None else
                     f", a checkpoint plan of {len(fit.checkpoint.plan)} regions re-running "
                     f"{fmt_share(fit.checkpoint.recompute_fraction)} of its FLOPs")
            for logger in trainer.loggers:
                logger.log_metrics({"fxmem/batch_size": fit.batch_size,
                                    "fxmem/predicted_peak_bytes": fit.peak_bytes,
                                    "fxmem/budget_bytes": fit.budget_bytes},
                                   step=trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        tensors = tensors_in(batch)
        if batch_idx % trainer.accumulate_grad_batches:  # inside an optimizer step
            if self._tracker is not None:  # the next micro-batch: on the device now
                for t in tensors:
                    self._tracker.register(t, self._tracker.op_count)
                self._tracker.__enter__()
            return
        self._batch = next((int(t.shape[0]) for t in tensors if t.dim()), None)
        if self._cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        measured = sum(s.measured_peak_bytes is not None for s in self.steps)
        if trainer.global_step < 1 or measured >= self.cpu_steps:
            return
        params = list(pl_module.parameters())
        state = [t for opt in trainer.optimizers for t in tensors_in(opt.state)]
        self._tracker = cpu_tracker([*params, *pl_module.buffers(), *state, *tensors,
                                     *(p.grad for p in params if p.grad is not None)])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        k = trainer.accumulate_grad_batches
        if (batch_idx + 1) % k and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            # until the next micro-batch's step: the loader's work on the host is not seen
            # (its frees of what the step made are)
            if self._tracker is not None:
                self._tracker.__exit__(None, None, None)
            return
        peak, how = None, "not measured"
        if self._cuda:
            torch.cuda.synchronize()
            peak, how = torch.cuda.max_memory_allocated(), "cuda max_memory_allocated"
        elif self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            peak, how = tracked_peak(tracker), "cpu live bytes"
        predicted = self.predicted(self._batch)
        self.steps.append(StepMemory(trainer.global_step, self._batch, predicted, peak, how))
        values = {"fxmem/batch_size": self._batch, "fxmem/predicted_peak_bytes": predicted,
                  "fxmem/measured_peak_bytes": peak}
        for name, v in values.items():
            if v is not None:
                pl_module.log(name, float(v), on_step=True, on_epoch=False, logger=True)

    def on_fit_end(self, trainer, pl_module):
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        self.close()

    # ---------------------------------------------------------------------------------
    def predicted(self, b: int | None) -> int | None:
        """The predicted peak at batch size ``b`` (None before ``fit`` starts)."""
        if self.report is None or b is None:
            return None
        try:
            return int(self.report.peak_bytes(b))
        except FxmemError:  # a batch size the formula does not hold at
            return None

    def close(self) -> None:
        """Leave a tracker still active (a step that raised)."""
        if self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracked_peak(tracker)


def _first_batch(trainer):
    """The first batch of the train dataloader the Trainer will make (its source's
    ``train_dataloader``, called once more)."""
    source = trainer.fit_loop._data_source
    loader = source.dataloader()
    if isinstance(loader, (dict, list, tuple)):
        raise InputError("the train dataloaders are a collection: give example_batch= (one "
                         "batch as training_step receives it)")
    try:
        return next(iter(loader))
    except StopIteration:
        raise InputError("the train dataloader is empty: give example_batch=") from None


__all__ = ["BatchSizeFromFxmem"]
