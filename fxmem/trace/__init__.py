"""Stage 1, the trace: one whole step run on fake tensors with the batch size as a symbol.

- :mod:`~fxmem.trace.step`: the step being analysed (inputs, loss, optimizer, training-loop
  options), run the same way by the tracer and by :func:`fxmem.measure`;
- :mod:`~fxmem.trace.tracer`: :func:`trace`, which runs it under ``FakeTensorMode`` and a
  ``ShapeEnv``; :mod:`~fxmem.trace.recorder`, the dispatch mode that records every aten op;
  :mod:`~fxmem.trace.records`, what it returns (:class:`Trace`, ops, storages);
- :mod:`~fxmem.trace.tracking`: storage-level allocation tracking, shared with the CPU
  measurement; :mod:`~fxmem.trace.saved`: who holds saved tensors, until when;
- :mod:`~fxmem.trace.rules`: where eager kernels differ from their fake (meta) ones;
  :mod:`~fxmem.trace.symbolic`: stand-ins for PyTorch kernels that take only concrete sizes;
  :mod:`~fxmem.trace.cpu_rnn`: the RNN kernels eager CPU runs (oneDNN's LSTM, RNN.cpp's
  layers);
  :mod:`~fxmem.trace.amp`: CUDA's autocast lists; :mod:`~fxmem.trace.cuda`: what CUDA's
  kernels run and allocate for ``device="cuda"``; :mod:`~fxmem.trace.compat`: what older
  PyTorch releases need;
- :mod:`~fxmem.trace.reuse` and :mod:`~fxmem.trace.splice`: a stack of identical blocks
  traced as two, the rest copied; :mod:`~fxmem.trace.reuse_parallel`: the same for a rank's
  blocks under FSDP2;
- :mod:`~fxmem.trace.checkpointing`: activation-checkpoint plans, applied while tracing and
  to real models (:func:`fxmem.apply_checkpoints`);
- :mod:`~fxmem.trace.lift`: a step that fixes B as a Python int (``len(x)``), traced at
  several batch sizes and its sizes fitted as polynomials in B.

Imports only from :mod:`fxmem.formula` and :mod:`fxmem.errors`.
"""

from .records import ModuleCall, OpInfo, StorageInfo, TensorDesc, Trace
from .tracer import trace

__all__ = ["trace", "Trace", "OpInfo", "StorageInfo", "TensorDesc", "ModuleCall"]
