"""Stage 1, the trace: one whole step run on fake tensors with the batch size as a symbol.

Seven rooms, each importing only the ones above it in this list (``tests/test_layout.py``);
every other stage enters a room by its face (its ``__init__``):

- :mod:`~fxmem.trace.ledger`: what a trace records (:class:`Trace`, ops, storages, saved
  tensors) and :class:`~fxmem.trace.ledger.tracking.StorageTracker`, the mode that sees them;
- :mod:`~fxmem.trace.kernels`: what eager kernels do that fake ones do not, on CPU and, for
  ``device="cuda"``, CUDA's (:mod:`fxmem.trace.kernels.cuda`); autocast's lists; values the
  trace knows; what each PyTorch release needs;
- :mod:`~fxmem.trace.compiled`: a ``torch.compile``'d model, inductor's own code run on the
  fakes;
- :mod:`~fxmem.trace.plans`: activation-checkpoint plans, applied while tracing and to real
  models (:func:`fxmem.apply_checkpoints`);
- :mod:`~fxmem.trace.parallel`: one rank of FSDP2, DDP (ZeRO-1), TP and FSDP2 x TP, wrapped
  by PyTorch's own code over a fake process group, and a model the user wrapped already;
- :mod:`~fxmem.trace.blocks`: a stack of identical blocks traced as two, the rest copied
  (under FSDP2 too);
- :mod:`~fxmem.trace.engine`: :class:`~fxmem.trace.engine.step.Step` and :func:`trace`,
  which runs the step under ``FakeTensorMode`` and a ``ShapeEnv`` with the recorder that
  records every aten op, and turns its records into a :class:`Trace` (a step that fixes B
  as a Python int is traced at several batch sizes and lifted).

Imports only from :mod:`fxmem.formula` and :mod:`fxmem.errors`.
"""

from .engine import trace
from .ledger import ModuleCall, OpInfo, StorageInfo, TensorDesc, Trace

__all__ = ["trace", "Trace", "OpInfo", "StorageInfo", "TensorDesc", "ModuleCall"]
