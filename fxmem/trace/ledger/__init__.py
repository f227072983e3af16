"""What a trace records, and the mode that sees it: the bottom room of the trace.

- :mod:`~fxmem.trace.ledger.records`: :class:`Trace`, its ops, storages and module calls
  (frozen dataclasses every later stage reads);
- :mod:`~fxmem.trace.ledger.tracking`: :class:`StorageTracker`, the dispatch mode that sees
  every aten op's storages (shared with the CPU measurement, :func:`fxmem.measure`);
- :mod:`~fxmem.trace.ledger.saved`: who holds the tensors autograd saved, until when.

A change here changes what every stage reads: the records' fields are the contract of
``fxmem.memory`` and ``fxmem.checkpoint``, and :class:`StorageTracker` is half of the ground
truth (``fxmem.measure`` counts with it on CPU), so it must see the eager step's storages
exactly as PyTorch allocates and frees them.
"""

from .records import ModuleCall, OpInfo, StorageInfo, TensorDesc, Trace, with_fields
from .saved import latest
from .tracking import StorageTracker, freeze_more, frozen_gc, storage_resizes

__all__ = ["ModuleCall", "OpInfo", "StorageInfo", "StorageTracker", "TensorDesc", "Trace",
           "freeze_more", "frozen_gc", "latest", "storage_resizes", "with_fields"]
