"""Exact univariate polynomials and their upper envelope over ``x >= 1``.

Pure Python (no torch, no sympy in the hot path): a polynomial is a tuple of
:class:`fractions.Fraction` coefficients, lowest degree first. The liveness stage uses
:func:`upper_envelope` to find which live-byte polynomials can be the peak for some batch
size, and :func:`le_on` to prove that a candidate never exceeds a set of others.

>>> upper_envelope([(F(10), F(1)), (F(0), F(2))])   # 10 + x vs 2x: cross at x = 10
[(Fraction(1, 1), 0), (Fraction(10, 1), 1)]
"""

from __future__ import annotations

import math
from fractions import Fraction as F
from typing import Sequence

Poly = tuple  # tuple[Fraction, ...], lowest degree first, no trailing zeros (except (0,))

ZERO: Poly = (F(0),)


def norm(coeffs: Sequence) -> Poly:
    """Coefficients as Fractions, trailing zeros removed."""
    c = [F(x) for x in coeffs] or [F(0)]
    while len(c) > 1 and c[-1] == 0:
        c.pop()
    return tuple(c)


def add(p: Poly, q: Poly) -> Poly:
    n = max(len(p), len(q))
    return norm([(p[i] if i < len(p) else 0) + (q[i] if i < len(q) else 0) for i in range(n)])


def sub(p: Poly, q: Poly) -> Poly:
    return add(p, tuple(-c for c in q))


def scale(p: Poly, k) -> Poly:
    return norm([c * k for c in p])


def evaluate(p: Poly, x):
    """Horner evaluation; exact for int or Fraction ``x``."""
    acc = 0
    for c in reversed(p):
        acc = acc * x + c
    return acc


def derivative(p: Poly) -> Poly:
    return norm([c * i for i, c in enumerate(p)][1:])


def _key(p: Poly, x, length: int = 0) -> tuple:
    """(p(x), p'(x), p''(x), ...), zero-padded to ``length`` entries: ordering these tuples
    orders polys just right of x. Compare keys of one common length only: an unpadded
    line's key is a prefix of a tangent parabola's and would rank below it even when the
    parabola bends down."""
    out = []
    while True:
        out.append(evaluate(p, x))
        if len(p) == 1:
            return tuple(out) + (0,) * (length - len(out))
        p = derivative(p)


def _positive_after(p: Poly, x) -> bool:
    """True when p > 0 on some interval (x, x + eps)."""
    for v in _key(p, x):
        if v != 0:
            return v > 0
    return False


ROOT_WIDTH = F(1, 10**30)  # irrational crossings are located to within this


def _real_roots_above(p: Poly, x) -> list:
    """Sorted real roots of p strictly greater than x, as Fractions.

    Lines give exact roots; quadratics exact or via integer square roots. For degree >= 3
    each root is isolated (sympy, exact) in an
    interval narrower than ROOT_WIDTH and represented by its right end; p has no other root
    between the true root and that point, so signs just right of it are exact.
    """
    if len(p) <= 1:
        return []
    if len(p) == 2:
        r = -p[0] / p[1]
        return [r] if r > x else []
    if len(p) == 3:
        return [r for r in _quadratic_roots(p) if r > x]
    import sympy  # degree >= 3 is rare (B appears once per tensor)

    s = sympy.Symbol("x")
    expr = sum(sympy.Rational(c.numerator, c.denominator) * s**i for i, c in enumerate(p))
    out = []
    for (a, b), _mult in sympy.Poly(expr, s).intervals(eps=sympy.Rational(1, 10**30)):
        b = F(int(b.p), int(b.q))
        if b > x:
            out.append(b)
    return sorted(out)


def _quadratic_roots(p: Poly) -> list:
    """Real roots of c0 + c1 x + c2 x^2: exact when rational, else the rational just above
    the root on a grid of ROOT_WIDTH (integer square roots, no iteration)."""
    c0, c1, c2 = p
    if c2 == 0:
        return [-c0 / c1] if c1 != 0 else []
    disc = c1 * c1 - 4 * c2 * c0
    if disc < 0:
        return []
    n, d = disc.numerator, disc.denominator
    r = math.isqrt(n * d)
    if r * r == n * d:  # rational square root: exact roots
        sq = F(r, d)
        return sorted({(-c1 - sq) / (2 * c2), (-c1 + sq) / (2 * c2)})
    scale = ROOT_WIDTH.denominator
    lo = F(math.isqrt(n * d * scale * scale), d * scale)  # sqrt(disc) in [lo, lo + 1/(d scale)]
    hi = lo + F(1, d * scale)
    # the root's right neighbour on the grid: (-c1 +- sqrt) / (2 c2) is monotone in sqrt
    roots = []
    for sign in (-1, 1):
        ends = ((-c1 + sign * lo) / (2 * c2), (-c1 + sign * hi) / (2 * c2))
        roots.append(max(ends))
    return sorted(roots)


def first_positive_at_or_after(p: Poly, x):
    """Smallest r >= x such that p > 0 just right of r, or None if p <= 0 on [x, inf)."""
    if _positive_after(p, x):
        return x
    for r in _real_roots_above(p, x):
        if _positive_after(p, r):
            return r
    return None


def upper_envelope(polys: Sequence[Poly], start=1) -> list:
    """Pieces ``[(x0, i0), (x1, i1), ...]`` of max(polys) on [start, inf).

    ``polys[i_k]`` is a maximum on ``[x_k, x_{k+1})``; ties go to the lowest index.
    """
    if not polys:
        raise ValueError("upper_envelope of no polynomials")
    x = F(start)

    degree = max(len(p) for p in polys)

    def best_at(pt):
        return max(range(len(polys)), key=lambda i: (_key(polys[i], pt, degree), -i))

    cur = best_at(x)
    pieces = [(x, cur)]
    while True:
        nxt = None
        for j, q in enumerate(polys):
            if j == cur or q == polys[cur]:
                continue
            r = first_positive_at_or_after(sub(q, polys[cur]), x)
            if r is not None and (nxt is None or r < nxt):
                nxt = r
        if nxt is None:
            return pieces
        x = nxt
        cur = best_at(x)
        pieces.append((x, cur))


def le_on(p: Poly, polys: Sequence[Poly], start=1) -> bool:
    """True when ``p(x) <= max(polys)(x)`` for every real x >= start."""
    if not polys:
        return False
    pieces = upper_envelope(polys, start)
    for k, (x0, i) in enumerate(pieces):
        x1 = pieces[k + 1][0] if k + 1 < len(pieces) else None
        r = first_positive_at_or_after(sub(p, polys[i]), x0)
        if r is not None and (x1 is None or r < x1):
            return False
    return True
