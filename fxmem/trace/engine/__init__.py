"""The recording engine: the step, run on fake tensors, recorded op by op.

- :mod:`~fxmem.trace.engine.step`: :class:`Step`, the step being analysed, run the same way
  by the tracer and by :func:`fxmem.measure`;
- :mod:`~fxmem.trace.engine.tracer`: :func:`trace`, which runs it under ``FakeTensorMode``
  and a ``ShapeEnv``; :mod:`~fxmem.trace.engine.recorder`: the dispatch mode that records
  every aten op, and asks the kernels' rules what eager PyTorch allocates;
- :mod:`~fxmem.trace.engine.finish`: the recorder's records turned into a :class:`Trace`;
  :mod:`~fxmem.trace.engine.lift`: a step that fixes B as a Python int;
- :mod:`~fxmem.trace.engine.messages`: what a user sees of a trace (one line);
  :mod:`~fxmem.trace.engine.modstate`: the user's model while a step is traced.

The top room: it may use every other. A change must leave the user's model, PyTorch's
global state (dispatch modes, patched functions, the default dtype) and the user's
process as they were, whether the trace succeeds or fails.
"""

from .request import TraceRequest
from .step import (
    PHASES,
    UNSET,
    Step,
    make_grad_scaler,
    make_optimizer,
    make_spec,
    run_step,
    scaler_tensors,
    warmup_steps,
)
from .tracer import trace

__all__ = ["PHASES", "Step", "TraceRequest", "UNSET", "make_grad_scaler", "make_optimizer",
           "make_spec", "run_step", "scaler_tensors", "trace", "warmup_steps"]
