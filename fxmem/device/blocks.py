"""The caching allocator's memory layout: segments, blocks and per-stream pools, and the
page mapping of expandable segments (``find_expandable_block``, ``map_block``,
``try_allocate_expandable_block``, ``unmap_block``, ``release_expandable_segment`` in
``c10/cuda/CUDACachingAllocator.cpp``; rule 10 of :mod:`fxmem.device.caching_allocator`).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from .allocator_config import _NO_CAPACITY_VA, KSMALL_BUFFER


class _Segment:
    """One cudaMalloc (``page == 0``) or one expandable segment's address range."""

    __slots__ = ("base", "size", "page", "stream", "small")

    def __init__(self, base, size, page, stream, small):
        self.base = base
        self.size = size  # cudaMalloc size, or virtual size for an expandable segment
        self.page = page
        self.stream = stream
        self.small = small


class _Block:
    __slots__ = ("addr", "size", "stream", "small", "seg", "prev", "next", "allocated",
                 "mapped", "requested")

    def __init__(self, addr, size, stream, small, seg, mapped=True):
        self.addr = addr
        self.size = size
        self.stream = stream
        self.small = small
        self.seg = seg
        self.prev = None
        self.next = None
        self.allocated = False
        self.mapped = mapped
        self.requested = 0


ADDR_BITS = 64  # a pool key: a block's size above its address (addresses < 2**64)


class _Pool:
    """Free mapped blocks of one (pool, stream): ``keys`` sorted by (size, address), each
    the int ``size << ADDR_BITS | address`` (ints compare sooner than tuples: a third of
    a replay's time went to the pools' sorted lists), and ``blocks``, the block of each
    key at its index."""

    __slots__ = ("keys", "blocks")

    def __init__(self):
        self.keys: list[int] = []
        self.blocks: list[_Block] = []

    def add(self, b: _Block) -> None:
        keys, k = self.keys, b.size << ADDR_BITS | b.addr
        i = bisect_left(keys, k)
        keys.insert(i, k)
        self.blocks.insert(i, b)

    def drop(self, b: _Block) -> None:
        keys, k = self.keys, b.size << ADDR_BITS | b.addr
        i = bisect_left(keys, k)
        assert keys[i] == k
        del keys[i]
        del self.blocks[i]


class _Unmapped:
    """Unmapped blocks of expandable segments of one (pool, stream), by address."""

    __slots__ = ("addrs", "by_addr")

    def __init__(self):
        self.addrs: list[int] = []
        self.by_addr: dict[int, _Block] = {}


class ExpandableSegments:
    """The expandable-segment half of :class:`~fxmem.device.caching_allocator.CachingAllocator`
    (a mixin: it reads and updates the allocator's pools, counters and configuration)."""

    def _unmapped_insert(self, b: _Block) -> None:
        key = (b.small, b.stream)
        um = self._unmapped.get(key)
        if um is None:
            um = self._unmapped[key] = _Unmapped()
        insort(um.addrs, b.addr)
        um.by_addr[b.addr] = b

    def _unmapped_remove(self, b: _Block) -> None:
        um = self._unmapped[(b.small, b.stream)]
        i = bisect_left(um.addrs, b.addr)
        assert um.addrs[i] == b.addr
        del um.addrs[i]
        del um.by_addr[b.addr]

    def _find_expandable_block(self, small: bool, stream: int, size: int) -> _Block:
        """``find_expandable_block``: lowest address with ``size`` free + unmapped bytes."""
        um = self._unmapped.get((small, stream))
        if um is not None:
            for addr in um.addrs:
                c = um.by_addr[addr]
                p = c.prev
                if p is not None and not p.allocated:
                    c = p
                total, b = 0, c
                while total < size and b is not None and not b.allocated:
                    total += b.size
                    b = b.next
                if total >= size:
                    return c
        page = KSMALL_BUFFER if small else self.config.large_segment_size
        cap = self._capacity
        va = _NO_CAPACITY_VA if cap is None else -(-(cap + cap // 8) // page) * page
        base = -(-self._next_addr // page) * page
        self._next_addr = base + va
        seg = _Segment(base, va, page, stream, small)
        c = _Block(base, va, stream, small, seg, mapped=False)
        self._unmapped_insert(c)
        return c

    def _map_block(self, to_map: _Block, size: int) -> bool:
        """``map_block``: map whole pages covering ``[to_map.addr, +size)``."""
        seg = to_map.seg
        page = seg.page
        off = to_map.addr - seg.base
        assert off % page == 0 and not to_map.mapped and size <= to_map.size
        nbytes = -(-(off + size) // page) * page - off
        if nbytes == 0:
            return False
        if self._capacity is not None and self.reserved + nbytes > self._capacity:
            return False  # cuMemCreate fails: pages of this call are released again
        self._unmapped_remove(to_map)
        to_map.mapped = True
        if nbytes < to_map.size:
            rem = _Block(to_map.addr + nbytes, to_map.size - nbytes, to_map.stream,
                         to_map.small, seg, mapped=False)
            rem.prev = to_map
            rem.next = to_map.next
            if to_map.next is not None:
                to_map.next.prev = rem
            to_map.next = rem
            self._unmapped_insert(rem)
            to_map.size = nbytes
        self._try_merge(to_map, to_map.prev)
        self._try_merge(to_map, to_map.next)
        self._pool_insert(to_map)
        self._grow_reserved(nbytes)
        self.num_device_alloc += 1
        return True

    def _try_allocate_expandable_block(self, small: bool, stream: int, size: int) -> _Block | None:
        """``try_allocate_expandable_block``: map pages until one free block holds ``size``."""
        c = self._find_expandable_block(small, stream, size)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nc = c.next
            if not self._map_block(nc, min(size - c.size, nc.size)):
                return None
            c = nc
        self._pool_remove(c)
        return c

    def _unmap_block(self, block: _Block) -> None:
        """``unmap_block``: unmap the whole pages inside a free expandable block."""
        seg = block.seg
        page = seg.page
        start = block.addr - seg.base
        end = start + block.size
        ubegin = -(-start // page) * page
        uend = end // page * page
        if ubegin >= uend:
            return
        self._pool_remove(block)
        base = seg.base
        before = ubegin - start
        if before > 0:
            bf = _Block(block.addr, before, block.stream, block.small, seg)
            bf.prev = block.prev
            if bf.prev is not None:
                bf.prev.next = bf
            bf.next = block
            block.prev = bf
            self._pool_insert(bf)
        after = end - uend
        if after > 0:
            af = _Block(base + uend, after, block.stream, block.small, seg)
            af.next = block.next
            if af.next is not None:
                af.next.prev = af
            af.prev = block
            block.next = af
            self._pool_insert(af)
        block.addr = base + ubegin
        block.size = uend - ubegin
        block.mapped = False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._unmapped_insert(block)
        self.reserved -= uend - ubegin
        self.num_device_free += 1

    def _release_expandable_segment(self, block: _Block) -> None:
        """``release_expandable_segment``: drop a segment with nothing mapped."""
        assert block.size == block.seg.size
        self._unmapped_remove(block)
