"""Stages 2 and 3, from a :class:`~fxmem.trace.Trace` to live bytes:
:mod:`~fxmem.memory.graph` (the step as a networkx graph of ops and the storages they
create), :mod:`~fxmem.memory.sizes` (what each storage takes on the device: bytes, or
512-byte blocks on CUDA), :mod:`~fxmem.memory.liveness` (live bytes after every op, the peak
as an exact ``Max`` in B, and the step's parts)."""
