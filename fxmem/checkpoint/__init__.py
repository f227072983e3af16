"""Activation checkpointing on one trace of the step: :mod:`~fxmem.checkpoint.segments`
(the modules whose forward could be a segment), :mod:`~fxmem.checkpoint.plans` (a plan's
schedule derived from the trace without it), :mod:`~fxmem.checkpoint.solve` (the plan
solver, plain numbers, no torch), :mod:`~fxmem.checkpoint.choose` (the solver's numbers from
a report, and the exact check of its answer), :mod:`~fxmem.checkpoint.flops` (what
recomputation costs). Applying a plan, while tracing and to a real model, is
:mod:`fxmem.trace.plans.checkpointing`'s."""
