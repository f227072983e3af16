"""The largest integer where a monotone condition holds: the search behind every "largest B
that fits" (``Report.max_batch_size``, ``max_length``, the chooser's)."""

from __future__ import annotations

from ..errors import FxmemError


def largest(fits, lo: int, limit: int | None = None, advance=None) -> int:
    """The largest integer B >= ``lo`` with ``fits(B)``, for ``fits`` true at ``lo`` and false
    from some B on: doubling until it fails, then bisection. ``limit``: give up (FxmemError)
    once a fitting B passes it. ``advance(b)``: for a B that fits, a B at least as large
    known to fit without asking ``fits``, from where the search goes on.

    >>> largest(lambda b: b * b <= 1000, 1)
    31
    >>> largest(lambda b: b * b <= 1000, 1, advance=lambda b: max(b, 30))
    31
    """
    step = (lambda b: b) if advance is None else advance
    hi = lo
    while fits(hi):  # grow until it no longer fits
        lo = step(hi)
        hi = lo * 2
        if limit is not None and lo > limit:
            raise FxmemError("the peak does not grow with B, so every batch size fits")
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (step(mid), hi) if fits(mid) else (lo, mid)
    return lo
