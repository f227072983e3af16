"""The cyclic garbage collector, paced for one command.

An analysis keeps millions of objects alive at once (the traces, their graphs, the
liveness passes, the planner's derived plans), and CPython's collector starts a full pass
over all of them each time enough new objects survive: in the 8B Llama ``--fsdp 8
--checkpoint auto`` command those passes took about a quarter of the wall time, the memory
they freed being nothing the command's peak depended on. While a command runs, a full pass
comes at most once every :data:`FULL_EVERY` passes over the middle generation (Python's
default is 10); the younger generations are collected as always, and the thresholds are
put back when the command ends, whatever happens (``docs/benchmarks.md``).

>>> import gc
>>> before = gc.get_threshold()
>>> with paced():
...     gc.get_threshold()[2] >= FULL_EVERY
True
>>> gc.get_threshold() == before
True
"""

from __future__ import annotations

import contextlib
import gc

FULL_EVERY = 100  # passes over generation 1 between full passes while a command runs


@contextlib.contextmanager
def paced():
    """Full collections at most every :data:`FULL_EVERY` generation-1 passes in the block
    (never more often than the process had them); the thresholds restored on exit."""
    was = gc.get_threshold()
    gc.set_threshold(was[0], was[1], max(was[2], FULL_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*was)
