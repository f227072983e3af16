"""fxmem.formula.prune: dropping live totals that are never the peak, over B and named dims. The
kept rows' maximum must equal all rows' maximum at every point of the domain."""

import itertools

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fxmem.formula.prune import prune_rows
from fxmem.formula.symbols import B, L

SIZES = [B * L, B * L**2, L, sympy.Integer(1), 512 * sympy.ceiling(3 * B * L / 512),
         512 * sympy.ceiling((B * L**2 + 7) / 512), sympy.floor(B * L / 3),
         # a CUDA kernel's temporary that depends on a branch (fxmem.trace.kernels.cuda.workspaces)
         sympy.Piecewise((8 * B * L, B * L > 20), (0, True)),
         3 * sympy.Min(50, sympy.floor(B * L / 2))]


def _value(sizes, row, b, n):
    return sum(c * int(s.xreplace({B: b, L: n})) for s, c in zip(sizes, row))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=len(SIZES), max_size=len(SIZES)),
                min_size=1, max_size=9),
       st.integers(1, 3), st.integers(1, 3))
def test_the_maximum_is_unchanged_everywhere(rows, low_b, low_l):
    keep = prune_rows(SIZES, rows, {B: low_b, L: low_l})
    assert keep and keep == sorted(set(keep))
    points = itertools.product(range(low_b, low_b + 9), [low_l, low_l + 1, 5, 17, 64, 300])
    for b, n in points:
        if n < low_l:
            continue
        values = [_value(SIZES, r, b, n) for r in rows]
        assert max(values[i] for i in keep) == max(values)


def test_one_row_or_a_mix_of_two_bounds_it():
    sizes = [B * L, sympy.Integer(1)]
    # 7BL+50 <= 0.4*10BL + 0.6*(5BL+100); 7BL+70 is above both at BL = 20 (210 > 200)
    assert prune_rows(sizes, [[10, 0], [5, 100], [7, 50], [7, 70]], {B: 1, L: 1}) == [0, 1, 3]
    assert prune_rows(sizes, [[10, 0], [9, 0], [10, 0]], {B: 1, L: 1}) == [0]  # ties: first
    # the bounds matter: 3BL vs BL + 8 is decided only from B*L >= 4
    assert prune_rows(sizes, [[3, 0], [1, 8]], {B: 1, L: 1}) == [0, 1]
    assert prune_rows(sizes, [[3, 0], [1, 8]], {B: 2, L: 2}) == [0]
    # sums past 64-bit integers stay exact (Python integers)
    big = [2**40 * B, sympy.Integer(1)]
    assert prune_rows(big, [[2**30, 0], [1, 2**45]], {B: 1}) == [0]
    assert prune_rows(big, [[2**30, 0], [1, 2**71]], {B: 1}) == [0, 1]


def test_rounding_is_bounded_not_ignored():
    c = 512 * sympy.ceiling(B * L / 512)  # between B*L and B*L + 511
    sizes = [c, B * L, sympy.Integer(1)]
    assert prune_rows(sizes, [[1, 0, 0], [0, 1, 511]], {B: 1, L: 1}) == [1]
    assert prune_rows(sizes, [[1, 0, 0], [0, 1, 510]], {B: 1, L: 1}) == [0, 1]
    # a size with no polynomial bound is only known to be >= 0
    odd = sympy.Mod(B, 7)
    assert prune_rows([odd, sympy.Integer(1)], [[1, 0], [0, 6]], {B: 1}) == [0, 1]
    assert prune_rows([odd, sympy.Integer(1)], [[1, 5], [0, 1]], {B: 1}) == [0]


def test_rounded_sizes_mixed_before_they_are_bounded():
    """7BL-ish midway between two rows, with a rounded mask (768 BL bytes rounded to 512) held
    1, 2 and 0 times: the exact mix at lam = 1/2 holds no mask, so no rounding slack."""
    mask = 512 * sympy.ceiling(3 * B * L / 2)
    rows = [[10, 2, 0], [5, 1, 5000], [0, 0, 10000]]
    assert prune_rows([B * L, mask, sympy.Integer(1)], rows, {B: 1, L: 1}) == [0, 2]


def test_a_branching_size_is_bounded_by_its_branches():
    ws = sympy.Piecewise((8 * B * L, B * L > 3072), (0, True))
    # 8BL >= the workspace everywhere; the workspace alone bounds nothing
    assert prune_rows([ws, B * L], [[1, 0], [0, 8]], {B: 1, L: 1}) == [1]
    assert prune_rows([ws, B * L], [[1, 0], [0, 7]], {B: 1, L: 1}) == [0, 1]


def _every_pair(sizes, rows, lows) -> list:
    """prune_rows as it was written first: every row against every other, then the mixes."""
    import numpy as np

    from fxmem.formula import prune as P

    rows = np.array(rows, dtype=object).reshape(len(rows), len(sizes))
    lo, hi, unbounded = P._bound_matrices(sizes, lows)
    n = len(rows)
    dominated = np.zeros((n, n), dtype=bool)
    for i in range(n):
        bounds, bad = P._difference_bounds(rows - rows[i], lo, hi, unbounded)
        dominated[i] = (bounds >= 0).all(axis=1) & ~bad
        dominated[i, i] = False
    alive = [i for i in range(n)
             if not any(dominated[i, j] and not (dominated[j, i] and i < j) for j in range(n))]
    for i in list(alive):
        others = [j for j in alive if j != i]
        if len(others) < 2:
            continue
        diff = rows[others] - rows[i]
        bounds, bad = P._difference_bounds(diff, lo, hi, unbounded)
        if P._pair_bounds(bounds[~bad].tolist()) or P._exact_pair(diff, lo, hi, unbounded):
            alive.remove(i)
    return alive


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=len(SIZES), max_size=len(SIZES)),
                min_size=1, max_size=5),
       st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 3))
def test_the_rows_kept_are_those_every_pair_keeps(pool, picks, low):
    """Rows tried against the few above them at sample points, the highest first, keep what
    trying every pair kept (rows repeated: of equal rows the first stays)."""
    rows = [pool[k % len(pool)] for k in picks]
    lows = {B: low, L: 1}
    assert prune_rows(SIZES, rows, lows) == _every_pair(SIZES, rows, lows)
