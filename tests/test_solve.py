"""fxmem.checkpoint.solve: the checkpoint-plan solver against exhaustive search and brute force."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxmem.checkpoint.solve
from fxmem.errors import InfeasibleBudgetError
from fxmem.checkpoint.solve import (Point, Problem, Solution, exhaustive, frontier, is_chain, min_peak,
                         peak, solve)

HUGE = 1 << 80


def random_chain(rng, n, kind):
    """A chain: activations pile up through the forward; spikes recompute one segment."""
    if kind == "small":  # small integers: many ties in cost and peak
        act = [rng.randint(0, 5) for _ in range(n)]
        cost = [rng.randint(0, 3) for _ in range(n)]
        base, noise = rng.randint(0, 10), (lambda: rng.randint(-3, 3))
    else:  # realistic magnitudes: up to ~1e9 bytes a segment, 1e12 FLOPs
        act = [rng.randint(10**6, 10**9) for _ in range(n)]
        cost = [a * rng.randint(100, 1000) if rng.random() < 0.5 else rng.randint(0, 10**12)
                for a in act]
        base, noise = rng.randint(0, 10**10), (lambda: rng.randint(-10**8, 10**8))
    rel = [rng.randint(0, a) for a in act]
    points = []
    for k in range(n + 1):
        for _ in range(rng.choice((0, 1, 1, 2))):
            bump = act[k - 1] * rng.randint(0, 2) if k else 0
            points.append(Point(base + sum(act[:k]) + bump + noise(), tuple(range(k))))
    for i in range(n):
        if rng.random() < 0.6:
            points.append(Point(base + sum(act[:i]) + 2 * act[i] + noise(), tuple(range(i)), i))
        if rng.random() < 0.4:  # the backward of i as it is when i is not checkpointed
            points.append(Point(base + sum(act[:i]) + act[i] + noise(), tuple(range(i)),
                                unless=i))
    if all(p.only_if >= 0 or p.unless >= 0 for p in points):
        points.append(Point(base + sum(act), tuple(range(n))))
    rng.shuffle(points)
    return Problem(tuple(rel), tuple(cost), tuple(points))


def random_general(rng, n, small=True):
    """Any covered sets: not a chain (most of the time)."""
    top = 6 if small else 10**9
    rel = [rng.randint(0, top) for _ in range(n)]
    cost = [rng.randint(0, 4 if small else 10**12) for _ in range(n)]
    points = []
    for _ in range(rng.randint(1, 2 * n + 2)):
        covered = tuple(sorted(rng.sample(range(n), rng.randint(0, n))))
        only_if = rng.randrange(n) if n and rng.random() < 0.3 else -1
        unless = rng.randrange(n) if n and only_if < 0 and rng.random() < 0.2 else -1
        points.append(Point(rng.randint(0, top * n + top), covered, only_if, unless))
    points.append(Point(rng.randint(0, top * n), ()))
    return Problem(tuple(rel), tuple(cost), tuple(points))


def outcome(fn, problem, budget):
    try:
        s = fn(problem, budget)
    except InfeasibleBudgetError as e:
        return ("infeasible", e.minimum_bytes)
    assert s.peak_bytes == peak(problem, s.plan) <= budget
    assert s.cost_flops == sum(problem.cost[i] for i in s.plan)
    return ("fits", s.plan, s.peak_bytes, s.cost_flops)


def naive(problem, budget):
    """Brute force straight from the definitions: (least cost, lowest peak, smallest plan)."""
    n = len(problem.released)
    plans = [p for k in range(n + 1) for p in itertools.combinations(range(n), k)]
    rows = [(sum(problem.cost[i] for i in p), peak(problem, p), p) for p in plans]
    fits = [r for r in rows if r[1] <= budget]
    low = min(rows, key=lambda r: (r[1], r[0], r[2]))
    return ("fits", min(fits)[2], min(fits)[1], min(fits)[0]) if fits else ("infeasible", low[1])


def budgets(rng, problem):
    """Infeasible, tight, loose and random budgets, and peaks of random plans +-1 (ties)."""
    n = len(problem.released)
    lo = min_peak_exhaustive(problem)
    hi = peak(problem, ())
    out = [lo - 1, lo, hi, hi + 1, rng.randint(min(lo, hi), max(lo, hi))]
    for _ in range(4):
        plan = [i for i in range(n) if rng.random() < 0.5]
        out.append(peak(problem, plan) + rng.choice((-1, 0, 0, 1)))
    return out


def min_peak_exhaustive(problem):
    with pytest.raises(InfeasibleBudgetError) as e:
        exhaustive(problem, -HUGE)
    return e.value.minimum_bytes


def test_peak_by_hand():
    # Two segments: checkpointing 0 frees 40 bytes, 1 frees 30.
    p = Problem(released=(40, 30), cost=(5, 7), points=(
        Point(20, ()),                  # before anything: nothing lowers it
        Point(100, (0, 1)),             # end of forward: lowered by both
        Point(90, (0,), only_if=1),     # recomputing 1: exists only if 1 is checkpointed
    ))
    assert peak(p, ()) == 100           # max(20, 100); the spike does not exist
    assert peak(p, [0]) == 60           # max(20, 100 - 40)
    assert peak(p, [1]) == 90           # max(20, 100 - 30, 90 - 0)
    assert peak(p, (0, 1)) == 50        # max(20, 100 - 70, 90 - 40)
    assert peak(p, iter([1, 0])) == 50  # any iterable, any order
    with pytest.raises(ValueError):
        peak(p, [2])


def test_unless_points_by_hand():
    # 50 exists while 0 is not checkpointed (lowered by nothing); 45 only while it is
    p = Problem((10,), (1,), (Point(30, ()), Point(50, (), unless=0), Point(45, (), only_if=0)))
    assert [peak(p, plan) for plan in [(), (0,)]] == [50, 45]
    assert is_chain(p) and solve(p, 47).plan == (0,) and solve(p, 50).plan == ()
    with pytest.raises(ValueError, match="both"):
        Point(1, (), only_if=0, unless=0)


def test_problem_validation():
    pt = Point(1, ())
    with pytest.raises(ValueError, match="costs"):
        Problem((1, 2), (1,), (pt,))
    with pytest.raises(ValueError, match=">= 0"):
        Problem((-1,), (1,), (pt,))
    with pytest.raises(ValueError, match="outside"):
        Problem((1,), (1,), (pt, Point(1, (1,))))
    with pytest.raises(ValueError, match="outside"):
        Problem((1,), (1,), (pt, Point(1, (), only_if=3)))
    with pytest.raises(ValueError, match="only_if == unless == -1"):
        Problem((1,), (1,), (Point(1, (), only_if=0),))
    with pytest.raises(ValueError, match="names"):
        Problem((1,), (1,), (pt,), names=("a", "b"))
    with pytest.raises(ValueError, match="sorted"):
        Point(1, (1, 0))
    assert Problem([1], [2], [Point(3, [0])]).points[0].covered == (0,)  # lists become tuples


def test_is_chain():
    assert is_chain(Problem((), (), (Point(5, ()),)))
    assert is_chain(Problem((1, 1), (1, 1), (Point(5, ()), Point(5, (0, 1)), Point(4, (0,), 1))))
    assert not is_chain(Problem((1, 1), (1, 1), (Point(5, (1,)),)))
    assert not is_chain(Problem((1, 1), (1, 1), (Point(5, ()), Point(4, (0, 1), 1))))  # spike
    assert not is_chain(Problem((1, 1), (1, 1), (Point(5, ()), Point(4, (), 1))))


@pytest.mark.parametrize("seed", range(300))
def test_chain_dp_equals_exhaustive(seed):
    rng = random.Random(seed)
    n = 1 + seed % 14
    problem = random_chain(rng, n, "small" if seed % 3 == 0 else "real")
    assert is_chain(problem)
    for b in budgets(rng, problem):
        got = outcome(solve, problem, b)
        assert got == outcome(exhaustive, problem, b), (b, problem)
        if got[0] == "fits":
            s = solve(problem, b)
            assert (s.method, s.exact) == ("chain-dp", True)


@pytest.mark.parametrize("seed", range(1, 300, 2))
def test_cost_bound_passes_stay_exact(seed, monkeypatch):
    # Tiny coarse passes, so the exact pass always runs with a cost bound to prune by.
    monkeypatch.setattr(fxmem.checkpoint.solve, "_PASSES", [1, 3])
    rng = random.Random(seed)
    problem = random_chain(rng, 4 + seed % 11, "small" if seed % 3 == 0 else "real")
    for b in budgets(rng, problem):
        assert outcome(solve, problem, b) == outcome(exhaustive, problem, b)


@pytest.mark.parametrize("seed", range(40))
def test_exhaustive_equals_naive(seed):
    rng = random.Random(seed)
    n = seed % 7
    problem = random_chain(rng, n, "small") if seed % 2 else random_general(rng, n)
    for b in budgets(rng, problem):
        assert outcome(exhaustive, problem, b) == naive(problem, b)


@settings(derandomize=True, deadline=None, max_examples=150)
@given(st.data())
def test_chain_dp_equals_exhaustive_hypothesis(data):
    n = data.draw(st.integers(0, 8))
    rel = data.draw(st.tuples(*[st.integers(0, 4)] * n))
    cost = data.draw(st.tuples(*[st.integers(0, 3)] * n))
    always = data.draw(st.lists(st.tuples(st.integers(0, 30), st.integers(0, n)), min_size=1))
    spikes = data.draw(st.lists(st.tuples(st.integers(0, 30), st.integers(0, max(n - 1, 0))),
                                max_size=n))
    points = [Point(b, tuple(range(k))) for b, k in always]
    points += [Point(b, tuple(range(i)), i) for b, i in spikes if n]
    problem = Problem(rel, cost, tuple(points))
    budget = data.draw(st.integers(-1, 31))
    assert outcome(solve, problem, budget) == outcome(exhaustive, problem, budget)


@pytest.mark.parametrize("seed", range(24))
def test_non_chain_small_is_exact(seed):
    rng = random.Random(seed)
    n = 16 if seed < 2 else 2 + seed % 11
    problem = random_general(rng, n, small=seed % 2 == 0)
    for b in budgets(rng, problem)[:3 if n == 16 else None]:
        assert outcome(solve, problem, b) == outcome(exhaustive, problem, b)
        if not is_chain(problem) and outcome(solve, problem, b)[0] == "fits":
            assert solve(problem, b).method == "exhaustive"


@pytest.mark.parametrize("seed", range(8))
def test_greedy_fits_30_segments(seed):
    rng = random.Random(seed)
    problem = random_general(rng, 30, small=False)
    assert not is_chain(problem)
    low, top = min_peak(problem), peak(problem, ())
    assert (low.method, low.exact) == ("greedy", False) and low.peak_bytes <= top
    for b in (top, (low.peak_bytes + top) // 2, low.peak_bytes):
        s = solve(problem, b)
        assert s.method == "greedy" and not s.exact
        assert s.peak_bytes == peak(problem, s.plan) <= b
        assert s.cost_flops == sum(problem.cost[i] for i in s.plan)
    assert solve(problem, top).plan == ()  # nothing needed: everything is dropped again
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(problem, min(low.peak_bytes, 0) - 10**12)
    assert e.value.minimum_bytes == low.peak_bytes


def brute_frontier(problem):
    """Pareto (peak, cost) pairs by brute force, each with the tie rule's smallest plan."""
    n = len(problem.released)
    rows = sorted((sum(problem.cost[i] for i in p), peak(problem, p), p)
                  for k in range(n + 1) for p in itertools.combinations(range(n), k))
    out = []
    for c, pk, plan in rows:  # cost ascending: keep a row when its peak beats all cheaper ones
        if not out or pk < out[-1][0]:
            out.append((pk, c, plan))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_frontier_equals_brute_force(seed):
    rng = random.Random(seed)
    n = 1 + seed % 9
    problem = random_chain(rng, n, "small" if seed % 2 else "real") if seed % 4 < 3 \
        else random_general(rng, n)
    got = frontier(problem)
    assert [(s.peak_bytes, s.cost_flops, s.plan) for s in got] == brute_frontier(problem)
    assert got[-1].peak_bytes == min_peak(problem).peak_bytes
    assert min_peak(problem) == solve(problem, got[-1].peak_bytes)


def test_frontier_max_points():
    problem = random_chain(random.Random(7), 12, "real")
    full = frontier(problem)
    assert len(full) > 3 and frontier(problem, max_points=3) == full[:3]


@pytest.mark.parametrize("seed", range(30))
def test_min_peak_equals_brute_force(seed):
    rng = random.Random(seed)
    problem = random_chain(rng, 1 + seed % 10, "small" if seed % 2 else "real")
    n = len(problem.released)
    rows = [(peak(problem, p), sum(problem.cost[i] for i in p), p)
            for k in range(n + 1) for p in itertools.combinations(range(n), k)]
    s = min_peak(problem)
    assert (s.peak_bytes, s.cost_flops, s.plan) == min(rows) and s.exact


def test_infeasible_message_and_minimum():
    p = Problem((40, 30), (5, 7), (Point(100, (0, 1)), Point(90, (0,), only_if=1)),
                names=("layer.0", "layer.1"))
    for fn in (solve, exhaustive):
        with pytest.raises(InfeasibleBudgetError) as e:
            fn(p, 49)
        assert e.value.minimum_bytes == 50
        msg = str(e.value)
        assert "49 bytes" in msg and "50 bytes" in msg and "layer.0, layer.1" in msg
    assert solve(p, 50) == Solution((0, 1), 50, 12, "chain-dp", True)
    with pytest.raises(InfeasibleBudgetError, match="with no checkpoint"):
        solve(Problem((1,), (1,), (Point(10, ()),)), 9)


def test_empty_problem():
    p = Problem((), (), (Point(10, ()),))
    assert solve(p, 10) == Solution((), 10, 0, "chain-dp", True)
    assert frontier(p) == (Solution((), 10, 0, "chain-dp", True),)
    with pytest.raises(InfeasibleBudgetError):
        solve(p, 9)


def test_ties_take_the_smallest_plan():
    # Four identical segments, one point lowered by all: any two of them reach 10 - 2 = 8 at
    # cost 2, so the rule picks the smallest sorted tuple, (0, 1).
    p = Problem((1,) * 4, (1,) * 4, (Point(10, (0, 1, 2, 3)),))
    assert solve(p, 8).plan == exhaustive(p, 8).plan == (0, 1)
    # Equal cost 1, peaks 9 (plan (0,)) and 8 (plan (1,)): the lower peak wins first.
    q = Problem((1, 2), (1, 1), (Point(10, (0, 1)),))
    assert solve(q, 9).plan == (1,)
    # Free segments: cost 0 either way, and the lower peak (both checkpointed) wins.
    z = Problem((1, 1), (0, 0), (Point(10, (0, 1)), Point(9, (0,), only_if=1)))
    assert solve(z, 10) == Solution((0, 1), 8, 0, "chain-dp", True)


@pytest.mark.parametrize("seed", range(10))
def test_grid_bucketing_still_fits(seed):
    rng = random.Random(seed)
    problem = random_chain(rng, 24, "real")
    exact = frontier(problem, max_points=6)
    for ref in exact:
        s = solve(problem, ref.peak_bytes, max_states=16)
        assert s.peak_bytes == peak(problem, s.plan) <= ref.peak_bytes
        assert s.cost_flops >= ref.cost_flops
    best = min_peak(problem)
    assert best.exact and min_peak(problem, max_states=16).peak_bytes >= best.peak_bytes
    with pytest.raises(InfeasibleBudgetError):  # whether anything fits stays exact
        solve(problem, best.peak_bytes - 1, max_states=16)
    assert solve(problem, best.peak_bytes, max_states=16).peak_bytes == best.peak_bytes
    mid = (best.peak_bytes + peak(problem, ())) // 2
    assert not solve(problem, mid, max_states=16).exact  # 16 states cannot hold 24 segments


def test_deterministic():
    problem = random_chain(random.Random(3), 40, "real")
    b = (min_peak(problem).peak_bytes + peak(problem, ())) // 2
    assert solve(problem, b) == solve(problem, b)
    assert frontier(problem, 8) == frontier(problem, 8)


def test_solver_imports_only_the_standard_library():
    import ast
    import sys
    tree = ast.parse(open(fxmem.checkpoint.solve.__file__).read())
    names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for a in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
