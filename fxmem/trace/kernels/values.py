"""Values the trace knows: tensors whose every element is one known number.

Fake tensors have no data: a value a model reads in its forward (``bool(t)``, ``t.item()``)
is a symbol (:mod:`fxmem.trace.kernels.datadep`), and a branch on it cannot be traced. Some reads
do not depend on data at all: a tensor the model filled itself (``torch.ones(batch, seq)``)
and what it computes from it elementwise or by reduction. :class:`KnownValues` follows
such tensors through the trace, one value per storage (every element of the storage equals
it), so that a read of one is answered as eager would answer it. A sum over a symbolic
number of elements is a symbolic value (``16*B``), and a comparison is answered only where
it holds for every batch size (``t.sum() == t.numel()``).

Libraries decide some branches by whether a tensor is fake: transformers' ``is_tracing(t)``
(transformers/utils/import_utils.py, ``is_fake_tensor``: ``isinstance(t, FakeTensor)``)
makes ``masking_utils`` build an attention mask that eager skips when it reads that the
padding mask is all ones (``_ignore_causal_mask_sdpa``, ``_ignore_bidirectional_mask_sdpa``).
While fxmem traces, :func:`eager_branches` answers that a fake tensor whose value is known
is not fake, so the branch eager takes is traced; a tensor of unknown value (the user's
attention mask) is still fake to it, and the traced branch is the one that does not read.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> known = KnownValues()
>>> with FakeTensorMode():
...     ones = torch.ones(4, 16)
...     known.update(torch.ops.aten.ones.default, ((4, 16),), {}, ones)
...     s = ones.sum()
...     known.update(torch.ops.aten.sum.default, (ones,), {}, s)
>>> known.value(s)
64.0
"""

from __future__ import annotations

import contextlib
import operator
import sys

import sympy
import torch
from torch.utils.weak import WeakIdKeyDictionary

from .affine import (
    _AFFINE_RULES,
    _VIEWS,
    _apply,
    _cast,
    _exact,
    _number,
    _plain,
    _symbolic,
    _truth,
    _zero,
)

aten = torch.ops.aten

# op -> the value of its output from the values of its tensor and number arguments
_FACTORY = {  # op -> the value it fills with (None: its fill_value argument, _FILL_ARG)
    aten.ones.default: 1, aten.zeros.default: 0, aten.full.default: None,
    aten.new_ones.default: 1, aten.new_zeros.default: 0, aten.new_full.default: None,
    aten.ones_like.default: 1, aten.zeros_like.default: 0, aten.full_like.default: None,
    aten.scalar_tensor.default: None,
}
_FILL_ARG = {aten.full.default: 1, aten.new_full.default: 2, aten.full_like.default: 1,
             aten.scalar_tensor.default: 0}
# every element of the output is an element of the input: same value, cast to its dtype
_COPIES = {
    aten.clone.default, aten._to_copy.default, aten.index.Tensor, aten.index_select.default,
    aten.repeat.default, aten.expand_copy.default, aten.contiguous.default,
    aten.gather.default, aten.flip.default, aten.roll.default,
}
_UNARY = {
    aten.bitwise_not.default: lambda v: not v if isinstance(v, bool) else ~v,
    aten.logical_not.default: lambda v: not v,
    aten.neg.default: operator.neg, aten.abs.default: abs,
}
_BINARY = {
    aten.add: operator.add, aten.sub: operator.sub, aten.mul: operator.mul,
    aten.div: operator.truediv,
    aten.eq: operator.eq, aten.ne: operator.ne, aten.lt: operator.lt, aten.le: operator.le,
    aten.gt: operator.gt, aten.ge: operator.ge,
    aten.bitwise_and: operator.and_, aten.bitwise_or: operator.or_,
    aten.logical_and: lambda a, b: bool(a) and bool(b),
    aten.logical_or: lambda a, b: bool(a) or bool(b),
}
_BINARY_OPS = {getattr(packet, name): fn for packet, fn in _BINARY.items()
               for name in ("Tensor", "Scalar") if hasattr(packet, name)}
_SUM = {aten.sum.default, aten.sum.dim_IntList}
_SAME_REDUCTIONS = {  # the reduction of n >= 1 equal values is that value
    aten.amax.default, aten.amin.default, aten.max.default, aten.min.default,
    aten.mean.default, aten.mean.dim,
}
_ALL_ANY = {aten.all.default: bool, aten.all.dim: bool, aten.any.default: bool,
            aten.any.dim: bool}
def written_args(func) -> tuple:
    """Positions and names of the arguments ``func`` writes (in-place and ``out=``)."""
    got = _WRITES.get(func)
    if got is None:
        got = _WRITES[func] = tuple(
            (i, a.name) for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write)
    return got


_WRITES: dict = {}


def passed(positions, args, kwargs) -> list:
    """The values a call passed for ``positions`` (``(index, name)`` pairs of its schema's
    arguments, as :func:`written_args` gives them), by position or by name; None for one
    passed neither way.

    >>> f = torch.ops.aten.add_.Tensor
    >>> passed(written_args(f), (1, 2), {})
    [1]
    >>> passed(((1, "out"),), (1,), {"out": 3})
    [3]
    """
    return [args[i] if i < len(args) else kwargs.get(name) for i, name in positions]


class KnownValues:
    """Storage -> (dtype, value): every element of the storage, read as ``dtype``, equals
    ``value`` (a Python number, or a sympy expression in the ShapeEnv's symbols). Holds no
    tensor: entries go with their storage."""

    def __init__(self):
        self._of = WeakIdKeyDictionary()
        # tensor -> (dtype, c, coefficients, generation): affine in its indices (see above)
        self._affine = WeakIdKeyDictionary()
        self._generation = WeakIdKeyDictionary()  # storage -> writes seen (forgets affines)

    def value(self, t):
        """The value of every element of ``t``, or None if unknown."""
        if not isinstance(t, torch.Tensor):
            return _number(t)
        got = self._of.get(t.untyped_storage()) if self._of and not t.is_meta else None
        if got is not None and got[0] == t.dtype:
            return got[1]
        got = self._affine_entry(t)
        if got is not None and all(_zero(x) for x in got[1]):
            return got[0]
        const = getattr(t, "constant", None)  # a fake tensor made from a real scalar
        if const is not None and const.numel() == 1:
            return const.item()
        return None

    def read(self, t):
        """What ``t.item()`` returns, or NotImplemented if its value is not known."""
        v = self.value(t)
        if v is None or _symbolic(v):
            return NotImplemented
        return _cast(v, t.dtype)

    def _set(self, t, v) -> None:
        v = _cast(v, t.dtype)
        if v is not None:
            self._of[t.untyped_storage()] = (t.dtype, v)

    def _affine_entry(self, t):
        """``(c, coefficients)`` recorded for ``t`` itself, if no write reached its storage
        since; None otherwise."""
        got = self._affine.get(t) if self._affine and not t.is_meta else None
        if got is None:
            return None
        dtype, c, a, gen = got
        if dtype != t.dtype or len(a) != t.dim() or \
                gen != self._generation.get(t.untyped_storage(), 0):
            return None
        return c, a

    def affine(self, t):
        """``(c, a)``: element ``i`` of ``t`` is ``c + sum(a[d] * i[d])``; None if unknown.
        A number is ``(value, ())``, a constant tensor has zero coefficients."""
        v = self.value(t)
        if v is not None:
            return v, (0,) * (t.dim() if isinstance(t, torch.Tensor) else 0)
        return self._affine_entry(t) if isinstance(t, torch.Tensor) else None

    def _set_affine(self, t, c, a, view: bool) -> None:
        """Record ``t`` as affine. A constant made by a view is recorded for that tensor
        only; one a kernel wrote (a new storage, all of it) for its storage."""
        a = tuple(0 if _number(n) == 1 else x for n, x in zip(t.shape, a))  # index 0 only
        if all(_zero(x) for x in a):
            if not view:
                self._set(t, c)
                return
        elif t.dtype == torch.bool or t.dtype.is_complex or not _exact(c, a, t):
            return
        c = _cast(c, t.dtype)
        a = tuple(_cast(x, t.dtype) if not _zero(x) else 0 for x in a)
        if c is None or any(x is None for x in a):
            return
        self._affine[t] = (t.dtype, c, a, self._generation.get(t.untyped_storage(), 0))

    def update(self, func, args, kwargs, out) -> None:
        """Follow ``func``: forget storages it writes, learn its output's value."""
        written = written_args(func)
        for t in passed(written, args, kwargs) if self._of or self._affine else ():
            for x in t if isinstance(t, (list, tuple)) else (t,):
                if isinstance(x, torch.Tensor):
                    st = x.untyped_storage()
                    self._of.pop(st, None)
                    self._generation[st] = self._generation.get(st, 0) + 1
        if written or not isinstance(out, torch.Tensor):
            return
        try:
            v = self._output(func, args, kwargs, out)
            if v is None and func in _AFFINE_RULES:  # fxmem.trace.kernels.affine
                got = _AFFINE_RULES[func](self, args, kwargs, out)
                if got is not None:
                    self._set_affine(out, *got, view=func in _VIEWS)
                return
        except (TypeError, ValueError, ArithmeticError, IndexError):  # e.g. 1 / 0: not known
            v = None
        if v is not None:
            self._set(out, v)

    def _output(self, func, args, kwargs, out):
        if func in _FACTORY:
            v = _FACTORY[func]
            if v is None:
                pos = _FILL_ARG[func]
                v = _number(args[pos] if len(args) > pos else kwargs.get("fill_value"))
            return v
        if func in _COPIES:
            return self.value(args[0])
        if func in _UNARY:
            v = self.value(args[0])
            return None if v is None or _symbolic(v) else _UNARY[func](v)
        fn = _BINARY_OPS.get(func)
        if fn is not None:
            a, b = self.value(args[0]), self.value(args[1])
            if a is None or b is None:
                return None
            alpha = kwargs.get("alpha")
            if alpha is not None:
                b = _apply(operator.mul, b, _number(alpha))
            return None if b is None else _apply(fn, a, b)
        if func is aten.where.self:
            c, a, b = (self.value(x) for x in args[:3])
            c = None if c is None else _truth(c)
            return (a if c else b) if c is not None else (a if a is not None and a == b
                                                         else None)
        if func in _SUM or func in _SAME_REDUCTIONS or func in _ALL_ANY:
            v = self.value(args[0])  # the count (sympy, in B) only for a known value
            count = None if v is None else self._count(args[0], out)
            if count is None:
                return None
            if func in _SUM:
                return _apply(operator.mul, v, count)
            if _truth(sympy.Ge(count, 1, evaluate=False) if _symbolic(count)
                      else count >= 1) is not True:
                return None
            return _truth(v) if func in _ALL_ANY else v
        return None

    @staticmethod
    def _count(x, out):
        """How many elements of ``x`` each element of ``out`` reduces."""
        n, m = _number(x.numel()), _number(out.numel())
        if n is None or m is None:
            return None
        if not _symbolic(n) and not _symbolic(m):
            return n // m if m else None
        return _plain(sympy.simplify(sympy.sympify(n) / sympy.sympify(m)))


@contextlib.contextmanager
def eager_branches(known: KnownValues):
    """While the block runs, transformers' ``is_fake_tensor`` (read by its ``is_tracing``)
    answers False for a fake tensor whose value ``known`` holds: transformers then takes
    the branch eager takes, reading the value, which the trace answers."""
    mod = sys.modules.get("transformers.utils.import_utils")
    orig = getattr(mod, "is_fake_tensor", None)
    if orig is None:
        yield
        return

    def is_fake_tensor(x) -> bool:
        return orig(x) and known.value(x) is None

    mod.is_fake_tensor = is_fake_tensor
    try:
        yield
    finally:
        mod.is_fake_tensor = orig
