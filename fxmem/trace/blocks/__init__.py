"""A stack of identical blocks traced as two, the ops of the rest copied.

- :mod:`~fxmem.trace.blocks.reuse`: the runs of identical blocks, and the stand-in that
  replaces a block's forward after the first two;
- :mod:`~fxmem.trace.blocks.splice`: the traced blocks' ops copied for the others;
- :mod:`~fxmem.trace.blocks.sharded`: the same for a rank's blocks under FSDP2 and TP;
- :mod:`~fxmem.trace.blocks.replicated`: and under DDP;
- :mod:`~fxmem.trace.blocks.installed`: which of them a step gets, by its strategy.

The result must be the trace a block-by-block run gives, op for op and byte for byte
(``tests/test_reuse.py``, ``test_reuse_parallel.py`` and ``test_reuse_ddp_tp.py`` compare
both): reuse only makes tracing faster.
"""

from .installed import copied, reuses_under, runs_of
from .reuse import NoReuse, traced_for_real
from .splice import splice
from .splice_graph import Spliced

__all__ = ["NoReuse", "Spliced", "copied", "reuses_under", "runs_of", "splice",
           "traced_for_real"]
