"""Input dims beyond the batch as symbols: the step's memory as a formula of B *and*, say, the
sequence length L.

``fxmem.analyze(..., dims={"L": [(0, 1), (1, 1)]})`` traces with dim 1 of tensors 0 and 1
(inputs, then targets) as the symbol :data:`fxmem.symbols.L`, and returns a
:class:`DimsReport`: the peak as an exact ``Max`` of expressions in B and L (B·L terms,
B·L² for attention), ``peak_bytes(B, L=...)``, ``max_batch_size(budget, L=...)`` and
``max_length(budget, B=...)``. ``report.at(L=512)`` is the ordinary :class:`fxmem.Report`
at that length (plans, regimes, breakdowns: everything in B), derived from the same trace.

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
from collections import Counter
from dataclasses import dataclass, field, replace

import sympy
import torch

from .allocator import device_sizes
from .errors import InfeasibleBudgetError, InputError
from .symbols import B, Size, dim_symbol

SAMPLES = (2, 8, 64, 512, 4096)  # B and L values where candidates are compared


def _subs(e, values: dict):
    return e.xreplace(values) if isinstance(e, sympy.Basic) else e


def specialize(trace, **values):
    """``trace`` with its named dims fixed (``L=512``): sizes, shapes and guards in B only.
    Raises :class:`fxmem.InputError` when a value breaks a condition the trace assumed."""
    missing = set(trace.dims) - set(values)
    unknown = set(values) - set(trace.dims)
    if missing or unknown:
        raise InputError(f"give a value for every named dim {list(trace.dims)}"
                         + (f"; unknown: {sorted(unknown)}" if unknown else ""))
    vals = {}
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{name} must be a positive int, got {v!r}")
        vals[dim_symbol(name)] = sympy.Integer(v)
    from .trace import TensorDesc, valid_when

    guards = []
    for g in trace.guards:
        h = g.xreplace(vals)
        if h is sympy.false:
            raise InputError(f"{', '.join(f'{k}={v}' for k, v in values.items())} is outside "
                             f"where the trace holds ({g})")
        if h is not sympy.true:
            guards.append(h)
    sizes: dict = {}
    storages = []
    for s in trace.storages:
        e = sympy.expand(s.size.expr.xreplace(vals))
        size = sizes.get(e) or sizes.setdefault(e, Size.of(e))
        storages.append(replace(s, size=size, shape=tuple(_subs(d, vals) for d in s.shape)))
    graph = torch.fx.Graph()
    env: dict = {}
    for node in trace.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        env[node] = new
        val = node.meta.get("val")
        if isinstance(val, (TensorDesc, tuple)):
            new.meta["val"] = _desc_subs(val, vals, TensorDesc)
        new.args = _tree_subs(new.args, vals)
        new.kwargs = _tree_subs(new.kwargs, vals)
    lower = [g for g in guards if g.free_symbols <= {B}]
    rest = [g for g in guards if not g.free_symbols <= {B}]
    return replace(trace, graph=graph, storages=tuple(storages),
                   guards=valid_when(lower) + tuple(rest), dims=())


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


@dataclass(frozen=True)
class DimsReport:
    """The step's memory as formulas in B and the named dims (bytes). ``peak``: an exact
    ``Max``; ``parts``: the seed-style parts; ``valid_when``: conditions on B, the dims and
    both. ``at(L=...)``: the :class:`fxmem.Report` at fixed named dims."""

    trace: object
    device: str
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def dims(self) -> tuple:
        return self.trace.dims

    @property
    def valid_when(self) -> tuple:
        return self.trace.guards

    def at(self, **values):
        """The :class:`fxmem.Report` with the named dims fixed, e.g. ``at(L=512)``."""
        key = tuple(sorted(values.items()))
        if key not in self._cache:
            from .graph import build_graph
            from .liveness import liveness
            from .result import Report, parts_of

            t = specialize(self.trace, **values)
            lv = liveness(build_graph(t), self.device)
            self._cache[key] = Report(lv, parts_of(lv), t.guards)
        return self._cache[key]

    def peak_bytes(self, B: int, **values) -> int:  # noqa: N803
        """Peak bytes at batch size ``B`` and the named dims' ``values``."""
        return self.at(**values).peak_bytes(B)

    def max_batch_size(self, budget_bytes: int, **values) -> int:
        """The largest B within ``budget_bytes`` at fixed named dims (``L=512``)."""
        return self.at(**values).max_batch_size(budget_bytes)

    def max_length(self, budget_bytes: int, B: int, name: str | None = None,  # noqa: N803
                   **values) -> int:
        """The largest value of the named dim ``name`` (the only one by default) whose peak
        at batch size ``B`` fits in ``budget_bytes``; other named dims in ``values``."""
        from .result import largest

        name = name or (self.dims[0] if len(self.dims) == 1 else None)
        if name not in self.dims:
            raise InputError(f"name the dim to solve for, one of {list(self.dims)}")
        lo = next((int(g.rhs) for g in self.valid_when if isinstance(g, sympy.GreaterThan)
                   and g.lhs == dim_symbol(name)), 1)

        def fits(n):
            return self.peak_bytes(B, **values, **{name: n}) <= budget_bytes

        if not fits(lo):
            least = self.peak_bytes(B, **values, **{name: lo})
            raise InfeasibleBudgetError(
                f"budget {budget_bytes:,} B is below the peak {least:,} B at B={B}, "
                f"{name}={lo}", minimum_bytes=least)
        return largest(fits, lo, limit=2**40)

    @functools.cached_property
    def _sizes(self) -> list:
        return [s.expr for s in device_sizes(self.trace.storages, self.device)]

    @functools.cached_property
    def peak(self) -> sympy.Expr:
        """The peak as an exact ``Max`` over the ops that can be the maximum: candidates
        whose live set another candidate's covers (size by size) are dropped, and so are
        polynomials another one bounds coefficient by coefficient."""
        cands = _candidates(self.trace, self._sizes)
        exprs = [sum((n * e for e, n in c.items()), sympy.Integer(0)) for c in cands]
        exprs = _drop_bounded([sympy.expand(e) for e in exprs])
        return exprs[0] if len(exprs) == 1 else sympy.Max(*exprs)

    @functools.cached_property
    def parts(self) -> dict:
        """Bytes by part (params, buffers, inputs, grads, optimizer_state, activations) as
        expressions in B and the named dims."""
        from .result import _PART_OF, PARTS

        out = {p: sympy.Integer(0) for p in PARTS}
        for s, e in zip(self.trace.storages, self._sizes):
            part = _PART_OF.get(s.category)
            if part:
                out[part] += e
        return {p: sympy.expand(v) for p, v in out.items()}

    def __str__(self) -> str:
        return (f"fxmem report in B and {', '.join(self.dims)} (device={self.device})\n"
                f"peak bytes = {self.peak}\n"
                f"valid when: {', '.join(map(str, self.valid_when))}")


def _candidates(trace, sizes) -> list:
    """Live storage sizes (a Counter expr -> count) right after each op that can be a peak
    (the last of a run of allocations), with covered live sets dropped."""
    from .graph import build_graph
    from .liveness import _events

    graph = build_graph(trace)
    allocs, frees = _events(graph)
    live: Counter = Counter()
    for s in graph.storages:
        if s.created_by < 0:
            live[sizes[s.sid]] += 1
    snaps = [+live]
    for sid in frees[0]:
        live[sizes[sid]] -= 1
    last = None
    for i in range(len(graph.ops)):
        for sid in allocs[i]:
            live[sizes[sid]] += 1
            last = i
        if frees[i + 1] and last is not None:
            snaps.append(+live)
            last = None
        for sid in frees[i + 1]:
            live[sizes[sid]] -= 1
    if last is not None:
        snaps.append(+live)
    unique = list({tuple(sorted(c.items(), key=str)): c for c in snaps}.values())
    # leaders: the largest at sample points; anything whose live set one of them covers goes
    points = [{B: b, **{dim_symbol(n): v for n in trace.dims}} for b in SAMPLES
              for v in SAMPLES]
    at = {e: [int(e.xreplace(p)) for p in points] for e in set(sizes)}
    value = [[sum(n * at[e][k] for e, n in c.items()) for k in range(len(points))]
             for c in unique]
    leaders = {max(range(len(unique)), key=lambda i: value[i][k]) for k in range(len(points))}
    kept = []
    for i, c in enumerate(unique):
        if i not in leaders and any(all(unique[j][e] >= n for e, n in c.items())
                                    for j in leaders):
            continue
        kept.append(c)
    return kept


def _drop_bounded(exprs: list) -> list:
    """Drop polynomials that another one bounds coefficient by coefficient (all symbols are
    positive integers, so a difference with no negative coefficient is >= 0)."""
    out = list(dict.fromkeys(exprs))
    syms = sorted(set().union(*(e.free_symbols for e in out)), key=str)
    polys = []
    for e in out:
        try:
            polys.append(sympy.Poly(e, *syms) if syms else None)
        except sympy.PolynomialError:
            polys.append(None)
    keep = []
    for i, e in enumerate(out):
        bounded = False
        for j, f in enumerate(out):
            if i == j or polys[i] is None or polys[j] is None:
                continue
            diff = polys[j] - polys[i]
            if all(c >= 0 for c in diff.coeffs()) and (not diff.is_zero or j < i):
                bounded = True
                break
        if not bounded:
            keep.append(e)
    return keep
