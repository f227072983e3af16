"""A pure-Python replay of PyTorch's CUDA caching allocator (torch 2.11 – 2.13).

Feed it the allocation and free requests of a program (sizes in **bytes**) and it reports
what ``torch.cuda.memory_allocated()``, ``max_memory_allocated()``, ``memory_reserved()``
and ``max_memory_reserved()`` would say. No torch import, no GPU: every rule below is
transcribed from ``c10/cuda/CUDACachingAllocator.cpp`` (class ``DeviceCachingAllocator``)
and the allocator configuration (``c10/core/AllocatorConfig.{h,cpp}``, which
``c10/cuda/CUDAAllocatorConfig`` forwards to since the config moved to c10/core). Read for
2.11 – 2.13; checked against the allocator of 2.14.1's and 2.15's own CUDA builds on the fake
GPU (:mod:`fxmem.validate.fakegpu`), event by event: allocated, reserved and both peaks after
each of thousands of random allocations, frees and ``empty_cache`` calls on two streams, with
the default configuration, ``max_split_size_mb`` and ``roundup_power2_divisions``
(``tests/test_fake_gpu.py``; expandable segments need the driver's virtual-memory API, which
the fake GPU lacks).

>>> from fxmem.device.caching_allocator import AllocatorConfig, replay
>>> s = replay([("alloc", "a", 1), ("alloc", "b", 1_500_000), ("free", "a")])
>>> s.allocated, s.max_allocated       # 1 B -> a 512 B block; 1.5e6 B -> 1_500_160 B
(1500160, 1500672)
>>> s.reserved                         # one 2 MiB small segment + one 20 MiB large segment
23068672
>>> replay([("alloc", "x", 12 * 2**20)], AllocatorConfig(expandable_segments=True)).reserved
20971520

Rules (constants in bytes; names are the torch functions they come from)
-----------------------------------------------------------------------
Sizes and the configuration: :mod:`fxmem.device.allocator_config` (rules 1 and 4:
``round_size``, ``get_allocation_size``; the constants).

2. ``get_pool``: rounded size <= ``kSmallSize`` -> small pool, else large pool. Each pool
   is one ordered set of free blocks keyed by (stream, size, address)
   (``BlockComparatorSize``), so a block is only ever reused by the stream that allocated
   its segment (per-stream pools).
3. ``get_free_block`` (best fit): ``lower_bound`` for (stream, size) -> the smallest free
   block of that stream with ``block.size >= size``, lowest address on ties; none on that
   stream -> miss. Then the ``max_split_size`` rules ("oversize" blocks):
   a request ``< max_split_size`` never takes a block ``>= max_split_size``; a request
   ``>= max_split_size`` only takes a block smaller than ``size + max_non_split_rounding``
   (``max_non_split_rounding_mb``, default = the large segment size, 20 MiB). A miss is not
   retried with a larger block: the allocator goes to step 4. With expandable segments the
   best-fit walk moves on to the next larger block while that one's *expandable size*
   (its size plus the unmapped space right after it) is smaller.
5. ``should_split``: the found block is split when the remainder is ``>= kMinBlockSize``
   in the small pool (or whenever expandable segments are on); in the large pool only when
   ``size < max_split_size`` and the remainder is ``> kSmallSize`` (strictly more than
   1 MiB). Otherwise the whole block is handed out (``alloc_found_block``) and **counts whole
   in allocated bytes**: e.g. a 19 MiB + 512 B request in a free 20 MiB block keeps the
   1 MiB - 512 B slack. The remainder of a split goes back to the pool as a free block.
6. ``free`` / ``free_block`` / ``try_merge_blocks``: the freed block merges with its free
   neighbours (prev/next inside the same segment) and goes back to its pool; no memory is
   returned to the device.
7. Counters (``alloc_found_block``, ``free``, ``alloc_block``, ``release_block``,
   ``map_block``, ``unmap_block``): *allocated* = sum of the (rounded, possibly
   whole-block) sizes of live blocks (``stats.allocated_bytes``); *reserved* = sum of
   cudaMalloc'd segment sizes plus mapped expandable pages (``stats.reserved_bytes``);
   peaks follow ``Stat::increase`` (updated on every increase) and
   ``resetPeakStats`` (peak := current, as ``torch.cuda.reset_peak_memory_stats``).
8. ``emptyCache`` -> ``release_cached_blocks`` -> ``release_blocks`` (large pool, then small
   pool): every free block that is a whole segment (no prev, no next) is cudaFree'd
   (``release_block``); a segment with any live block stays. Expandable free blocks are
   unmapped page-wise (``unmap_block``, below).
9. Out of memory (``malloc``): when ``alloc_block`` fails the allocator
   (a) ``release_available_cached_blocks`` — only when ``max_split_size`` is set: frees the
   smallest cached oversize block of the stream of size >= max(size, max_split_size), else
   frees oversize blocks from the largest down until that much is freed — and retries;
   (b) ``release_cached_blocks`` (everything ``empty_cache`` frees, all streams) and
   retries once more (``num_alloc_retries``); then raises :class:`OutOfMemory`. Cached
   memory released along the way stays released. Here a cudaMalloc of ``n`` bytes
   succeeds iff ``reserved + n <= capacity_bytes``; ``allowed_bytes`` is the separate
   ``set_per_process_memory_fraction`` check ``reserved + alloc_size > allowed`` that
   ``alloc_block`` makes before any device call (for expandable segments too, with the
   step-4 ``alloc_size``).
10. ``expandable_segments:True`` (``find_expandable_block``, ``map_block``,
    ``try_allocate_expandable_block``, ``unmap_block``, ``release_expandable_segment``):
    one virtual segment per (pool, stream), reserved at about 1.125 x the device memory and
    mapped on demand in pages of 2 MiB (small pool) or ``large_segment_size`` (20 MiB, large
    pool). A miss maps just enough whole pages, at the lowest address where free + unmapped
    space fits the *rounded request* (not the step-4 allocation size) — so reserved memory
    grows in 2/20 MiB steps and a 12 MiB request costs one 20 MiB page, not a 12 MiB
    segment. Blocks split whenever the remainder is >= 512 B, so reserved tracks the
    high-water mark of the live layout instead of accumulating per-size segments.
    ``empty_cache`` unmaps the whole pages inside each free block (pages shared with a
    live block stay mapped) and drops a segment once nothing of it is mapped.
    ``release_available_cached_blocks`` never frees expandable blocks.

Where this model approximates
-----------------------------
* Addresses: cudaMalloc and the virtual-address reservations of expandable segments get
  increasing addresses from a bump pointer. The real driver may hand out lower or reused
  addresses; that only changes which of several *equal-size* free blocks (in different
  segments) best fit picks, hence which segment gets split.
* ``capacity_bytes`` stands for the device memory the allocator can get: no CUDA context,
  other processes, or physical fragmentation. An expandable segment's virtual size is
  ``ceil(1.125 * capacity / page) * page`` (2**48 bytes without a capacity) — only a limit
  on how far one segment can grow.
* Not modelled: CUDA events / ``record_stream`` (a free is immediately reusable), CUDA
  graph private pools and ``MemPool``, ``garbage_collection_threshold``, free-memory
  callbacks, IPC, toggling ``expandable_segments`` at run time.
* ``release_available_cached_blocks`` skips split blocks (torch would cudaFree them; not
  reachable with the option checks torch and :class:`AllocatorConfig` make).

Versions: the stored ``CUDACachingAllocator.cpp`` snapshots read (a 2.4-era one and a recent
main one using ``AcceleratorAllocatorConfig``) and the headers of the installed torch
2.13.0 agree on every rule above. Later additions, all with unchanged defaults:
``max_non_split_rounding_mb`` (torch 2.6), ``large_segment_size_mb`` (Jan 2026; in the 2.13
headers, may be missing in 2.11 — default 20 MiB either way), expandable blocks skipped by
``release_available_cached_blocks``, and ``roundup_power2_divisions:[...,>:d]`` filling from
the interval after the last boundary. The generic templated ``CachingDeviceAllocator``
(open PRs, comparator ordered by size first) is not in 2.13.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .allocator_config import (
    DEFAULT_CONFIG,
    KLARGE_BUFFER,
    KMIN_BLOCK_SIZE,
    KMIN_LARGE_ALLOC,
    KROUND_LARGE,
    KSMALL_BUFFER,
    KSMALL_SIZE,
    AllocatorConfig,
    get_allocation_size,
    round_size,
)
from .blocks import ADDR_BITS, ExpandableSegments, _Block, _Pool, _Segment, _Unmapped

__all__ = [
    "KMIN_BLOCK_SIZE", "KSMALL_SIZE", "KSMALL_BUFFER", "KLARGE_BUFFER", "KMIN_LARGE_ALLOC",
    "KROUND_LARGE", "AllocatorConfig", "AllocatorStats", "CachingAllocator", "OutOfMemory",
    "round_size", "get_allocation_size", "replay",
]

class OutOfMemory(Exception):
    """``torch.OutOfMemoryError`` of the model: no cached block fit and the device refused.

    Attributes (bytes): ``requested`` (as asked), ``rounded`` (after ``round_size``),
    ``alloc_size`` (the segment size the allocator tried to get, what torch's message calls
    "Tried to allocate"), ``capacity`` (``capacity_bytes``; ``allowed`` the fraction limit),
    ``allocated`` and ``reserved`` at the moment of the error (after cached segments were
    released), and the ``stream``.
    """

    def __init__(self, requested: int, capacity: int | None, *, rounded: int = 0,
                 alloc_size: int = 0, allocated: int = 0, reserved: int = 0,
                 allowed: int | None = None, stream: int = 0):
        self.requested = requested
        self.capacity = capacity
        self.rounded = rounded
        self.alloc_size = alloc_size
        self.allocated = allocated
        self.reserved = reserved
        self.allowed = allowed
        self.stream = stream
        limit = f"capacity {capacity} B" if capacity is not None else "no capacity"
        if allowed is not None:
            limit += f", {allowed} B allowed"
        super().__init__(
            f"CUDA out of memory (model). Tried to allocate {alloc_size} B for a request of "
            f"{requested} B ({limit}); {allocated} B allocated, "
            f"{reserved - allocated} B reserved but unallocated.")


@dataclass(frozen=True)
class AllocatorStats:
    """What the torch.cuda memory counters would read, in bytes (counts where noted).

    ``allocated`` / ``max_allocated``: ``memory_allocated()`` / ``max_memory_allocated()``;
    ``reserved`` / ``max_reserved``: ``memory_reserved()`` / ``max_memory_reserved()``;
    ``requested`` / ``max_requested``: ``requested_bytes.all`` (unrounded sizes of live
    allocations); ``segments``: cudaMalloc'd segments held (``segment.all.current``;
    expandable segments are not counted, as in torch); ``num_alloc_retries``,
    ``num_device_alloc`` (cudaMalloc + map calls), ``num_device_free`` (cudaFree + unmap
    calls), ``num_ooms``: counts as in ``torch.cuda.memory_stats()``.
    """

    allocated: int
    reserved: int
    max_allocated: int
    max_reserved: int
    requested: int = 0
    max_requested: int = 0
    segments: int = 0
    num_alloc_retries: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    num_ooms: int = 0
    config: AllocatorConfig = field(default=DEFAULT_CONFIG, compare=False, repr=False)


class CachingAllocator(ExpandableSegments):
    """One device's ``DeviceCachingAllocator``: malloc/free requests in bytes.

    >>> a = CachingAllocator()
    >>> h = a.malloc(1000)
    >>> a.allocated, a.reserved
    (1024, 2097152)
    >>> a.free(h); a.empty_cache(); a.reserved, a.max_reserved
    (0, 2097152)
    """

    def __init__(self, config: AllocatorConfig | None = None):
        self.config = config = config or DEFAULT_CONFIG
        self.allocated = 0
        self.reserved = 0
        self.requested = 0
        self.max_allocated = 0
        self.max_reserved = 0
        self.max_requested = 0
        self.segments = 0
        self.num_alloc_retries = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_ooms = 0
        self._pools: dict[tuple[bool, int], _Pool] = {}
        self._unmapped: dict[tuple[bool, int], _Unmapped] = {}
        self._live: dict[int, _Block | None] = {}
        self._next_handle = 0
        self._next_addr = 1 << 32
        self._expandable = config.expandable_segments
        self._split_limit = config.split_limit
        self._non_split_rounding = config.non_split_rounding
        self._capacity = config.capacity_bytes
        self._allowed = config.allowed_bytes
        self._plain_rounding = all(d <= 1 for d in config.roundup_power2_divisions)

    # ------------------------------------------------------------------ public API
    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; return a handle for :meth:`free`.

        Raises :class:`OutOfMemory` when neither the cache nor the device can serve it.
        """
        handle = self._next_handle
        self._next_handle = handle + 1
        if size <= 0:
            if size < 0:
                raise ValueError("negative allocation size")
            self._live[handle] = None  # torch: 0 bytes -> null pointer, no block
            return handle
        if self._plain_rounding:
            rsize = (KMIN_BLOCK_SIZE if size < KMIN_BLOCK_SIZE
                     else -(-size // KMIN_BLOCK_SIZE) * KMIN_BLOCK_SIZE)
        else:
            rsize = round_size(size, self.config)
        small = rsize <= KSMALL_SIZE
        pool = self._pools.get((small, stream))
        block = None if pool is None else self._get_free_block(pool, rsize)
        if block is None:
            block = self._malloc_slow(size, rsize, small, stream)
            pool = self._pools.get((small, stream))
        # should_split
        remaining = block.size - rsize
        if small or self._expandable:
            split = remaining >= KMIN_BLOCK_SIZE
        else:
            split = rsize < self._split_limit and remaining > KSMALL_SIZE
        # alloc_found_block
        if split:
            new = _Block(block.addr, rsize, stream, small, block.seg)
            prev = block.prev
            new.prev = prev
            if prev is not None:
                prev.next = new
            new.next = block
            block.prev = new
            block.addr += rsize
            block.size = remaining
            if pool is None:  # (the remainder goes back to the pool the block came from)
                pool = self._pools[(small, stream)] = _Pool()
            keys, k = pool.keys, remaining << ADDR_BITS | block.addr  # (_Pool.add inline)
            i = bisect_left(keys, k)
            keys.insert(i, k)
            pool.blocks.insert(i, block)
            block = new
        block.allocated = True
        block.requested = size
        self.allocated += block.size
        if self.allocated > self.max_allocated:
            self.max_allocated = self.allocated
        self.requested += size
        if self.requested > self.max_requested:
            self.max_requested = self.requested
        self._live[handle] = block
        return handle

    def free(self, handle: int) -> None:
        """Free the allocation ``handle``: its block returns to the cache (no device call)."""
        block = self._live.pop(handle)
        if block is None:
            return
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        block.requested = 0
        self._free_block(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: release every cached segment that is entirely free."""
        self._release_cached_blocks()

    def reset_peak(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: every peak becomes its current value."""
        self.max_allocated = self.allocated
        self.max_reserved = self.reserved
        self.max_requested = self.requested

    def block_size(self, handle: int) -> int:
        """Bytes the allocation ``handle`` holds (what it adds to ``allocated``)."""
        b = self._live[handle]
        return 0 if b is None else b.size

    def stats(self) -> AllocatorStats:
        """The counters now, as an :class:`AllocatorStats`."""
        return AllocatorStats(
            allocated=self.allocated, reserved=self.reserved,
            max_allocated=self.max_allocated, max_reserved=self.max_reserved,
            requested=self.requested, max_requested=self.max_requested,
            segments=self.segments, num_alloc_retries=self.num_alloc_retries,
            num_device_alloc=self.num_device_alloc, num_device_free=self.num_device_free,
            num_ooms=self.num_ooms, config=self.config)

    def snapshot(self) -> list[dict]:
        """Segments in address order, like ``torch.cuda.memory_snapshot()`` (sizes in B).

        Each: ``stream``, ``is_large``, ``is_expandable``, ``total_size`` (mapped bytes),
        ``allocated_size`` and ``blocks``: ``[(size, allocated), ...]`` of its mapped blocks.
        An expandable segment is reported once per contiguous mapped range, as torch does.
        """
        blocks: list[_Block] = [b for b in self._live.values() if b is not None]
        for pool in self._pools.values():
            blocks.extend(pool.blocks)
        heads = sorted((b for b in blocks if b.prev is None or not b.prev.mapped),
                       key=lambda b: b.addr)
        out = []
        for h in heads:
            segment = {"stream": h.stream, "is_large": not h.small,
                       "is_expandable": h.seg.page != 0, "total_size": 0,
                       "allocated_size": 0, "blocks": []}
            b = h
            while b is not None and b.mapped:
                segment["blocks"].append((b.size, b.allocated))
                segment["total_size"] += b.size
                if b.allocated:
                    segment["allocated_size"] += b.size
                b = b.next
            out.append(segment)
        return out

    # ------------------------------------------------------------------ pools
    def _pool_insert(self, b: _Block) -> None:
        key = (b.small, b.stream)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
        pool.add(b)

    def _pool_remove(self, b: _Block) -> None:
        self._pools[(b.small, b.stream)].drop(b)

    def _grow_reserved(self, n: int) -> None:
        self.reserved += n
        if self.reserved > self.max_reserved:
            self.max_reserved = self.reserved

    # ------------------------------------------------------------------ malloc path
    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """``get_free_block``: best fit in ``pool`` (of a stream), with the oversize rules."""
        keys = pool.keys
        i = bisect_left(keys, size << ADDR_BITS)
        n = len(keys)
        if i == n:
            return None
        blocks = pool.blocks
        block = blocks[i]
        if block.seg.page:
            # expandable: compare the size each block could grow to
            nxt = block.next
            esize = block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
            while block.seg.page and i + 1 < n:
                cand = blocks[i + 1]
                cn = cand.next
                csize = cand.size + (cn.size if cn is not None and not cn.mapped else 0)
                if csize < esize:
                    i += 1
                    block, esize = cand, csize
                else:
                    break
        limit = self._split_limit
        if size < limit:
            if block.size >= limit:
                return None
        elif block.size >= size + self._non_split_rounding:
            return None
        del keys[i]
        del blocks[i]
        return block

    def _malloc_slow(self, size: int, rsize: int, small: bool, stream: int) -> _Block:
        alloc_size = get_allocation_size(rsize, self.config)
        block = self._alloc_block(small, stream, rsize, alloc_size, False)
        if block is None and self._release_available_cached_blocks(small, stream, rsize):
            block = self._alloc_block(small, stream, rsize, alloc_size, False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(small, stream, rsize, alloc_size, True)
        if block is None:
            self.num_ooms += 1
            raise OutOfMemory(size, self._capacity, rounded=rsize, alloc_size=alloc_size,
                              allocated=self.allocated, reserved=self.reserved,
                              allowed=self._allowed, stream=stream)
        return block

    def _alloc_block(self, small: bool, stream: int, rsize: int, alloc_size: int,
                     is_retry: bool) -> _Block | None:
        """``alloc_block``: a new cudaMalloc segment (or expandable pages); None on failure."""
        if is_retry:
            self.num_alloc_retries += 1
        if self._allowed is not None and self.reserved + alloc_size > self._allowed:
            return None
        if self._expandable:
            return self._try_allocate_expandable_block(small, stream, rsize)
        if self._capacity is not None and self.reserved + alloc_size > self._capacity:
            return None
        addr = self._next_addr
        self._next_addr = addr + alloc_size
        seg = _Segment(addr, alloc_size, 0, stream, small)
        self._grow_reserved(alloc_size)
        self.segments += 1
        self.num_device_alloc += 1
        return _Block(addr, alloc_size, stream, small, seg)

    def _release_available_cached_blocks(self, small: bool, stream: int, size: int) -> bool:
        """``release_available_cached_blocks``: free cached oversize blocks (max_split_size set)."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        pool = self._pools.get((small, stream))
        if pool is None:
            return False
        key = max(size, limit)
        keys, blocks = pool.keys, pool.blocks
        i = bisect_left(keys, key << ADDR_BITS)
        found = blocks[i] if i < len(keys) else None
        if found is None or found.seg.page:
            # no single block is large enough: free oversize blocks from the largest down
            released = 0
            j = i - 1
            while released < key and j >= 0 and keys[j] >> ADDR_BITS >= limit:
                b = blocks[j]
                if not b.seg.page and b.prev is None and b.next is None:
                    released += b.size
                    self._release_block(b)
                j -= 1
            return released >= key
        if found.prev is not None or found.next is not None:
            return False  # torch would cudaFree a split block here (see module notes)
        self._release_block(found)
        return True

    # ------------------------------------------------------------------ free path
    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
        """``try_merge_blocks``: absorb the free neighbour ``src`` into ``dst``."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._pool_remove(src)
        else:
            self._unmapped_remove(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _free_block(self, block: _Block) -> None:
        """``free_block``: merge with free neighbours, return to the pool (its stream's, as
        its neighbours'; :meth:`_try_merge` and :meth:`_pool_insert`, with the pool looked
        up once: most of a replay's events end here)."""
        prev, nxt = block.prev, block.next
        if not block.mapped or (prev is not None and not prev.mapped) or \
                (nxt is not None and not nxt.mapped):  # (expandable segments' pages)
            if prev is not None and not prev.allocated:
                self._try_merge(block, prev)
            if nxt is not None and not nxt.allocated:
                self._try_merge(block, nxt)
            self._pool_insert(block)
            return
        key = (block.small, block.stream)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
        keys, blocks = pool.keys, pool.blocks  # (_Pool.drop and add inline: replays sooner)
        if prev is not None and not prev.allocated:
            i = bisect_left(keys, prev.size << ADDR_BITS | prev.addr)
            del keys[i]
            del blocks[i]
            block.addr = prev.addr
            block.size += prev.size
            block.prev = before = prev.prev
            if before is not None:
                before.next = block
        if nxt is not None and not nxt.allocated:
            i = bisect_left(keys, nxt.size << ADDR_BITS | nxt.addr)
            del keys[i]
            del blocks[i]
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            block.size += nxt.size
        k = block.size << ADDR_BITS | block.addr
        i = bisect_left(keys, k)
        keys.insert(i, k)
        blocks.insert(i, block)

    def _release_block(self, block: _Block) -> None:
        """``release_block``: cudaFree a whole free segment."""
        self._pool_remove(block)
        self.reserved -= block.size
        self.segments -= 1
        self.num_device_free += 1

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks`` -> ``release_blocks`` on the large, then the small pool."""
        for small in (False, True):
            to_unmap = []
            for key in sorted(k for k in self._pools if k[0] is small):
                pool = self._pools[key]
                for b in list(pool.blocks):
                    if b.seg.page:
                        to_unmap.append(b)
                    elif b.prev is None and b.next is None:
                        self._release_block(b)
            for b in to_unmap:
                self._unmap_block(b)
                if b.prev is None and b.next is None and not b.mapped:
                    self._release_expandable_segment(b)

    # ------------------------------------------------------------------ expandable segments
def replay(events: Iterable[Sequence], config: AllocatorConfig | None = None) -> AllocatorStats:
    """Run ``events`` through a fresh :class:`CachingAllocator`; return the final counters.

    Events: ``("alloc", key, nbytes)`` or ``("alloc", key, nbytes, stream)``,
    ``("free", key)``, ``("empty_cache",)``, ``("reset_peak",)``. ``key`` is any hashable
    naming a live allocation; sizes are bytes. Raises :class:`OutOfMemory` when the config's
    capacity is exceeded, ``KeyError`` for a free of an unknown key and ``ValueError`` for a
    malformed event or an alloc of a live key.
    """
    a = CachingAllocator(config)
    handles: dict = {}
    malloc, free = a.malloc, a.free
    for ev in events:
        op = ev[0]
        if op == "alloc":
            key = ev[1]
            if key in handles:
                raise ValueError(f"alloc of live key {key!r}")
            handles[key] = malloc(ev[2], ev[3]) if len(ev) > 3 else malloc(ev[2])
        elif op == "free":
            free(handles.pop(ev[1]))
        elif op == "empty_cache":
            a.empty_cache()
        elif op == "reset_peak":
            a.reset_peak()
        else:
            raise ValueError(f"unknown event {ev!r}")
    return a.stats()
