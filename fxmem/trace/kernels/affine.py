"""Values affine in a tensor's indices, and the arithmetic of known numbers.

:mod:`fxmem.trace.kernels.values` knows tensors whose every element is one number. Positions are
values a model makes too, one per index: ``torch.arange(L)`` expanded to the batch, as
transformers' decoders make ``position_ids``. Such a tensor is *affine*: its element
``(i_0, ..., i_n)`` is ``c + a_0*i_0 + ... + a_n*i_n``, written ``(c, a)``. Each rule here
gives an op's output as ``(c, a)`` from its arguments' (read with ``known.affine``) or
None when it is not affine or not known: views (``slice``, ``select``, ``expand``, ...),
sums and differences, ``cat`` of pieces that continue one another, the ``cumsum`` of a
constant. A tensor whose coefficients are all zero is a constant again. So transformers'
``find_packed_sequence_indices`` (masking_utils.py) is answered as eager answers it: the
``diff`` of such positions is 1 throughout (``torch.diff`` is ``cat`` then a difference of
two slices, aten/src/ATen/native/ReduceOps.cpp ``diff``), ``!= 1`` is False, its ``cumsum``
0, ``== 0`` True: no packed sequences, and the mask eager skips is not traced.

A number is a Python number or a sympy expression in the ShapeEnv's symbols (a symbolic
size); :func:`_apply` combines them, a comparison only where it is decided for every B.

>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> from fxmem.trace.kernels.values import KnownValues
>>> known = KnownValues()
>>> def run(op, *args):
...     out = op(*args)
...     known.update(op, args, {}, out)
...     return out
>>> with FakeTensorMode():
...     pos = run(aten.expand.default, run(aten.unsqueeze.default,
...                                        run(aten.arange.default, 6), 0), [4, -1])
...     step = run(aten.sub.Tensor, run(aten.slice.Tensor, pos, 1, 1, 6),
...                run(aten.slice.Tensor, pos, 1, 0, 5))
>>> known.affine(pos), known.value(step)
((0, (0, 1)), 1)
"""

from __future__ import annotations

import math
import operator

import sympy
import torch

aten = torch.ops.aten

_COMPARE = {operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge}


def _number(x):
    """``x`` as a Python number or a sympy expression (a symbolic size); None if it is not
    a number."""
    if isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _plain(x.node.expr)
    return None


def _plain(e):
    """A sympy number as a Python one; any other expression as is."""
    if isinstance(e, sympy.Basic) and e.is_number:
        if e in (sympy.true, sympy.false):
            return bool(e)
        return int(e) if e.is_integer else float(e)
    return e


def _symbolic(v) -> bool:
    return isinstance(v, sympy.Basic)


def _truth(e) -> bool | None:
    """A sympy relation or a number's truth where it holds for every positive value of its
    symbols; None where it depends on them."""
    if isinstance(e, (bool, int, float)):
        return bool(e)
    if e in (sympy.true, sympy.false):
        return bool(e)
    if isinstance(e, sympy.Rel):
        d = sympy.expand(e.lhs - e.rhs)
        sign = {sympy.Eq: d.is_zero, sympy.Ne: d.is_nonzero, sympy.Lt: d.is_negative,
                sympy.Le: d.is_nonpositive, sympy.Gt: d.is_positive,
                sympy.Ge: d.is_nonnegative}.get(type(e))
        return sign
    z = sympy.expand(e).is_zero
    return None if z is None else not z


def _apply(fn, *vals):
    """``fn`` on known values; a comparison of symbolic ones only where it is decided."""
    if not any(_symbolic(v) for v in vals):
        return fn(*vals)
    vals = tuple(int(v) if isinstance(v, bool) else v for v in vals)
    if fn in _COMPARE:
        rel = {operator.eq: sympy.Eq, operator.ne: sympy.Ne, operator.lt: sympy.Lt,
               operator.le: sympy.Le, operator.gt: sympy.Gt, operator.ge: sympy.Ge}[fn]
        return _truth(rel(*vals, evaluate=False))
    if fn in (operator.add, operator.sub, operator.mul, operator.neg, abs):
        return _plain(sympy.expand(fn(*vals)))
    return None


def _cast(v, dtype: torch.dtype):
    """``v`` as an element of ``dtype`` holds it; None where that is not decided."""
    if v is None:
        return None
    if dtype == torch.bool:
        return _truth(v)
    if dtype.is_complex:
        return None
    if dtype.is_floating_point:
        return v if _symbolic(v) else float(v)
    if _symbolic(v):
        return v if v.is_integer else None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    info = torch.iinfo(dtype)
    return int(v) if info.min <= int(v) <= info.max else None  # no wrap-around modelled


def _zero(x) -> bool:
    return x == 0 if not _symbolic(x) else sympy.expand(x).is_zero is True


def _exact(c, a, t) -> bool:
    """Does ``t``'s dtype hold every element ``c + sum(a[d] * i[d])`` exactly? Integers: in
    range, where that can be decided (no wrap-around modelled). Floating point: integers
    the format represents exactly, on concrete sizes only (a float32 ``arange(n) * 0.1`` is
    rounded, element by element, as exact arithmetic is not)."""
    sizes = [_number(n) for n in t.shape]
    symbolic = any(_symbolic(x) for x in (c, *a)) or \
        any(_symbolic(n) for x, n in zip(a, sizes) if not _zero(x))
    if t.dtype.is_floating_point:
        if symbolic or any(isinstance(x, float) and not x.is_integer() for x in (c, *a)):
            return False
        top = 2 / torch.finfo(t.dtype).eps  # 2**24 for float32: every integer up to it
    elif symbolic:
        return True
    else:
        info = torch.iinfo(t.dtype)
        if any(isinstance(x, float) and not x.is_integer() for x in (c, *a)):
            return False  # truncated to integers: no longer affine
    lo = c + sum(min(0, x * (n - 1)) for x, n in zip(a, sizes) if not _zero(x) and n)
    hi = c + sum(max(0, x * (n - 1)) for x, n in zip(a, sizes) if not _zero(x) and n)
    if t.dtype.is_floating_point:
        return -top <= lo and hi <= top
    return info.min <= lo and hi <= info.max


def _arg(args, kwargs, pos, name, default=None):
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _dim(d, n):
    return d + n if d < 0 else d


def _lin(fn, x, y):
    """``fn`` (add, sub) term by term of two affine values of the same number of dims."""
    c = _apply(fn, x[0], y[0])
    a = tuple(_apply(fn, p, q) for p, q in zip(x[1], y[1]))
    return None if c is None or any(v is None for v in a) else (c, a)


def _scaled(x, k):
    c = _apply(operator.mul, x[0], k)
    a = tuple(_apply(operator.mul, v, k) for v in x[1])
    return None if c is None or any(v is None for v in a) else (c, a)


def _broadcast(known, t, n):
    """``t``'s affine value over ``n`` dims (broadcast: missing leading dims and dims of size
    one have coefficient zero)."""
    got = known.affine(t)
    if got is None or len(got[1]) > n:
        return None
    return got[0], (0,) * (n - len(got[1])) + got[1]


def _arange(known, args, kwargs, out):
    # arange(end), arange(start, end), arange(start, end, step): start + step * i
    start = 0 if len(args) < 2 else _number(args[0])
    step = _number(args[2]) if len(args) > 2 else _number(kwargs.get("step", 1))
    if not all(isinstance(v, int) or _symbolic(v) and v.is_integer for v in (start, step)):
        return None  # float steps: arange rounds
    return start, (step,)


def _add_sub(fn):
    def rule(known, args, kwargs, out):
        n = out.dim()
        x, y = _broadcast(known, args[0], n), _broadcast(known, args[1], n)
        alpha = _number(_arg(args, kwargs, 2, "alpha", 1))
        if x is None or y is None or alpha is None:
            return None
        y = y if alpha == 1 else _scaled(y, alpha)
        return None if y is None else _lin(fn, x, y)
    return rule


def _mul(known, args, kwargs, out):
    n = out.dim()
    x, y = _broadcast(known, args[0], n), _broadcast(known, args[1], n)
    if x is None or y is None:
        return None
    if all(_zero(v) for v in y[1]):
        return _scaled(x, y[0])
    return _scaled(y, x[0]) if all(_zero(v) for v in x[1]) else None


def _neg(known, args, kwargs, out):
    x = known.affine(args[0])
    return None if x is None else _scaled(x, -1)


def _same(known, args, kwargs, out):  # a copy or an alias: the same elements
    return known.affine(args[0])


def _cumsum(known, args, kwargs, out):
    # the cumulative sum of a constant v along dim d: v * (i_d + 1)
    v, d = known.value(args[0]), _dim(args[1], out.dim())
    if v is None or _symbolic(v) and not v.is_integer:
        return None
    v = int(v) if isinstance(v, bool) else v
    return v, tuple(v if e == d else 0 for e in range(out.dim()))


def _cat(known, args, kwargs, out):
    """Pieces that continue one another along the dim: c_k = c_0 + a_d * offset_k."""
    n = out.dim()
    d = _dim(_arg(args, kwargs, 1, "dim", 0), n)
    pieces = [(t, known.affine(t)) for t in args[0] if _number(t.numel()) != 0]
    if not pieces or any(p is None or len(p[1]) != n for _, p in pieces):
        return None
    (_, (c0, a0)), offsets, o = pieces[0], [], 0
    for t, _ in pieces:
        offsets.append(o)
        o = _apply(operator.add, o, _number(t.shape[d]))
    wide = [p[1][d] for t, p in pieces if _number(t.shape[d]) != 1]
    step = wide[0] if wide else _apply(operator.sub, pieces[1][1][0], c0) if len(pieces) > 1 \
        else 0
    a = tuple(step if e == d else x for e, x in enumerate(a0))
    for (t, (c, ak)), off in zip(pieces, offsets):
        want = _apply(operator.add, c0, _apply(operator.mul, step, off))
        if want is None or not _zero(_apply(operator.sub, c, want)):
            return None
        if any(not _zero(_apply(operator.sub, x, y)) for e, (x, y) in enumerate(zip(ak, a))
               if e != d or _number(t.shape[d]) != 1):
            return None
    return c0, a


def _slice(known, args, kwargs, out):
    x = known.affine(args[0])
    if x is None:
        return None
    d = _dim(_arg(args, kwargs, 1, "dim", 0), args[0].dim())
    start = _arg(args, kwargs, 2, "start")
    start, step = 0 if start is None else _number(start), _number(_arg(args, kwargs, 4, "step", 1))
    size = _number(args[0].shape[d])
    if not isinstance(start, int) or step is None:
        return None
    if start < 0:
        start = _apply(operator.add, start, size)
        if not _symbolic(start) and start < 0:
            start = 0
    c = _apply(operator.add, x[0], _apply(operator.mul, x[1][d], start))
    ad = _apply(operator.mul, x[1][d], step)
    return None if c is None or ad is None else (c, (*x[1][:d], ad, *x[1][d + 1:]))


def _select(known, args, kwargs, out):
    x = known.affine(args[0])
    if x is None:
        return None
    d = _dim(args[1], args[0].dim())
    i = _number(args[2])
    if i is None:
        return None
    if not _symbolic(i) and i < 0:
        i = _apply(operator.add, i, _number(args[0].shape[d]))
    c = _apply(operator.add, x[0], _apply(operator.mul, x[1][d], i))
    return None if c is None else (c, x[1][:d] + x[1][d + 1:])


def _unsqueeze(known, args, kwargs, out):
    x = known.affine(args[0])
    if x is None:
        return None
    d = _dim(args[1], out.dim())
    return x[0], (*x[1][:d], 0, *x[1][d:])


def _expand(known, args, kwargs, out):
    return _broadcast(known, args[0], out.dim())  # an expanded dim had size one


def _permute(known, args, kwargs, out):
    x = known.affine(args[0])
    if x is None:
        return None
    n = out.dim()
    if len(args) > 2:  # transpose.int(self, dim0, dim1)
        order = list(range(n))
        i, j = _dim(args[1], n), _dim(args[2], n)
        order[i], order[j] = order[j], order[i]
    elif len(args) == 2:  # permute(self, dims)
        order = [_dim(d, n) for d in args[1]]
    else:  # t(self)
        order = list(range(n))[::-1]
    return x[0], tuple(x[1][d] for d in order)


def _reshape(known, args, kwargs, out):
    """Squeeze, and a view that only adds or drops dims of size one (the others, in order,
    keep their sizes and coefficients)."""
    x = known.affine(args[0])
    if x is None:
        return None
    kept = [(_number(n), a) for n, a in zip(args[0].shape, x[1]) if _number(n) != 1]
    wanted = [e for e, n in enumerate(out.shape) if _number(n) != 1]
    if len(kept) != len(wanted) or any(
            not _zero(_apply(operator.sub, n, _number(out.shape[e])))
            for (n, _), e in zip(kept, wanted)):
        return None
    a = [0] * out.dim()
    for (_, ak), e in zip(kept, wanted):
        a[e] = ak
    return x[0], tuple(a)


_VIEWS = {
    aten.slice.Tensor: _slice, aten.select.int: _select, aten.unsqueeze.default: _unsqueeze,
    aten.expand.default: _expand, aten.transpose.int: _permute, aten.permute.default: _permute,
    aten.t.default: _permute, aten.alias.default: _same, aten.detach.default: _same,
    aten.view.default: _reshape, aten.squeeze.default: _reshape, aten.squeeze.dim: _reshape,
    aten.squeeze.dims: _reshape, aten._unsafe_view.default: _reshape,
}
#: op -> its output's affine value, ``(c, a)``, from its arguments' (None: not affine)
_AFFINE_RULES = {
    **_VIEWS,
    aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
    aten.add.Tensor: _add_sub(operator.add), aten.add.Scalar: _add_sub(operator.add),
    aten.sub.Tensor: _add_sub(operator.sub), aten.sub.Scalar: _add_sub(operator.sub),
    aten.mul.Tensor: _mul, aten.mul.Scalar: _mul, aten.neg.default: _neg,
    aten.clone.default: _same, aten._to_copy.default: _same, aten.expand_copy.default: _expand,
    aten.lift_fresh_copy.default: _same,
    aten.cat.default: _cat, aten.cumsum.default: _cumsum,
}
