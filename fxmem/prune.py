"""Which live totals can be the peak: proofs over B and the named dims.

The peak in B and, say, L is the ``Max`` of the live totals after the ops that can be the
maximum. Each total is a row of counts over distinct storage sizes (``sum_k count_k *
size_k``). :func:`prune_rows` drops the rows that are proved never above the others on the
whole domain where the trace holds (every symbol an integer at or above its lower bound):

- each symbol is written as its bound plus a non-negative ``t``; a polynomial in the ``t``
  with no negative coefficient is then >= 0;
- a ``ceiling(p/q)`` is bounded by ``p/q`` below and ``(p + q - 1)/q`` above (``floor``
  likewise), so CUDA's 512-byte rounding is handled; sizes the two rows share cancel exactly;
- row ``i`` is dropped when one other row, or a convex combination ``lam*j + (1-lam)*k`` of
  two others, bounds it that way: then ``row_i <= max(row_j, row_k)`` everywhere.

The proof is sufficient, not necessary: a row it cannot drop stays, so the ``Max`` is exact
and may keep a term that is never the maximum. Pure numpy and sympy, exact integers.

>>> import sympy
>>> from fxmem.symbols import B, L
>>> sizes = [B * L, sympy.Integer(1)]
>>> rows = [[10, 0], [5, 100], [7, 50], [7, 70]]   # 10BL, 5BL+100, 7BL+50, 7BL+70
>>> prune_rows(sizes, rows, {B: 1, L: 1})            # 7BL+50 <= max(10BL, 5BL+100)
[0, 1, 3]
"""

from __future__ import annotations

from fractions import Fraction
from math import lcm

import numpy as np
import sympy

from .guards import shifted


def prune_rows(sizes, rows, lows: dict) -> list:
    """Indices of the ``rows`` (counts over ``sizes``) that are kept: every dropped row is
    proved at most the maximum of the kept ones wherever each symbol ``x`` is an integer
    ``>= lows[x]``. Of rows equal everywhere, the first is kept."""
    rows = np.array(rows, dtype=object).reshape(len(rows), len(sizes))
    lo, hi, unbounded = _bound_matrices(sizes, lows)
    # exact either way: machine integers when no sum of products can overflow them
    biggest = max((abs(int(x)) for x in (*lo.flat, *hi.flat, *rows.flat)), default=0)
    if 2 * biggest * biggest * max(len(sizes), 1) < 2**62:
        rows, lo, hi = rows.astype(np.int64), lo.astype(np.int64), hi.astype(np.int64)
    n = len(rows)
    # one row bounds another (vectorized per row); ties keep the lower index
    dominated = np.zeros((n, n), dtype=bool)  # [i, j]: row j >= row i everywhere
    for i in range(n):
        bounds, bad = _difference_bounds(rows - rows[i], lo, hi, unbounded)
        dominated[i] = (bounds >= 0).all(axis=1) & ~bad
        dominated[i, i] = False
    alive = [i for i in range(n)
             if not any(dominated[i, j] and not (dominated[j, i] and i < j) for j in range(n))]
    # a convex combination of two others bounds it
    for i in list(alive):
        others = [j for j in alive if j != i]
        bounds, bad = _difference_bounds(rows[others] - rows[i], lo, hi, unbounded)
        if len(others) >= 2 and _pair_bounds(bounds[~bad].tolist()):
            alive.remove(i)
    return alive


def _bound_matrices(sizes, lows):
    """Integer matrices (size x monomial in the shifted symbols): lower and upper bounds of
    each size, scaled by one common denominator; and which sizes have no upper bound."""
    shift, ts = shifted(lows)
    polys, unbounded = [], []
    for s in sizes:
        b = _lo_hi(sympy.sympify(s))
        if b is None:  # no polynomial bound: only size >= 0 is known
            polys.append(({}, {}))
            unbounded.append(True)
            continue
        lo, hi = (sympy.Poly(sympy.expand(x.xreplace(shift)), *ts).as_dict() for x in b)
        if any(v < 0 for v in lo.values()):
            lo = {}  # a size is never negative: 0 is a lower bound with no negative coefficient
        polys.append((lo, hi))
        unbounded.append(False)
    monomials = sorted({m for lo, hi in polys for m in (*lo, *hi)}) or [(0,) * len(ts)]
    den = 1
    for lo, hi in polys:
        for v in (*lo.values(), *hi.values()):
            den = lcm(den, int(sympy.Rational(v).q))

    def matrix(which):
        return np.array([[int(p[which].get(m, 0) * den) for m in monomials] for p in polys],
                        dtype=object).reshape(len(polys), len(monomials))

    return matrix(0), matrix(1), np.array(unbounded, dtype=bool)


def _lo_hi(e):
    """Polynomials (lo, hi) with lo <= e <= hi for integer symbols, or None."""
    if not e.has(sympy.ceiling, sympy.floor):
        return (e, e) if e.is_polynomial() else None
    if e.is_Add:
        parts = [_lo_hi(a) for a in e.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*(p[0] for p in parts)), sympy.Add(*(p[1] for p in parts))
    if e.is_Mul:
        c, rest = e.as_coeff_Mul()
        b = _lo_hi(rest) if c.is_Rational and rest != e else None
        if b is None:
            return None
        return (c * b[0], c * b[1]) if c >= 0 else (c * b[1], c * b[0])
    if isinstance(e, (sympy.ceiling, sympy.floor)):
        b = _lo_hi(e.args[0])
        if b is None:
            return None
        _, den = sympy.fraction(sympy.together(e.args[0]))
        # the argument is p/q with p an integer: ceiling adds at most (q - 1)/q
        slack = sympy.Rational(den - 1, den) if den.is_Integer else sympy.Integer(1)
        return (b[0], b[1] + slack) if isinstance(e, sympy.ceiling) else (b[0] - slack, b[1])
    return None


def _difference_bounds(diff, lo, hi, unbounded):
    """For each row of count differences ``other - row``: the coefficients of a polynomial
    that bounds ``other - row`` from below, and whether that bound is void (a size without
    an upper bound is subtracted)."""
    out = np.maximum(diff, 0).dot(lo) + np.minimum(diff, 0).dot(hi)
    bad = (diff < 0)[:, unbounded].any(axis=1) if unbounded.any() else np.zeros(len(diff), bool)
    return out, bad


def _pair_bounds(usable: list) -> bool:
    """Is there a pair (a, b) of coefficient lists and lam in [0, 1] with
    lam*a + (1 - lam)*b >= 0 coefficient by coefficient? Then the row is at most the larger
    of the two others."""
    signs = [np.array([c < 0 for c in b]) for b in usable]
    for x in range(len(usable)):
        for y in range(x + 1, len(usable)):
            if (signs[x] & signs[y]).any():  # a coefficient negative in both: no lam helps
                continue
            if _lam_exists(usable[x], usable[y]):
                return True
    return False


def _lam_exists(a, b) -> bool:
    """Exact: is there lam in [0, 1] with lam*a_m + (1 - lam)*b_m >= 0 for every m?"""
    least, most = Fraction(0), Fraction(1)
    for am, bm in zip(a, b):
        d = am - bm
        if d > 0:
            least = max(least, Fraction(-bm, d))
        elif d < 0:
            most = min(most, Fraction(bm, -d))
        elif bm < 0:
            return False
        if least > most:
            return False
    return True
