"""The chain solver (:mod:`fxmem.checkpoint.chain`) against every plan of small chains, and
on a long chain whose states are cut."""

import random
from dataclasses import replace

import numpy as np
import pytest

from fxmem.checkpoint import chain as C
from fxmem.errors import InfeasibleBudgetError


def random_problem(rng: random.Random, n: int) -> C.ChainProblem:
    """Activations pile up through the forward; each block has its none, a whole and a few
    partial checkpoints, and some stretches of blocks a group."""
    boundary = [rng.randint(5, 15)]
    for _ in range(n):
        boundary.append(boundary[-1] + rng.randint(5, 40))
    choices = []
    for k in range(n):
        choices.append(C.Choice(k, k, 0, 0, boundary[k + 1] + rng.randint(0, 30), ("none", k)))
        for j in range(rng.randint(1, 3)):
            choices.append(C.Choice(k, k, rng.randint(1, boundary[k + 1] - boundary[k]),
                                    rng.randint(1, 50), boundary[k + 1] + rng.randint(0, 40),
                                    ("ck", k, j)))
    for first in range(n - 1):
        last = min(n - 1, first + rng.randint(1, 2))
        choices.append(C.Choice(first, last, rng.randint(1, boundary[last + 1] - boundary[first]),
                                rng.randint(20, 120), boundary[last + 1] + rng.randint(0, 60),
                                ("group", first, last)))
    return C.ChainProblem(n, tuple(choices), tuple(boundary), start=boundary[0])


def every_plan(problem: C.ChainProblem):
    """Each tiling of the blocks by the problem's choices, as (cost, peak, choices)."""
    starts = C._by_first(problem)

    def tilings(k):
        if k == problem.n:
            yield ()
            return
        for c in starts[k]:
            for rest in tilings(c.last + 1):
                yield (c, *rest)
    for plan in tilings(0):
        yield sum(c.cost for c in plan), C.peak(problem, plan), plan


@pytest.mark.parametrize("seed", range(40))
def test_solve_is_the_cheapest_plan_of_every_plan(seed):
    rng = random.Random(seed)
    problem = random_problem(rng, 2 + seed % 5)
    plans = list(every_plan(problem))
    peaks = sorted({p for _, p, _ in plans})
    assert C.lowest_peak(problem) == peaks[0]
    low = C.min_peak(problem)
    assert low.peak_bytes == peaks[0]
    assert low.cost == min(c for c, p, _ in plans if p == peaks[0])
    for budget in [peaks[0] - 1, *peaks, *(p + 1 for p in peaks)]:
        fitting = [(c, p) for c, p, _ in plans if p <= budget]
        if not fitting:
            with pytest.raises(InfeasibleBudgetError) as e:
                C.solve(problem, budget)
            assert e.value.minimum_bytes == peaks[0]
            continue
        got = C.solve(problem, budget)
        assert (got.cost, got.peak_bytes) == min(fitting)
        assert C.peak(problem, got.choices) == got.peak_bytes
        assert sum(c.cost for c in got.choices) == got.cost


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("times", [1, (1 << 64) + (1 << 62) - 1])
def test_a_cost_bound_keeps_the_same_plan_and_searches_fewer_states(seed, times, monkeypatch):
    """``solve(..., max_cost=)``: at the answer's own cost or above, the same plan (costs past
    2**62 too); one less, no plan; and the states the search makes are fewer where the
    bound is below the dearest plan's cost (the walks over budgets pass the cost of a plan
    they found within a smaller one)."""
    problem = random_problem(random.Random(500 + seed), 8 + seed % 5)
    problem = C.ChainProblem(problem.n, tuple(replace(c, cost=c.cost * times)
                                              for c in problem.choices),
                             problem.boundary, problem.start)
    made = []
    staircase = C._staircase
    monkeypatch.setattr(C, "_staircase", lambda parts, cap: made.append(
        sum(len(p[0]) for p in parts)) or staircase(parts, cap))
    lowest, top = C.lowest_peak(problem), C.solve(problem, 10**9).peak_bytes
    fewer = 0
    for budget in range(lowest, top + 1, max(1, (top - lowest) // 6)):
        made.clear()
        got = C.solve(problem, budget)
        free = sum(made)
        for bound in (got.cost, got.cost + times, 2 * got.cost + 1):
            made.clear()
            assert C.solve(problem, budget, bound) == got
            fewer += sum(made) < free
            assert sum(made) <= free
        if got.cost:
            with pytest.raises(InfeasibleBudgetError):
                C.solve(problem, budget, got.cost - 1)
    assert fewer


@pytest.mark.parametrize("seed", range(10))
def test_frontier_is_every_plans_pareto_front(seed):
    problem = random_problem(random.Random(100 + seed), 3 + seed % 4)
    front = []
    for cost, pk, _ in sorted(every_plan(problem), key=lambda t: (t[0], t[1])):
        if not front or pk < front[-1][1]:
            front.append((cost, pk))
    assert [(s.cost, s.peak_bytes) for s in C.frontier(problem)] == front


def test_a_long_chain_keeps_its_smallest_peak(monkeypatch):
    """Twenty blocks whose frontier states are cut to a few (as 80 blocks of Llama-3.1-70B's
    are cut to 16,384): the cut keeps the cheapest states, yet the smallest peak and the
    frontier's last point stay the exact ones."""
    rng = random.Random(5)
    problem = random_problem(rng, 20)
    monkeypatch.setattr(C, "MAX_STATES", 8)
    lowest = C.lowest_peak(problem)
    cut = min(s[1] for s in C._run(problem, None, 8))
    assert cut > lowest  # the cut lost the smallest peaks
    assert C.min_peak(problem).peak_bytes == lowest
    assert C.frontier(problem)[-1].peak_bytes == lowest


def test_the_budget_is_kept_over_a_long_chain():
    problem = random_problem(random.Random(9), 30)
    lowest = C.lowest_peak(problem)
    top = C.solve(problem, 10**9)
    assert top.cost == 0
    for budget in range(lowest, top.peak_bytes + 1, max(1, (top.peak_bytes - lowest) // 25)):
        got = C.solve(problem, budget)
        assert got.peak_bytes <= budget and C.peak(problem, got.choices) == got.peak_bytes


def test_a_chain_of_no_blocks_has_the_empty_plan():
    """No blocks (a parallel step whose model has no stack): the one plan is the empty one,
    peaking at its boundary, within a budget at least that."""
    problem = C.ChainProblem(0, (), (5,), start=3)
    got = C.solve(problem, 10)
    assert (got.choices, got.peak_bytes, got.cost) == ((), 5, 0)
    with pytest.raises(InfeasibleBudgetError):
        C.solve(problem, 4)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("times", [1 << 62, (1 << 64) + (1 << 62) - 1])
def test_costs_past_2_to_the_62_choose_as_small_ones(seed, times):
    """Costs of Python ints past int64 (PyTorch-counted FLOPs weighted over the others, as
    Llama-3.1-70B's are): each cost c made c * ``times`` (which keeps their order and ties;
    the second's low 62 bits are 2**62 - c, so that sums carry) gives the same plans and
    costs, on the frontier and within budgets."""
    problem = random_problem(random.Random(300 + seed), 12)
    wide = C.ChainProblem(problem.n, tuple(replace(c, cost=c.cost * times)
                                           for c in problem.choices),
                          problem.boundary, problem.start)
    assert [(s.names, s.peak_bytes, s.cost * times) for s in C.frontier(problem)] \
        == [(s.names, s.peak_bytes, s.cost) for s in C.frontier(wide)]
    lowest, top = C.lowest_peak(problem), C.solve(problem, 10**9).peak_bytes
    for budget in range(lowest, top + 1, max(1, (top - lowest) // 10)):
        got, far = C.solve(problem, budget), C.solve(wide, budget)
        assert (got.names, got.cost * times) == (far.names, far.cost)
    assert C.min_peak(problem).names == C.min_peak(wide).names


def test_costs_past_2_to_the_62_sort_by_their_value():
    """The sort keys of such costs order them as the integers they are (high bits first)."""
    rng = random.Random(11)
    costs = [rng.randrange(4) << 62 | rng.randrange(1 << 62) for _ in range(500)]
    order = np.lexsort(C._cost_keys(C._wide(costs)))
    assert [costs[i] for i in order] == sorted(costs)


def _per_choice(layer, choices, boundary, cost, nR, pk, ids, budget, max_cost):  # noqa: N803
    """The states a boundary's choices make, one part per choice (the solver's step before
    it made them in one array operation per boundary ended before)."""
    for c in choices:
        v = np.maximum(pk, np.maximum(c.own + nR, boundary[c.last + 1] + nR - c.released))
        ok = v <= budget
        if max_cost is not None:
            ok &= C._within(cost, max_cost - c.cost)
        if ok.any():
            layer[c.last + 1].append((C._plus(cost[ok], c.cost), nR[ok] - c.released, v[ok],
                                      ids[ok], np.full(int(ok.sum()), c.name[-1])))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("times", [1, (1 << 64) + (1 << 62) - 1])
def test_each_boundary_makes_the_states_choice_by_choice(seed, times):
    """:func:`fxmem.checkpoint.chain._extend` makes a boundary's new states as a part per
    choice would, in the same order (which breaks ties between plans): each boundary's
    arrays equal, within budgets and cost bounds, for costs past 2**62 too."""
    rng = random.Random(900 + seed)
    problem = random_problem(rng, 6 + seed % 4)
    problem = C.ChainProblem(problem.n, tuple(
        replace(c, cost=c.cost * times, name=(*c.name, i)) for i, c in enumerate(problem.choices)),
        problem.boundary, problem.start)
    cost = C._wide([rng.randrange(200) * times for _ in range(40)]) if times > 1 else \
        np.array([rng.randrange(200) for _ in range(40)], np.int64)
    nR = -np.array([rng.randrange(100) for _ in range(40)], float)  # noqa: N806
    pk = np.array([rng.randrange(50, 400) for _ in range(40)], float)
    ids = np.arange(100, 140)
    for budget in (300, 450, 10**9):
        for bound in (None, 150 * times, 10 * times, -1):
            for k, choices in enumerate(C._by_first(problem)):
                want = [[] for _ in range(problem.n + 1)]
                _per_choice(want, choices, problem.boundary, cost, nR, pk, ids, budget, bound)
                got = [[] for _ in range(problem.n + 1)]
                for end, group in C._ends(problem)[k]:
                    C._extend(got[end], group, problem.boundary[end], cost, nR, pk, ids,
                              budget, bound)
                for a, b in zip(want, got):
                    a = [np.concatenate(col) for col in zip(*a)] if a else []
                    b = [np.concatenate(col) for col in zip(*b)] if b else []
                    assert len(a) == len(b)
                    for x, y in zip(a, b):
                        assert x.dtype == y.dtype and np.array_equal(x, y)
