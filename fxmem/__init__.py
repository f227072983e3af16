"""fxmem: the device memory of a PyTorch training or inference step as a formula of the
batch size B, before anything runs on a GPU.

The pipeline, one stage per module, each taking the previous stage's result:

- :mod:`fxmem.trace`    run the step on fake tensors (B symbolic), record ops and frees,
  applying :mod:`fxmem.rules` where eager kernels differ from their fake ones,
  :mod:`fxmem.kernels` for ``device="cuda"`` (what CUDA's kernels run and allocate:
  :mod:`fxmem.sdpa` chooses the attention kernel, :mod:`fxmem.sdpa_memory`,
  :mod:`fxmem.cuda_rnn` and :mod:`fxmem.cuda_workspaces` say what the kernels allocate), and
  :mod:`fxmem.reuse` to trace a stack of identical blocks as two and copy the rest, and
  :mod:`fxmem.guards` to fold shape guards into where the formula holds (``B >= 2``);
- :mod:`fxmem.graph`    a networkx graph of ops and the storages they create;
- :mod:`fxmem.liveness` live bytes after each op and the peak as an exact ``Max`` in B;
- :mod:`fxmem.allocator` what the device adds (CUDA block rounding; the step replayed
  through :mod:`fxmem.caching_allocator` with cuBLAS's workspaces, and cuDNN's on request:
  ``Report.cuda_memory``);
- :mod:`fxmem.result`   the :class:`Report` users read; :mod:`fxmem.report` renders it
  (terminal, Markdown, JSON, HTML with plots) and :mod:`fxmem.cli` is the ``fxmem`` command;
- :mod:`fxmem.measure`  ground truth: a real eager step; :mod:`fxmem.validate` runs the zoo
  (:mod:`fxmem.zoo`) on a device against it, and :mod:`fxmem.divergence` names where a
  missed case's allocations part ways with the prediction.

Activation checkpointing, on the same trace: :mod:`fxmem.saved` (who holds saved tensors,
until when), :mod:`fxmem.segments` (candidate modules), :mod:`fxmem.plans` (a plan's schedule
derived from the trace), :mod:`fxmem.solve` (the plan solver, plain numbers, no torch),
:mod:`fxmem.choose` (the solver's numbers from a report, and the exact check of its answer),
:mod:`fxmem.checkpoint` (plans applied with PyTorch's ``checkpoint_wrapper``).

:mod:`fxmem.whatif` answers the seed article's six ways to save memory for a step, each as
its own analysis (:mod:`fxmem.step` holds the training-loop options they use: ``grad_accum``,
``set_to_none``, ``amp``, ``inference_mode``, ``grad_scaler``); :mod:`fxmem.amp` emulates
CUDA's autocast rules on CPU tensors; :mod:`fxmem.dims` makes input dims beyond the batch
(the sequence length L) symbols too, its peak in B and L kept short by :mod:`fxmem.prune`
(the ops proved never above the others dropped).

>>> import torch, fxmem
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   optimizer=torch.optim.SGD, device="cpu")
>>> r.peak_bytes(B=10) == fxmem.measure(torch.nn.Linear(8, 2), torch.randn(4, 8),
...     loss=lambda o: o.sum(), optimizer=torch.optim.SGD, B=10).peak_bytes
True
"""

from .analyze import analyze, plan_checkpoints
from .checkpoint import apply_checkpoints
from .choose import FrontierPoint, PlanChoice
from .errors import (FxmemError, InfeasibleBudgetError, InputError, SpecializationError,
                     TraceError)
from .measure import Measurement, measure
from .result import Breakdown, Report
from .dims import DimsReport
from .symbols import B, L
from .whatif import WhatIf, whatif

__all__ = ["B", "L", "DimsReport", "analyze", "apply_checkpoints", "plan_checkpoints", "measure", "PlanChoice",
           "FrontierPoint", "whatif", "WhatIf", "Report", "Breakdown", "Measurement", "FxmemError",
           "InputError", "TraceError", "SpecializationError", "InfeasibleBudgetError"]
