"""The peak as a person reads it: one polynomial, and the conditions under which it is exact.

An exact peak on CUDA is a ``Max`` of sums of ``ceiling`` (the allocator's 512-byte blocks),
``floor``, ``Min`` and ``Piecewise`` (a kernel's size that depends on a threshold). Around a
point (the asked B and L), :func:`readable` takes the ``Max`` branch that is the peak there,
picks each ``Piecewise`` / ``Min`` / ``Max`` inside it as it is at the point (its condition
becomes a condition of the formula), and writes each ``ceiling(p/q)`` as ``p/q`` where ``q``
divides ``p`` (a condition too, stated on one symbol: "L a multiple of 64"). Then it proves,
with the shifted-coefficient proofs of :mod:`fxmem.formula.guards`, where that branch stays
the peak: everywhere the trace holds, or where ``B*L >= N``, or where one symbol is at least
a bound; every other branch is bounded above by a polynomial (its ceilings rounded up, its
choices at their largest) and the chosen branch below (its ceilings as they are).

Where the divisibility conditions fail but the others hold, the exact peak is the formula
plus at least ``error[0]`` and at most ``error[1]`` bytes.

>>> from fxmem.formula.symbols import B, L
>>> peak = sympy.Max(512 * sympy.ceiling(3 * B * L / 64) + 4096, 12 * B + 100000)
>>> r = readable(peak, {B: 16, L: 1024}, {B: 2, L: 2})
>>> r.formula, r.exact_when, r.error
(24*B*L + 4096, ('L a multiple of 64', 'B*L >= 5328'), (0, 504))
>>> r.holds(B=16, L=1024), r.holds(B=16, L=1000), r.holds(multiples=False, B=16, L=1000)
(True, False, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from math import gcd, lcm

import sympy

from .guards import shifted


@dataclass(frozen=True)
class Readable:
    """``formula`` (a polynomial in B and the named dims, bytes) equals the exact peak
    wherever each symbol of ``multiples`` (``(("L", 64),)``) is a multiple of its number and
    every condition of ``where`` (sympy, e.g. ``B*L >= 512``) holds, on the domain where the
    trace holds (its ``valid_when``): :meth:`holds` says whether a point meets them,
    ``exact_when`` says them in words. ``error``: ``(lo, hi)``, where only the multiples fail
    the exact peak is between ``formula + lo`` and ``formula + hi`` (ints, or polynomials
    with whole coefficients where a rounding is scaled by a symbol, as in
    ``B*ceiling(L/32)``; :meth:`error_at` reads them at a point). ``point``: where it was
    read (the asked B and dims); ``proved``: False when no range beyond the point could be
    proved (``where`` is then the point itself, and ``formula`` the peak's branch there with
    its roundings as they are at the point, exact there: no ``multiples``)."""

    formula: sympy.Expr
    multiples: tuple
    where: tuple
    error: tuple
    point: dict
    proved: bool = True

    def __str__(self) -> str:
        return str(self.formula)

    @property
    def exact_when(self) -> tuple:
        """The conditions as text: ``("L a multiple of 64", "B*L >= 512")``."""
        return tuple(f"{x} a multiple of {k}" for x, k in self.multiples) + tuple(
            f"{c.lhs} = {c.rhs}" if isinstance(c, sympy.Eq) else str(c) for c in self.where)

    def holds(self, multiples: bool = True, **values) -> bool:
        """Whether ``formula`` is exact at ``values`` (``B=16, L=1024``) by its conditions;
        ``multiples=False``: by ``where`` alone (where the exact peak is then within
        ``error`` of it)."""
        at = {sympy.Symbol(k, integer=True, positive=True): sympy.Integer(v)
              for k, v in values.items()}
        return all(c.xreplace(at) is sympy.true for c in self.where) and not (
            multiples and any(values[x] % k for x, k in self.multiples))


    def error_at(self, **values) -> tuple:
        """``error`` at ``values`` (``B=16, L=1000``): two ints.

        >>> from fxmem.formula.symbols import B, L
        >>> r = readable(512 * B * sympy.ceiling(L / 32), {B: 2, L: 64}, {B: 1, L: 1})
        >>> r.formula, r.exact_when, r.error, r.error_at(B=2, L=40)
        (16*B*L, ('L a multiple of 32',), (0, 496*B), (0, 992))
        """
        at = {sympy.Symbol(k, integer=True, positive=True): sympy.Integer(v)
              for k, v in values.items()}
        return tuple(int(sympy.sympify(e).xreplace(at)) for e in self.error)


class _Unreadable(Exception):
    """A term with a function the readable form does not know (``Mod``, ...)."""


def readable_around(peak, valid_when, B: int, **dims) -> Readable | None:  # noqa: N803
    """:func:`readable` of a report's ``peak`` at batch size ``B`` and the named dims'
    values, on the domain its guards ``valid_when`` bound from below.

    >>> from fxmem.formula.symbols import B
    >>> str(readable_around(512 * sympy.ceiling(3 * B / 64) + 4096, (B >= 2,), 64))
    '24*B + 4096'
    """
    from .guards import lower_bounds
    from .symbols import dim_symbol

    point = {dim_symbol(n): v for n, v in {"B": B, **dims}.items()}  # dim_symbol("B") is B
    return readable(peak, point, lower_bounds(valid_when, list(point)))


def readable(expr, point: dict, lows: dict) -> Readable | None:
    """The readable form of the exact peak ``expr`` around ``point`` (symbol -> int) on the
    domain where each symbol is an integer at or above its ``lows`` bound; None when the
    peak's own branch holds a function it cannot read (the exact expression is then all
    there is). Another branch past bounding leaves no range proved: the branch is read at
    the point alone."""
    expr = _no_remainders(sympy.sympify(expr))
    at = {x: sympy.Integer(v) for x, v in point.items()}
    terms = list(expr.args) if isinstance(expr, sympy.Max) else [expr]
    lows = {x: max(int(lows.get(x, 1)), 1) for x in expr.free_symbols | set(point)}
    unreadable = (_Unreadable, TypeError, ValueError, NotImplementedError,
                  sympy.PolynomialError)
    try:
        best = max(terms, key=lambda t: int(t.xreplace(at)))
        conds: list = []
        chosen = _choose(best, at, conds)
        divs: dict = {}
        formula, lo_err, hi_err = _unround(chosen, divs, at)
        formula = sympy.expand(formula)
    except unreadable:
        return None  # sympy could not read the peak's branch: the exact expression is all
    low_bound = sympy.expand(formula + lo_err)  # the branch, each rounding at its least
    rest = [t for t in terms if t is not best]
    try:
        region, proved = _region([sympy.expand(low_bound - _upper(t, at)) for t in rest],
                                 lows, point)
        if not proved:  # the other branches' choices taken as at the point, as conditions
            picked: list = []
            rest = [_choose(t, at, picked) for t in rest]
            again = _region([sympy.expand(low_bound - _upper(t, at)) for t in rest], lows,
                            point)
            if again[1]:
                region, proved = tuple(picked) + again[0], True
    except unreadable:  # another branch past bounding (a product of roundings): no range
        region, proved = _at_point(point), False  # is proved, the branch is read at the point
    if not proved:  # read at the point alone: exact there (its roundings as they are there,
        # in the constant), no multiples ("B a multiple of 64 ... and B = 2" never holds)
        formula += int(expr.xreplace(at)) - int(formula.xreplace(at))
        return Readable(formula, (), tuple(region), (0, 0), dict(point), False)
    multiples = tuple((str(x), k) for x, k in sorted(divs.items(), key=lambda kv: str(kv[0]))
                      if k > 1)
    where: list = []
    for c in _folded([*conds, *region], lows):
        if c not in where and not _holds(c, lows):
            where.append(c)
    err = (_whole(lo_err, up=False), _whole(hi_err, up=True))
    return Readable(formula, multiples, tuple(where), err, dict(point), proved)


def _no_remainders(expr):
    """``expr`` with each remainder by a positive integer, ``Mod(x, k)`` (sympy's or
    PyTorch's), written as the rounding it is, ``x - k*floor(x/k)`` (the same integers): a
    length padded to a multiple (memory-efficient attention's L up to a multiple of 8).

    >>> from fxmem import L
    >>> _no_remainders(sympy.Mod(L, 8) + 1)
    L - 8*floor(L/8) + 1
    """
    from torch.utils._sympy.functions import Mod, PythonMod  # (torch's, of sizes >= 0)

    return expr.replace(lambda t: isinstance(t, (sympy.Mod, Mod, PythonMod))
                        and t.args[1].is_Integer and t.args[1] > 0,
                        lambda t: t.args[0] - t.args[1] * sympy.floor(t.args[0] / t.args[1]))


def _folded(conds: list, lows: dict) -> list:
    """The conditions on one symbol folded into its bounds (``B >= 70, B <= 112``,
    :func:`fxmem.formula.guards.valid_when`), the others as they are."""
    from .guards import valid_when

    conds = [c.args[0].negated if isinstance(c, sympy.Not) else c for c in conds]
    out, alone = [], {}
    for c in conds:
        syms = c.free_symbols if isinstance(c, sympy.Basic) else set()
        if len(syms) == 1 and not isinstance(c, sympy.Eq):
            alone.setdefault(next(iter(syms)), []).append(c)
        else:
            out.append(c)
    for x, cs in sorted(alone.items(), key=lambda kv: str(kv[0])):
        out += [g for g in valid_when(cs, lower=lows.get(x, 1), symbol=x)
                if g != (x >= lows.get(x, 1))]
    return out


def _holds(cond, lows) -> bool:
    """A condition every point of the domain meets (``B >= 2`` when B's bound is 2)."""
    from .guards import implied

    try:
        return implied(cond, lows)
    except (TypeError, ValueError):
        return False


def _choose(e, at: dict, conds: list):
    """``e`` with each ``Piecewise``, ``Min`` and ``Max`` replaced by its value's branch at
    ``at``; the conditions that keep each choice go to ``conds``."""
    if not e.has(sympy.Piecewise, sympy.Min, sympy.Max):
        return e
    if isinstance(e, sympy.Piecewise):
        for i, (value, cond) in enumerate(e.args):
            if cond.xreplace(at) is sympy.true:
                if cond is not sympy.true:
                    conds.append(cond)
                conds.extend(sympy.Not(c) for _, c in e.args[:i])
                return _choose(value, at, conds)
        raise _Unreadable(str(e))
    if isinstance(e, (sympy.Min, sympy.Max)):
        vals = [(int(a.xreplace(at)), a) for a in e.args]
        pick = (min if isinstance(e, sympy.Min) else max)(vals, key=lambda v: v[0])[1]
        for a in e.args:
            if a is not pick:
                conds.append(pick <= a if isinstance(e, sympy.Min) else pick >= a)
        return _choose(pick, at, conds)
    return e.func(*(_choose(a, at, conds) for a in e.args))


def _unround(e, divs: dict, at: dict | None = None):
    """``(p, lo, hi)``: ``e`` with ``ceiling`` and ``floor`` removed, exact where the symbols
    in ``divs`` are multiples of their values (added to ``divs``), and ``lo <= e - p <= hi``
    (numbers) anywhere."""
    if not e.has(sympy.ceiling, sympy.floor):
        if e.has(sympy.Function) and not e.is_polynomial():
            raise _Unreadable(str(e))
        return e, sympy.Integer(0), sympy.Integer(0)
    if e.is_Add:
        parts = [_unround(a, divs, at) for a in e.args]
        return (sympy.Add(*(p[0] for p in parts)), sympy.Add(*(p[1] for p in parts)),
                sympy.Add(*(p[2] for p in parts)))
    if e.is_Mul:
        c, rest = e.as_coeff_Mul()
        if not c.is_Rational:
            raise _Unreadable(str(e))
        if rest == e:  # B*ceiling(L/32): a monomial times one rounding, its error times it
            return _scaled(e, divs, at)
        p, lo, hi = _unround(rest, divs, at)
        return (c * p, c * lo, c * hi) if c >= 0 else (c * p, c * hi, c * lo)
    if isinstance(e, (sympy.ceiling, sympy.floor)):
        inner, ilo, ihi = _unround(e.args[0], divs, at)  # a rounding inside: its error carried
        num, q = sympy.fraction(sympy.together(sympy.expand(inner)))
        num = sympy.expand(num)
        if not q.is_Integer or not num.is_polynomial():
            raise _Unreadable(str(e))
        q = int(q)
        const, _ = num.as_coeff_Add()
        const = const if const.is_Integer else sympy.Integer(0)
        p0 = sympy.expand(num - const)
        _divisible(p0, q, divs, at or {})
        k, r = divmod(int(const), q)
        ceil = isinstance(e, sympy.ceiling)
        value = p0 / q + k + (1 if ceil and r else 0)
        # with q | p0: ceiling((p0 + r)/q) = p0/q + [r > 0], floor = p0/q; otherwise the
        # value moves by at most (q - 1)/q from (p0 + r)/q, to one side
        span = sympy.Rational(q - 1, q)
        lo = sympy.Rational(r, q) - (1 if ceil and r else 0) - (0 if ceil else span)
        return value, lo + _floor(ilo), lo + span + _ceiling(ihi)
    raise _Unreadable(str(e))


def _scaled(e, divs: dict, at: dict | None):
    """:func:`_unround` of a product of positive symbols' powers and one rounding (memory
    efficient attention's ``B*ceiling(L/32)``): the rounding's error times the monomial, a
    polynomial (zero where the multiples hold)."""
    rounded = [f for f in e.args if f.has(sympy.ceiling, sympy.floor)]
    m = sympy.Mul(*(f for f in e.args if f not in rounded))
    if len(rounded) != 1 or m.has(sympy.Function) or not all(
            isinstance(f, sympy.Symbol) or (f.is_Pow and isinstance(f.base, sympy.Symbol)
                                            and f.exp.is_Integer and f.exp > 0)
            for f in sympy.Mul.make_args(m)):
        raise _Unreadable(str(e))
    p, lo, hi = _unround(rounded[0], divs, at)
    return m * p, sympy.expand(m * lo), sympy.expand(m * hi)  # m > 0: the same sides


def _floor(x):
    """A lower bound of ``floor(x)``: itself for a number, ``x - 1`` for a polynomial."""
    return sympy.floor(x) if x.is_number else x - 1


def _ceiling(x):
    """An upper bound of ``ceiling(x)``: itself for a number, ``x + 1`` for a polynomial."""
    return sympy.ceiling(x) if x.is_number else x + 1


def _whole(x, up: bool):
    """Error bound ``x`` with whole coefficients, rounded to the side that keeps it a bound
    for positive symbols (each coefficient up for an upper bound, down for a lower one)."""
    if x.is_number:
        return int(sympy.ceiling(x) if up else sympy.floor(x))
    r = sympy.ceiling if up else sympy.floor
    return sympy.Add(*(r(c) * m for c, m in (t.as_coeff_Mul()
                                            for t in sympy.Add.make_args(sympy.expand(x)))))


def _divisible(p0, q: int, divs: dict, at: dict) -> None:
    """Require, in ``divs`` (symbol -> modulus), what makes each term of the integer
    polynomial ``p0`` a multiple of ``q``: a named dim's multiple when the term has one
    (users choose lengths as multiples of 64), else B's; of a term in B and a dim, as much
    as the dim's value at the point ``at`` is a multiple of, the rest on B (``B*L/128`` at
    L = 64: L a multiple of 64 and B of 2), so the formula holds at the point it was read."""
    if p0 == 0:
        return
    for term in sympy.Add.make_args(p0):
        c, m = term.as_coeff_Mul()
        need = q // gcd(q, abs(int(c)))
        if need == 1:
            continue
        syms = sorted(m.free_symbols, key=lambda s: (s.name == "B", s.name))
        if not syms:
            raise _Unreadable(str(term))
        for x in syms[:-1]:
            k = need if x not in at else gcd(need, int(at[x]))
            divs[x] = lcm(divs.get(x, 1), k)
            need //= k
            if need == 1:
                break
        else:
            divs[syms[-1]] = lcm(divs.get(syms[-1], 1), need)


def _upper(t, at: dict):
    """A polynomial at least ``t`` for integer symbols (:func:`_bounds`)."""
    return sympy.expand(_bounds(t, at)[1])


def _positive(p) -> bool:
    return _signed(p, -1) == 0


def _signed(p, sign: int):
    """The terms of polynomial ``p`` whose coefficient has ``sign``: for positive symbols,
    ``_signed(p, -1) <= p <= _signed(p, 1)``, and the first is <= 0, the second >= 0."""
    return sympy.Add(*(t for t in sympy.Add.make_args(sympy.expand(p))
                       if t.as_coeff_Mul()[0] * sign > 0))


def _bounds(e, at: dict) -> tuple:
    """Polynomials ``(lo, hi)`` with ``lo <= e <= hi`` for positive integer symbols: each
    rounding at its least and largest, a choice between non-negative values at least 0 and
    at most their sum (a ``Min``: at most its value that is least at the point ``at``)."""
    if not e.has(sympy.ceiling, sympy.floor, sympy.Piecewise, sympy.Min, sympy.Max):
        if not e.is_polynomial():
            raise _Unreadable(str(e))
        return e, e
    if e.is_Add:
        parts = [_bounds(a, at) for a in e.args]
        return sympy.Add(*(p[0] for p in parts)), sympy.Add(*(p[1] for p in parts))
    if e.is_Mul:
        c, rest = e.as_coeff_Mul()
        plain = [f for f in sympy.Mul.make_args(rest) if f.is_polynomial()
                 and not f.has(sympy.Function)]
        funcs = [f for f in sympy.Mul.make_args(rest) if f not in plain]
        mono = sympy.Mul(*plain)
        if len(funcs) != 1 or not c.is_Rational or not _positive(mono):
            raise _Unreadable(str(e))
        lo, hi = _bounds(funcs[0], at)
        lo, hi = c * mono * lo, c * mono * hi
        return (lo, hi) if c >= 0 else (hi, lo)
    if isinstance(e, (sympy.ceiling, sympy.floor)):
        if not e.args[0].has(sympy.Piecewise, sympy.Min, sympy.Max):
            value, lo, hi = _unround(e, {})
            return value + lo, value + hi
        lo, hi = _bounds(e.args[0], at)
        return (lo, hi + 1) if isinstance(e, sympy.ceiling) else (lo - 1, hi)
    if isinstance(e, (sympy.Piecewise, sympy.Min, sympy.Max)):
        # one of the values: at least the sum of their lower bounds' negative terms, at
        # most the sum of their upper bounds' positive terms (a Min: at most any of them)
        values = [v for v, _ in e.args] if isinstance(e, sympy.Piecewise) else list(e.args)
        parts = [_bounds(v, at) for v in values]
        lo = sympy.Add(*(_signed(p[0], -1) for p in parts))
        if isinstance(e, sympy.Min):
            return lo, min((hi for _, hi in parts), key=lambda h: h.xreplace(at))
        return lo, sympy.Add(*(_signed(p[1], 1) for p in parts))
    raise _Unreadable(str(e))


def _nonneg(e, lows: dict) -> bool:
    """``e >= 0`` wherever each symbol is an integer at or above its bound (proved)."""
    e = sympy.expand(e)
    if e.is_number:
        return e >= 0
    shift, ts = shifted({x: lows[x] for x in sorted(lows, key=str)})
    p = sympy.expand(e.xreplace(shift))
    if not p.is_polynomial(*ts):
        return False
    return all(c >= 0 for c in sympy.Poly(p, *ts).coeffs())


def _region(diffs: list, lows: dict, point: dict) -> tuple:
    """Conditions under which every ``diffs`` is >= 0, containing ``point``: ``()`` when
    they hold on the whole domain, else ``(B*L >= N,)`` (the product of the symbols), else
    one symbol's lower bound; ``(point's values,)`` and False when none is proved."""
    if all(_nonneg(d, lows) for d in diffs):
        return (), True
    syms = sorted(point, key=str)
    if len(syms) == 1:
        return _interval(diffs, syms[0], lows[syms[0]], int(point[syms[0]]))
    prod = reduce(lambda a, b: a * b, syms, sympy.Integer(1))
    if len(syms) > 1:  # B*L >= N, and if need be one symbol at least a bound (L >= 16)
        at = int(prod.xreplace({x: sympy.Integer(v) for x, v in point.items()}))
        need = _needs(diffs, prod, lows, at)
        if need is not None:
            return (prod >= need,), True
        for x in sorted(syms, key=lambda s: (s.name == "B", s.name)):
            lo, hi = lows[x], int(point[x])
            if _needs(diffs, prod, {**lows, x: hi}, at) is None:
                continue
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if _needs(diffs, prod, {**lows, x: mid}, at) is not None \
                    else (mid, hi)
            return (prod >= _needs(diffs, prod, {**lows, x: hi}, at), x >= hi), True
    for x in sorted(syms, key=lambda s: (s.name == "B", s.name)):
        def ok(v, x=x):
            return all(_nonneg(d, {**lows, x: v}) for d in diffs)
        lo, hi = lows[x], int(point[x])
        if not ok(hi):
            continue
        while hi - lo > 1:  # ok(hi); the proof only gets easier as the bound rises
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        return (x >= (lo if ok(lo) else hi),), True
    return _at_point(point), False


def _at_point(point: dict) -> tuple:
    """The conditions of a formula read at ``point`` alone: each symbol equal to its value."""
    return tuple(sympy.Eq(x, v) for x, v in sorted(point.items(), key=lambda kv: str(kv[0])))


def _needs(diffs, prod, lows: dict, at: int) -> int | None:
    """The least ``N <= at`` with every ``diffs`` proved >= 0 where ``prod >= N`` (and each
    symbol at or above its bound in ``lows``), or None."""
    need = 0
    for d in diffs:
        n = _product_bound(d, prod, lows)
        if n is None or n > at:
            return None
        need = max(need, n)
    return need


def _product_bound(d, prod, lows: dict) -> int | None:
    """The least ``N`` with ``d >= 0`` proved wherever ``prod >= N`` (and each symbol at or
    above its bound), or None. ``d = a*prod + rest`` with the largest ``a > 0`` that leaves
    ``rest``'s shifted coefficients non-negative (but its constant): then ``d >= a*N +
    rest(lows)``."""
    if _nonneg(d, lows):
        return 0
    shift, ts = shifted({x: lows[x] for x in sorted(lows, key=str)})
    dp = sympy.Poly(sympy.expand(d.xreplace(shift)), *ts)
    pp = sympy.Poly(sympy.expand(prod.xreplace(shift)), *ts)
    zero = (0,) * len(ts)
    a = None
    for m, c in dp.terms():
        if m == zero:
            continue
        k = pp.coeff_monomial(m)
        if k > 0:
            a = c / k if a is None else min(a, c / k)
        elif c < 0:
            return None
    for m, k in pp.terms():  # a monomial of prod that d lacks
        if m != zero and dp.coeff_monomial(m) == 0 and k > 0:
            a = sympy.Integer(0)
    if a is None or a <= 0:
        return None
    at_lows = {x: sympy.Integer(v) for x, v in lows.items()}
    return int(sympy.ceiling(prod.xreplace(at_lows) - d.xreplace(at_lows) / a))


def _interval(diffs: list, x, low: int, v: int) -> tuple:
    """For polynomials in ``x`` alone: the widest run of integers around ``v`` (from ``low``
    up) where every ``diffs`` is >= 0, as conditions, exactly (sympy's real roots)."""
    lo, hi = sympy.Integer(low), sympy.oo
    for d in diffs:
        ok = sympy.solve_univariate_inequality(sympy.expand(d) >= 0, x, relational=False)
        for piece in (ok.args if isinstance(ok, sympy.Union) else (ok,)):
            if piece.contains(v) is sympy.true:
                lo, hi = max(lo, sympy.ceiling(piece.inf)), min(hi, sympy.floor(piece.sup))
                break
        else:
            return (sympy.Eq(x, v),), False
    return tuple(c for c, keep in ((x >= lo, lo > low), (x <= hi, hi != sympy.oo)) if keep), True
