"""The cyclic garbage collector, paced for one command.

An analysis keeps millions of objects alive at once (the traces, their graphs, the
liveness passes, the planner's derived plans), and CPython's collector starts a full pass
over all of them each time enough new objects survive: in the 8B Llama ``--fsdp 8
--checkpoint auto`` command those passes took about a quarter of the wall time, the memory
they freed being nothing the command's peak depended on. While a command runs, a full pass
comes at most once every :data:`FULL_EVERY` passes over the middle generation (Python's
default is 10); the younger generations are collected as always, and the thresholds are
put back when the command ends, whatever happens (``docs/benchmarks.md``). And the objects
that exist when it starts (torch's, the model's), then each trace once made, are exempt
from those passes (:func:`fxmem.trace.ledger.frozen_gc`, ``freeze_more``) until the command
ends: the 70B ``--fsdp 64 --checkpoint auto`` command's 15 full passes had taken 17.4 s of
its 164 s (under load), each walking every trace made before it.

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
    (never more often than the process had them), over the objects made in it and not
    frozen since; the thresholds restored and every object unfrozen on exit."""
    from ..trace.ledger import frozen_gc

    was = gc.get_threshold()
    gc.set_threshold(was[0], was[1], max(was[2], FULL_EVERY))
    try:
        with frozen_gc():
            yield
    finally:
        gc.set_threshold(*was)
