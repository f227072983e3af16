"""Input dims beyond the batch as symbols: the step's memory as a formula of B *and*, say, the
sequence length L, from one trace.

``fxmem.analyze(..., dims={"L": [(0, 1), (1, 1)]})`` traces with dim 1 of tensors 0 and 1
(inputs, then targets) as the symbol :data:`fxmem.formula.symbols.L`; :class:`DimsFormula`
reads that trace: the peak as an exact ``Max`` of expressions in B and L (B·L terms, B·L²
for attention), evaluated at a point in integer arithmetic, and the largest length for a
budget. :func:`specialize` fixes the named dims (``L=512``), giving a trace in B alone, which
the rest of the pipeline reads as usual (``Report.at(L=512)``).

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
>>> r = fxmem.analyze(m, torch.randn(4, 10, 16), loss=lambda o: o.sum(), device="cpu",
...                   dims={"L": [(0, 1)]})
>>> r.peak
Max(128*B*L + 2184, 192*B*L + 1096)
>>> r.peak_bytes(8, L=100) == r.at(L=100).peak_bytes(8)
True
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import sympy
import torch

from ..errors import InfeasibleBudgetError, InputError
from ..formula.guards import lower_bounds, valid_when
from ..formula.prune import prune_rows
from ..formula.symbols import B, Size, dim_symbol
from ..trace.ledger import with_fields
from .sizes import device_sizes

B_SYM = B


def _subs(e, values: dict):
    return e.xreplace(values) if isinstance(e, sympy.Basic) else e


def _positive(**ints) -> None:
    """Each of ``ints`` (B, a named dim's value) a positive int; else an
    :class:`fxmem.InputError` naming it."""
    for name, v in ints.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{name} must be a positive int, got {v!r}")


def _at(b: int, values: dict) -> dict:
    """B and the named dims' symbols -> ``b`` and ``values`` as sympy Integers."""
    return {B_SYM: sympy.Integer(b), **{dim_symbol(n): sympy.Integer(v)
                                        for n, v in values.items()}}


def specialize(trace, **values):
    """``trace`` with its named dims fixed (``L=512``): sizes, shapes and guards in B only.
    Raises :class:`fxmem.InputError` when a value breaks a condition the trace assumed."""
    missing = set(trace.dims) - set(values)
    unknown = set(values) - set(trace.dims)
    if missing or unknown:
        raise InputError(f"give a value for every named dim {list(trace.dims)}"
                         + (f"; unknown: {sorted(unknown)}" if unknown else ""))
    _positive(**values)
    vals = {dim_symbol(name): sympy.Integer(v) for name, v in values.items()}
    guards = []
    for g in trace.guards:
        h = g.xreplace(vals)
        if h is sympy.false:
            raise InputError(f"{', '.join(f'{k}={v}' for k, v in values.items())} is outside "
                             f"where the trace holds ({g})")
        if h is not sympy.true:
            guards.append(h)
    fixed, made = _fixed(trace)
    sizes: dict = dict(made)
    by_expr: dict = {}  # a size expression -> its Size here (storages share a few dozen)
    dims: dict = {}  # a shape's dim -> its value here
    storages = []
    for i, s in enumerate(trace.storages):
        if i in fixed:  # no named dim in it: as every value makes it
            storages.append(fixed[i])
            continue
        size = by_expr.get(s.size.expr)
        if size is None:
            e = sympy.expand(s.size.expr.xreplace(vals))
            size = by_expr[s.size.expr] = sizes.get(e) or sizes.setdefault(e, Size.of(e))
        shape = tuple(dims[d] if d in dims else dims.setdefault(d, _subs(d, vals))
                      for d in s.shape)
        storages.append(with_fields(s, size=size, shape=shape))
    lower = [g for g in guards if g.free_symbols <= {B}]
    rest = [g for g in guards if not g.free_symbols <= {B}]
    return replace(trace, graph_source=Specialized(trace, vals), storages=tuple(storages),
                   ops=_ops_at(trace.ops, vals), guards=valid_when(lower) + tuple(rest),
                   dims=())


# the last ops specialized: (ops, values, ops with the values put in). The traces of a rank's
# step at other world sizes share its ops (fxmem.trace.parallel.other_ranks), so each
# specialized at the same values shares one tuple, which the planner's numbers are kept by
# (fxmem.checkpoint.plans.derive_numbers)
_OPS_AT: list = []


def _ops_at(ops: tuple, vals: dict) -> tuple:
    """``ops`` with the named dims' values ``vals`` put in the reductions' arguments
    (:mod:`fxmem.trace.kernels.cuda.reduce_replay`), once per object (Llama-3.1-8B: 195 ops
    share 15; the trace holds them, so their ids stay theirs); the same tuple again for the
    same ``ops`` and values."""
    if _OPS_AT and _OPS_AT[0] is ops and _OPS_AT[1] == vals:
        return _OPS_AT[2]
    subbed: dict = {}

    def reduce_of(args):
        got = subbed.get(id(args))
        if got is None:
            got = subbed[id(args)] = _tree_subs(args, vals)
        return got
    out = tuple(op if op.reduce is None else with_fields(op, reduce=reduce_of(op.reduce))
                for op in ops)
    _OPS_AT[:] = [ops, dict(vals), out]
    return out


def _fixed(trace) -> tuple:
    """What :func:`specialize` makes of ``trace``'s storages whose size and shape hold no
    named dim, whatever the dims' values: ``({index: storage}, {size expression: Size})``,
    made once per trace (the longest-length search specializes one trace at a dozen
    lengths: Llama-3.1-8B's over 8 GPUs, 7,162 storages each time, 3,207 of them holding no
    L, the rest sized by some 50 expressions)."""
    got = trace.__dict__.get("_fixed_storages")
    if got is None:
        syms = {dim_symbol(name) for name in trace.dims}

        held: dict = {}  # a shape, its dim or a size's expression -> whether it holds one

        def free(e) -> bool:
            if not isinstance(e, sympy.Basic):
                return False
            got = held.get(e)
            if got is None:
                got = held[e] = bool(e.free_symbols & syms)
            return got
        fixed, sizes, own = {}, {}, {}  # own: id of a Size -> the Size it is without dims
        for i, s in enumerate(trace.storages):
            shaped = held.get(s.shape)  # (a shape's tuple: as its dims')
            if shaped is None:
                shaped = held[s.shape] = any(free(d) for d in s.shape)
            if shaped or free(s.size.expr):
                continue
            size = own.get(id(s.size))
            if size is None:  # (storages share a few dozen Sizes, the trace holding them)
                e = sympy.expand(s.size.expr)
                size = own[id(s.size)] = sizes.get(e) or sizes.setdefault(e, Size.of(e))
            fixed[i] = s if size is s.size else with_fields(s, size=size)  # (mostly itself)
        got = fixed, sizes
        object.__setattr__(trace, "_fixed_storages", got)  # (a frozen dataclass)
    return got


class Specialized:
    """The graph source of a trace :func:`specialize` made: its graph is the original's with
    the named dims' ``values`` put in, built when first asked for (``Trace.graph``). What
    reads only the nodes' shapes (FLOP counts: :func:`fxmem.checkpoint.flops.op_flops`)
    reads the ``original``'s nodes with ``values`` put in (:func:`nodes_and_values`),
    copying none."""

    def __init__(self, original, values: dict):
        self.original, self.values = original, values

    def __call__(self) -> torch.fx.Graph:
        graph = torch.fx.Graph()
        env: dict = {}
        for node in self.original.graph.nodes:
            new = graph.node_copy(node, lambda n: env[n])
            env[node] = new
            if "val" in node.meta:
                new.meta["val"] = value_in(node.meta["val"], self.values)
            new.args = args_in(new.args, self.values)
            new.kwargs = args_in(new.kwargs, self.values)
        return graph


def nodes_and_values(trace) -> tuple:
    """(the graph whose nodes stand for ``trace``'s ops, the values to put in their
    shapes and arguments with :func:`value_in` and :func:`args_in`): a specialized trace's
    original graph and its dims' values, or ``trace.graph`` and none."""
    source = trace.graph_source
    if isinstance(source, Specialized):
        return source.original.graph, source.values
    return trace.graph, {}


def value_in(val, values: dict):
    """A node's value (``meta["val"]``) with ``values`` put in, as in a specialized graph."""
    from ..trace.ledger import TensorDesc

    return _desc_subs(val, values, TensorDesc) if values and isinstance(
        val, (TensorDesc, tuple)) else val


def args_in(args, values: dict):
    """A node's arguments with ``values`` put in, as in a specialized graph (the nodes
    among them kept)."""
    return _tree_subs(args, values) if values else args


def _desc_subs(val, vals, desc):
    if isinstance(val, tuple):
        return tuple(_desc_subs(v, vals, desc) for v in val)
    if isinstance(val, desc):
        return desc(tuple(_subs(d, vals) for d in val.shape), val.dtype, val.sid)
    return val


def _tree_subs(x, vals):
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_subs(v, vals) for v in x)
    if isinstance(x, dict):
        return {k: _tree_subs(v, vals) for k, v in x.items()}
    return _subs(x, vals)


MAX_SKIPPED = 4096  # values of a named dim tried above its least for one the trace holds at


def _holds(guards, subs: dict) -> bool:
    """Whether none of ``guards`` is false at ``subs`` (one that divides by zero there is).

    >>> L = sympy.Symbol("L", positive=True, integer=True)
    >>> from torch.utils._sympy.functions import FloorDiv, Mod
    >>> _holds([sympy.Eq(Mod(L, FloorDiv(L, 16)), 0)], {L: 32}), _holds(
    ...     [sympy.Eq(Mod(L, FloorDiv(L, 16)), 0)], {L: 8})
    (True, False)
    """
    for g in guards:
        try:
            if g.xreplace(subs) is sympy.false:
                return False
        except ZeroDivisionError:
            return False
    return True


def _multiple_of(guards, x) -> int:
    """The k the guards hold ``x`` to a multiple of (``Eq(Mod(c*x, m), 0)`` for integers
    ``c`` and ``m``: k = m / gcd(c, m); sympy's ``Mod`` or PyTorch's ``Mod``/``PythonMod``),
    the least common multiple of all such; 1 where none.

    >>> L = sympy.Symbol("L", positive=True, integer=True)
    >>> _multiple_of([sympy.Eq(sympy.Mod(L, 16), 0), L >= 2], L), _multiple_of([L >= 2], L)
    (16, 1)
    >>> from torch.utils._sympy.functions import Mod
    >>> _multiple_of([sympy.Eq(Mod(128 * L, 2048), 0)], L)  # a view of 4*L*32 as (-1, 16, 32)
    16
    """
    k = 1
    for g in guards:
        if not (isinstance(g, sympy.Eq) and g.rhs == 0 and len(g.lhs.args) == 2
                and type(g.lhs).__name__ in ("Mod", "PythonMod")):
            continue
        a, m = g.lhs.args
        c = sympy.simplify(a / x)
        if m.is_Integer and c.is_Integer and c != 0:
            k = sympy.ilcm(k, int(m) // sympy.igcd(int(c), int(m)))
    return int(k)


class Length(int):
    """:meth:`DimsFormula.max_length`'s answer, an ``int``; ``beyond``: it fits and the
    trace ends there (``valid_when``: e.g. a compiled kernel's 32-bit indices), so a longer
    one may fit too, unseen by this trace; ``multiple``: the trace holds for multiples of it
    alone, the answer among them (a longer one that is none may fit, unseen by this trace).

    >>> n = Length(4096, beyond=True)
    >>> n + 1, n.beyond, n.multiple
    (4097, True, 1)
    """

    beyond: bool = False
    multiple: int = 1

    def __new__(cls, value: int, beyond: bool = False, multiple: int = 1):
        self = super().__new__(cls, value)
        self.beyond, self.multiple = beyond, multiple
        return self


@dataclass(frozen=True)
class DimsFormula:
    """The step's memory as formulas in B and the named dims (bytes), from a trace with
    named dims: ``peak`` (an exact ``Max``), ``peak_bytes(B, L=...)``, ``parts``,
    ``max_length``; ``valid_when``: conditions on B, the dims and both. Read through
    :class:`fxmem.Report` (``analyze(..., dims=...)``)."""

    trace: object
    device: str

    @property
    def dims(self) -> tuple:
        return self.trace.dims

    @property
    def valid_when(self) -> tuple:
        return self.trace.guards

    def peak_bytes(self, B: int, **values) -> int:  # noqa: N803
        """Peak bytes at batch size ``B`` and the named dims' ``values``: the largest live
        total among the candidate ops, each size evaluated with integer arithmetic (no
        re-derivation, so a new point costs well under a millisecond)."""
        point = self._point(B, values)
        exprs, counts = self._candidates
        sizes = np.array([self._compiled[e](*point) for e in exprs], dtype=object)
        return int(max(counts.dot(sizes)))

    def point(self, b: int, values: dict) -> tuple | None:
        """The step at batch size ``b`` and the named dims' ``values`` for the allocator's
        replay (:func:`fxmem.device.allocator.run_at_point`), without its report there
        (:meth:`fxmem.Report.at` specializes every size's formula, 0.06 s a length on
        Llama-3.1-8B over 8 GPUs, where the longest length's search replays a dozen):
        ``(graph, sizes, ops)``, the trace's graph (kept: what the replays at every point
        share), each storage's bytes there and the ops with the values put in. None where
        the point is outside where the trace holds (the report there says so) or a size is
        no expression :func:`compile_size` writes."""
        try:
            point = self._point(b, values)
        except InputError:
            return None
        made = self._points
        if made is None:
            return None
        graph, sized = made
        vals = {dim_symbol(n): sympy.Integer(v) for n, v in values.items()}
        return (graph, [sized[s.size.expr](*point) for s in graph.storages],
                _ops_at(self.trace.ops, vals))

    @functools.cached_property
    def _points(self) -> tuple | None:
        """:meth:`point`'s graph and each distinct storage size as a function of (B, *dims);
        None where some size is not one :func:`compile_size` writes."""
        from .graph import build_graph

        args = (B, *(dim_symbol(n) for n in self.dims))
        graph, sized = build_graph(self.trace), {}
        try:
            for s in graph.storages:
                if s.size.expr not in sized:
                    sized[s.size.expr] = compile_size(s.size.expr, args)
        except ValueError:
            return None
        return graph, sized

    def _point(self, b, values) -> tuple:
        _positive(B=b)
        if set(values) != set(self.dims):
            raise InputError(f"give a value for every named dim {list(self.dims)}")
        _positive(**values)
        g = self._broken(b, values)
        if g is not None:
            where = ", ".join(f"{k}={v}" for k, v in {"B": b, **values}.items())
            raise InputError(f"{where} is outside where the trace holds ({g})")
        return (b, *(values[n] for n in self.dims))

    def _broken(self, b: int, values: dict):
        """The first guard that does not hold at B = ``b`` and the dims' ``values``, or
        None. A guard that divides by zero there does not (``Mod(L, L//16)`` at L < 16)."""
        subs = _at(b, values)
        return next((g for g in self.valid_when if not _holds([g], subs)), None)

    @functools.cached_property
    def _candidates(self) -> tuple:
        return _candidates(self.trace, self._sizes)

    @functools.cached_property
    def _compiled(self) -> dict:
        """Each distinct size as a function of (B, *dims) in exact integer arithmetic."""
        args = (B_SYM, *(dim_symbol(n) for n in self.dims))
        return {e: compile_size(e, args) for e in self._candidates[0]}

    def max_length(self, budget_bytes: int, B: int, name: str | None = None,  # noqa: N803
                   limit: int | None = None, **values) -> Length:
        """The largest value of the named dim ``name`` (the only one by default) whose peak
        at batch size ``B`` fits in ``budget_bytes``; other named dims in ``values``.
        ``limit``: the model's own maximum, which no shape shows (e.g. GPT-2's
        ``config.n_positions``): the answer is never above it. Searched where the trace
        holds at ``B``; where it ends below ``limit`` and the step fits there, that end,
        marked (:class:`Length`'s ``beyond``)."""
        from ..formula.search import largest

        name = name or (self.dims[0] if len(self.dims) == 1 else None)
        if name not in self.dims:
            raise InputError(f"name the dim to solve for, one of {list(self.dims)}")
        lo, hi = self._range(name, B, values)
        ends = hi is not None and (limit is None or hi < limit)  # the trace, before limit
        limit = hi if ends else limit
        # where the trace holds for multiples of k alone (T5's L a multiple of 16), the
        # search is over them: k*m for m from the least where every guard holds (L//16
        # neither 0 nor 1 for a view of L as (L//16, 16): from L = 32) to the most
        subs = _at(B, values)
        k = _multiple_of([g.xreplace(subs) for g in self.valid_when], dim_symbol(name))
        lo, limit = -(-lo // k), None if limit is None else limit // k
        for _ in range(MAX_SKIPPED):
            if self._broken(B, {**values, name: k * lo}) is None:
                break
            lo += 1
        else:
            raise InputError(f"the trace holds at no {name} from {k * (lo - MAX_SKIPPED)} "
                             f"to {k * lo} at B={B}")

        def fits(m):  # (never past limit: past the trace's end there is no formula)
            return (limit is None or m <= limit) and \
                self.peak_bytes(B, **values, **{name: k * m}) <= budget_bytes

        if not fits(lo):
            least = self.peak_bytes(B, **values, **{name: k * lo})
            raise InfeasibleBudgetError(
                f"budget {budget_bytes:,} B is below the peak {least:,} B at B={B}, "
                f"{name}={k * lo}", minimum_bytes=least)
        if limit is not None and fits(limit):
            return Length(k * max(limit, lo), beyond=ends, multiple=k)
        return Length(k * largest(fits, lo, limit=2**40), multiple=k)

    def _range(self, name: str, B: int, values: dict) -> tuple:  # noqa: N803
        """``(least, most)`` values of the named dim ``name`` where the trace holds at batch
        size ``B`` and the other named dims' ``values`` (``most``: None, no end): its own
        bounds, and those of conditions over several symbols with ``B`` and ``values`` put
        in (a compiled step's ``4096*B*L >= 5242880``, where inductor chose a kernel by
        size, or ``14336*B*L <= 2147483647``, where its indices fit 32 bits)."""
        x = dim_symbol(name)
        _positive(B=B, **values)  # (the rest checked by peak_bytes)
        subs = _at(B, values)
        left = [h for h in (g.xreplace(subs) for g in self.valid_when)
                if h is not sympy.true and h.free_symbols == {x}]
        folded = valid_when(left, symbol=x)
        most = [int(g.rhs) for g in folded
                if isinstance(g, sympy.LessThan) and g.lhs == x and g.rhs.is_Integer]
        return (max(self.least_values[x], lower_bounds(folded, [x])[x]),
                min(most) if most else None)

    @functools.cached_property
    def _sizes(self) -> list:
        return [s.expr for s in device_sizes(self.trace.storages, self.device)]

    @functools.cached_property
    def peak(self) -> sympy.Expr:
        """The peak as an exact ``Max`` over the ops that can be the maximum: candidates
        whose live set another candidate's covers (size by size) are dropped, and so are
        those proved at most one other, or a convex combination of two others, wherever the
        trace holds (:func:`fxmem.formula.prune.prune_rows`)."""
        sizes, counts = self._candidates
        keep = prune_rows(sizes, counts, self.least_values)
        exprs = [sympy.Add(*[int(n) * e for e, n in zip(sizes, counts[i]) if n])
                 for i in keep]
        return exprs[0] if len(exprs) == 1 else sympy.Max(*exprs, evaluate=False)

    @functools.cached_property
    def least_values(self) -> dict:
        """Each symbol's least value where the trace holds: its bound in ``valid_when``
        (``B >= 2``), or above it the least where every guard on it alone holds (a view of
        L as ``(L//16, 16)`` holds from L = 32, ``L//16`` neither 0 nor 1, though no guard
        reads ``L >= 32``: the sizes divide by zero below). A guard over several symbols
        (a compiled step's ``4096*B*L >= 5242880``) bounds none of them alone."""
        lows = lower_bounds(self.valid_when, [B_SYM, *map(dim_symbol, self.dims)])
        for x in lows:
            own = [g for g in self.valid_when if g.free_symbols == {x}]
            for v in range(lows[x], lows[x] + MAX_SKIPPED):
                if _holds(own, {x: v}):
                    lows[x] = v
                    break
        return lows

    @functools.cached_property
    def parts(self) -> dict:
        """Bytes by part (params, buffers, inputs, grads, optimizer_state, activations) as
        expressions in B and the named dims."""
        from .liveness import _PART_OF, PARTS, held_for_backward

        out = {p: sympy.Integer(0) for p in PARTS}
        for s, e in zip(self.trace.storages, self._sizes):
            part = _PART_OF.get(s.category)
            if part:
                out[part] += e
        out = {p: sympy.expand(v) for p, v in out.items()}
        # the most bytes held for backward at once, as liveness.parts_of says
        sizes, counts = _candidates(self.trace, self._sizes,
                                    held_for_backward(self.trace))
        keep = prune_rows(sizes, counts, self.least_values) if len(sizes) else []
        exprs = list(dict.fromkeys(
            sympy.Add(*[int(n) * e for e, n in zip(sizes, counts[i]) if n]) for i in keep))
        out["activations"] = (sympy.Integer(0) if not exprs else exprs[0] if len(exprs) == 1
                              else sympy.Max(*exprs, evaluate=False))
        return out


def compile_size(expr, args):
    """A Python function of ``args`` computing the integer ``expr`` exactly: polynomials
    with integer coefficients, and ``ceiling`` / ``floor`` of polynomials over an integer.

    >>> from fxmem.formula.symbols import L
    >>> f = compile_size(512 * sympy.ceiling(3 * B * L**2 / 32) + 8 * L, (B, L))
    >>> f(3, 7), int((512 * sympy.ceiling(3 * B * L**2 / 32) + 8 * L).subs({B: 3, L: 7}))
    (7224, 7224)
    """
    names = {a: f"a{i}" for i, a in enumerate(args)}

    def code(e) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return names[e]
        if e.is_Add:
            return "(" + " + ".join(code(a) for a in e.args) + ")"
        if e.is_Mul:
            num, den = sympy.fraction(e)
            if den != 1:
                raise ValueError(f"not an integer expression: {e}")
            return "(" + " * ".join(code(a) for a in e.args) + ")"
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return f"({code(e.base)} ** {int(e.exp)})"
        if isinstance(e, sympy.Piecewise):
            out = "0"
            for value, cond in reversed(e.args):
                out = code(value) if cond is sympy.true else \
                    f"({code(value)} if {code(cond)} else {out})"
            return out
        if isinstance(e, (sympy.Min, sympy.Max)):
            return f"{'min' if isinstance(e, sympy.Min) else 'max'}(" + \
                ", ".join(code(a) for a in e.args) + ")"
        if isinstance(e, sympy.core.relational.Relational):
            return f"({code(sympy.expand(e.lhs))} {e.rel_op} {code(sympy.expand(e.rhs))})"
        if isinstance(e, (sympy.And, sympy.Or)):
            return "(" + f" {type(e).__name__.lower()} ".join(code(a) for a in e.args) + ")"
        if isinstance(e, (sympy.ceiling, sympy.floor)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if not den.is_Integer:
                raise ValueError(f"not an integer expression: {e}")
            q = f"({code(sympy.expand(num))}) // {int(den)}"
            return f"(-((-{code(sympy.expand(num))}) // {int(den)}))" \
                if isinstance(e, sympy.ceiling) else f"({q})"
        raise ValueError(f"not an integer expression: {e}")

    try:
        src = f"lambda {', '.join(names.values())}: {code(sympy.expand(expr))}"
    except ValueError:
        return lambda *vals: int(expr.xreplace(dict(zip(args, map(sympy.Integer, vals)))))
    return eval(src)  # noqa: S307 - code generated above from a sympy expression


def _candidates(trace, sizes, only=None) -> tuple:
    """The distinct sizes, and a matrix of counts (one row per op that can be a peak: the
    last of a run of allocations) of the storages of each size live right after it (of
    the storages ``only``, if given). Rows that another row covers (every count at least
    as large) are dropped: sizes are never negative, so such an op is never above the one
    covering it."""
    from .graph import build_graph
    from .liveness import sweep

    graph = build_graph(trace)
    index = {e: i for i, e in enumerate(dict.fromkeys(sizes))}
    col = [index[e] for e in sizes]
    live = np.zeros(len(index), dtype=np.int64)
    rows = []
    for kind, x in sweep(graph):
        if kind == "peak":
            rows.append(live.copy())
        elif only is None or x in only:
            live[col[x]] += 1 if kind == "+" else -1
    m = np.unique(np.array(rows), axis=0)
    # drop covered rows: compare each row with all others (in chunks to bound memory)
    keep = np.ones(len(m), dtype=bool)
    order = np.argsort(-m.sum(axis=1), kind="stable")  # big rows first: early coverers
    m = m[order]
    for i in range(len(m)):
        if not keep[i]:
            continue
        covered = np.all(m <= m[i], axis=1)  # rows that row i covers
        covered[i] = False
        keep &= ~covered
    m = m[keep]
    used = np.flatnonzero(m.any(axis=0))
    exprs = list(index)
    return [exprs[j] for j in used], m[:, used].astype(object)
