"""One rank of a data- or tensor-parallel step, wrapped by PyTorch's own code.

- :mod:`~fxmem.trace.parallel.strategy`: what every strategy has; :mod:`~fxmem.trace.parallel.fsdp`:
  :class:`FSDP` (FSDP2's ``fully_shard`` over a fake process group), the fake world and the
  sharded meta copy; :mod:`~fxmem.trace.parallel.ddp`: :class:`DDP` and ZeRO-1;
  :mod:`~fxmem.trace.parallel.tp`: :class:`TP` and :class:`Parallel` (FSDP2 x TP);
- :mod:`~fxmem.trace.parallel.local_step`: a rank's optimizer step over its local shards;
- :mod:`~fxmem.trace.parallel.offload`: FSDP2's CPU offload; :mod:`~fxmem.trace.parallel.wrapped`:
  a model the user wrapped already, analysed as it is;
- :mod:`~fxmem.trace.parallel.fsdp_buffers`: FSDP2's own buffers, told apart while tracing;
  :mod:`~fxmem.trace.parallel.other_ranks`: a rank's step under FSDP2 derived from one
  rank's trace, of the same world size or another.

No formula of fxmem's stands in for a wrapping: a change must keep each rank's trace exact
against the same rank run for real over gloo (``tests/test_fsdp.py``, ``test_ddp.py``,
``test_tp.py``).
"""

from .ddp import Kept, local_optimizer
from .fsdp import DDP, FSDP, check_parallel
from .local_step import on_local_shards
from .offload import host_storages, offloaded
from .other_ranks import at_world_size, other_rank
from .tp import TP, Parallel
from .wrapped import AsWrapped, as_wrapped, refuse_wrapped

__all__ = ["AsWrapped", "at_world_size", "DDP", "FSDP", "Kept", "Parallel", "TP", "as_wrapped",
           "check_parallel", "host_storages", "local_optimizer", "offloaded",
           "on_local_shards", "other_rank", "refuse_wrapped"]
