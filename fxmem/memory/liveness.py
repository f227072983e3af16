"""Stage 3: live bytes after every op, and the peak as a short exact formula in B.

Live bytes right after op i has allocated its outputs (before anything freed after it) are
the sum of the device sizes of every storage created at or before i and not yet freed. Only
the last op of a run of allocations can be a maximum, so those are the *candidates*. Each
candidate's live bytes are an exact expression in B; the peak is their ``Max``, pruned to
the candidates that are the maximum for some B >= 1 (proved with :mod:`fxmem.formula.poly`).

>>> import torch
>>> from fxmem.trace import trace
>>> from fxmem.memory.graph import build_graph
>>> lv = liveness(build_graph(trace(torch.nn.Linear(8, 2), torch.randn(4, 8),
...                                 loss=lambda o: o.sum(), device="cpu")))
>>> lv.peak
Max(32*B + 152, 40*B + 76)
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import sympy

from ..formula import poly as P
from ..formula.symbols import B, Size
from .graph import StorageGraph
from .sizes import device_sizes

NUMERIC_PEAKS = 4  # B's whose peak is read off the timeline before the candidates are made


@dataclass(frozen=True)
class Candidate:
    """Live bytes right after op ``op_index`` (-1: before the first op), as a function of B.

    ``poly`` is the exact polynomial part; ``extras`` are (count, Size) terms that are not
    polynomials (e.g. CUDA block rounding); ``lo <= value <= hi`` for B >= 1.
    """

    op_index: int
    poly: tuple
    extras: tuple
    lo: tuple | None
    hi: tuple | None

    def __call__(self, b: int) -> int:
        v = P.evaluate(self.poly, b)
        for n, s in self.extras:
            v += n * s(b)
        return int(v)

    @property
    def expr(self) -> sympy.Expr:
        e = sum((sympy.Rational(c.numerator, c.denominator) * B**i
                 for i, c in enumerate(self.poly)), sympy.Integer(0))
        return e + sum((n * s.expr for n, s in self.extras), sympy.Integer(0))


@dataclass(frozen=True)
class Liveness:
    """Result of :func:`liveness`.

    ``sizes[sid]``: bytes of each storage on the device; ``candidates``: the pruned peak
    candidates, in op order; ``regimes``: ``(B_from, candidate)`` pieces saying which
    candidate is the peak from that B on (exact on CPU; from lower bounds on CUDA). The
    sizes (unless ``given``) and the candidates are made when first asked for: a step only
    replayed through the caching allocator (:meth:`fxmem.Report.runs_on_device`, a
    planner's walk, the longest-length search) reads neither (the replay takes each
    storage's own bytes), and the candidates are most of a liveness pass's time, the sizes
    a quarter of a report's specialization at a length (each rounded to the allocator's
    blocks in sympy).
    """

    graph: StorageGraph
    device: str
    given: tuple | None = field(default=None, repr=False)  # the sizes, where made already

    @functools.cached_property
    def sizes(self) -> tuple:
        """Each storage's bytes on the device (:func:`fxmem.memory.sizes.device_sizes`)."""
        if self.given is not None:
            return self.given
        return tuple(device_sizes(self.graph.storages, self.device))

    @functools.cached_property
    def _pruned(self) -> tuple:
        raw = _candidates(self.graph, self.sizes)
        kept, regimes = prune(raw)
        return tuple(kept), tuple(regimes), len(raw)

    @property
    def candidates(self) -> tuple:
        return self._pruned[0]

    @property
    def regimes(self) -> tuple:
        return self._pruned[1]

    @property
    def n_candidates_before_pruning(self) -> int:
        return self._pruned[2]

    @property
    def peak(self) -> sympy.Expr:
        """Peak bytes, a sympy expression in B (a ``Max`` when the peak moves with B)."""
        exprs = list(dict.fromkeys(c.expr for c in self.candidates))
        return exprs[0] if len(exprs) == 1 else sympy.Max(*exprs, evaluate=False)

    def peak_candidate(self, b: int) -> Candidate:
        """The candidate that is the peak at batch size b (the earliest one on ties)."""
        return max(self.candidates, key=lambda c: (c(b), -c.op_index))

    def peak_bytes(self, b: int) -> int:
        """The live bytes' peak at batch size b: from the candidates once they are made,
        else from the timeline at b (a plan's step that a search asks about at one B or two
        needs no formula). The same number: only a candidate's point can be the maximum,
        and the start counts the storages freed before the first op."""
        if "_pruned" in self.__dict__:
            return self.peak_candidate(b)(b)
        asked = self.__dict__.setdefault("_peaks_at", {})
        if b not in asked:
            if len(asked) >= NUMERIC_PEAKS:  # a search over B: the formulas answer faster
                return self.peak_candidate(b)(b)
            start = start_bytes(self.graph.storages, self.sizes, b)
            asked[b] = max([start, *self.timeline(b)])
        return asked[b]

    def live_sids(self, op_index: int) -> list[int]:
        """Storages alive right after op ``op_index``'s allocations."""
        return [s.sid for s in self.graph.storages
                if s.created_by <= op_index
                and (s.freed_after is None or s.freed_after >= op_index)]

    def timeline(self, b: int) -> list[int]:
        """Live bytes right after each op's allocations, at batch size b."""
        return timeline(self.graph.storages, self.sizes, len(self.graph.ops), b)


def timeline(storages, sizes, n_ops: int, b: int) -> list[int]:
    """Live bytes right after each of ``n_ops`` ops' allocations at batch size b, for
    ``storages`` of device sizes ``sizes`` (storages freed "after op -1" never count)."""
    delta = [0] * (n_ops + 1)
    live = 0
    for s, size in zip(storages, sizes):
        v = size(b)
        if s.created_by < 0:
            live += v
        else:
            delta[s.created_by] += v
        if s.freed_after is not None and s.freed_after + 1 <= n_ops:
            delta[max(s.freed_after + 1, 0)] -= v
    out = []
    for i in range(n_ops):
        live += delta[i]
        out.append(live)
    return out


def start_bytes(storages, sizes, b: int) -> int:
    """Live bytes before the step's first op at batch size b: the storages made before it
    (freed before op 0 or not), of device sizes ``sizes``."""
    return sum(z(b) for s, z in zip(storages, sizes) if s.created_by < 0)


SHARDED = ("param", "grad", "optimizer_state")  # what FSDP2 cuts into shards


def sharded_peak(lv: "Liveness", b: int):
    """``peak(ratio)``: the live bytes' peak at ``b`` with the storages FSDP2 shards
    (parameters, their gradients, the optimizer's state) ``ratio`` times their size, the
    rest as they are: an estimate of a rank's peak when the step runs over ``1 / ratio``
    times its GPUs (padding, the gathered blocks and FSDP2's buffers left out), for a
    world-size search's first guess. The sizes are evaluated once; each ratio is a sum of
    two timelines.

    >>> import torch, fxmem
    >>> r = fxmem.analyze(torch.nn.Linear(64, 64), torch.randn(4, 64), loss=lambda o: o.sum(),
    ...                   device="cpu")
    >>> peak = sharded_peak(r.liveness, 4)
    >>> peak(1.0) == r.peak_bytes(4) > peak(0.5)
    True
    """
    storages, n = lv.graph.storages, len(lv.graph.ops)
    sharded = [s.category in SHARDED for s in storages]
    rest = timeline(storages, [no_bytes if x else z for x, z in zip(sharded, lv.sizes)], n, b)
    shards = timeline(storages, [z if x else no_bytes for x, z in zip(sharded, lv.sizes)], n, b)
    rest, shards = np.asarray(rest, float), np.asarray(shards, float)
    return lambda ratio: float((rest + ratio * shards).max(initial=0))


def no_bytes(b: int) -> int:
    """A size of no bytes at any B: a storage left out of a :func:`timeline`."""
    return 0


def _events(graph: StorageGraph):
    """Per op: storages allocated by it, storages freed right after it (-1: before op 0):
    lists, read only (a step graph's replays share them), the empty tuple where there are
    none (two empty lists per op had been made for each plan a walk replays)."""
    n = len(graph.ops)
    allocs: list = [()] * n
    frees: list = [()] * (n + 1)  # frees[i + 1]: freed after op i
    for s in graph.storages:
        for lists, i in ((allocs, s.created_by), (frees, -1 if s.freed_after is None
                                                   else s.freed_after + 1)):
            if i >= 0:
                if lists[i]:
                    lists[i].append(s.sid)
                else:
                    lists[i] = [s.sid]
    return allocs, frees


def sweep(graph: StorageGraph):
    """The step's live set, change by change: ``("+", sid)`` / ``("-", sid)`` as storages
    appear and go, and ``("peak", i)`` where the live bytes right after op ``i`` (-1: the
    start) may be a maximum, i.e. after the last op of a run of allocations."""
    allocs, frees = _events(graph)
    for s in graph.storages:
        if s.created_by < 0:
            yield "+", s.sid
    yield "peak", -1  # the start is always a candidate, as a fallback
    for sid in frees[0]:
        yield "-", sid
    last_alloc = None
    for i in range(len(graph.ops)):
        for sid in allocs[i]:
            yield "+", sid
            last_alloc = i
        if frees[i + 1] and last_alloc is not None:
            yield "peak", last_alloc
            last_alloc = None
        for sid in frees[i + 1]:
            yield "-", sid
    if last_alloc is not None:
        yield "peak", last_alloc


def liveness(graph: StorageGraph, device: str | None = None) -> Liveness:
    device = device or graph.trace.device
    return Liveness(graph, device)


def _candidates(graph: StorageGraph, sizes, only=None) -> list[Candidate]:
    """The live bytes at each point of :func:`sweep` that may be a maximum, of the storages
    ``only`` (None: all; else only the points after one of them was allocated: at the
    others their bytes are at most what they were at the point before)."""
    poly = P.ZERO
    extras: Counter = Counter()
    raw: list[Candidate] = []
    grown = True
    for kind, x in sweep(graph):
        if kind == "peak":
            if not grown:
                continue
            grown = only is None
            ex = tuple((n, s) for s, n in sorted(extras.items(), key=lambda kv: str(kv[0].expr)))
            lo = hi = poly
            for n, s in ex:
                if s.lo is None or lo is None:
                    lo = hi = None
                    break
                lo, hi = P.add(lo, P.scale(s.lo, n)), P.add(hi, P.scale(s.hi, n))
            raw.append(Candidate(x, poly, ex, lo, hi))
        elif only is None or x in only:
            size, sign = sizes[x], 1 if kind == "+" else -1
            grown = grown or sign > 0
            if size.exact:
                poly = P.add(poly, P.scale(size.lo, sign))
            else:
                extras[size] += sign
                if extras[size] == 0:
                    del extras[size]
    return raw


def prune(cands: list[Candidate]) -> tuple[list[Candidate], list]:
    """Drop candidates that are never the maximum for any B >= 1; return (kept, regimes)."""
    uniq: dict = {}
    for c in cands:  # identical functions: keep the earliest op
        uniq.setdefault((c.poly, tuple((n, id(s)) for n, s in c.extras)), c)
    cands = list(uniq.values())
    bounded = [c for c in cands if c.lo is not None]
    unbounded = [c for c in cands if c.lo is None]
    if not bounded:
        return cands, [(1, cands[0])]
    lows = [c.lo for c in bounded]
    pieces = P.upper_envelope(lows)
    on_env = {i for _, i in pieces}
    kept = []
    for i, c in enumerate(bounded):
        if i in on_env:
            kept.append(c)
        elif c.lo != c.hi and not _le_pieces(c.hi, lows, pieces) \
                and not _below_by_branch(c, lows, pieces):
            kept.append(c)
    kept += [c for c in unbounded if not _below_by_branch(c, lows, pieces)]
    for k in [c for c in kept if c.lo is None or c.lo != c.hi]:
        if any(j is not k and _dominates(j, k) for j in kept):
            kept.remove(k)  # one at a time, so one of two equal functions always stays
    kept.sort(key=lambda c: c.op_index)
    regimes = [(int(x) if Fraction(x).denominator == 1 else x, bounded[i]) for x, i in pieces]
    return kept, regimes


def _dominates(j: Candidate, k: Candidate) -> bool:
    """j >= k for every B >= 1, proved term by term (shared extras cancel exactly)."""
    diff = P.sub(j.poly, k.poly)
    cj = {id(s): (n, s) for n, s in j.extras}
    ck = {id(s): (n, s) for n, s in k.extras}
    for key in cj.keys() | ck.keys():
        s = (cj.get(key) or ck.get(key))[1]
        d = cj.get(key, (0, s))[0] - ck.get(key, (0, s))[0]
        if d == 0:
            continue
        bound = s.lo if d > 0 else s.hi
        if bound is None:
            return False
        diff = P.add(diff, P.scale(bound, d))
    return P.first_positive_at_or_after(P.scale(diff, -1), 1) is None


def _branch_points(c: Candidate) -> list:
    """Integers where a branch of the candidate's sizes may change (a kernel's ``Piecewise``
    condition, ``Min`` / ``Max`` arguments crossing), from 1 up; [] when a branch is not a
    threshold in B."""
    points = {1}
    for _, size in c.extras:
        for node in sympy.preorder_traversal(size.expr):
            if isinstance(node, sympy.Piecewise):
                exprs = [cond.lhs - cond.rhs for _, cond in node.args
                         if isinstance(cond, sympy.core.relational.Relational)]
            elif isinstance(node, (sympy.Min, sympy.Max)):
                exprs = [a - b for a, b in zip(node.args, node.args[1:])]
            else:
                continue
            for e in exprs:  # floor(x) and ceiling(x) cross where x does, within 1
                e = e.replace(lambda x: isinstance(x, (sympy.floor, sympy.ceiling)),
                              lambda x: x.args[0])
                if e.free_symbols != {B} or not e.is_polynomial(B) or sympy.degree(e, B) != 1:
                    return []
                x = sympy.Symbol("x", real=True)
                for root in sympy.solve(e.xreplace({B: x}), x):
                    r = int(sympy.floor(root))
                    points |= {max(1, r + k) for k in (-1, 0, 1, 2)}
    return sorted(points)


def _at_branch(e, b: int):
    """``e`` with each ``Piecewise``, ``Min`` and ``Max`` replaced by the argument it takes
    at B = ``b``."""
    def piece(x):
        return next(v for v, cond in x.args if bool(cond.subs(B, b)))

    def extreme(x):
        vals = [arg.subs(B, b) for arg in x.args]
        pick = min if isinstance(x, sympy.Min) else max
        return x.args[pick(range(len(vals)), key=vals.__getitem__)]

    e = e.replace(lambda x: isinstance(x, sympy.Piecewise), piece)
    return e.replace(lambda x: isinstance(x, (sympy.Min, sympy.Max)), extreme)


def _below_by_branch(c: Candidate, lows, pieces) -> bool:
    """``c`` <= the envelope on [1, inf), shown interval by interval between the points where
    its sizes' branches change: on each, every ``Piecewise``, ``Min`` and ``Max`` is one of its
    arguments, so the bounds are that argument's (a kernel's workspace that exists only above
    some size bounds nothing below it)."""
    points = _branch_points(c)
    if len(points) < 2:
        return False
    for a, b in zip(points, points[1:] + [None]):
        hi = c.poly
        for n, size in c.extras:
            bd = Size.of(_at_branch(size.expr, a))
            if bd.hi is None:
                return False
            hi = P.add(hi, P.scale(bd.hi, n))
        if not _le_pieces(hi, lows, pieces, a, b):
            return False
    return True


def _le_pieces(p, lows, pieces, start=1, stop=None) -> bool:
    """p <= the envelope given by ``pieces`` over [start, stop) (stop None: infinity)."""
    for k, (x0, i) in enumerate(pieces):
        x1 = pieces[k + 1][0] if k + 1 < len(pieces) else None
        if (stop is not None and x0 >= stop) or (x1 is not None and x1 <= start):
            continue
        r = P.first_positive_at_or_after(P.sub(p, lows[i]), max(x0, start))
        end = x1 if stop is None else stop if x1 is None else min(x1, stop)
        if r is not None and (end is None or r < end):
            return False
    return True


# --- the step's parts: what the peak is made of --------------------------------------------

PARTS = ("params", "buffers", "inputs", "grads", "optimizer_state", "activations")
_PART_OF = {"param": "params", "buffer": "buffers", "input": "inputs", "grad": "grads",
            "optimizer_state": "optimizer_state"}


class Parts(Mapping):
    """A step's :func:`parts_of`, made when first read: a plan's step that a search only
    replays, or asks the peak of, never reads them (their sums and the activations' high
    water are formulas over every storage). Its keys are :data:`PARTS`."""

    def __init__(self, lv: Liveness):
        self._lv, self._made = lv, None

    def _parts(self) -> dict:
        if self._made is None:
            self._made = _parts(self._lv)
        return self._made

    def __getitem__(self, part: str) -> sympy.Expr:
        return self._parts()[part]

    def __iter__(self):
        return iter(PARTS)

    def __len__(self) -> int:
        return len(PARTS)

    def __repr__(self) -> str:
        return repr(self._parts())


def parts_of(lv: Liveness) -> Parts:
    """:func:`_parts`, made when first read (:class:`Parts`).

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> r = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
    >>> r.parts["params"], r.parts["activations"], list(r.parts) == list(PARTS)
    (712, 64*B, True)
    """
    return Parts(lv)


def _parts(lv: Liveness) -> dict:
    """Bytes by part, as sympy expressions in B (device sizes): each of the first five
    totalled over the step (the previous step's gradients that a late zero_grad frees,
    ``zero_grad_at="backward"``, are the ones the step makes again: counted once), and
    ``activations`` the most bytes held for backward at once (:func:`held_for_backward`),
    so that it follows a checkpoint plan: the checkpoints kept, the outputs a selective
    plan keeps, and a recomputed region's saved tensors while its backward runs."""
    out = {p: sympy.Integer(0) for p in PARTS}
    for s, size in zip(lv.graph.storages, lv.sizes):
        p = _PART_OF.get(s.category)
        if p == "grads" and s.created_by < 0 and s.freed_after is not None:
            continue
        if p is not None:
            out[p] += size.expr
    out["activations"] = high_water(lv, held_for_backward(lv.graph))
    return out


def held_for_backward(graph) -> set:
    """Storages held for backward, of a :class:`StorageGraph` or a trace: the activations
    (made in the forward and saved by autograd, a checkpoint or selective checkpointing
    for backward), and the tensors a checkpoint's re-run in backward makes that outlive
    the re-run (its forward's saved tensors, handed to the backward; the others die inside
    the re-run, as a forward's temporaries do)."""
    ops = graph.ops
    run_end: list = [None] * len(ops)  # recompute op -> last op of its run of re-run ops
    end = None
    for i in range(len(ops) - 1, -1, -1):
        end = (i if end is None else end) if ops[i].recompute else None
        run_end[i] = end
    out = set()
    for s in graph.storages:
        if s.category == "activation":
            out.add(s.sid)
        elif s.category == "temporary" and s.created_by >= 0 and \
                run_end[s.created_by] is not None and \
                (s.freed_after is None or s.freed_after > run_end[s.created_by]):
            out.add(s.sid)
    return out


def high_water(lv: Liveness, sids) -> sympy.Expr:
    """The most bytes of the storages ``sids`` live at once during the step, an exact
    expression in B (a ``Max`` when which moment it is changes with B, pruned as the peak
    is)."""
    kept, _ = prune(_candidates(lv.graph, lv.sizes, set(sids)))
    exprs = list(dict.fromkeys(c.expr for c in kept))
    return exprs[0] if len(exprs) == 1 else sympy.Max(*exprs, evaluate=False)
