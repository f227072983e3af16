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
>>> from fxmem.formula.symbols import B, L
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
from .symbols import choice_parts


def prune_rows(sizes, rows, lows: dict) -> list:
    """Indices of the ``rows`` (counts over ``sizes``) that are kept: every dropped row is
    proved at most the maximum of the kept ones wherever each symbol ``x`` is an integer
    ``>= lows[x]``. Of rows equal everywhere, the first is kept."""
    rows = np.array(rows, dtype=object).reshape(len(rows), len(sizes))
    lo, hi, unbounded = _bound_matrices(sizes, lows)
    # exact either way: machine integers when no sum of products can overflow them
    # (a difference of two rows' counts times a bound, summed over the sizes)
    bound = max((abs(int(x)) for x in (*lo.flat, *hi.flat)), default=0)
    count = max((abs(int(x)) for x in rows.flat), default=0)
    if 4 * count * bound * max(len(sizes), 1) < 2**62:
        rows, lo, hi = rows.astype(np.int64), lo.astype(np.int64), hi.astype(np.int64)
    n = len(rows)
    # one row bounds another; ties keep the lower index. A row proved at least row i
    # everywhere is at least it at a few points of the domain too, so only those rows are
    # tried, the highest first, a few at a time, until one drops row i: of Llama-3.1-70B's
    # 3,635 rows (a live total after each op that can be the peak), about half are above a
    # row at every point, and one of the first few tried drops it
    values = _at_points(sizes, rows, lows)

    def proved(i, js):  # which rows js are proved >= row i everywhere
        bounds, bad = _difference_bounds(rows[js] - rows[i], lo, hi, unbounded)
        return js[(bounds >= 0).all(axis=1) & ~bad]

    alive = []
    for i in range(n):
        if values is None:
            near = np.arange(n)
        else:
            near = np.flatnonzero((values >= values[i]).all(axis=1))
            near = near[np.argsort(-values[near, -1], kind="stable")]
        near = near[near != i]
        at, size, dropped = 0, 8, False
        while at < len(near) and not dropped:
            for j in proved(i, near[at:at + size]).tolist():  # j >= i: i goes, unless
                if not (i < j and len(proved(j, np.array([i])))):  # equal and i first
                    dropped = True
                    break
            at, size = at + size, 2 * size
        if not dropped:
            alive.append(i)
    # a convex combination of two others bounds it
    for i in list(alive):
        others = [j for j in alive if j != i]
        if len(others) < 2:
            continue
        diff = rows[others] - rows[i]
        bounds, bad = _difference_bounds(diff, lo, hi, unbounded)
        if _pair_bounds(bounds[~bad].tolist()) or _exact_pair(diff, lo, hi, unbounded):
            alive.remove(i)
    return alive


def _at_points(sizes, rows, lows):
    """Each row's total at a few integer points of the domain (each symbol at or above its
    lower bound): an (n rows x points) array, exact; None when a size has no integer value
    there."""
    symbols = list(lows)
    base = {x: int(lows[x]) for x in symbols}
    points = [base, {x: v + 1 for x, v in base.items()}]
    for k, x in enumerate(symbols):  # one symbol far out, the others at their bounds
        points.append({**base, x: base[x] + 4096 + 61 * k})
    points.append({x: v + 1000 + 7 * k for k, (x, v) in enumerate(base.items())})
    at = [[sympy.sympify(sympy.sympify(z).xreplace(p)) for p in points] for z in sizes]
    if not all(v.is_Integer for row in at for v in row):
        return None
    at = np.array([[int(v) for v in row] for row in at], dtype=object).reshape(
        len(sizes), len(points))
    out = rows.astype(object).dot(at)
    top = max((abs(int(v)) for v in out.flat), default=0)
    return out.astype(np.int64) if top < 2**62 else out


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
    if not e.has(sympy.ceiling, sympy.floor, sympy.Piecewise, sympy.Min, sympy.Max):
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
    choices = choice_parts(e)
    if choices is not None:  # a kernel's size chosen by a branch: 0 <= it <= a polynomial
        parts = [_lo_hi(c) for c in choices[0]]
        if any(p is None or not _nonnegative(p[0]) for p in parts):
            return None
        his = [p[1] for p in parts]
        if choices[1] == "min":
            return sympy.Integer(0), min(his, key=lambda h: (_degree(h), len(h.args)))
        return sympy.Integer(0), sympy.Add(*his)
    return None


def _degree(p) -> int:
    p = sympy.expand(p)
    return 0 if p.is_number else sympy.Poly(p).total_degree()


def _nonnegative(p) -> bool:
    """A polynomial with no negative coefficient: >= 0 for non-negative symbols."""
    p = sympy.expand(p)
    return p.is_number and p >= 0 or (p.is_polynomial() and
                                      all(c >= 0 for c in sympy.Poly(p).coeffs()))


def _difference_bounds(diff, lo, hi, unbounded):
    """For each row of count differences ``other - row``: the coefficients of a polynomial
    that bounds ``other - row`` from below, and whether that bound is void (a size without
    an upper bound is subtracted)."""
    out = np.maximum(diff, 0).dot(lo) + np.minimum(diff, 0).dot(hi)
    bad = (diff < 0)[:, unbounded].any(axis=1) if unbounded.any() else np.zeros(len(diff), bool)
    return out, bad


def _exact_pair(diff, lo, hi, unbounded) -> bool:
    """Like :func:`_pair_bounds`, but the counts are mixed before they are bounded: for rows
    ``j``, ``k`` and ``lam``, ``c = lam*(j - i) + (1 - lam)*(k - i)`` counts each size, and
    ``c.lo + min(c, 0).(hi - lo)`` bounds ``lam*j + (1 - lam)*k - i`` below. A size the three
    rows hold alike (the same transient workspace, the same rounded mask) then costs no slack,
    where bounding each difference first costs it twice. Each coefficient is concave and
    piecewise linear in ``lam``, linear between the points where some ``c_s`` changes sign:
    a feasible ``lam`` is found segment by segment, exactly."""
    diff = np.asarray(diff, dtype=object)
    lin = diff.dot(np.asarray(lo, dtype=object))  # the exact part of each difference
    width = np.asarray(hi, dtype=object) - np.asarray(lo, dtype=object)
    loose = [s for s in range(diff.shape[1]) if unbounded[s] or any(width[s])]
    loose = [s for s in loose if (diff[:, s] < 0).any()]  # a size never short costs nothing
    n = len(diff)
    for x in range(n):
        for y in range(x + 1, n):
            if not _lam_exists(lin[x], lin[y]):
                continue  # not even the exact parts mix to >= 0: slack only subtracts
            if _lam_on_segments(diff[x], diff[y], lin[x], lin[y], width, loose, unbounded):
                return True
    return False


def _lam_on_segments(dx, dy, lx, ly, width, loose, unbounded) -> bool:
    # each loose size's count c_s(lam) = lam*a + (1 - lam)*b: always negative, or negative
    # past (or before) the point z where it crosses 0
    always, falling, rising, cuts = [], [], [], {Fraction(0), Fraction(1)}
    for s in loose:
        a, b = dx[s], dy[s]
        if a < 0 and b < 0:
            always.append(s)
        elif a < 0 <= b or b < 0 <= a:
            z = Fraction(b, b - a)
            cuts.add(z)
            (falling if a < 0 else rising).append((z, s))  # falling: negative for lam > z
    if any(unbounded[s] for s in always):
        return False
    cuts = sorted(cuts)
    for p, q in zip(cuts, cuts[1:]):
        neg = always + [s for z, s in falling if z <= p] + [s for z, s in rising if z >= q]
        if any(unbounded[s] for s in neg):
            continue
        least, most = p, q
        for m in range(len(lx)):
            # g(lam) = base + lam*slope on [p, q]
            base = ly[m] + sum(dy[s] * width[s][m] for s in neg)
            slope = lx[m] - ly[m] + sum((dx[s] - dy[s]) * width[s][m] for s in neg)
            if slope > 0:
                least = max(least, Fraction(-base, slope))
            elif slope < 0:
                most = min(most, Fraction(base, -slope))
            elif base < 0:
                least, most = Fraction(1), Fraction(0)
            if least > most:
                break
        if least <= most:
            return True
    return False


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
