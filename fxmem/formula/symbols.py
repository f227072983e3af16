"""The batch-size symbol and exact size expressions.

``fxmem.B`` is the one sympy Symbol for the batch size (integer, positive). Storage sizes are
:class:`Size` objects: an exact sympy expression in B, polynomial bounds used to prune the
peak formula, and a fast exact evaluator for a numeric B.

>>> s = Size.of(12 * B + 4)
>>> s(10), s.exact
(124, True)
>>> Size.of(12 * B + 4).rounded(512).expr
512*ceiling(3*B/128 + 1/128)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import sympy

from . import poly as P

B = sympy.Symbol("B", integer=True, positive=True)
"""The batch size: the batch dim of every input and target (dim 0 unless ``batch_dim=``
says where it is)."""


def dim_symbol(name: str) -> sympy.Symbol:
    """The symbol of a named input dim beyond the batch (``analyze(..., dims={"L": ...})``):
    a positive integer, like :data:`B`.

    >>> dim_symbol("L") is dim_symbol("L"), dim_symbol("L").is_positive
    (True, True)
    """
    return sympy.Symbol(name, integer=True, positive=True)


L = dim_symbol("L")
"""A sequence length, the usual named dim (``dims={"L": [(0, 1)]}``)."""


def _to_fraction(c) -> Fraction:
    c = sympy.Rational(c)
    return Fraction(int(c.p), int(c.q))


def as_poly(expr) -> P.Poly | None:
    """Coefficients of ``expr`` as a polynomial in B with rational coefficients, or None."""
    expr = sympy.sympify(expr)
    if expr.free_symbols - {B}:
        return None
    try:
        p = sympy.Poly(expr, B)
    except sympy.PolynomialError:
        return None
    if not all(c.is_Rational for c in p.all_coeffs()):
        return None
    return P.norm([_to_fraction(c) for c in reversed(p.all_coeffs())])


def plain(expr) -> sympy.Expr:
    """``expr`` with PyTorch's integer functions (``torch.utils._sympy.functions``: what
    ``ceil(L / 32)`` or ``L // 64`` on a SymInt make) written as sympy's own ``floor`` and
    ``ceiling`` of rationals, which :func:`bounds` and the formulas understand.

    >>> from torch.utils._sympy.functions import CeilToInt, FloorDiv, IntTrueDiv
    >>> plain(32 * CeilToInt(IntTrueDiv(L, 32)) + FloorDiv(L + 63, 64))
    32*ceiling(L/32) + floor(L/64 + 63/64)
    """
    from torch.utils._sympy import functions as F

    rules = {F.FloorDiv: lambda a, b: sympy.floor(a / b),
             F.CeilDiv: lambda a, b: sympy.ceiling(a / b),
             F.IntTrueDiv: lambda a, b: a / b,
             F.CeilToInt: sympy.ceiling, F.FloorToInt: sympy.floor,
             F.Min: sympy.Min, F.Max: sympy.Max,  # torch's own classes, sympy's names
             F.Where: lambda c, a, b: sympy.Piecewise((a, c), (b, True))}
    if not any(expr.has(f) for f in rules):
        return expr
    return expr.replace(lambda e: type(e) in rules, lambda e: rules[type(e)](*e.args))


def bounds(expr) -> tuple[P.Poly, P.Poly] | None:
    """Polynomials (lo, hi) with lo <= expr <= hi for every B >= 1, or None if unknown."""
    p = as_poly(expr)
    if p is not None:
        return p, p
    if isinstance(expr, sympy.Add):
        lo, hi = P.ZERO, P.ZERO
        for a in expr.args:
            b = bounds(a)
            if b is None:
                return None
            lo, hi = P.add(lo, b[0]), P.add(hi, b[1])
        return lo, hi
    if isinstance(expr, sympy.Mul):
        const, rest = expr.as_coeff_Mul()
        b = bounds(rest) if const.is_Rational and rest != expr else None
        if b is None:
            return None
        k = _to_fraction(const)
        lo, hi = P.scale(b[0], k), P.scale(b[1], k)
        return (lo, hi) if k >= 0 else (hi, lo)
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        b = bounds(expr.args[0])
        if b is None:
            return None
        if isinstance(expr, sympy.floor):
            return P.add(b[0], (Fraction(-1),)), b[1]
        return b[0], P.add(b[1], (Fraction(1),))
    choices = choice_parts(expr)
    if choices is not None:  # a kernel's size that depends on a branch: >= 0, <= one poly
        parts = [bounds(c) for c in choices[0]]
        if any(p is None or any(c < 0 for c in p[0]) for p in parts):
            return None
        his = [p[1] for p in parts]
        if choices[1] == "min":  # at most any of them: the one of least degree
            return P.ZERO, min(his, key=lambda h: (len(h), h))
        hi = P.ZERO
        for h in his:
            hi = P.add(hi, h)
        return P.ZERO, hi
    return None


def choice_parts(expr):
    """``(values, kind)`` when ``expr`` picks one of several values (``Piecewise``, ``Min``,
    ``Max``: what a kernel's size is when it branches on a symbolic size), else None; kind is
    ``"min"`` for ``Min`` (at most any value) and ``"one"`` otherwise (one of them)."""
    if isinstance(expr, sympy.Piecewise):
        return [v for v, _ in expr.args], "one"
    if isinstance(expr, sympy.Min):
        return list(expr.args), "min"
    if isinstance(expr, sympy.Max):
        return list(expr.args), "one"
    return None


def _remembered(expr) -> Callable[[int], int]:
    """``b -> int(expr at B=b)`` for an expression that is not a polynomial (``Max``,
    ``Piecewise``, ``ceiling``: sympy substitutes and simplifies, ~1 ms a call), the last
    values kept: a planner asks for the same storage at the same B once per candidate plan."""
    return functools.lru_cache(maxsize=256)(lambda b: int(expr.xreplace({B: sympy.Integer(b)})))


@dataclass(frozen=True, eq=False)
class Size:
    """Bytes of one storage as a function of B.

    ``expr`` is exact; ``lo <= expr <= hi`` for B >= 1 (equal when ``exact``); calling the
    object with an int returns the exact integer number of bytes.
    """

    expr: sympy.Expr
    lo: P.Poly | None
    hi: P.Poly | None
    _fn: Callable[[int], int]

    @property
    def exact(self) -> bool:
        return self.lo is not None and self.lo == self.hi

    def __call__(self, b: int) -> int:
        return self._fn(b)

    @staticmethod
    def of(expr) -> "Size":
        return _size_of(sympy.sympify(expr))

    @staticmethod
    def _of(expr) -> "Size":
        p = as_poly(expr)
        if p is not None:
            if all(c.denominator == 1 for c in p):
                ints = tuple(int(c) for c in p)
                return Size(expr, p, p, lambda b, ints=ints: P.evaluate(ints, b))
            return Size(expr, p, p, lambda b, p=p: int(P.evaluate(p, b)))
        bd = bounds(expr)
        return Size(expr, bd[0] if bd else None, bd[1] if bd else None, _remembered(expr))

    def rounded(self, block: int) -> "Size":
        """The size rounded up to a multiple of ``block`` bytes (e.g. CUDA's 512)."""
        if self.exact and all(c.denominator == 1 and int(c) % block == 0 for c in self.lo):
            return self
        if isinstance(self.expr, sympy.Piecewise):  # round each branch: a readable formula
            expr = sympy.Piecewise(*((block * sympy.ceiling(v / block), c)
                                     for v, c in self.expr.args))
        else:
            expr = block * sympy.ceiling(self.expr / block)
        lo = self.lo
        hi = P.add(self.hi, (Fraction(block - 1),)) if self.hi is not None else None
        return Size(expr, lo, hi, lambda b, f=self._fn: -(-f(b) // block) * block)


# a step's sizes and FLOPs repeat an expression per block (Llama-3.1-8B's planner read
# 11,628 FLOP counts of a few hundred expressions), and a Size never changes
_size_of = functools.lru_cache(maxsize=4096)(Size._of)

ZERO = Size.of(0)
