"""The world-size search on plain callables (:func:`fewest`): the smallest world size that
fits, searched from guesses and from the line ``a + s / w`` through the needs it saw
(:func:`through`, :func:`secant`), and why it stopped where none does (:func:`towards`).
:func:`fxmem.report.world_size.fewest_ranks` searches FSDP2's fewest GPUs with it.

>>> fewest(lambda w: 80 + 160 / w <= 100, 2, need=lambda w: 80 + 160 / w, budget=100)
8
"""

from __future__ import annotations

from .text import fmt_bytes

MAX_WORLD_SIZE = 1024  # the FSDP2 search stops here


def towards(seen: list, by: str) -> str:
    """Why the world-size search stopped, from the (w, need, floor) points it saw, the floor
    as ``fxmem.report.ways.Check.floor`` gives it ``by``.

    >>> towards([(2, 100, 90), (1024, 95, 60)], "live")
    'not even 1024 GPUs do (a rank needs 95 B there)'
    """
    if not seen:
        return f"not even {MAX_WORLD_SIZE} GPUs do"
    if seen[-1][0] >= MAX_WORLD_SIZE:
        return f"not even {MAX_WORLD_SIZE} GPUs do (a rank needs {fmt_bytes(seen[-1][1])} there)"
    line = through([seen[0][::2], seen[-1][::2]]) if len(seen) >= 2 else None
    what = "a rank's live bytes" if by == "live" else "a rank's max_memory_allocated()"
    if line is None:
        return f"more GPUs do not lower {what}"
    w1, w2 = seen[0][0], seen[-1][0]
    return (f"{what} fall towards {fmt_bytes(max(int(line[0]), 0))} as GPUs are "
            f"added (a + s / w through {w1} and {w2} GPUs)")


def fewest(fits, lo: int, hi: int = MAX_WORLD_SIZE, need=None, budget: int | None = None,
           seen: list | None = None, floor=None, guess: int | None = None,
           fork: bool = False, every=None) -> int | None:
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
    ``fxmem.report.ways.Check.floor`` on CUDA: the allocator's ``max_memory_allocated()``,
    where ``need`` is its ``max_memory_reserved()`` with no limit, which a step within a
    budget may undercut): when the line through the first and the last floor has its limit
    ``a`` at or over the budget, or the floor does not fall, no w is tried more.

    Padded shards make a rank's need rise a little from some w to the next (``ceil(rows /
    w)`` rows, gathered as ``w`` times that), so near the budget ``fits`` may hold at w and
    fail at w + 1: the w returned fits and w - 1 does not, both checked. ``seen``: a list
    the (w, need, floor) points that did not fit are added to (given with one, e.g. the
    world size asked, the lines start from it). ``guess``: tried first (at most ``hi``;
    given none, twice the last w ``seen`` when there is one); when it fits and one fewer
    does not, the answer in two analyses; when it does not, the lines through ``seen`` say
    where to go on, or that no w will fit. ``fork``: where a w and its neighbour below are
    both asked (a guess, and the w confirming it), the neighbour is searched in a forked
    child while w's plan is traced (:func:`_and_below`).

    ``every(w)``: what must hold too at the answer, too costly to ask of every w tried (a
    world size's other groups of ranks, each traced, where ``fits`` reads rank 0's,
    derived): asked only of a w about to be answered (where its neighbour below is searched
    too, while that is); where it does not hold, the answer is the next w up for which both
    do (each w below it having failed one or the other).

    >>> fewest(lambda w: w >= 3, 1, 10, every=lambda w: w >= 5)
    5
    """
    seen = [] if seen is None else seen
    known: dict = {}  # w -> fits(w): an answer the child gave is not searched again here
    held: dict = {}  # w -> every(w)
    asked = fits

    def fits(w):
        if w not in known:
            known[w] = bool(asked(w))
        return known[w]

    def holds(w):
        if w not in held:
            held[w] = every is None or bool(every(w))
        return held[w]

    def point(w):  # (w, need, floor) of a w that does not fit: the lines' points
        n = need(w)
        return w, n, n if floor is None else floor(w)

    def answer(w):  # w fits: it, or the first w above it that fits and holds every
        while not holds(w):
            w += 1
            while w <= hi and not fits(w):
                w += 1
            if w > hi:
                return None
        return w
    if guess is None and seen:
        guess = 2 * seen[-1][0]
    guess = None if guess is None else min(guess, hi)
    if guess is not None and lo < guess:
        ok, below = _and_below(fits, guess, True, known, fork, holds)
        if ok:
            if not below:
                return answer(guess)
            hi = guess - 1
        else:
            if need is not None:
                seen.append(point(guess))
            lo = guess + 1
            if _beyond(seen, budget):
                return None
    if lo > hi:
        return None
    bad, w = lo - 1, lo  # nothing up to ``bad`` fits
    if need is not None and len(seen) >= 2:  # a line already (a guess that did not fit)
        w = min(max(_aim(seen, budget, bad), lo), hi)
    while not fits(w):
        if w >= hi:
            if need is not None and w >= MAX_WORLD_SIZE:  # the search's end, tried: its
                seen.append(point(w))  # point kept, which says so (:func:`towards`)
            return None
        bad = w
        if need is not None:
            seen.append(point(w))
        if _beyond(seen, budget):
            return None
        w = min(max(_aim(seen, budget, w), w + 1), hi)
    if w - 1 > bad:  # one guess: where the floor on the line through the last w that did
        g = None  # not fit and this one meets the budget (no w below fits; at w: w's
        # neighbour, which confirms a guess that met the line), else halfway
        if budget is not None and seen and seen[-1][0] == bad:
            g = secant(through([seen[-1][::2], (w, (floor or need)(w))]), budget)
        g = (bad + w) // 2 if g is None else min(max(g, bad + 1), w - 1)
        ok, below = _and_below(fits, g, g - 1 != bad, known, fork, holds)
        if not ok:
            bad = g
        elif g - 1 == bad or not below:
            return answer(g)
        else:
            w = g - 1
    lo = bad + 1
    while lo < w:  # fits(w); nothing below lo fits
        mid = (lo + w) // 2
        lo, w = (lo, mid) if fits(mid) else (mid + 1, w)
    return answer(w)


def _aim(seen: list, budget: int | None, w: int) -> int:
    """The next world size to try after ``w`` did not fit: where the line through the needs
    of the last two ``seen`` meets the budget, or of the first and the last; where the need
    falls towards a limit at or over the budget on both (its floor's line does not: else
    :func:`_beyond` has stopped the search, the need alone saying nothing, as a step within
    a budget may need less than its replay with none), the most the search tries
    (:data:`MAX_WORLD_SIZE`: if even that does not fit, none does; Qwen2.5-3B at B=8,
    L=4,096 with a plan had been tried on 8, 16, ... 1,024 GPUs, a walk over its plans
    each), else ``2 * w``.

    >>> [_aim([(2, 100), (4, n)], 70, 4) for n in (80, 96, 100)]
    [8, 1024, 8]
    """
    lines = [through([p[:2] for p in seen[-2:]]),
             through([seen[0][:2], seen[-1][:2]]) if len(seen) >= 2 else None]
    for line in lines:
        if (got := secant(line, budget)) is not None:
            return got
    if budget is not None and any(lines) and all(line is None or line[0] >= budget
                                                 for line in lines):
        return MAX_WORLD_SIZE
    return 2 * w


def _beyond(seen: list, budget: int | None) -> bool:
    """More GPUs cannot bring the need under ``budget``: the line through the floors of the
    first and the last world size ``seen`` (that did not fit) has its limit ``a`` at or over
    it, or the floor does not fall."""
    if budget is None or len(seen) < 2:
        return False
    low = through([seen[0][::2], seen[-1][::2]])
    return low is None or low[0] >= budget


def through(seen) -> tuple | None:
    """``(a, s)`` of the line ``a + s / w`` through two (w, need) points, or None (fewer
    points, or a need that does not fall as w grows)."""
    if len(seen) < 2:
        return None
    (w1, n1), (w2, n2) = seen
    s = (n1 - n2) * w1 * w2 / (w2 - w1)
    return None if s <= 0 else (n2 - s / w2, s)


def _and_below(fits, w: int, below: bool, known: dict, fork: bool, holds=None) -> tuple:
    """``(fits(w), fits(w - 1))``, the second asked where the first holds and ``below``
    (else None), and kept in ``known``; where the first holds, ``holds(w)`` asked too
    (:func:`fewest`'s ``every``: w may be the answer). ``fork``: ``fits(w - 1)`` made in
    a child forked as the first foreground block of ``fits(w)`` or ``holds(w)`` begins (a
    plan traced: :func:`fxmem.report.forked.meanwhile`), so the two searches share the
    machine's cores; where no such block begins, after them here.

    >>> _and_below(lambda w: w >= 4, 4, True, {}, False)
    (True, False)
    """
    from .forked import meanwhile

    if not below or w - 1 in known:
        ok = fits(w)
        under = fits(w - 1) if ok and below else None
        if ok and not under and holds is not None:
            holds(w)
        return ok, under
    with meanwhile(lambda: fits(w - 1), fork) as under:
        if not fits(w):
            return False, None
        if holds is not None:
            holds(w)
        known[w - 1] = bool(under.result())
        return True, known[w - 1]


def secant(line, budget) -> int | None:
    """Where ``line`` (:func:`through`) meets ``budget``, or None."""
    if line is None or budget is None or line[0] >= budget:
        return None
    a, s = line
    return int(-(-s // (budget - a)))
