"""The caching allocator's configuration and size rounding (torch 2.11 – 2.13): the
``PYTORCH_ALLOC_CONF`` options, the constants, and the size of a block and of a segment
for a request, as ``c10/core/AllocatorConfig.{h,cpp}`` and ``CUDACachingAllocator.cpp``
define them (:mod:`fxmem.device.caching_allocator` replays the allocator with them).

>>> round_size(1), round_size(1_500_000), get_allocation_size(1_500_160)
(512, 1500160, 20971520)

Constants (``c10/core/AllocatorConfig.h`` in 2.13): ``kMinBlockSize = 512``,
``kSmallSize = 1 MiB``, ``kSmallBuffer = 2 MiB``, ``kMinLargeAlloc = 10 MiB``,
``kRoundLarge = 2 MiB``, ``kLargeBuffer`` = ``large_segment_size()`` = 20 MiB by default
(``large_segment_size_mb``; ``AllocatorConfig.large_segment_size`` here).

Rules
-----

1. ``round_size``: a request under 512 B becomes 512 B; otherwise, if
   ``roundup_power2_divisions(size) = d > 1`` and ``size > 512 * d``, it is rounded up by
   ``roundup_power2_next_division`` (the power-of-two interval [2^k, 2^(k+1)) is cut into
   ``d`` equal steps; a power of two stays as is); else it is rounded up to a multiple of
   512 B. ``roundup_power2_divisions(size)`` indexes a 16-entry table by
   ``max(0, floor(log2 size) - 20)`` capped at 15 (intervals start at 1 MiB, end at 64 GiB;
   sizes under 1 MiB use entry 0). Default: all 0 (no power-of-two rounding). A request of
   0 B gets no block (``NativeCachingAllocator::allocate`` returns a null pointer).
2. ``get_allocation_size`` (the size of a new segment, one cudaMalloc): ``kSmallBuffer``
   (2 MiB) for a small request, ``kLargeBuffer`` (20 MiB) for a request < ``kMinLargeAlloc``
   (10 MiB), else the request rounded up to a multiple of ``kRoundLarge`` (2 MiB).
   ``alloc_block`` cudaMallocs it; segments are never shared between pools or streams.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20

KMIN_BLOCK_SIZE = 512  # kMinBlockSize: every block is a multiple of 512 B
KSMALL_SIZE = MiB  # kSmallSize: largest request served by the small pool
KSMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segment / expandable page size
KLARGE_BUFFER = 20 * MiB  # kLargeBuffer: default large_segment_size
KMIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: below it a large request gets a 20 MiB segment
KROUND_LARGE = 2 * MiB  # kRoundLarge: larger requests get a segment rounded to 2 MiB
_ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB
_NO_CAPACITY_VA = 1 << 48  # virtual size of an expandable segment without a capacity


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class AllocatorConfig:
    """``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` options plus the device limit.

    All sizes in bytes.

    ``max_split_size``: ``max_split_size_mb`` (None = unlimited, torch's default).
    ``max_non_split_rounding``: ``max_non_split_rounding_mb`` (None = ``large_segment_size``).
    Both must be whole MiB >= ``large_segment_size``, which must be whole MiB > 10 MiB
    (torch's parse checks). ``expandable_segments``: ``expandable_segments:True``.
    ``roundup_power2_divisions``: one int for every interval or 16 ints, one per power-of-two
    interval from [1 MiB, 2 MiB) to [32 GiB, ∞) (0 or 1 = plain 512 B rounding; others must
    be powers of two). ``large_segment_size``: ``large_segment_size_mb`` (20 MiB).
    ``capacity_bytes``: device memory the allocator may cudaMalloc/map (None = unlimited).
    ``allowed_bytes``: ``torch.cuda.set_per_process_memory_fraction`` limit
    (``allowed_memory_maximum``; None = not set).
    """

    max_split_size: int | None = None
    max_non_split_rounding: int | None = None
    expandable_segments: bool = False
    roundup_power2_divisions: int | tuple[int, ...] | None = None
    large_segment_size: int = KLARGE_BUFFER
    capacity_bytes: int | None = None
    allowed_bytes: int | None = None

    def __post_init__(self):
        # the checks of AcceleratorAllocatorConfig::parse{LargeSegmentSize,MaxSplitSize,
        # MaxNonSplitRoundingSize}: options are whole MiB, the large segment > 10 MiB, and
        # both split limits >= the large segment size.
        seg = self.large_segment_size
        if seg <= KMIN_LARGE_ALLOC or seg % MiB:
            raise ValueError("large_segment_size must be a whole number of MiB > 10 MiB")
        for name in ("max_split_size", "max_non_split_rounding"):
            v = getattr(self, name)
            if v is not None and (v < seg or v % MiB):
                raise ValueError(f"{name} must be a whole number of MiB >= large_segment_size "
                                 f"({seg} B), as torch requires")
        d = self.roundup_power2_divisions
        if d is None:
            table = (0,) * _ROUNDUP_INTERVALS
        elif isinstance(d, int):
            table = (d,) * _ROUNDUP_INTERVALS
        else:
            table = tuple(int(v) for v in d)
            if len(table) != _ROUNDUP_INTERVALS:
                raise ValueError("roundup_power2_divisions needs one int or 16 ints")
        if any(v != 0 and not _is_pow2(v) for v in table):
            raise ValueError("roundup_power2_divisions must be 0 or powers of two")
        object.__setattr__(self, "roundup_power2_divisions", table)
        for name in ("capacity_bytes", "allowed_bytes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def split_limit(self) -> float:
        """``max_split_size`` in bytes, infinity when unlimited."""
        return float("inf") if self.max_split_size is None else self.max_split_size

    @property
    def non_split_rounding(self) -> int:
        """Effective ``max_non_split_rounding`` in bytes."""
        if self.max_non_split_rounding is None:
            return self.large_segment_size
        return self.max_non_split_rounding

    @classmethod
    def from_string(cls, conf: str, *, capacity_bytes: int | None = None,
                    allowed_bytes: int | None = None) -> "AllocatorConfig":
        """Parse a ``PYTORCH_ALLOC_CONF`` string (``AcceleratorAllocatorConfig::parseArgs``).

        Understood keys: ``max_split_size_mb``, ``max_non_split_rounding_mb``,
        ``expandable_segments``, ``roundup_power2_divisions`` (``N`` or ``[256:4,>:1]``,
        boundaries in MiB), ``large_segment_size_mb``. Other known keys (``backend``,
        ``garbage_collection_threshold``, ``release_lock_on_cudamalloc``, ``pinned_*``) are
        ignored; unknown keys raise ``ValueError``.

        >>> c = AllocatorConfig.from_string("expandable_segments:True,max_split_size_mb:256")
        >>> c.expandable_segments, c.max_split_size
        (True, 268435456)
        >>> c = AllocatorConfig.from_string("roundup_power2_divisions:[2:4,>:8]")
        >>> c.roundup_power2_divisions[:3]   # [1, 2) MiB and [2, 4) MiB: 4; above: 8
        (4, 4, 8)
        """
        toks: list[str] = []
        buf = ""
        for ch in conf:
            if ch in ",:[]":
                if buf:
                    toks.append(buf)
                    buf = ""
                toks.append(ch)
            elif ch != " ":
                buf += ch
        if buf:
            toks.append(buf)
        kw: dict = {}
        ignored = {"backend", "garbage_collection_threshold", "release_lock_on_cudamalloc",
                   "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
                   "pinned_use_hip_host_register", "pinned_num_register_threads",
                   "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
                   "graph_capture_record_stream_reuse", "per_process_memory_fraction",
                   "pinned_max_round_threshold", "pinned_max_cached_size"}

        def expect(i: int, tok: str) -> None:
            if i >= len(toks) or toks[i] != tok:
                raise ValueError(f"allocator config {conf!r}: expected {tok!r}")

        i = 0
        while i < len(toks):
            key = toks[i]
            expect(i + 1, ":")
            i += 2
            if key == "roundup_power2_divisions":
                table = [0] * _ROUNDUP_INTERVALS
                if toks[i] == "[":
                    first, last = True, 0
                    i += 1
                    while toks[i] != "]":
                        bound = toks[i]
                        expect(i + 1, ":")
                        val = int(toks[i + 2])
                        i += 3
                        if bound == ">":
                            for j in range(last + 1, _ROUNDUP_INTERVALS):
                                table[j] = val
                        else:
                            b = int(bound)
                            if not _is_pow2(b):
                                raise ValueError("roundup intervals must be powers of two")
                            idx = min(b.bit_length() - 1, _ROUNDUP_INTERVALS - 1)
                            if first:
                                for j in range(idx):
                                    table[j] = val
                                first = False
                            table[idx] = val
                            last = idx
                        if toks[i] == ",":
                            i += 1
                    kw["roundup_power2_divisions"] = tuple(table)
                else:
                    kw["roundup_power2_divisions"] = int(toks[i])
            else:
                val = toks[i]
                if key == "max_split_size_mb":
                    kw["max_split_size"] = int(val) * MiB
                elif key == "max_non_split_rounding_mb":
                    kw["max_non_split_rounding"] = int(val) * MiB
                elif key == "large_segment_size_mb":
                    kw["large_segment_size"] = int(val) * MiB
                elif key == "expandable_segments":
                    if val.lower() not in ("true", "false"):
                        raise ValueError("expandable_segments expects True or False")
                    kw["expandable_segments"] = val.lower() == "true"
                elif key not in ignored:
                    raise ValueError(f"unknown allocator option {key!r}")
            i += 1
            if i < len(toks):
                expect(i, ",")
                i += 1
        return cls(capacity_bytes=capacity_bytes, allowed_bytes=allowed_bytes, **kw)


DEFAULT_CONFIG = AllocatorConfig()


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: round ``size`` (B) up to the next 1/divisions step
    of its power-of-two interval."""
    if _is_pow2(size):
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(nbytes: int, config: AllocatorConfig = DEFAULT_CONFIG) -> int:
    """The block size (bytes) torch's ``round_size`` gives a request of ``nbytes`` bytes.

    >>> round_size(1), round_size(513), round_size(1200 * 1024)
    (512, 1024, 1228800)
    >>> round_size(1200 * 1024, AllocatorConfig(roundup_power2_divisions=4))   # 1.25 MiB
    1310720
    """
    if nbytes < KMIN_BLOCK_SIZE:
        return KMIN_BLOCK_SIZE
    table = config.roundup_power2_divisions
    idx = nbytes.bit_length() - 21  # floor(log2) - log2(1 MiB)
    d = table[0 if idx < 0 else (idx if idx < _ROUNDUP_INTERVALS else _ROUNDUP_INTERVALS - 1)]
    if d > 1 and nbytes > KMIN_BLOCK_SIZE * d:
        return _roundup_power2_next_division(nbytes, d)
    return -(-nbytes // KMIN_BLOCK_SIZE) * KMIN_BLOCK_SIZE


def get_allocation_size(size: int, config: AllocatorConfig = DEFAULT_CONFIG) -> int:
    """Size in bytes of the segment cudaMalloc'd for a rounded request of ``size`` bytes.

    >>> get_allocation_size(512), get_allocation_size(3 * 2**20), get_allocation_size(11 * 2**20)
    (2097152, 20971520, 12582912)
    """
    if size <= KSMALL_SIZE:
        return KSMALL_BUFFER
    if size < KMIN_LARGE_ALLOC:
        return config.large_segment_size
    return -(-size // KROUND_LARGE) * KROUND_LARGE
