"""What each storage takes on the device, in bytes: the sizes liveness adds up.

``device="cpu"``: pure live bytes, each storage counts ``untyped_storage().nbytes()``.
``device="cuda"``: each storage is a block of the caching allocator, rounded up to a
multiple of 512 bytes (``kMinBlockSize``), and 0-byte storages take no block. torch.optim
keeps the ``step`` counters of non-capturable, non-fused optimizers on the host, so they do
not count. What the allocator adds beyond that (segments, cuBLAS workspaces) is
:mod:`fxmem.device.allocator`'s.

>>> from fxmem.formula.symbols import Size
>>> from fxmem.trace.ledger.records import StorageInfo
>>> s = StorageInfo(0, Size.of(100), "activation", "", "", 0, None, False, None, ())
>>> [x.expr for x in device_sizes([s], "cpu")], [x.expr for x in device_sizes([s], "cuda")]
([100], [512])
"""

from __future__ import annotations

from ..formula.symbols import ZERO, Size

CUDA_BLOCK_BYTES = 512


def _host_resident(storage) -> bool:
    """torch.optim's per-parameter ``step`` counter: a 0-dim tensor kept on the CPU."""
    return (storage.category == "optimizer_state" and storage.name.endswith(".step")
            and storage.shape == ())


def device_sizes(storages, device: str) -> list[Size]:
    """The size each storage takes on ``device``, in bytes."""
    if device == "cpu":
        return [s.size for s in storages]
    cache: dict[int, Size] = {}
    out = []
    for s in storages:
        if _host_resident(s):
            out.append(ZERO)
            continue
        r = cache.get(id(s.size))
        if r is None:
            r = cache[id(s.size)] = s.size.rounded(CUDA_BLOCK_BYTES)
        out.append(r)
    return out
