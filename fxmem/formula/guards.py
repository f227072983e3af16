"""Where a formula holds: the shape guards of a trace folded into short conditions, and
proofs over the domain they leave (every symbol an integer at or above its lower bound).

The trace stage folds guards on one symbol with :func:`valid_when` (``B >= 2``, ``L <= 512``)
and drops those on several symbols that the per-symbol bounds imply (:func:`implied`). The
proofs write each symbol as its bound plus a non-negative integer (:func:`shifted`): a
polynomial in those integers with no negative coefficient is then >= 0 everywhere.

>>> from fxmem.formula.symbols import L
>>> g = valid_when([sympy.Ne(B, 1)]) + valid_when([L > 1], symbol=L)
>>> g, lower_bounds(g, [B, L])
((B >= 2, L >= 2), {B: 2, L: 2})
"""

from __future__ import annotations

import functools

import sympy
from torch.utils._sympy.functions import FloorDiv

from .symbols import B


def simplified(g):
    """``sympy.simplify(g)``, or ``g`` itself when simplifying fails: sympy tries numbers in
    it, and the ``Mod`` of torch/utils/_sympy/functions.py (in guards such as a CUDA kernel's
    ``L - Mod(L, 8) + 8`` padding) raises ``AssertionError`` on a negative or fractional one."""
    try:
        return sympy.simplify(g)
    except AssertionError:
        return g


def lower_bounds(guards, symbols) -> dict:
    """Each of ``symbols``' least value under ``guards`` (its ``x >= k`` condition; 1 when it
    has none: every symbol is a positive integer)."""
    lows = {x: 1 for x in symbols}
    for g in guards:
        if isinstance(g, sympy.GreaterThan) and g.lhs in lows and g.rhs.is_Integer:
            lows[g.lhs] = max(lows[g.lhs], int(g.rhs))
    return lows


def shifted(lows: dict) -> tuple:
    """``({x: k + t_x}, [t_x, ...])``: each symbol as its bound ``k`` plus a fresh integer
    ``t_x >= 0`` (not the symbol itself: its own assumption, >= 1, would let sympy decide
    ``Mod`` and the like for values above the bound)."""
    ts = [sympy.Symbol(f"_t_{x}", integer=True, nonnegative=True) for x in lows]
    return {x: t + lo for (x, lo), t in zip(lows.items(), ts)}, ts


def valid_when(guards, lower: int = 1, upper: int | None = None, symbol=B) -> tuple:
    """Fold shape guards on B (or another ``symbol``) into short conditions, e.g.
    ``(B >= 2,)``. Made once per set of arguments (:func:`_folded`): a report's
    specializations at a dozen lengths fold the same guards in B each time (Llama-3.1-8B
    over 8 GPUs: ``B >= 2, B <= 65535`` at every length the longest-length search tries).

    >>> valid_when([sympy.Ne(B, 1), B < 16])
    (B >= 2, B <= 15)
    >>> valid_when([B**2 > 1, B**2 - B >= 0, B**2 >= 2])  # over sizes, B >= 1: one bound
    (B >= 2,)
    """
    return _folded(tuple(guards), lower, upper, symbol)


@functools.lru_cache(maxsize=256)
def _folded(guards: tuple, lower: int, upper: int | None, symbol) -> tuple:
    """:func:`valid_when` of a tuple of guards (sympy's simplifications and solutions of
    each: tens of milliseconds a call)."""
    B = symbol  # noqa: N806 - the same folding for every named dim
    lower, excluded, other = max(lower, 1), set(), []
    for g in [h for g in guards for h in unfloored(g)]:
        g = simplified(g)
        if g is sympy.true:
            continue
        if isinstance(g, sympy.Ne) and B in g.free_symbols and (g.lhs - g.rhs).is_polynomial(B):
            sol = sympy.solve(g.lhs - g.rhs, B)
            if len(sol) == 1 and sol[0].is_integer:
                excluded.add(int(sol[0]))
                continue
        if isinstance(g, sympy.core.relational.Relational) and g.free_symbols == {B}:
            try:
                s = sympy.solve_univariate_inequality(g, B, relational=False)
            except (NotImplementedError, ValueError, RecursionError):
                # sympy cannot solve it (T5's relative buckets at B, L: a Max over L padded
                # to a multiple of 8 recursed past Python's limit): reported as it is (below)
                s = None
            if s is not None:  # over the sizes a shape takes (``L**2 > 1``: its negative
                s = s.intersect(sympy.Interval(1, sympy.oo))  # half too, else a union)
            if isinstance(s, sympy.Interval):
                if s.left.is_finite:
                    lower = max(lower, int(sympy.ceiling(s.left + (1 if s.left_open else 0)
                                                         if s.left.is_integer else s.left)))
                if s.right.is_finite:
                    r = int(sympy.floor(s.right - (1 if s.right_open else 0)
                                        if s.right.is_integer else s.right))
                    upper = r if upper is None else min(upper, r)
                continue
        other.append(g)
    while lower in excluded:
        lower += 1
    out = [B >= lower]
    if upper is not None:
        out.append(B <= upper)
    out += [sympy.Ne(B, k) for k in sorted(excluded) if k > lower and (upper is None or k <= upper)]
    return tuple(out + other)


def unfloored(g) -> list:
    """``floor(p / q) == k`` (torch's ``FloorDiv``, a ``torch.chunk``'s count of chunks) as
    the two inequalities it means, ``k*q <= p < (k+1)*q``, for a positive ``q``; any other
    guard as it is.

    >>> from torch.utils._sympy.functions import FloorDiv
    >>> unfloored(sympy.Eq(FloorDiv(3 * B - 1, B), 2))
    [2*B <= 3*B - 1, 3*B - 1 < 3*B]
    """
    if isinstance(g, sympy.Eq):
        for f, k in ((g.lhs, g.rhs), (g.rhs, g.lhs)):
            if k.is_Integer and isinstance(f, (FloorDiv, sympy.floor)):
                p, q = f.args if isinstance(f, FloorDiv) else sympy.fraction(f.args[0])
                if q.is_positive:
                    return [sympy.Le(k * q, p, evaluate=False),
                            sympy.Lt(p, (k + 1) * q, evaluate=False)]
    return [g]


def implied(g, lows: dict) -> bool:
    """Does ``g`` hold wherever every symbol is an integer at or above its ``lows`` bound?
    Proved, not sampled: with each symbol written as its bound plus a non-negative integer,
    an integer polynomial with no negative coefficient is >= 0. Handles ``>=``, ``>``,
    ``<=``, ``<``, ``!=`` of polynomials, and ``Mod(x, y) != 0`` when 1 <= x < y.

    >>> from fxmem.formula.symbols import L
    >>> implied(sympy.Ne(B * L, B), {B: 2, L: 2}), implied(B * L >= 5, {B: 2, L: 2})
    (True, False)
    """
    if g is sympy.true:
        return True
    if not g.free_symbols <= set(lows):
        return False
    shift, ts = shifted(lows)

    def nonneg(e, less=0) -> bool:  # e - less >= 0 for symbols at or above their bounds
        e = sympy.expand(e.xreplace(shift))
        if not e.is_polynomial(*ts):
            return False
        coeffs = sympy.Poly(e, *ts).coeffs()
        if less and not all(c.is_integer for c in coeffs):
            return False  # e > 0 means e >= 1 only for integer values
        return all(c.is_rational and c >= 0
                   for c in sympy.Poly(e - less, *ts).coeffs())

    if isinstance(g, sympy.Ne):
        for a, b in ((g.lhs, g.rhs), (g.rhs, g.lhs)):
            if b == 0 and isinstance(a, sympy.Mod):  # Mod(x, y) = x when 0 < x < y
                x, y = a.args
                return nonneg(x, 1) and nonneg(y - x, 1)
        return nonneg(g.lhs - g.rhs, 1) or nonneg(g.rhs - g.lhs, 1)
    if isinstance(g, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        big, small = g.lhs, g.rhs
    elif isinstance(g, (sympy.LessThan, sympy.StrictLessThan)):
        big, small = g.rhs, g.lhs
    else:
        return False
    strict = isinstance(g, (sympy.StrictGreaterThan, sympy.StrictLessThan))
    return nonneg(big - small, 1 if strict else 0)
