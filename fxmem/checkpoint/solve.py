"""The activation-checkpoint plan solver, on plain numbers (no torch).

**Model.** There are ``n`` candidate segments ``0..n-1`` in forward order. A *plan* is the set
of segments to checkpoint. Checkpointing segment ``i`` frees ``released[i]`` bytes over a
window of the step and costs ``cost[i]`` FLOPs of recomputation. The step's live memory is
summarised by :class:`Point` s: ``bytes`` live there with no checkpoint, lowered by
``released[j]`` for every checkpointed ``j`` in ``covered``; a point with ``only_if = i``
exists only when ``i`` is checkpointed (its recomputation spike), one with ``unless = i``
only when ``i`` is not (what a checkpoint of ``i`` changes in its own backward). The peak of
a plan is the largest value over the points that exist (:func:`peak`).

**Objective.** :func:`solve` returns, among plans whose peak fits the budget, the one of
least cost; among those, the lowest peak; among those, the lexicographically smallest
sorted plan tuple (so ``()`` < ``(0,)`` < ``(0, 1)`` < ``(1,)``). This is the *tie rule*.

**Algorithm.** A *chain* (:func:`is_chain`) is a problem where every point is lowered by a
prefix of the segments: a forward point after segment ``k-1``, a backward point before the
backward of segment ``k``, the recomputation spike of ``k``. Only ``M[k]``, the largest
always-point over prefix ``k``, and ``S[i]``, the largest spike of ``i``, matter then. Chains
are solved by a rotor-style dynamic program (Beaumont et al., *Optimal checkpointing for
heterogeneous chains*, restricted to store-or-recompute-once per segment): segments are
decided in order; a state is ``(R, cost, peak so far, plan)`` with ``R`` the bytes released by
the chosen segments so far. A state survives unless another has ``R`` at least as large and a
smaller ``(cost, peak so far)`` pair, which keeps the optimal (cost, peak) exactly. Two coarse
passes first find a plan that fits; its cost bounds the exact pass, which drops states whose
cost plus a fractional-knapsack bound on what they still must pay exceeds it. A backward pass
over the suffixes then picks the lexicographically smallest plan of the optimal cost and peak.

**Exactness.** A result is *exact* (``Solution.exact``: it is the plan :func:`exhaustive`
returns) unless a step of the DP holds more than ``max_states`` states -- never for 15
segments or fewer. Then ``R`` is bucketed to a grid and each bucket keeps its best state: the
plan still truly fits (every check uses the true ``R``, and whether anything fits stays
exact) but may cost more than the optimum. Other problems fall back to :func:`exhaustive`
search over all ``2**n`` plans for ``n <= 16`` (exact), beyond to a greedy heuristic
(``method="greedy"``, ``exact=False``). Reported peaks are always recomputed by :func:`peak`.

>>> p = Problem(released=(40, 30), cost=(5, 7),
...             points=(Point(20, ()), Point(100, (0, 1)), Point(90, (0,), only_if=1)))
>>> [peak(p, plan) for plan in [(), (0,), (1,), (0, 1)]]
[100, 60, 90, 50]
>>> solve(p, 60).plan, solve(p, 55).plan, min_peak(p).peak_bytes
((0,), (0, 1), 50)
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache

from ..errors import InfeasibleBudgetError

MAX_STATES = 1 << 15
_PASSES = [256, 4096]  # state limits of the coarse passes that bound the exact pass's cost
_NONE = float("-inf")  # "no such point": lower than any byte count


@dataclass(frozen=True)
class Point:
    """Live bytes at one moment of the step; see the module docstring."""

    bytes: int
    covered: tuple[int, ...]
    only_if: int = -1
    unless: int = -1  # >= 0: the point exists only when that segment is *not* checkpointed

    def __post_init__(self):
        object.__setattr__(self, "covered", tuple(self.covered))
        if any(b <= a for a, b in zip(self.covered, self.covered[1:])):
            raise ValueError(f"Point.covered must be sorted and unique, got {self.covered}")
        if self.only_if >= 0 and self.unless >= 0:
            raise ValueError(f"{self} has both only_if and unless")

    def exists(self, chosen) -> bool:
        """Whether the point exists under the plan ``chosen`` (a set of segments)."""
        return ((self.only_if < 0 or self.only_if in chosen)
                and (self.unless < 0 or self.unless not in chosen))


@dataclass(frozen=True)
class Problem:
    """Segments (``released`` bytes, recompute ``cost`` FLOPs) and the points of the step."""

    released: tuple[int, ...]
    cost: tuple[int, ...]
    points: tuple[Point, ...]
    names: tuple[str, ...] = ()

    def __post_init__(self):
        for f in ("released", "cost", "points", "names"):
            object.__setattr__(self, f, tuple(getattr(self, f)))
        n = len(self.released)
        if len(self.cost) != n:
            raise ValueError(f"{n} released values but {len(self.cost)} costs")
        if self.names and len(self.names) != n:
            raise ValueError(f"{n} segments but {len(self.names)} names")
        if any(v < 0 for v in self.released + self.cost):
            raise ValueError("released bytes and costs must be >= 0")
        for p in self.points:
            if any(not 0 <= j < n for j in p.covered) or not -1 <= p.only_if < n \
                    or not -1 <= p.unless < n:
                raise ValueError(f"{p} refers to a segment outside 0..{n - 1}")
        if all(p.only_if >= 0 or p.unless >= 0 for p in self.points):
            raise ValueError("a problem needs at least one point with only_if == unless == -1")


@dataclass(frozen=True)
class Solution:
    """A plan (sorted segment indices) with its true peak and cost. ``exact``: provably the
    plan :func:`exhaustive` returns (optimal, tie rule included)."""

    plan: tuple[int, ...]
    peak_bytes: int
    cost_flops: int
    method: str
    exact: bool = True


def peak(problem: Problem, plan: Iterable[int]) -> int:
    """The largest live-bytes value over the points that exist under ``plan``.

    >>> p = Problem((10, 5), (1, 1), (Point(30, (0, 1)), Point(25, (0,), only_if=1)))
    >>> peak(p, []), peak(p, [1]), peak(p, {0, 1})
    (30, 25, 15)
    """
    chosen = set(plan)
    if any(not 0 <= i < len(problem.released) for i in chosen):
        raise ValueError(f"plan {sorted(chosen)} names a segment outside the problem")
    rel = problem.released
    return max(p.bytes - sum(rel[j] for j in p.covered if j in chosen)
               for p in problem.points if p.exists(chosen))


def is_chain(problem: Problem) -> bool:
    """True when every point is lowered by a prefix of the segments (the DP applies).

    >>> is_chain(Problem((1, 1), (1, 1), (Point(5, (0,)), Point(4, (0,), only_if=1))))
    True
    >>> is_chain(Problem((1, 1), (1, 1), (Point(5, (1,)),)))
    False
    """
    return all(p.covered == tuple(range(len(p.covered) if max(p.only_if, p.unless) < 0
                                        else max(p.only_if, p.unless)))
               for p in problem.points)


def solve(problem: Problem, budget_bytes: int, *, max_states: int = MAX_STATES) -> Solution:
    """The least-cost plan whose peak fits ``budget_bytes`` (tie rule: module docstring).

    Raises :class:`fxmem.InfeasibleBudgetError` when no plan fits; its ``minimum_bytes`` is
    the smallest achievable peak (:func:`min_peak`).

    >>> p = Problem((40, 30), (5, 7), (Point(100, (0, 1)), Point(90, (0,), only_if=1)))
    >>> solve(p, 60)
    Solution(plan=(0,), peak_bytes=60, cost_flops=5, method='chain-dp', exact=True)
    >>> try:
    ...     solve(p, 40)
    ... except InfeasibleBudgetError as e:
    ...     print(e.minimum_bytes, "|", str(e).split("; ")[1])
    50 | the smallest achievable peak is 50 bytes, checkpointing segments 0, 1
    """
    sol = _solve(problem, budget_bytes, max_states)
    if sol is None:
        raise _infeasible(problem, budget_bytes, min_peak(problem, max_states=max_states))
    return sol


def min_peak(problem: Problem, *, max_states: int = MAX_STATES) -> Solution:
    """The plan with the smallest achievable peak (ties: least cost, then the tie rule).

    >>> min_peak(Problem((40, 30), (5, 7), (Point(100, (0, 1)), Point(90, (0,), only_if=1))))
    Solution(plan=(0, 1), peak_bytes=50, cost_flops=12, method='chain-dp', exact=True)
    """
    n = len(problem.released)
    if is_chain(problem):
        final, exact = _forward(_chain(problem), None, False, max_states)
        bound = peak(problem, _bits(min(final)[3]))
        sol = _solve(problem, bound, max_states)
        return replace(sol, exact=sol.exact and exact)
    if n <= 16:
        return _enumerate(problem, None)[1]
    return _solution(problem, _greedy(problem, None), "greedy", False)


def frontier(problem: Problem, max_points: int = 64, *,
             max_states: int = MAX_STATES) -> tuple[Solution, ...]:
    """Pareto-optimal (peak, cost) plans, peak descending and cost ascending: each the
    :func:`solve` answer at the previous peak minus one, from the cheapest plan (the empty
    one, or free segments that lower the peak) down to the min-peak plan. At most
    ``max_points``: a long heterogeneous chain has thousands, and these are the cheapest.

    >>> p = Problem((40, 30), (5, 7), (Point(100, (0, 1)), Point(90, (0,), only_if=1)))
    >>> [(s.plan, s.peak_bytes, s.cost_flops) for s in frontier(p)]
    [((), 100, 0), ((0,), 60, 5), ((0, 1), 50, 12)]
    """
    out: list[Solution] = []
    budget = peak(problem, ())  # no plan costs less than the empty one, so none above it counts
    for _ in range(2 * max_points):  # more solves than points only after inexact ones
        if len(out) == max_points and out[-1].exact:  # no later plan can beat an exact one
            break
        sol = _solve(problem, budget, max_states)
        if sol is None or len(out) == max_points and out[-1].cost_flops < sol.cost_flops:
            break
        while out and out[-1].cost_flops >= sol.cost_flops:  # an inexact solve was beaten
            out.pop()
        out.append(sol)
        budget = min(budget, sol.peak_bytes) - 1
    return tuple(out)


def exhaustive(problem: Problem, budget_bytes: int) -> Solution:
    """:func:`solve` by trying all ``2**n`` plans (``n <= 20``); the reference for tests.

    >>> exhaustive(Problem((40, 30), (5, 7), (Point(100, (0, 1)),)), 70).plan
    (0,)
    """
    if len(problem.released) > 20:
        raise ValueError(f"exhaustive search over {len(problem.released)} segments "
                         "(2**n plans) is too slow; at most 20")
    best, low = _enumerate(problem, budget_bytes)
    if best is None:
        raise _infeasible(problem, budget_bytes, low)
    return best


# -- internals -------------------------------------------------------------------------------

def _infeasible(problem: Problem, budget: int, low: Solution) -> InfeasibleBudgetError:
    what = "smallest achievable peak" if low.exact else "smallest peak found (not proven)"
    plan = ", ".join(problem.names[i] if problem.names else str(i) for i in low.plan)
    return InfeasibleBudgetError(
        f"no checkpoint plan keeps the peak within {budget} bytes; the {what} is "
        f"{low.peak_bytes} bytes, " + (f"checkpointing segments {plan}" if plan else
                                       "with no checkpoint"), minimum_bytes=low.peak_bytes)


def _solve(problem: Problem, budget: int, max_states: int) -> Solution | None:
    """:func:`solve`, with ``None`` when nothing fits."""
    if is_chain(problem):
        return _solve_chain(problem, _chain(problem), budget, max_states)
    if len(problem.released) <= 16:
        return _enumerate(problem, budget)[0]
    mask = _greedy(problem, budget)
    return None if mask is None else _solution(problem, mask, "greedy", False)


def _solution(problem: Problem, mask: int, method: str, exact: bool) -> Solution:
    plan = _bits(mask)
    return Solution(plan, peak(problem, plan), sum(problem.cost[i] for i in plan), method, exact)


def _bits(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


@dataclass(frozen=True)
class _Chain:
    """A chain reduced to what matters (``-inf`` where no point): ``M[k]`` (k = 0..n) the
    largest always-point over prefix ``k``, ``tail[k]`` the largest over prefixes ``>= k``,
    ``S[i]`` the largest spike of segment ``i``, ``U[i]`` the largest point that exists
    unless ``i`` is checkpointed, ``tailU[k]`` the largest ``U`` from ``k`` on."""

    rel: tuple[int, ...]
    cost: tuple[int, ...]
    M: list
    tail: list
    S: list
    U: list
    tailU: list


def _chain(problem: Problem) -> _Chain:
    n = len(problem.released)
    M, S, U = [_NONE] * (n + 1), [_NONE] * n, [_NONE] * n
    for p in problem.points:
        if p.only_if >= 0:
            S[p.only_if] = max(S[p.only_if], p.bytes)
        elif p.unless >= 0:
            U[p.unless] = max(U[p.unless], p.bytes)
        else:
            M[len(p.covered)] = max(M[len(p.covered)], p.bytes)
    tail, tailU = list(M), [*U, _NONE]
    for i in range(n - 1, -1, -1):
        tail[i] = max(tail[i], tail[i + 1])
        tailU[i] = max(tailU[i], tailU[i + 1])
    return _Chain(problem.released, problem.cost, M, tail, S, U, tailU)


def _forward(ch: _Chain, budget: int | None, by_cost: bool, max_states: int,
             bound: int | None = None):
    """The forward DP. Returns (final states ``(cost, peak, -R, mask)``, exact); no states
    when nothing fits. ``by_cost``: least (cost, peak) first; else least peak (costs are
    then taken as 0), with no budget. ``bound``: the cost of some plan that fits."""
    rel, M, S, n = ch.rel, ch.M, ch.S, len(ch.rel)
    cost = ch.cost if by_cost else (0,) * n
    limit = float("inf") if budget is None else budget
    # need[i]: the least R a state must hold before segment i for the always-points over
    # prefixes k >= i to fit even if it checkpointed every segment in i..k-1. States below
    # it are dead; need[i] >= M[i] - budget is constraint (1) below.
    need = [_NONE] * (n + 1)
    if budget is not None:
        need[n] = M[n] - budget
        for i in range(n - 1, -1, -1):
            need[i] = max(M[i] - budget, need[i + 1] - rel[i])
    lower = _knapsack(ch, suffix=True) if bound is not None else None
    states, grid = [(0, _NONE, 0, 0)], 0  # (cost, peak so far, -R, mask)
    for i in range(n + 1):
        # (1) the always-points over prefix i (before segment i is decided, or at the end of
        # the step for i == n) see the R of the chosen segments < i: M[i] - R <= budget.
        m, lo = M[i], -need[i]
        states = [(c, pk if pk >= (v := m + nR) else v, nR, mask)
                  for c, pk, nR, mask in states if nR <= lo]
        if lower:  # (2) drop states that cannot finish within the bound cost: segments >= i
            tb = ch.tail[i] - limit  # must still release tb - R bytes at least
            states = [st for st in states
                      if st[0] + (0 if (d := tb + st[2]) <= 0 else lower(i, d)) <= bound]
        if not states or i == n:
            return states, grid == 0
        r, k, s, u, bit = rel[i], cost[i], S[i], ch.U[i], 1 << i
        # (3) checkpointing i adds its recomputation spike, lowered by the segments before i
        # only (R before adding released[i]): S[i] - R <= budget.
        taken = [(c + k, pk if pk >= (v := s + nR) else v, nR - r, mask | bit)
                 for c, pk, nR, mask in states if s + nR <= limit]
        # (3') not checkpointing i keeps the points that exist unless i is checkpointed,
        # lowered by the segments before i: U[i] - R <= budget.
        states = [(c, pk if pk >= (v := u + nR) else v, nR, mask)
                  for c, pk, nR, mask in states if u + nR <= limit] + taken
        # (4) dominance: a state with R at least as large and a smaller (cost, peak so far)
        # is at least as good for every completion: later points only fall as R grows, and
        # a smaller cost stays smaller. Sorted by that pair, a state survives when its R
        # beats every state before it.
        states.sort()
        kept, top = [], 1
        for st in states:
            if st[2] < top:
                kept.append(st)
                top = st[2]
        # (5) too many states: bucket R to a grid of about max_states / 4 cells; a bucket
        # keeps only its best state (true R kept, so plans still truly fit). The highest-R
        # state always stays: it tells exactly whether anything fits.
        if kept and (len(kept) > max_states or grid):  # (empty: nothing fits, stop next step)
            grid = grid or max(1, -(-sum(rel) // max(1, max_states // 4)))
            first: dict = {}  # cell -> its best state (kept is best-first within a cell)
            for st in kept:
                first.setdefault(-st[2] // grid, st)
            states = list(first.values())
            if states[-1] is not kept[-1]:
                states.append(kept[-1])
        else:
            states = kept
    raise AssertionError("unreachable")


def _knapsack(ch: _Chain, suffix: bool):
    """lower(i, d): at most the least cost of segments i..n-1 (``suffix``) or 0..i-1 that
    release d bytes -- the fractional knapsack bound, cheapest bytes first."""
    rel, cost, n = ch.rel, ch.cost, len(ch.rel)
    order = sorted((j for j in range(n) if rel[j]), key=lambda j: (Fraction(cost[j], rel[j]), j))
    tables = []
    for i in range(n + 1):  # the segments on the side of i, as cumulative (bytes, cost)
        segs, cr, cc = [j for j in order if (j >= i if suffix else j < i)], [0], [0]
        for j in segs:
            cr.append(cr[-1] + rel[j])
            cc.append(cc[-1] + cost[j])
        tables.append((segs, cr, cc))

    def lower(i: int, d: int) -> int:  # callers keep 0 < d <= the bytes on that side
        segs, cr, cc = tables[i]
        j = bisect_left(cr, d)
        return cc[j - 1] + (d - cr[j - 1]) * cost[segs[j - 1]] // rel[segs[j - 1]]
    return lower


def _solve_chain(problem: Problem, ch: _Chain, budget: int, max_states: int) -> Solution | None:
    best = None  # (final states, exact) of the last pass that kept any
    bound = None
    for size in [s for s in _PASSES if s < max_states] + [max_states]:
        # Coarse passes first: the cost of the cheapest plan one finds bounds the next one.
        final, exact = _forward(ch, budget, True, size, bound)
        if final:
            best, bound = (final, exact), min(final)[0]
            if exact:
                break
        elif best is None:  # the first pass keeps the highest-R state: nothing fits at all
            return None
    final, exact = best
    c, pk, _, mask = min(final, key=lambda s: (s[0], s[1], _bits(s[3])))
    if exact:  # (c, pk) is optimal: now the smallest plan of that cost and peak
        lex = _smallest_plan(ch, pk, c, max_states)
        if lex is None:
            exact = False
        else:
            mask = sum(1 << i for i in lex)
    return _solution(problem, mask, "chain-dp", exact)


def _smallest_plan(ch: _Chain, P: int, C: int, max_states: int) -> tuple[int, ...] | None:
    """The lexicographically smallest plan with peak <= P and cost <= C (one exists)."""
    rel, cost, M, S, U, n = ch.rel, ch.cost, ch.M, ch.S, ch.U, len(ch.rel)
    reach, R = [], 0  # reach[i]: the most R any fitting plan holds before segment i
    for i in range(n):
        reach.append(R)
        R += rel[i] if S[i] - R <= P else 0
    reach.append(R)
    # F[i]: Pareto set of (least R needed before segment i, cost) over plans of the suffix
    # i..n-1 that keep every point from prefix i on within P, need ascending; the segments
    # before i must be able to release that R within the cost left (a knapsack bound).
    lower = _knapsack(ch, suffix=False)
    F: list = [None] * (n + 1)
    F[n] = [(M[n] - P, 0)]
    for i in range(n - 1, -1, -1):
        base, spike = max(M[i] - P, U[i] - P), max(M[i] - P, S[i] - P)  # (1), (3'), (3)
        r, k = rel[i], cost[i]
        cand = [(nd if nd >= base else base, c) for nd, c in F[i + 1]]
        cand += [(nd - r if nd - r >= spike else spike, c + k) for nd, c in F[i + 1]]
        cand.sort()
        F[i], low = [], C + 1
        for nd, c in cand:
            if nd > reach[i]:  # no plan holds that much R before i
                break
            if c < low and c + (0 if nd <= 0 else lower(i, nd)) <= C:
                F[i].append((nd, c))
                low = c
        if len(F[i]) > max_states:
            return None
    needs = [[nd for nd, _ in f] for f in F]

    def fits(i: int, R: int, left: int) -> bool:  # some suffix from i fits with R, cost <= left
        j = bisect_right(needs[i], R)
        return j > 0 and F[i][j - 1][1] <= left

    if not fits(0, 0, C):
        return None
    plan, R, c = [], 0, 0
    for i in range(n):
        if max(ch.tail[i], ch.tailU[i]) - R <= P:  # stopping here fits: the smallest plan
            break
        if S[i] - R <= P and fits(i + 1, R + rel[i], C - c - cost[i]):  # (i, ...) < (i+1, ...)
            plan.append(i)
            R, c = R + rel[i], c + cost[i]
    return tuple(plan)


def _enumerate(problem: Problem, budget: int | None):
    """All 2**n plans: (the best that fits or None, the min-peak one), tie rule applied."""
    cost, pk = _table(problem)
    masks = range(len(cost))
    best = min(((cost[m], pk[m]) for m in masks if pk[m] <= budget), default=None) \
        if budget is not None else None
    low = min((pk[m], cost[m]) for m in masks)
    return (None if best is None else
            Solution(min(_bits(m) for m in masks if (cost[m], pk[m]) == best), best[1], best[0],
                     "exhaustive"),
            Solution(min(_bits(m) for m in masks if (pk[m], cost[m]) == low), low[0], low[1],
                     "exhaustive"))


@lru_cache(maxsize=2)  # frontier() and tests solve one problem at many budgets
def _table(problem: Problem) -> tuple[list, list]:
    """The cost and the peak of every plan, indexed by plan bitmask."""
    n, rel, cost = len(problem.released), problem.released, problem.cost
    sr, sc = [0] * (1 << n), [0] * (1 << n)
    for mask in range(1, 1 << n):  # each subset from the one without its lowest segment
        low, rest = (mask & -mask).bit_length() - 1, mask & (mask - 1)
        sr[mask], sc[mask] = sr[rest] + rel[low], sc[rest] + cost[low]
    pk, masks = [_NONE] * (1 << n), range(1 << n)
    for (cm, oi, ui), b in sorted(_points(problem).items()):
        bit = 1 << oi if oi >= 0 else 0
        ubit = 1 << ui if ui >= 0 else 0
        col = [b - sr[m & cm] if (not bit or m & bit) and not m & ubit else _NONE
               for m in masks]
        pk = list(map(max, pk, col))
    return sc, pk


def _points(problem: Problem) -> dict:
    """Points merged by (covered bitmask, only_if, unless), keeping the largest bytes."""
    out: dict = {}
    for p in problem.points:
        k = (sum(1 << j for j in p.covered), p.only_if, p.unless)
        out[k] = max(out.get(k, _NONE), p.bytes)
    return out


def _greedy(problem: Problem, budget: int | None) -> int | None:
    """Greedy plan (a bitmask): add the segment with the best peak decrease / (cost + 1)
    until the peak fits (with ``budget`` None: the largest decrease, until none decreases
    it); then drop chosen segments, most costly first, while the plan still fits. Ties go
    to the lower index."""
    rel, cost, n = problem.released, problem.cost, len(problem.released)
    pts = sorted(_points(problem).items())

    def pk(mask: int) -> int:
        best = _NONE
        for (cm, oi, ui), b in pts:
            if (oi < 0 or mask >> oi & 1) and (ui < 0 or not mask >> ui & 1):
                m = mask & cm
                while m:
                    b -= rel[(m & -m).bit_length() - 1]
                    m &= m - 1
                best = max(best, b)
        return best

    def add(target: int | None) -> tuple[int, int]:
        mask, cur = 0, pk(0)
        while target is None or cur > target:
            # (decrease, segment) for each segment not chosen that lowers the peak at all
            gains = [(d, i) for i in range(n) if not mask >> i & 1
                     and (d := cur - pk(mask | 1 << i)) > 0]
            if not gains:
                break
            d, i = max(gains, key=(lambda g: (g[0], -cost[g[1]], -g[1])) if target is None
                       else (lambda g: (Fraction(g[0], cost[g[1]] + 1), -g[1])))
            mask, cur = mask | 1 << i, cur - d
        return mask, cur

    mask, cur = add(budget)
    if budget is not None and cur > budget:
        mask, cur = add(None)  # the lowest peak greedy reaches may still fit
        if cur > budget:
            return None
    limit = cur if budget is None else budget
    for i in sorted(_bits(mask), key=lambda i: (-cost[i], i)):
        if pk(mask & ~(1 << i)) <= limit:
            mask &= ~(1 << i)
    return mask
