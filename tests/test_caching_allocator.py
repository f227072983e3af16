"""The pure-Python CUDA caching allocator model against hand-computed sequences.

Every expected number is derived in the comment above it from the rules in
``fxmem/device/caching_allocator.py`` (torch's CUDACachingAllocator.cpp), not from running the code.
MiB = 1_048_576 B; "seg" = one cudaMalloc segment.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxmem.device.blocks import ADDR_BITS
from fxmem.device.caching_allocator import (
    AllocatorConfig, CachingAllocator, OutOfMemory, get_allocation_size, replay, round_size)

MiB = 1 << 20
KiB = 1 << 10


def blocks(alloc):
    """[(size, allocated), ...] per segment of a snapshot, in address order."""
    return [s["blocks"] for s in alloc.snapshot()]


# ---------------------------------------------------------------- rounding and segment size
def test_rounding_to_512():
    # round_size: < 512 -> 512; otherwise up to a multiple of 512.
    assert round_size(1) == 512
    assert round_size(511) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(1_500_000) == 1_500_160  # ceil(1_500_000 / 512) = 2930 -> 2930 * 512
    # allocated counts the rounded block: 1 B -> 512, then 513 B -> 1024 (same small seg).
    s = replay([("alloc", "a", 1), ("alloc", "b", 513)])
    assert (s.allocated, s.reserved) == (512 + 1024, 2 * MiB)


def test_zero_byte_allocation_takes_no_block():
    # torch: allocate(0) returns a null pointer without touching the allocator.
    s = replay([("alloc", "z", 0), ("free", "z")])
    assert (s.allocated, s.reserved, s.max_reserved) == (0, 0, 0)


def test_allocation_sizes():
    # get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else up to 2 MiB multiple.
    assert get_allocation_size(512) == 2 * MiB
    assert get_allocation_size(MiB) == 2 * MiB
    assert get_allocation_size(MiB + 512) == 20 * MiB
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB
    assert get_allocation_size(11 * MiB + 512) == 12 * MiB
    assert get_allocation_size(3 * MiB, AllocatorConfig(large_segment_size=64 * MiB)) == 64 * MiB


def test_roundup_power2_divisions():
    c4 = AllocatorConfig(roundup_power2_divisions=4)
    # 1200 KiB in [1 MiB, 2 MiB), 4 steps of 256 KiB -> 1280 KiB.
    assert round_size(1200 * KiB, c4) == 1280 * KiB
    # 600_000 B: power-of-two floor 512 KiB, step 128 KiB; 600_000 > 512 KiB -> 640 KiB.
    assert round_size(600_000, c4) == 640 * KiB
    # a power of two stays; 1500 B is not > 512 * 4 = 2048 -> plain 512 rounding: 1536.
    assert round_size(MiB, c4) == MiB
    assert round_size(1500, c4) == 1536
    # "[256:4,>:1]": intervals below and at 256 MiB use 4, the ones after use 1.
    c = AllocatorConfig.from_string("roundup_power2_divisions:[256:4,>:1]")
    assert c.roundup_power2_divisions == (4,) * 9 + (1,) * 7
    assert round_size(300 * MiB, c) == 320 * MiB  # [256, 512) MiB in 64 MiB steps
    assert round_size(600 * MiB + 1, c) == 600 * MiB + 512  # 1 division: plain rounding
    # a rounded-up request also counts rounded: 1200 KiB -> 1280 KiB block.
    s = replay([("alloc", "a", 1200 * KiB)], c4)
    assert s.allocated == 1280 * KiB


def test_config_string():
    c = AllocatorConfig.from_string(
        "expandable_segments:True, max_split_size_mb:256,max_non_split_rounding_mb:40,"
        "garbage_collection_threshold:0.6", capacity_bytes=80 * 2**30)
    assert c.expandable_segments and c.max_split_size == 256 * MiB
    assert c.non_split_rounding == 40 * MiB and c.capacity_bytes == 80 * 2**30
    assert AllocatorConfig().non_split_rounding == 20 * MiB
    with pytest.raises(ValueError):
        AllocatorConfig.from_string("no_such_option:1")
    with pytest.raises(ValueError):
        AllocatorConfig(max_split_size=10 * MiB)  # torch: max_split_size_mb must be >= 20


# ---------------------------------------------------------------- small pool
def test_small_requests_share_one_2mib_segment():
    a = CachingAllocator()
    # 1000 B -> 1024 B block; new 2 MiB small seg, remainder 2 MiB - 1024 >= 512 -> split.
    h1 = a.malloc(1000)
    assert (a.allocated, a.reserved) == (1024, 2 * MiB)
    # 1 MiB is still "small" (<= kSmallSize): best fit is the 2_096_128 B remainder, split.
    h2 = a.malloc(MiB)
    assert (a.allocated, a.reserved) == (1024 + MiB, 2 * MiB)
    # exactly the last 2 MiB - 1024 - 1 MiB = 1_047_552 B: taken whole, remainder 0.
    a.malloc(1_047_552)
    assert (a.allocated, a.reserved) == (2 * MiB, 2 * MiB)
    assert blocks(a) == [[(1024, True), (MiB, True), (1_047_552, True)]]
    # the segment is full: 1 more byte needs a second 2 MiB segment.
    a.malloc(1)
    assert (a.allocated, a.reserved, a.segments) == (2 * MiB + 512, 4 * MiB, 2)
    # freeing the first two merges them into one 1_049_600 B free block at the start.
    a.free(h1)
    a.free(h2)
    assert blocks(a)[0] == [(1024 + MiB, False), (1_047_552, True)]


# ---------------------------------------------------------------- large pool
def test_one_and_a_half_mib_gets_a_20mib_segment_split():
    # 1.5 MiB > 1 MiB -> large pool; < 10 MiB -> 20 MiB seg; remainder 18.5 MiB > 1 MiB -> split.
    a = CachingAllocator()
    a.malloc(3 * MiB // 2)
    assert (a.allocated, a.reserved) == (3 * MiB // 2, 20 * MiB)
    # the second 1.5 MiB request is served by the 18.5 MiB remainder.
    a.malloc(3 * MiB // 2)
    assert (a.allocated, a.reserved) == (3 * MiB, 20 * MiB)
    assert blocks(a) == [[(3 * MiB // 2, True), (3 * MiB // 2, True), (17 * MiB, False)]]


def test_twelve_mib_gets_its_own_twelve_mib_segment():
    # 12 MiB >= 10 MiB -> seg rounded to 2 MiB = 12 MiB; remainder 0 -> no split.
    s = replay([("alloc", "a", 12 * MiB)])
    assert (s.allocated, s.reserved, s.segments) == (12 * MiB, 12 * MiB, 1)
    # 12 MiB + 1 B -> 12 MiB + 512 block in a 14 MiB seg; remainder 2 MiB - 512 > 1 MiB: split.
    s = replay([("alloc", "a", 12 * MiB + 1)])
    assert (s.allocated, s.reserved) == (12 * MiB + 512, 14 * MiB)
    # 11 MiB + 512 -> 12 MiB seg; remainder 1 MiB - 512 <= 1 MiB -> no split: whole 12 MiB counts.
    s = replay([("alloc", "a", 11 * MiB + 512)])
    assert (s.allocated, s.reserved) == (12 * MiB, 12 * MiB)


def test_large_pool_keeps_the_slack_when_the_remainder_is_at_most_1mib():
    a = CachingAllocator()
    # 5 MiB -> 20 MiB seg split: [5 MiB live][15 MiB free].
    a.malloc(5 * MiB)
    # 14.5 MiB in the 15 MiB block: remainder 0.5 MiB <= 1 MiB -> not split, counts 15 MiB.
    h = a.malloc(14 * MiB + 512 * KiB)
    assert a.block_size(h) == 15 * MiB
    assert (a.allocated, a.reserved) == (20 * MiB, 20 * MiB)
    # boundary: a remainder of exactly 1 MiB is not split (needs > kSmallSize) ...
    a.free(h)
    h = a.malloc(14 * MiB)
    assert a.block_size(h) == 15 * MiB
    # ... one of 1 MiB + 512 B is.
    a.free(h)
    h = a.malloc(14 * MiB - 512)
    assert a.block_size(h) == 14 * MiB - 512
    assert blocks(a) == [[(5 * MiB, True), (14 * MiB - 512, True), (MiB + 512, False)]]


def test_best_fit_takes_the_smallest_sufficient_block():
    a = CachingAllocator()
    # three whole segments of 12, 16 and 14 MiB, then all freed (cached, reserved 42 MiB).
    hs = [a.malloc(n * MiB) for n in (12, 16, 14)]
    for h in hs:
        a.free(h)
    # 13 MiB: smallest free block >= 13 MiB is the 14 MiB one; remainder 1 MiB -> no split.
    h13 = a.malloc(13 * MiB)
    assert a.block_size(h13) == 14 * MiB
    # 11 MiB: the 12 MiB one; remainder 1 MiB -> no split.
    h11 = a.malloc(11 * MiB)
    assert a.block_size(h11) == 12 * MiB
    assert (a.allocated, a.reserved) == (26 * MiB, 42 * MiB)
    # segments in address order: 12 (live), 16 (free), 14 (live).
    assert [s["allocated_size"] for s in a.snapshot()] == [12 * MiB, 0, 14 * MiB]


def test_best_fit_ties_go_to_the_lowest_address():
    a = CachingAllocator()
    p, q = a.malloc(12 * MiB), a.malloc(12 * MiB)  # p's segment has the lower address
    a.free(q)
    a.free(p)
    a.malloc(12 * MiB)
    # equal sizes -> (stream, size, address) order picks p's segment, the first one.
    assert [s["allocated_size"] for s in a.snapshot()] == [12 * MiB, 0]


def test_free_merges_neighbours():
    a = CachingAllocator()
    # three 2 MiB requests (large pool) carve one 20 MiB seg: [a 2][b 2][c 2][free 14].
    ha, hb, hc = a.malloc(2 * MiB), a.malloc(2 * MiB), a.malloc(2 * MiB)
    assert a.reserved == 20 * MiB
    a.free(hb)  # neighbours a and c live: no merge
    assert blocks(a) == [[(2 * MiB, True), (2 * MiB, False), (2 * MiB, True), (14 * MiB, False)]]
    a.free(ha)  # merges with the free b: one 4 MiB free block
    assert blocks(a) == [[(4 * MiB, False), (2 * MiB, True), (14 * MiB, False)]]
    # best fit for 4 MiB: the merged 4 MiB block (not the 14 MiB one), remainder 0.
    hd = a.malloc(4 * MiB)
    assert blocks(a) == [[(4 * MiB, True), (2 * MiB, True), (14 * MiB, False)]]
    a.free(hd)
    a.free(hc)  # merges with both neighbours: the whole 20 MiB is one free block
    assert blocks(a) == [[(20 * MiB, False)]]
    a.empty_cache()
    assert (a.allocated, a.reserved, a.segments) == (0, 0, 0)


def test_empty_cache_releases_only_entirely_free_segments():
    a = CachingAllocator()
    x = a.malloc(2 * MiB)          # 20 MiB seg, split: [x 2][free 18]
    y = a.malloc(2 * MiB)          # same seg: [x][y][free 16]
    z = a.malloc(24 * MiB)         # 24 > 16 free: own 24 MiB seg
    s = a.malloc(100)              # 2 MiB small seg
    for h in (x, z, s):
        a.free(h)
    # reserved 20 + 24 + 2 = 46 MiB; only the 20 MiB seg still holds a live block (y).
    assert a.reserved == 46 * MiB
    a.empty_cache()
    assert (a.allocated, a.reserved, a.segments) == (2 * MiB, 20 * MiB, 1)
    a.free(y)
    a.empty_cache()
    assert (a.reserved, a.max_reserved) == (0, 46 * MiB)


def test_peaks_and_reset_peak():
    a = CachingAllocator()
    h1, _ = a.malloc(12 * MiB), a.malloc(12 * MiB)    # allocated = reserved = 24 MiB
    a.free(h1)                                        # allocated 12, reserved 24 (cached)
    assert (a.allocated, a.max_allocated, a.reserved, a.max_reserved) == (
        12 * MiB, 24 * MiB, 24 * MiB, 24 * MiB)
    a.reset_peak()                                    # peaks := current
    assert (a.max_allocated, a.max_reserved) == (12 * MiB, 24 * MiB)
    a.empty_cache()                                   # reserved 12; a decrease keeps the peak
    assert (a.reserved, a.max_reserved) == (12 * MiB, 24 * MiB)
    a.reset_peak()
    assert a.max_reserved == 12 * MiB
    s = replay([("alloc", 1, 12 * MiB), ("free", 1), ("reset_peak",), ("alloc", 2, MiB)])
    # after the reset: allocated 0 -> 1 MiB (small pool, reusing nothing: new 2 MiB seg).
    assert (s.max_allocated, s.max_reserved, s.reserved) == (MiB, 14 * MiB, 14 * MiB)


def test_blocks_are_reused_only_by_their_stream():
    a = CachingAllocator()
    h = a.malloc(12 * MiB, stream=0)
    a.free(h)
    # stream 1 cannot reuse stream 0's cached 12 MiB block: a new 12 MiB seg.
    a.malloc(12 * MiB, stream=1)
    assert a.reserved == 24 * MiB
    # stream 0 again: its cached block fits.
    a.malloc(12 * MiB, stream=0)
    assert (a.allocated, a.reserved) == (24 * MiB, 24 * MiB)
    # small pool too: one 2 MiB seg per stream.
    a.malloc(512, stream=0)
    a.malloc(512, stream=1)
    assert a.reserved == 28 * MiB
    s = replay([("alloc", "a", 100, 0), ("alloc", "b", 100, 7), ("alloc", "c", 100, 0)])
    assert s.reserved == 4 * MiB


# ---------------------------------------------------------------- max_split_size
def test_max_split_size():
    cfg = AllocatorConfig(max_split_size=64 * MiB)
    a = CachingAllocator(cfg)
    ha = a.malloc(100 * MiB)  # 100 MiB seg, whole
    a.free(ha)
    # 30 MiB < max_split: may not take the oversize (>= 64 MiB) 100 MiB block -> new 30 MiB seg.
    hb = a.malloc(30 * MiB)
    assert (a.block_size(hb), a.reserved) == (30 * MiB, 130 * MiB)
    # without max_split_size it takes the 100 MiB block and splits (remainder 70 MiB > 1 MiB).
    s = replay([("alloc", "a", 100 * MiB), ("free", "a"), ("alloc", "b", 30 * MiB)])
    assert (s.allocated, s.reserved) == (30 * MiB, 100 * MiB)
    # 90 MiB >= max_split: takes the 100 MiB block (100 < 90 + 20), never split: counts 100.
    hc = a.malloc(90 * MiB)
    assert (a.block_size(hc), a.reserved) == (100 * MiB, 130 * MiB)
    a.free(hc)
    # 79 MiB: 100 >= 79 + 20 -> refused; new seg of 80 MiB (2 MiB rounding), not split.
    he = a.malloc(79 * MiB)
    assert (a.block_size(he), a.reserved) == (80 * MiB, 210 * MiB)
    # a wider max_non_split_rounding (32 MiB): 100 < 79 + 32 -> the 100 MiB block is reused.
    s = replay([("alloc", "a", 100 * MiB), ("free", "a"), ("alloc", "e", 79 * MiB)],
               AllocatorConfig(max_split_size=64 * MiB, max_non_split_rounding=32 * MiB))
    assert (s.allocated, s.reserved) == (100 * MiB, 100 * MiB)


# ---------------------------------------------------------------- capacity / OOM
def test_capacity_releases_cached_segments_then_retries():
    a = CachingAllocator(AllocatorConfig(capacity_bytes=64 * MiB))
    h = a.malloc(40 * MiB)
    a.free(h)
    # 50 MiB: no cached block >= 50 MiB; cudaMalloc 50 MiB with 40 reserved: 90 > 64 fails;
    # release_cached_blocks frees the cached 40 MiB seg, the retry (0 + 50 <= 64) succeeds.
    hb = a.malloc(50 * MiB)
    assert (a.allocated, a.reserved, a.max_reserved) == (50 * MiB, 50 * MiB, 50 * MiB)
    assert a.num_alloc_retries == 1
    # 20 MiB: 50 + 20 > 64 and nothing cached to release -> OutOfMemory.
    with pytest.raises(OutOfMemory) as e:
        a.malloc(20 * MiB)
    assert (e.value.requested, e.value.capacity, e.value.alloc_size) == (
        20 * MiB, 64 * MiB, 20 * MiB)
    assert (a.allocated, a.reserved, a.num_ooms) == (50 * MiB, 50 * MiB, 1)
    a.free(hb)


def test_a_segment_with_a_live_block_cannot_be_released_on_oom():
    a = CachingAllocator(AllocatorConfig(capacity_bytes=64 * MiB))
    x = a.malloc(2 * MiB)      # 20 MiB seg split: [x][y][free 16]
    a.malloc(2 * MiB)
    a.free(x)
    # 50 MiB: 20 + 50 > 64; the 20 MiB seg still holds y -> not releasable -> OOM.
    with pytest.raises(OutOfMemory):
        a.malloc(50 * MiB)
    assert a.reserved == 20 * MiB
    with pytest.raises(OutOfMemory):
        replay([("alloc", "a", 10 * MiB), ("alloc", "b", 10 * MiB)],
               AllocatorConfig(capacity_bytes=16 * MiB))


def test_oom_with_max_split_size_releases_just_enough_oversize_blocks():
    cfg = AllocatorConfig(max_split_size=32 * MiB, capacity_bytes=128 * MiB)
    a = CachingAllocator(cfg)
    h40, h70 = a.malloc(40 * MiB), a.malloc(70 * MiB)
    a.free(h40)
    a.free(h70)                # cached oversize 40 and 70 MiB, reserved 110
    # 45 MiB: best fit 70 MiB refused (70 >= 45 + 20); cudaMalloc 46 MiB (2 MiB rounding):
    # 110 + 46 > 128. release_available_cached_blocks frees the smallest cached oversize
    # block >= 45 MiB, the 70 MiB one, and the retry succeeds: reserved 40 + 46.
    h = a.malloc(45 * MiB)
    assert (a.block_size(h), a.reserved) == (46 * MiB, 86 * MiB)
    assert a.num_alloc_retries == 0  # not the last-resort retry
    # no single block big enough: frees oversize blocks from the largest down.
    b = CachingAllocator(cfg)
    h40, h50 = b.malloc(40 * MiB), b.malloc(50 * MiB)
    b.free(h40)
    b.free(h50)                # cached 40, 50; reserved 90
    # 60 MiB: nothing >= 60 cached; 90 + 60 > 128; release 50 (50 < 60) then 40 (90 >= 60).
    b.malloc(60 * MiB)
    assert (b.reserved, b.segments) == (60 * MiB, 1)


# ---------------------------------------------------------------- expandable segments
EXP = AllocatorConfig(expandable_segments=True)


def test_expandable_small_pool_maps_2mib_pages():
    # small pool pages are 2 MiB: same numbers as a 2 MiB segment.
    s = replay([("alloc", "a", 1), ("alloc", "b", 1000)], EXP)
    assert (s.allocated, s.reserved) == (512 + 1024, 2 * MiB)


def test_expandable_large_pool_grows_in_20mib_pages():
    a = CachingAllocator(EXP)
    # 12 MiB: one 20 MiB page mapped (not a 12 MiB seg); split at 512 B granularity.
    a.malloc(12 * MiB)
    assert (a.allocated, a.reserved) == (12 * MiB, 20 * MiB)
    # 12 MiB more: the 8 MiB free tail is too small; map one more page right after it
    # (merged free 28 MiB), split: allocated 24, reserved 40, free 16 MiB left.
    a.malloc(12 * MiB)
    assert (a.allocated, a.reserved) == (24 * MiB, 40 * MiB)
    a.malloc(12 * MiB)  # fits in the 16 MiB free block
    assert (a.allocated, a.reserved) == (36 * MiB, 40 * MiB)
    assert a.segments == 0  # no cudaMalloc segment
    assert [(s["is_expandable"], s["total_size"]) for s in a.snapshot()] == [(True, 40 * MiB)]


def test_expandable_segments_tile_a_slightly_larger_request():
    ev = [("alloc", "a", 30 * MiB), ("free", "a"), ("alloc", "b", 32 * MiB)]
    # plain: the cached 30 MiB seg is too small for 32 MiB -> a second seg: 30 + 32.
    assert replay(ev).reserved == 62 * MiB
    # expandable: 30 MiB maps 2 pages (40 MiB); freed, the 40 MiB block serves 32 MiB.
    assert replay(ev, EXP).reserved == 40 * MiB


def test_expandable_best_fit_prefers_a_block_that_cannot_grow():
    a = CachingAllocator(EXP)
    ha = a.malloc(10 * MiB)   # page [0,20): a=[0,10), free [10,20)
    a.malloc(2 * MiB)         # b=[10,12), free [12,20) next to the unmapped rest
    a.free(ha)                # free [0,10), between nothing and b
    # 8 MiB: lower_bound gives [12,20) (8 MiB) but it could grow (unmapped next), the 10 MiB
    # block's expandable size 10 MiB is smaller -> [0,10) is taken and split.
    a.malloc(8 * MiB)
    assert blocks(a) == [[(8 * MiB, True), (2 * MiB, False), (2 * MiB, True), (8 * MiB, False)]]


def test_expandable_empty_cache_unmaps_whole_free_pages_only():
    a = CachingAllocator(EXP)
    ha = a.malloc(30 * MiB)   # 2 pages [0,40): a=[0,30), free [30,40)
    a.malloc(25 * MiB)        # free 10 too small: map [40,60), merged [30,60) -> b=[30,55)
    assert a.reserved == 60 * MiB
    a.free(ha)                # free [0,30)
    a.empty_cache()
    # free [0,30): page [0,20) unmapped, [20,30) shares a page with b; [55,60) likewise.
    assert (a.allocated, a.reserved) == (25 * MiB, 40 * MiB)
    assert blocks(a) == [[(10 * MiB, False), (25 * MiB, True), (5 * MiB, False)]]
    # 15 MiB: no free block fits; the lowest unmapped range [0,20) plus free [20,30) does:
    # one page mapped there, merged free [0,30), split -> reserved back to 60 MiB.
    a.malloc(15 * MiB)
    assert (a.allocated, a.reserved) == (40 * MiB, 60 * MiB)
    assert blocks(a) == [[(15 * MiB, True), (15 * MiB, False), (25 * MiB, True), (5 * MiB, False)]]


def test_expandable_everything_freed_then_empty_cache_releases_all():
    s = replay([("alloc", "a", 30 * MiB), ("alloc", "s", 100), ("free", "a"), ("free", "s"),
                ("empty_cache",)], EXP)
    assert (s.reserved, s.max_reserved) == (0, 42 * MiB)


def test_expandable_capacity():
    a = CachingAllocator(AllocatorConfig(expandable_segments=True, capacity_bytes=64 * MiB))
    a.malloc(30 * MiB)        # 40 MiB mapped
    a.malloc(30 * MiB)        # free [30,40) + one page [40,60): 60 MiB <= 64, exact fit
    assert (a.allocated, a.reserved) == (60 * MiB, 60 * MiB)
    # 2 MiB (large pool): needs a new 20 MiB page, 80 > 64; nothing free to unmap -> OOM.
    with pytest.raises(OutOfMemory):
        a.malloc(2 * MiB)
    # 512 B goes to the small pool: one 2 MiB page, 62 <= 64.
    a.malloc(512)
    assert a.reserved == 62 * MiB
    # Another stream's request releases this stream's free pages on OOM:
    b = CachingAllocator(AllocatorConfig(expandable_segments=True, capacity_bytes=64 * MiB))
    b.free(b.malloc(30 * MiB, stream=0))     # 40 MiB mapped, all free
    # stream 1: own segment, mapping 40 MiB -> 80 > 64 fails; release_cached_blocks unmaps
    # stream 0's 40 MiB; retry maps stream 1's 2 pages.
    b.malloc(30 * MiB, stream=1)
    assert (b.allocated, b.reserved, b.max_reserved, b.num_alloc_retries) == (
        30 * MiB, 40 * MiB, 40 * MiB, 1)


def test_allowed_bytes_checks_the_allocation_size():
    # set_per_process_memory_fraction: reserved + alloc_size must stay <= allowed, checked
    # with get_allocation_size even for expandable segments (20 MiB for a 3 MiB request).
    with pytest.raises(OutOfMemory):
        replay([("alloc", "a", 3 * MiB)], AllocatorConfig(allowed_bytes=16 * MiB))
    with pytest.raises(OutOfMemory):
        replay([("alloc", "a", 3 * MiB)],
               AllocatorConfig(expandable_segments=True, allowed_bytes=16 * MiB))
    s = replay([("alloc", "a", 3 * MiB)], AllocatorConfig(allowed_bytes=20 * MiB))
    assert s.reserved == 20 * MiB


def test_replay_errors():
    with pytest.raises(ValueError):
        replay([("alloc", "a", 1), ("alloc", "a", 1)])
    with pytest.raises(KeyError):
        replay([("free", "nope")])
    with pytest.raises(ValueError):
        replay([("defrag",)])


# ---------------------------------------------------------------- invariants
def _check(a: CachingAllocator, live: dict):
    """Invariants of the model, from its public counters and its block lists."""
    sizes = {h: a.block_size(h) for h in live}
    assert a.allocated == sum(sizes.values())
    assert a.requested == sum(live.values())
    for h, n in live.items():
        assert sizes[h] >= (round_size(n, a.config) if n else 0)
    assert 0 <= a.allocated <= a.reserved
    assert a.max_allocated >= a.allocated and a.max_reserved >= a.reserved
    snap = a.snapshot()
    assert sum(s["total_size"] for s in snap) == a.reserved
    assert sum(s["allocated_size"] for s in snap) == a.allocated
    if a.config.capacity_bytes is not None:
        assert a.reserved <= a.config.capacity_bytes
    # every chain is address-contiguous and no two free mapped neighbours are left unmerged
    for pool in a._pools.values():
        assert pool.keys == sorted(pool.keys) and len(pool.keys) == len(pool.blocks)
        for key, b in zip(pool.keys, pool.blocks):
            assert key == b.size << ADDR_BITS | b.addr  # each key its block's (size, address)
            assert not b.allocated and b.mapped
            for nb in (b.prev, b.next):
                assert nb is None or nb.allocated or not nb.mapped
            if b.next is not None:
                assert b.addr + b.size == b.next.addr
            if b.prev is not None:
                assert b.prev.addr + b.prev.size == b.addr


sizes = st.one_of(
    st.integers(0, 4096), st.integers(1, MiB), st.integers(MiB, 10 * MiB),
    st.integers(10 * MiB, 120 * MiB), st.sampled_from([MiB, 2 * MiB, 20 * MiB, 512, 513]))
ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), sizes, st.integers(0, 1)),
    st.tuples(st.just("free"), st.integers(0, 10**6)),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("reset_peak"))), max_size=60)
configs = st.builds(
    AllocatorConfig,
    max_split_size=st.sampled_from([None, 20 * MiB, 64 * MiB]),
    expandable_segments=st.booleans(),
    roundup_power2_divisions=st.sampled_from([None, 2, 4, 8]),
    capacity_bytes=st.sampled_from([None, 200 * MiB, 1024 * MiB]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, ops)
def test_random_sequences_keep_the_invariants(cfg, seq):
    a = CachingAllocator(cfg)
    live: dict[int, int] = {}
    for op in seq:
        if op[0] == "alloc":
            try:
                live[a.malloc(op[1], op[2])] = op[1]
            except OutOfMemory as e:
                assert cfg.capacity_bytes is not None and e.requested == op[1]
        elif op[0] == "free" and live:
            h = list(live)[op[1] % len(live)]
            a.free(h)
            del live[h]
        elif op[0] == "empty_cache":
            a.empty_cache()
        elif op[0] == "reset_peak":
            a.reset_peak()
            assert (a.max_allocated, a.max_reserved) == (a.allocated, a.reserved)
        _check(a, live)
    for h in list(live):
        a.free(h)
        del live[h]
    _check(a, live)
    assert a.allocated == 0 and a.requested == 0
    a.empty_cache()
    assert a.reserved == 0 and a.segments == 0 and a.snapshot() == []
