"""The plan solver over a chain of blocks with several ways to checkpoint each: plain
numbers (numpy arrays for the cheapest plan's states), no torch.

**Model.** ``n`` blocks ``0..n-1`` run in forward order (and backward in reverse). A
:class:`Choice` covers the consecutive blocks ``first..last``: left alone (the *none* choice
of one block), checkpointed whole, checkpointed with a selective policy, or grouped with its
neighbours as one segment. A plan picks choices that tile ``0..n-1``. Live bytes are
summarised so (every figure from an exact derivation of that choice alone, see
:mod:`fxmem.checkpoint.options`):

- ``boundary[k]``: the most bytes live at moments outside every block's own ops whose windows
  are those of the choices ending before block ``k`` (``k = 0..n``: between block ``k-1`` and
  ``k`` in the forward, and between their backwards);
- ``Choice.own``: the most bytes live during the choice's own forward, recomputation and
  backward under that choice;
- each is lowered by ``Choice.released`` for every chosen choice whose window (from the end
  of its forward to its recomputation) holds it: the choices before block ``k`` for
  ``boundary[k]`` and for a choice starting at block ``k``.

The plan's peak is the largest of these (and ``start``, the bytes before the step).

**Algorithm.** Dynamic programming over the block boundaries, as rotor's over a chain
(Beaumont et al., *Optimal checkpointing for heterogeneous chains*), with a choice of many
kinds per stretch: a state at boundary ``k`` is (bytes released so far ``R``, cost, peak so
far). :func:`solve` (the cheapest plan within a budget) keeps a state unless a cheaper one
has as much ``R`` as the rest of a plan can use, or one as cheap has as much ``R`` and no
higher peak: exact for this model. :func:`frontier` (every peak and cost) keeps a state
unless another has ``R`` at least as large, a cost at most as large and a peak at most as
large, cut to the cheapest ``MAX_STATES``. The caller derives the returned plan exactly and
tightens the budget if the model was short.

>>> none = [Choice(k, k, 0, 0, 50, "none") for k in range(2)]
>>> full = [Choice(k, k, 30, 10, 45, f"ck{k}") for k in range(2)]
>>> group = [Choice(0, 1, 45, 20, 60, "group")]
>>> p = ChainProblem(2, tuple(none + full + group), boundary=(10, 80, 90), start=10)
>>> [(s.names, s.peak_bytes, s.cost) for s in frontier(p)]
[(('none', 'none'), 90, 0), (('ck0', 'none'), 60, 10), (('ck0', 'ck1'), 50, 20)]
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from ..errors import InfeasibleBudgetError

_NONE = float("-inf")
MAX_STATES = 1 << 14


@dataclass(frozen=True)
class Choice:
    """Checkpointing blocks ``first..last`` one way: ``released`` bytes over its window,
    ``cost`` FLOPs re-run, ``own`` the most bytes live during its own ops; ``name`` is the
    caller's (a plan entry, or a marker for "none")."""

    first: int
    last: int
    released: int
    cost: int
    own: float
    name: object


@dataclass(frozen=True)
class ChainProblem:
    n: int
    choices: tuple
    boundary: tuple  # n + 1 values (-inf: no such moment)
    start: int = 0

    def __post_init__(self):
        if len(self.boundary) != self.n + 1:
            raise ValueError(f"{self.n} blocks need {self.n + 1} boundary values, "
                             f"got {len(self.boundary)}")
        for c in self.choices:
            if not 0 <= c.first <= c.last < self.n or c.released < 0 or c.cost < 0:
                raise ValueError(f"{c} is not a choice over blocks 0..{self.n - 1}")
        starts = {c.first for c in self.choices}
        if not all(k in starts for k in range(self.n)):
            raise ValueError("every block needs a choice starting at it (its 'none' at least)")


@dataclass(frozen=True)
class ChainSolution:
    """Chosen choices (in block order), the model's peak and the total cost."""

    choices: tuple
    peak_bytes: int
    cost: int

    @property
    def names(self) -> tuple:
        return tuple(c.name for c in self.choices)


def peak(problem: ChainProblem, choices) -> int:
    """The model's peak of a plan (choices tiling the blocks)."""
    R, top = 0, max(problem.start, problem.boundary[0])
    for c in sorted(choices, key=lambda c: c.first):
        top = max(top, c.own - R)
        R += c.released
        top = max(top, problem.boundary[c.last + 1] - R)
    return int(top)


def _by_first(problem):
    out = [[] for _ in range(problem.n)]
    for c in problem.choices:
        out[c.first].append(c)
    return out


def _run(problem: ChainProblem, budget, max_states: int = MAX_STATES):
    """States at the last boundary that fit ``budget`` (None: any), as
    ``(cost, peak, -R, choices)``, the choices in block order: a state is kept unless one
    before it in (cost, peak, -R) order has a peak and a -R at most its own, and each
    boundary keeps its first ``max_states`` (:func:`_pareto`)."""
    limit = float("inf") if budget is None else budget
    return [(cost, int(pk), int(nR), choices) for cost, nR, pk, choices in
            _layers(problem, limit, lambda parts, k: _pareto(parts, max_states))]


def _layers(problem: ChainProblem, budget, prune, max_cost: int | None = None) -> list:
    """The dynamic program over the block boundaries that :func:`_run` and
    :func:`_cheapest` share: the states at the last boundary whose peak fits ``budget``,
    as ``(cost, -R, peak, choices)``, the choices in block order. ``prune(parts, k)``: the
    states boundary ``k`` keeps, from its arrays (cost, -R, peak, parent, choice) in the
    order they were made, as such arrays. ``max_cost``: states costing more are not made
    (costs only grow along a plan, so no plan within it is lost).

    A boundary's states are numpy arrays (bytes as float64, exact below 2**53; costs int64,
    or where a plan's could pass 2**62 two int64 columns, its low 62 bits and the rest:
    :func:`_plus`), each with the index of the state it came from and of its last choice, so
    a plan's choices are read back only for the last boundary's states."""
    starts = _by_first(problem)
    top0 = max(problem.start, problem.boundary[0])
    if top0 > budget:
        return []
    most = sum(max(c.cost for c in s) for s in starts)
    if most >= 1 << 123:
        raise OverflowError("a plan's recompute cost is past 2**123")
    layers: list = [[] for _ in range(problem.n + 1)]
    layers[0] = [(np.zeros((1, 2) if most >= 1 << 62 else 1, np.int64), np.zeros(1),
                  np.array([top0], float), np.array([-1]), np.array([-1]))]
    came, last, seen = [], [], 0  # every kept state's parent (a global index) and choice
    for k in range(problem.n):
        if not layers[k]:  # no plan within the budget ends before block k
            continue
        cost, nR, pk, parent, pick = prune(layers[k], k)
        layers[k] = None
        came.append(parent)
        last.append(pick)
        ids = np.arange(seen, seen + len(cost))
        seen += len(cost)
        for end, group in _ends(problem)[k]:
            _extend(layers[end], group, problem.boundary[end], cost, nR, pk, ids, budget,
                    max_cost)
    if not layers[problem.n]:
        return []
    came, last = (np.concatenate(x) if x else x for x in (came, last))  # none: no blocks
    out = []
    for cost, nR, pk, parent, pick in zip(*prune(layers[problem.n], problem.n)):
        chosen = []
        while pick >= 0:
            chosen.append(problem.choices[pick])
            pick, parent = last[parent], came[parent]
        out.append((_value(cost), float(nR), float(pk), tuple(reversed(chosen))))
    return out


def _ends(problem: ChainProblem) -> list:
    """Per block, its choices by the boundary each ends before, in the order of the first
    of each, as ``(boundary, (own, released, costs, indices))``: the choices' own and
    released bytes (float64 arrays, as the states' bytes), costs (ints) and indices in
    ``problem.choices`` (an int64 array), in their order (kept on the problem: a search
    solves one many times)."""
    known = problem.__dict__.get("_ends")
    if known is None:
        index = {id(c): i for i, c in enumerate(problem.choices)}
        known = []
        for choices in _by_first(problem):
            ends: dict = {}
            for c in choices:
                ends.setdefault(c.last + 1, []).append(c)
            known.append([(end, (np.array([c.own for c in cs], float),
                                 np.array([c.released for c in cs], float),
                                 [c.cost for c in cs],
                                 np.array([index[id(c)] for c in cs], np.int64)))
                          for end, cs in ends.items()])
        problem.__dict__["_ends"] = known
    return known


def _extend(layer: list, group: tuple, boundary, cost, nR, pk, ids, budget,  # noqa: N803
            max_cost) -> None:
    """The states the choices of ``group`` (:func:`_ends`, all ending before one boundary of
    bytes ``boundary``) make from a boundary's states (``cost``: int64, or :func:`_wide`
    rows; ``nR``, ``pk``, ``ids``), appended to ``layer`` as one part: choice by choice, each
    one's states in order, as a part per choice had been. One array operation for them all:
    numpy's calls per choice had been half a solve's time (the 31 solves of a walk over
    Llama-3.1-8B's plans on 5 GPUs, 32 blocks of 11 choices each: 0.87 to 0.91 s of CPU,
    0.72 to 0.76 s so)."""
    own, released, costs, picks = group
    v = np.maximum(pk, np.maximum(own[:, None] + nR, (boundary + nR) - released[:, None]))
    ok = v <= budget
    if max_cost is not None:
        ok &= _within(cost, [max_cost - c for c in costs])
    rows, cols = np.nonzero(ok)  # choice by choice, each one's states in order
    if len(rows):
        add = (np.array(costs, np.int64) if cost.ndim == 1 else _wide(costs))[rows]
        layer.append((_plus(cost[cols], add), nR[cols] - released[rows], v[rows, cols],
                      ids[cols], picks[rows]))


def _pareto(parts: list, max_states: int) -> tuple:
    """The states of a boundary's arrays (cost, -R, peak, parent, choice) that :func:`_run`
    keeps, in (cost, peak, -R) order (a stable sort: states of equal keys in the order they
    were made): a state no earlier one beats on peak and -R at once, the first
    ``max_states`` of them."""
    cols = [np.concatenate(col) for col in zip(*parts)]
    cost, nR, pk = cols[:3]
    order = np.lexsort((nR, pk, *_cost_keys(cost)))
    keep = []
    peaks: list = []  # the staircase of the states kept: peak ascending, -R descending
    nRs: list = []
    for i, p, r in zip(order.tolist(), pk[order].tolist(), nR[order].tolist()):
        j = bisect_right(peaks, p)
        if j and nRs[j - 1] <= r:
            continue
        keep.append(i)
        if len(keep) == max_states:  # the cheapest; the caller still checks exactly
            break
        m = j
        while m < len(peaks) and nRs[m] >= r:
            m += 1
        peaks[j:m] = [p]
        nRs[j:m] = [r]
    keep = np.array(keep, np.int64)
    return tuple(col[keep] for col in cols)


def _cost_keys(cost) -> tuple:
    """int64 arrays that sort as ``cost`` does, the most significant last (for
    ``np.lexsort``): ``cost`` itself, or of a wide cost (past 2**62: PyTorch-counted FLOPs
    weighted over the others, :meth:`fxmem.checkpoint.options.Planner.problem`; its rows the
    low 62 bits and the rest, :func:`_plus`) its two columns.

    >>> [k.tolist() for k in _cost_keys(_wide([3 << 62 | 5, 1 << 62, 7]))]
    [[5, 0, 7], [3, 1, 0]]
    """
    return (cost,) if cost.ndim == 1 else (cost[:, 0], cost[:, 1])


_LOW = (1 << 62) - 1


def _wide(costs) -> np.ndarray:
    """Python ints below 2**123 as rows of their low 62 bits and the rest (int64)."""
    return np.array([(c & _LOW, c >> 62) for c in costs], np.int64).reshape(-1, 2)


def _plus(cost: np.ndarray, add) -> np.ndarray:
    """Each of ``cost`` (int64, or :func:`_wide` rows) plus ``add`` (an int, or one for each
    in the same form), in the same form: the wide rows' low bits carried into the high ones,
    all in int64 (Python ints in an object array had taken most of the solver's time over
    Llama-3.1-70B's 80 blocks).

    >>> c = _plus(_wide([_LOW, 5]), 3 << 62 | 1)
    >>> [_value(r) for r in c] == [_LOW + (3 << 62 | 1), 5 + (3 << 62 | 1)]
    True
    >>> [_value(r) for r in _plus(_wide([_LOW, 5]), _wide([1, 2 << 62]))] == [1 << 62, 5 | 2 << 62]
    True
    """
    if cost.ndim == 1:
        return cost + add
    lo, hi = (add & _LOW, add >> 62) if isinstance(add, int) else (add[:, 0], add[:, 1])
    low = cost[:, 0] + lo
    return np.stack((low & _LOW, cost[:, 1] + hi + (low >> 62)), axis=1)


def _within(cost: np.ndarray, most) -> np.ndarray:
    """Whether each of ``cost`` (int64, or :func:`_wide` rows) is at most the int ``most``;
    or, ``most`` a list of ints, a row of that for each (a boundary's choices' rooms).

    >>> _within(_wide([5, 3 << 62]), 3 << 62).tolist(), _within(np.array([1, 2]), 1).tolist()
    ([True, True], [True, False])
    >>> _within(np.array([1, 2]), [2, -1, 1]).tolist()
    [[True, True], [False, False], [True, False]]
    """
    if not isinstance(most, int):
        room = np.array([m >= 0 for m in most])[:, None]
        if cost.ndim == 1:
            return room & (cost <= np.array([min(m, _LOW) for m in most], np.int64)[:, None])
        lo, hi = _wide([max(m, 0) for m in most]).T[:, :, None]
        return room & ((cost[:, 1] < hi) | ((cost[:, 1] == hi) & (cost[:, 0] <= lo)))
    if most < 0:
        return np.zeros(len(cost), bool)
    if cost.ndim == 1:
        return cost <= min(most, _LOW)
    hi, lo = most >> 62, most & _LOW
    return (cost[:, 1] < hi) | ((cost[:, 1] == hi) & (cost[:, 0] <= lo))


def _value(cost) -> int:
    """One state's cost as the Python int it stands for (an int64, or a wide row)."""
    return int(cost) if np.ndim(cost) == 0 else int(cost[1]) << 62 | int(cost[0])


def solve(problem: ChainProblem, budget_bytes: int,
          max_cost: int | None = None) -> ChainSolution:
    """The least-cost plan whose model peak fits ``budget_bytes``, exactly (:func:`_least`:
    ties, the lowest peak of those it kept). ``max_cost``: a cost the answer is known not
    to pass (a plan within the budget costing that much, or a bound the caller stops at):
    the states costing more are not searched, and where no plan costs at most that much
    the error is raised as for no plan within the budget."""
    got = _least(problem, budget_bytes, max_cost)
    if got is None:
        low = lowest_peak(problem)
        raise InfeasibleBudgetError(
            f"no checkpoint plan keeps the peak within {budget_bytes} bytes; the smallest "
            f"peak is {low} bytes", minimum_bytes=low)
    return got


def _least(problem: ChainProblem, budget: int, max_cost: int | None = None):
    """The cheapest plan within ``budget`` (ties: the lowest peak) costing at most
    ``max_cost``, a :class:`ChainSolution`, or None."""
    final = _cheapest(problem, budget, max_cost)
    if not final:
        return None
    cost, _, pk, choices = min(final, key=lambda s: (s[0], s[2]))
    return ChainSolution(choices, int(pk), cost)


def _cheapest(problem: ChainProblem, budget: int, max_cost: int | None = None):
    """The states at the last boundary of the plans whose peak fits ``budget``, as ``(cost,
    -R, peak, choices)``. Within a budget the rest of a plan can go on from a state
    when its ``R`` is enough, whatever its peak so far: a state is beaten by a cheaper one
    with at least its ``R``, ``R`` past what any later choice needs (``need``) counting as
    that much, and by one as cheap with at least its ``R`` and at most its peak (the peak
    breaks ties). Each state's peak and ``R`` are its own, and no cut: the cheapest plan is
    exact, where :func:`_run`'s three numbers (for :func:`frontier`) are cut to
    ``MAX_STATES``, the cheapest kept: over 80 blocks that cut lost the smallest peaks.
    Searched by :func:`_layers` (none costing past ``max_cost``), each boundary's states
    pruned by :func:`_staircase`."""
    starts = _by_first(problem)
    need = [0] * (problem.n + 1)  # the most R a plan from boundary k on needs
    for k in range(problem.n - 1, -1, -1):
        need[k] = max([need[k + 1]] + [max(c.own, problem.boundary[c.last + 1] - c.released)
                                       - budget for c in starts[k]])
    return _layers(problem, budget, lambda parts, k: _staircase(parts, -need[k]), max_cost)


def _staircase(parts: list, cap: float) -> tuple:
    """The states no other beats (:func:`_cheapest`), from a layer's arrays (cost, -R, peak,
    parent, choice) in the order they were made, sorted by cost, -R and peak; ``cap``:
    ``-R`` at which a state has all the ``R`` the rest of a plan can use.

    A state is kept when its capped -R is below every cheaper state's (the least -R of the
    cheaper ones kept is the least of all the cheaper ones') and its peak below that of
    every state as cheap with a smaller -R kept before it."""
    cols = [np.concatenate(col) for col in zip(*parts)]
    keys = _cost_keys(cols[0])
    order = np.lexsort((cols[2], cols[1], *keys))
    nR, pk = (cols[i][order] for i in (1, 2))
    capped = np.maximum(nR, cap)
    new = np.zeros(len(nR), bool)  # the first state of each cost
    new[:1] = True
    for key in keys:
        key = key[order]
        new[1:] |= key[1:] != key[:-1]
    group = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    most = np.minimum.accumulate(np.minimum.reduceat(capped, firsts))
    below = capped < np.concatenate(([1.0], most[:-1]))[group]
    rank = _ranks(pk, int(group[-1]) + 2)
    top = int(rank.max()) + 1  # a rank no kept state has; each group below the one before
    shifted = np.where(below, rank, top) - group * (top + 1)
    low = np.minimum.accumulate(shifted)
    before = np.empty_like(low)
    before[0] = top
    before[1:] = low[:-1]
    before[firsts] = top - group[firsts] * (top + 1)
    keep = order[below & (shifted < before)]
    return tuple(col[keep] for col in cols)


def _ranks(pk, groups: int):
    """int64 values that order as the peaks ``pk`` do (equal where they are equal), small
    enough that ``groups`` times their range stays within int64: the peaks less the least
    (whole bytes, exact in float64), or where that range is too wide their ranks (a sort:
    a quarter of a solve over Llama-3.1-70B's 80 blocks).

    >>> _ranks(np.array([7.0, 5.0, 7.0]), 3).tolist(), _ranks(np.array([2.0**61, 0.0]), 9).tolist()
    ([2, 0, 2], [1, 0])
    """
    low = float(pk.min())
    if (float(pk.max()) - low + 2) * (groups + 1) < 2.0 ** 62:
        return (pk - low).astype(np.int64)
    return np.unique(pk, return_inverse=True)[1].reshape(-1).astype(np.int64)


def min_peak(problem: ChainProblem) -> ChainSolution:
    """The plan of the smallest model peak (ties: least cost), exactly: at
    :func:`lowest_peak`, the cheapest plan :func:`_cheapest` finds."""
    return _least(problem, lowest_peak(problem))


def lowest_peak(problem: ChainProblem) -> int:
    """The smallest model peak of any plan, costs ignored: states kept on peak and bytes
    released alone (one dominates another with no higher peak and no less released), never
    cut to ``MAX_STATES`` as :func:`min_peak`'s may be, so a bound that holds."""
    starts = _by_first(problem)
    layers: list = [[] for _ in range(problem.n + 1)]
    layers[0] = [(max(problem.start, problem.boundary[0]), 0)]
    for k in range(problem.n):
        states, most = [], -1
        for pk, R in sorted(layers[k], key=lambda s: (s[0], -s[1])):
            if R > most:  # no state of a lower or equal peak released as much
                states.append((pk, R))
                most = R
        layers[k] = None
        for c in starts[k]:
            b = problem.boundary[c.last + 1]
            # _run's step, costs left out
            layers[c.last + 1] += [(max(pk, c.own - R, b - R - c.released), R + c.released)
                                   for pk, R in states]
    return int(min(pk for pk, _ in layers[problem.n]))


def frontier(problem: ChainProblem, max_points: int = 256) -> tuple:
    """Pareto-optimal (peak, cost) plans of the model, peak descending, from the cheapest."""
    final = _run(problem, None)
    pts = sorted(((s[0], s[1], s[3]) for s in final), key=lambda s: (s[0], s[1]))
    out: list = []
    for cost, pk, ch in pts:
        if not out or pk < out[-1].peak_bytes:
            out.append(ChainSolution(ch, int(pk), cost))
    if not out or out[-1].peak_bytes > lowest_peak(problem):  # the cut lost the smallest
        out.append(min_peak(problem))
    if len(out) > max_points:  # evenly spaced, both ends kept
        step = (len(out) - 1) / (max_points - 1)
        out = [out[round(i * step)] for i in range(max_points)]
    return tuple(out)
