"""fxmem: the device memory of a PyTorch training or inference step as a formula of the
batch size B, before anything runs on a GPU.

The pipeline, one folder per stage, each importing only the ones above it in this list
(``tests/test_layout.py`` keeps it so; ``docs/architecture.md`` draws it):

- :mod:`fxmem.formula`     exact formulas: the symbols B and the named dims, polynomials,
  shape guards folded into where a formula holds, proofs of which terms can be the peak;
- :mod:`fxmem.trace`       stage 1: the step (:mod:`fxmem.trace.engine.step`) run on fake tensors
  with B symbolic, every aten op and free recorded; eager-vs-fake kernel rules, CUDA's
  autocast lists and, for ``device="cuda"``, what CUDA's kernels run and allocate
  (:mod:`fxmem.trace.kernels.cuda`); stacks of identical blocks traced as two; checkpoint plans;
  one rank of a data-parallel step, the model wrapped by PyTorch's own FSDP2
  (:mod:`fxmem.trace.parallel.fsdp`) or DDP, optionally with ZeRO-1
  (:mod:`fxmem.trace.parallel.ddp`); tensor parallel plans and FSDP2 x TP
  (:mod:`fxmem.trace.parallel.tp`); a model the user wrapped already, analysed as it is
  (:mod:`fxmem.trace.parallel.wrapped`);
- :mod:`fxmem.memory`      stage 2-3: the step as a networkx graph, each storage's device
  size, live bytes after every op and the peak as an exact ``Max`` in B (and in the named
  dims, :mod:`fxmem.memory.dims`);
- :mod:`fxmem.device`      what the device adds at one B: the caching allocator replayed
  with cuBLAS's workspaces (``Report.cuda_memory``);
- :mod:`fxmem.checkpoint`  activation checkpointing on the same trace: candidate segments,
  a plan's schedule, the solver (plain numbers), the chooser, FLOPs;
- :mod:`fxmem.report`      the :class:`Report` users hold and its renderers (text, terminal,
  Markdown, JSON, HTML with plots);
- :mod:`fxmem.analyze`, :mod:`fxmem.whatif`  the pipeline in one call;
- :mod:`fxmem.validate`    ground truth: :func:`measure` (a real eager step; a data-parallel
  one in several processes, :mod:`fxmem.validate.distributed`), the zoo, the harness, and
  where a missed case parts ways with the prediction;
- :mod:`fxmem.integrations`  the Hugging Face Trainer and accelerate's batch-size finder,
  imported only when used;
- :mod:`fxmem.cli`         the ``fxmem`` command.

The public API is ``fxmem.__all__`` below and the command; every module is importable but
internal (its path may change between releases).

>>> import torch, fxmem
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   optimizer=torch.optim.SGD, device="cpu")
>>> r.peak_bytes(B=10) == fxmem.measure(torch.nn.Linear(8, 2), torch.randn(4, 8),
...     loss=lambda o: o.sum(), optimizer=torch.optim.SGD, B=10).peak_bytes
True
"""

import warnings as _warnings

from .trace.kernels import untested_release as _untested

if _untested():  # a release no test ran on: said once, at import (issue 37)
    _warnings.warn(_untested(), stacklevel=2)

from .analyze import analyze, min_world_size, plan_checkpoints  # noqa: E402
from .checkpoint.choose import FrontierPoint, PlanChoice
from .errors import (
    DataDependentError,
    FxmemError,
    InfeasibleBudgetError,
    InputError,
    ModelError,
    SpecializationError,
    TraceError,
)
from .formula.symbols import B, L
from .report.ranks import ParallelReport
from .report.result import Breakdown, Report
from .trace.engine import Step
from .trace.parallel import DDP, FSDP, TP, Parallel
from .trace.plans import Plan, Region, apply_checkpoints, load_plan
from .validate.measure import Measurement, measure
from .whatif import WhatIf, whatif

DimsReport = Report  # deprecated alias: analyze(..., dims=...) returns a Report in B and the dims

__all__ = ["analyze", "Step", "Report", "Breakdown", "B", "L", "measure", "Measurement",
           "plan_checkpoints", "apply_checkpoints", "Plan", "Region", "load_plan", "PlanChoice",
           "FrontierPoint", "whatif",
           "WhatIf", "FSDP", "DDP", "TP", "Parallel", "ParallelReport", "min_world_size",
           "FxmemError", "InputError", "TraceError", "SpecializationError", "DataDependentError",
           "ModelError",
           "InfeasibleBudgetError", "DimsReport"]
