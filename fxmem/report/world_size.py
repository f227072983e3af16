"""The fewest GPUs under FSDP2: the world-size search of :func:`fxmem.report.fit.fit`'s
"fewest GPUs" way, on plain callables (each world size's analysis is the caller's), and the
line ``a + s / w`` through the needs it saw.

>>> fewest(lambda w: 80 + 160 / w <= 100, 2, need=lambda w: 80 + 160 / w, budget=100)
8
"""

from __future__ import annotations

from .text import fmt_bytes

MAX_WORLD_SIZE = 1024  # the FSDP2 search stops here


def towards(seen: list, by: str) -> str:
    """Why the world-size search stopped, from the (w, need, floor) points it saw, the floor
    as ``fxmem.report.fit._Check.floor`` gives it ``by``."""
    if not seen or seen[-1][0] >= MAX_WORLD_SIZE:
        return f"not even {MAX_WORLD_SIZE} GPUs do"
    line = through([seen[0][::2], seen[-1][::2]]) if len(seen) >= 2 else None
    what = "a rank's live bytes" if by == "live" else "a rank's max_memory_allocated()"
    if line is None:
        return f"more GPUs do not lower {what}"
    w1, w2 = seen[0][0], seen[-1][0]
    return (f"{what} fall towards {fmt_bytes(max(int(line[0]), 0))} as GPUs are "
            f"added (a + s / w through {w1} and {w2} GPUs)")


def fewest(fits, lo: int, hi: int = MAX_WORLD_SIZE, need=None, budget: int | None = None,
           seen: list | None = None, floor=None, guess: int | None = None) -> int | None:
    """The smallest w in [lo, hi] with ``fits(w)``, or None, for a ``fits`` that holds from
    some w on. ``need(w)`` (bytes; with ``budget``): a rank's need, which FSDP2 makes about
    ``a + s / w`` (the shards, their gradients and optimizer state, and the optimizer's
    temporaries shrink as ``s / w``; activations and gathered blocks do not): after two
    world sizes that do not fit, the next one tried is where the line through the last two
    meets the budget (or, where their need does not fall, the line through the first and the
    last); once one fits, where the floor (below) on the line through it and the last that
    did not meets the budget is one more guess (else halfway), and its neighbour below
    confirms it, so a search costs about five analyses, not a doubling's dozen.
    ``floor(w)`` (default: ``need``): bytes no step on w GPUs runs under (the live peak;
    ``fxmem.report.fit._Check.floor`` on CUDA: the allocator's ``max_memory_allocated()``,
    where ``need`` is its ``max_memory_reserved()`` with no limit, which a step within a
    budget may undercut): when the line through the first and the last floor has its limit ``a`` at or
    over the budget, or the floor does not fall, no w is tried more.

    Padded shards make a rank's need rise a little from some w to the next (``ceil(rows /
    w)`` rows, gathered as ``w`` times that), so near the budget ``fits`` may hold at w and
    fail at w + 1: the w returned fits and w - 1 does not, both checked. ``seen``: a list
    the (w, need, floor) points that did not fit are added to. ``guess``: tried first; when
    it fits and one fewer does not, the answer in two analyses."""
    seen = [] if seen is None else seen
    if guess is not None and lo < guess <= hi:
        if fits(guess):
            if not fits(guess - 1):
                return guess
            hi = guess - 1
        else:
            if need is not None:
                seen.append((guess, need(guess), (floor or need)(guess)))
            lo = guess + 1
    if lo > hi:
        return None
    bad, w = lo - 1, lo  # nothing up to ``bad`` fits
    while not fits(w):
        if w >= hi:
            return None
        bad = w
        if need is not None:
            n = need(w)
            seen.append((w, n, n if floor is None else floor(w)))
        if budget is not None and len(seen) >= 2:
            low = through([seen[0][::2], seen[-1][::2]])
            if low is None or low[0] >= budget:
                return None  # more GPUs cannot bring it under the budget
        aim = secant(through([p[:2] for p in seen[-2:]]), budget) or \
            secant(through([seen[0][:2], seen[-1][:2]]) if len(seen) >= 2 else None, budget) \
            or 2 * w
        w = min(max(aim, w + 1), hi)
    if w - 1 > bad:  # one guess: where the floor on the line through the last w that did
        g = None  # not fit and this one meets the budget (no w below fits; at w: w's
        # neighbour, which confirms a guess that met the line), else halfway
        if budget is not None and seen and seen[-1][0] == bad:
            g = secant(through([seen[-1][::2], (w, (floor or need)(w))]), budget)
        g = (bad + w) // 2 if g is None else min(max(g, bad + 1), w - 1)
        if not fits(g):
            bad = g
        elif g - 1 == bad or not fits(g - 1):
            return g
        else:
            w = g - 1
    lo = bad + 1
    while lo < w:  # fits(w); nothing below lo fits
        mid = (lo + w) // 2
        lo, w = (lo, mid) if fits(mid) else (mid + 1, w)
    return w


def through(seen) -> tuple | None:
    """``(a, s)`` of the line ``a + s / w`` through two (w, need) points, or None (fewer
    points, or a need that does not fall as w grows)."""
    if len(seen) < 2:
        return None
    (w1, n1), (w2, n2) = seen
    s = (n1 - n2) * w1 * w2 / (w2 - w1)
    return None if s <= 0 else (n2 - s / w2, s)


def secant(line, budget) -> int | None:
    """Where ``line`` (:func:`through`) meets ``budget``, or None."""
    if line is None or budget is None or line[0] >= budget:
        return None
    a, s = line
    return int(-(-s // (budget - a)))
