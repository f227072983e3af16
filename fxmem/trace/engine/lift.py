"""A step that fixes B as a Python int, traced at several batch sizes and lifted to B.

``len(x)``, ``int(x.shape[0])`` or a size passed through numpy or a list turn the batch size
into a Python int (CPython's ``len()`` converts ``__len__``'s result with ``__index__``, so no
tracer can keep it symbolic): the ``ShapeEnv`` then fixes B to the example's value and no
formula in B comes out of the symbolic trace. (Likewise when the model's own Python code
fails on a symbolic B: ``np.arange(x.shape[0])`` makes an array of objects, which
``torch.from_numpy`` refuses.) Instead the step is traced with B a plain int
at :data:`FIT` and :data:`CHECK` (fake tensors, so each costs what one symbolic trace costs).
The traces must be the same step: the same ops in the same order, storages, aliasing,
lifetimes, saved tensors, dtypes (:func:`_skeleton`); only numbers may differ between them:
storage sizes, shape entries and the ops' scalar arguments. Each such number is fitted
exactly through the :data:`FIT` points (Newton's divided differences over the rationals, a
polynomial of degree at most ``len(FIT) - 1``) and must then give the traced value at every
:data:`CHECK` point and at the example's batch size. The result is one
:class:`~fxmem.trace.ledger.records.Trace` in B, read by every later stage like a symbolic one,
whose ``lifted`` says how it was obtained (``Report.lifted``, shown by every renderer).

The step is refused, with the original error and why, when the traces differ (a Python loop
over the batch, a branch on its size) or a number is no such polynomial. What the traced
points cannot show: a branch on B beyond them (in the model, or in a kernel rule of
fxmem's, decided at each concrete B), and a condition on B met after B was fixed (a slice
``pos[:len(x)]`` bounds B in a symbolic trace only): the formula is fitted, not derived,
and :class:`~fxmem.trace.ledger.records.Lifted` says so.

>>> import torch
>>> from fxmem.trace import trace
>>> class Eye(torch.nn.Module):
...     def forward(self, x):
...         return torch.eye(len(x)) @ x
>>> t = trace(Eye(), torch.randn(4, 3), loss=lambda o: o.sum(), train=False, device="cpu")
>>> sorted({str(s.size.expr) for s in t.storages}, key=len), t.lifted.checked
(['12*B', '4*B**2'], (6, 97))
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from fractions import Fraction

import sympy
import torch
from torch.utils._sympy.functions import Mod as TorchMod
from torch.utils._sympy.functions import PythonMod

from ...errors import DataDependentError, FxmemError, SpecializationError, TraceError
from ...formula.guards import implied, lower_bounds, valid_when
from ...formula.symbols import B, Size, dim_symbol
from ..ledger.records import Lifted, TensorDesc, Trace

FIT = (2, 3, 4, 5)  # the batch sizes each number is fitted through (avoiding 0 and 1)
# where the fitted polynomials must give the traced numbers again (and at the example's
# batch size): 97, prime and far, shows sizes padded to a multiple of up to 96 and branches
# on B up to it
CHECK = (6, 97)
_HOLE = "<number>"  # a number's place in a skeleton
_PLAIN = (str, bool, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def lift(trace_at, error: TraceError, guards=(), *, hint: int,
         cause: str = "makes B a Python int") -> Trace:
    """One trace in B from ``trace_at(b)`` (the step traced with B the int ``b``) at every
    point of :data:`FIT` and :data:`CHECK`; ``error``: the error of the symbolic trace (a
    :class:`SpecializationError` that fixed B, or the model's own code failing on a symbolic
    B), ``cause`` what it was; ``guards``: the conditions on B the symbolic trace met before
    it; ``hint``: the lifted trace's ``batch_hint`` (the example's batch size: checked too).
    Raises ``error``, with why lifting failed, when the step is not one polynomial step."""
    t0 = time.perf_counter()
    traces = {b: _traced(trace_at, b, error) for b in FIT}
    kept = [g for g in guards if all(g.xreplace({B: b}) is sympy.true for b in FIT)]
    traces, upper = _checked(trace_at, error, traces, kept, hint)
    checks = tuple(b for b in traces if b not in FIT)
    if not checks:
        raise _refused(error, f"the step runs only up to B={FIT[-1]}, so no batch size is "
                              "left to check a fit at")
    points = FIT + checks
    skeletons = {b: _skeleton(t) for b, t in traces.items()}
    ref = skeletons[FIT[0]]
    for b in points[1:]:
        why = _difference(ref, skeletons[b], FIT[0], b, traces[FIT[0]])
        if why:
            raise _refused(error, why)
    fitted, cache = [], {}
    for i, (where, _) in enumerate(ref[1]):
        values = tuple(skeletons[b][1][i][1] for b in points)
        got = cache.get(values)
        if got is None:
            got = cache[values] = _fit(values, checks)
        if got is _NONE:
            shown = ", ".join(f"{v}" for v in values)
            raise _refused(error, f"{where} is {shown} at B={', '.join(map(str, points))}: "
                                  f"no polynomial in B of degree <= {len(FIT) - 1}")
        fitted.append(got)
    kept += [B <= upper] if upper is not None else []
    note = Lifted(error.source, error.op, FIT, checks, time.perf_counter() - t0, cause)
    return _rebuilt(traces[FIT[0]], fitted, valid_when(kept, FIT[0]), hint, note)


def _traced(trace_at, b: int, error):
    """The step traced at B=``b``, or ``error`` saying why it cannot be (``error`` itself when
    it was no SpecializationError and the step fails at B=``b`` too: not for B's sake)."""
    try:
        return trace_at(b)
    except FxmemError as e:
        if not isinstance(error, SpecializationError) and b == FIT[0]:
            raise error from e
        if isinstance(e, DataDependentError):  # its own message says what and where
            at = f" at {e.source.rsplit(' in ', 1)[0]}" if getattr(e, "source", None) else ""
            raise _refused(error, f"at B={b} the step branches on data too{at}") from e
        why = getattr(e, "reason", str(e))
        op = f" ({e.op})" if getattr(e, "op", None) else ""
        raise _refused(error, f"the step cannot be traced at B={b}{op}: {why}") from e


def _checked(trace_at, error: TraceError, traces: dict, guards: list, hint: int) -> tuple:
    """``traces`` with the step traced at the check points too, and the largest B the step
    runs at (None: no limit seen). A check point beyond the conditions the symbolic trace
    met (``B <= 64`` from ``pos[:x.shape[0]]``) becomes their bound; one where the step
    fails (the same slice after B was fixed) is replaced by the largest B it runs at,
    found by bisection: the step fails from there on, for real, so the formula is only
    claimed up to it."""
    upper = valid_when(guards, FIT[0])
    upper = next((int(g.rhs) for g in upper if isinstance(g, sympy.LessThan)), None)
    wanted = sorted({*CHECK, hint} - set(FIT))
    if upper is not None:
        wanted = sorted({b for b in wanted if b <= upper} | ({upper} - set(FIT)))
    last = FIT[-1]
    for b in wanted:
        try:
            traces[b] = trace_at(b)
            last = b
            continue
        except FxmemError:
            failed = b
        while failed - last > 1:  # the step runs at ``last``, not at ``failed``
            mid = (last + failed) // 2
            try:
                traces[mid] = trace_at(mid)
                last = mid
            except FxmemError:
                failed = mid
        if last == FIT[-1]:  # nothing beyond the fitted points: say why it failed there
            _traced(trace_at, failed, error)
        return traces, last
    return traces, upper


def _refused(error: TraceError, why: str) -> TraceError:
    """``error`` with why the traces at concrete batch sizes could not replace it."""
    why = why.splitlines()[0] if why else why
    return type(error)(f"{error.reason}; tracing at concrete batch sizes to fit a "
                               f"formula failed: {why}", op=error.op, module=error.module,
                               source=error.source, phase=error.phase)


# the skeleton: a trace with its numbers taken out -----------------------------------------
def _walk(x, number, node):
    """``x`` (an op's arguments, a shape, a TensorDesc) with each number replaced by
    ``number(x)`` and each graph node by ``node(x)``, in a fixed order."""
    t = type(x)
    if t is int or t is float or isinstance(x, sympy.Expr):
        return number(x)
    if t is list or t is tuple or t is torch.Size:
        return (list if t is list else tuple)(_walk(v, number, node) for v in x)
    if t is dict:
        return {k: _walk(v, number, node) for k, v in x.items()}
    if t is TensorDesc:
        return TensorDesc(_walk(x.shape, number, node), x.dtype, x.sid)
    if isinstance(x, torch.fx.Node):
        return node(x)
    return x


def _skeleton(t: Trace) -> tuple:
    """``(parts, numbers)``: ``parts`` the trace with every number taken out, as
    ``[(what, [items])]`` to compare between batch sizes; ``numbers`` the ``(where, value)``
    taken out, in the order :func:`_rebuilt` puts them back."""
    numbers = []

    def taker(where):
        def take(v):
            numbers.append((where, v))
            return _HOLE
        return take

    def kind(x):  # objects other than numbers, strings, dtypes: compared by their type
        return x if isinstance(x, _PLAIN) else type(x).__name__

    storages = []
    for s in t.storages:
        where = f"the size of storage {s.sid} ({s.category} {s.name or s.module or '(root)'})"
        take = taker(where)
        storages.append(replace(s, size=take(s.size.expr), shape=_walk(s.shape, take, None)))
    rows = []
    for n in t.graph.nodes:
        op = n.meta.get("index")
        take = taker(f"a number in op {op} ({n.target})" if op is not None else
                     f"a shape of {n.name}")

        def args(x, take=take):
            return _walk(x, take, lambda m: ("node", m.name))

        walked = (args(n.args), args(n.kwargs), args(n.meta.get("val")))
        rows.append((n.op, str(n.target), n.name, n.meta.get("phase"), n.meta.get("module"),
                     op, _plainly(walked, kind)))
    ops = [op if op.reduce is None else  # a reduction's arguments (its tensors' sizes)
           replace(op, reduce=_walk(op.reduce, taker(f"a number in reduction op {op.index}"),
                                    None)) for op in t.ops]
    fields = [("the ops", ops), ("the storages", storages), ("the graph", rows),
              ("the conditions on the named dims", _named_guards(t)),
              ("what is not modelled", _texts(t.unmodelled, taker("a number in what "
                                                               "fxmem does not model"))),
              ("the CUDA kernels", _texts(t.kernel_choices, taker("a number in the CUDA "
                                                                  "kernels chosen"))),
              ("the module calls", t.calls), ("the saved tensors", t.packs),
              ("the copied blocks", t.reused), ("the checkpointed modules", t.plan),
              ("the step", (t.train, t.device, t.has_optimizer, t.grad_accum, t.dims,
                            t.compute_capability))]
    return fields, numbers


def _texts(rows, number) -> tuple:
    """``rows`` of strings (what is not modelled, the kernels chosen) with each number in
    them passed to ``number``: a note may say how many indices a kernel sorts."""
    return tuple(tuple(_NUMBER.sub(lambda m: str(number(int(m.group()))), s)
                       if isinstance(s, str) else s for s in row) for row in rows)


_NUMBER = re.compile(r"(?<![\w.])[1-9][0-9]*(?![\w.])")  # not in names, decimals


def _plainly(x, leaf):
    """``x`` with objects other than numbers, strings, dtypes and the like as type names
    (two traces hold different objects of the same kind)."""
    if type(x) in (list, tuple):
        return type(x)(_plainly(v, leaf) for v in x)
    if type(x) is dict:
        return {k: _plainly(v, leaf) for k, v in x.items()}
    if type(x) is TensorDesc or type(x) in (int, float) or isinstance(x, sympy.Expr):
        return x
    return leaf(x)


def _difference(a, b, ba: int, bb: int, trace: Trace) -> str | None:
    """Why the skeletons ``a`` (at B=``ba``) and ``b`` (at ``bb``) are not the same step."""
    for (what, xs), (_, ys) in zip(a[0], b[0]):
        if xs == ys:
            continue
        xs, ys = list(xs), list(ys)
        if what == "the ops" and len(xs) != len(ys):
            return (f"the step runs {len(xs)} ops at B={ba} and {len(ys)} at B={bb} (a Python "
                    "loop or branch on the batch size)")
        i = next((i for i, (x, y) in enumerate(zip(xs, ys)) if x != y), min(len(xs), len(ys)))
        if what == "the ops" and i < len(xs):
            x, y = xs[i], ys[i]
            return (f"op {i} is {x.op} in {x.module or '(root)'} at B={ba} and {y.op} in "
                    f"{y.module or '(root)'} at B={bb}")
        if what == "the storages" and i < min(len(xs), len(ys)):
            x = xs[i]
            made = trace.ops[x.created_by].op if x.created_by >= 0 else "the step's start"
            return (f"storage {x.sid} ({x.category}, made by {made}) lives or is held "
                    f"differently at B={ba} and B={bb}")
        return f"{what} differ between B={ba} and B={bb}" + (
            f" (at item {i})" if len(xs) == len(ys) else f" ({len(xs)} and {len(ys)} items)")
    return None


# the fit -------------------------------------------------------------------------------
_NONE = object()  # no polynomial fits


def _fit(values: tuple, checks: tuple):
    """The number at :data:`FIT` + ``checks`` (``values``, in that order) as one value:
    itself when it never changes, else a polynomial in B through the :data:`FIT` values that
    gives the ``checks`` ones too; :data:`_NONE` when there is none. A float (an op's scalar
    argument, never a size) is read as the nearest fraction of small denominator, and
    matched to 12 digits, or as one over a polynomial (``1 / len(x)``)."""
    if all(v == values[0] or _nan(v) and _nan(values[0]) for v in values[1:]):
        return values[0]  # (a NaN argument too)
    if all(type(v) is int or isinstance(v, sympy.Integer) for v in values):
        return _fit_rational([Fraction(int(v)) for v in values], checks)
    if all(type(v) in (int, float) for v in values):  # an op's scalar argument
        if not all(abs(v) < float("inf") for v in values):
            return _NONE

        def near(vs):
            return [Fraction(v).limit_denominator(10**6) for v in vs]

        for inverse in (False, True):
            if inverse and not all(values):
                break
            got = _fit_rational(near(1 / v if inverse else v for v in values), checks,
                                exact=False)
            got = got if got is _NONE or not inverse else 1 / got
            if got is not _NONE and all(math.isclose(float(got.subs(B, b)), v, rel_tol=1e-12)
                                        for b, v in zip(FIT + checks, values)):
                return got
        return _NONE
    ys = [sympy.sympify(v) for v in values]  # numbers in the named dims too
    poly = sympy.expand(sympy.interpolate(list(zip(FIT, ys[:len(FIT)])), B))
    ok = all(sympy.expand(poly.subs(B, b) - y) == 0 for b, y in zip(checks, ys[len(FIT):]))
    return poly if ok else _NONE


def _nan(v) -> bool:
    return type(v) is float and math.isnan(v)


def _fit_rational(ys: list, checks: tuple, exact: bool = True):
    """Newton's divided differences through (:data:`FIT`, ``ys``), checked at ``checks``
    when ``exact``: the polynomial as a sympy expression in B, or :data:`_NONE`."""
    n, xs = len(FIT), FIT
    coef = ys[:n]
    for j in range(1, n):
        for i in range(n - 1, j - 1, -1):
            coef[i] = (coef[i] - coef[i - 1]) / (xs[i] - xs[i - j])

    def at(x):
        v = coef[-1]
        for i in range(n - 2, -1, -1):
            v = v * (x - xs[i]) + coef[i]
        return v

    if exact and any(at(b) != y for b, y in zip(checks, ys[n:])):
        return _NONE
    expr = sympy.Integer(0)
    term = sympy.Integer(1)
    for i, c in enumerate(coef):
        expr += sympy.Rational(c.numerator, c.denominator) * term
        term *= B - xs[i]
    return sympy.expand(expr)


# the lifted trace --------------------------------------------------------------------------
def _rebuilt(t: Trace, fitted: list, guards: tuple, hint: int, note: Lifted) -> Trace:
    """``t`` (traced at one batch size) with its numbers replaced by ``fitted``, in the
    order :func:`_skeleton` took them out."""
    values = iter(fitted)

    def put(_):
        return next(values)

    sizes: dict = {}
    storages = []
    for s in t.storages:
        e = sympy.sympify(put(None))
        size = sizes.get(e) or sizes.setdefault(e, Size.of(e))
        storages.append(replace(s, size=size, shape=_walk(s.shape, put, None)))
    graph = torch.fx.Graph()
    env: dict = {}
    for node in t.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        env[node] = new
        new.args = _walk(node.args, put, env.__getitem__)
        new.kwargs = _walk(node.kwargs, put, env.__getitem__)
        val = _walk(node.meta.get("val"), put, None)
        if val is not None:
            new.meta["val"] = val
    ops = tuple(op if op.reduce is None else replace(op, reduce=_walk(op.reduce, put, None))
                for op in t.ops)
    unmodelled, kernels = _texts(t.unmodelled, put), _texts(t.kernel_choices, put)
    return replace(t, graph_source=graph, storages=tuple(storages), ops=ops,
                   guards=tuple(guards) + _named_guards(t), batch_hint=hint, lifted=note,
                   unmodelled=unmodelled, kernel_choices=kernels)


def _named_guards(t: Trace) -> tuple:
    """The conditions of ``t`` (traced with B an int) on its named dims, without those
    implied by the dims' lower bounds: with B a number, a condition on B and a dim reads
    ``Mod(2, 2*L) != 0`` at B=2 and ``Mod(3, 3*L) != 0`` at B=3, both always true."""
    dims = [dim_symbol(n) for n in t.dims]
    lows = lower_bounds(t.guards, dims)
    return tuple(g for g in t.guards if g is not sympy.true and (
        isinstance(g, sympy.GreaterThan) and g.lhs in dims or not implied(g, lows)))


# the parity of B ------------------------------------------------------------------------
def parity_checked(t: Trace, trace_with_hint) -> Trace:
    """``t`` without its conditions on the remainder of B (``Eq(Mod(B, 2), 0)``) when the
    step is the same whatever the remainder. Such a condition comes from code that asks
    whether B divides evenly and may take another path when not: DTensor's view rule asks
    it of every dim it might keep sharded (``_view_ops.py``, ``_analyze_split``:
    ``guard_or_false(out_size % mesh_dim_size == 0)``), even of a replicated one, whose
    path the answer does not change. ``trace_with_hint(b)``: the step traced with B
    symbolic and ``b`` as its example. A B outside the conditions is traced; the
    conditions are dropped only when that trace's own remainder conditions and ``t``'s
    cover every B (checked over a whole period) and the two steps are the same op by op,
    size by size (:func:`_skeleton`). Otherwise ``t`` is returned as it is: the formula
    then holds only where its conditions say."""
    def remainders(g):  # sympy's Mod, or torch's (torch/utils/_sympy/functions.py)
        return [m for m in g.atoms(sympy.Mod, TorchMod, PythonMod) if m.args[1].is_Integer]

    mods = [g for g in t.guards if remainders(g) and g.free_symbols == {B}]
    if not mods:
        return t
    period = math.lcm(*(int(m.args[1]) for g in mods for m in remainders(g)))
    lo = lower_bounds(t.guards, [B])[B]

    def holds(guards, b):
        return all(bool(g.xreplace({B: b})) for g in guards)

    other = next((b for b in range(lo, lo + period) if not holds(mods, b)), None)
    if other is None or period > 16:  # (a period this long: too many paths to trace)
        return t
    u = trace_with_hint(other)
    theirs = [g for g in u.guards if remainders(g) and g.free_symbols == {B}]
    rest = tuple(g for g in t.guards if g not in mods)
    if (set(rest) != {g for g in u.guards if g not in theirs}
            or not all(holds(mods, b) or holds(theirs, b) for b in range(lo, lo + period))):
        return t
    a, b = _skeleton(replace(t, guards=rest)), _skeleton(replace(u, guards=rest))
    if a[0] != b[0] or [v for _, v in a[1]] != [v for _, v in b[1]]:
        return t
    return replace(t, guards=rest)
