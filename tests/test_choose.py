"""Choosing plans: the solver's choice against every plan of the candidates, each derived
exactly from the trace, and the chosen plan against a real step with it applied."""

import copy
import itertools

import pytest
import torch
from torch import nn

import fxmem
from fxmem.checkpoint.choose import default_candidates
from zoo import OPTIMIZERS, ZOO


def _stack(n=5, d=24, h=96):
    return nn.Sequential(*[nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
                           for _ in range(n)])


CASES = {  # name -> (model, inputs, targets, loss, B)
    "stack": lambda: (_stack(), (torch.randn(4, 24),), (), lambda o: o.square().mean(), 64),
    "resnet": lambda: (*ZOO["resnet"](), 16),
    "transformer": lambda: (*ZOO["transformer_train_mode"](), 8),
}


def _all_plans(report, b):
    """(exact peak, recompute FLOPs, plan) of every subset of the default candidates."""
    cands = report._chooser(None, ("module",)).candidates
    ch = report._chooser(None, ("module",))
    out = []
    for k in range(len(cands) + 1):
        for idx in itertools.combinations(range(len(cands)), k):
            plan = ch.paths(idx)
            peak = report.with_plan(plan).peak_bytes(b)  # the exact report, not the fast path
            assert peak == ch.peak(idx, b)
            out.append((peak, ch.costs(idx, b), plan))
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    model, x, y, loss, b = CASES[request.param]()
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    return request.param, model, x, y, loss, b, report, _all_plans(report, b)


def test_default_candidates_are_the_stack_blocks(case):
    name, *_, report, _ = case
    # numbered children of stacks that release something (stem.0, a conv, saves only its
    # input and weight; stem.2, an in-place ReLU, saves nothing of its own)
    expected = {"stack": ("0", "1", "2", "3", "4"),
                "resnet": ("stem.1", "layer1.0", "layer1.1"),
                "transformer": ("enc.layers.0", "enc.layers.1")}[name]
    assert default_candidates(report) == expected


def test_the_chosen_plan_is_the_cheapest_that_fits(case):
    name, model, x, y, loss, b, report, plans = case
    peaks = sorted({p for p, _, _ in plans})
    for budget in peaks + [(lo + hi) // 2 for lo, hi in zip(peaks, peaks[1:])]:
        best = min(c for p, c, _ in plans if p <= budget)
        got = report.plan_for(budget, b, kinds=["module"])
        assert got.peak_bytes <= budget and got.recompute_flops == best, (name, budget)


def test_no_plan_fits_below_the_smallest_peak(case):
    *_, b, report, plans = case
    smallest = min(p for p, _, _ in plans)
    with pytest.raises(fxmem.InfeasibleBudgetError) as e:
        report.plan_for(smallest - 1, b, kinds=["module"])
    assert e.value.minimum_bytes == smallest
    assert f"{smallest:,}" in str(e.value)


def test_frontier_is_the_pareto_set_of_all_plans(case):
    *_, b, report, plans = case
    pareto = {(p, c) for p, c, _ in plans
              if not any(p2 <= p and c2 <= c and (p2, c2) != (p, c) for p2, c2, _ in plans)}
    front = report.frontier(b, kinds=["module"])
    assert {(f.peak_bytes, f.recompute_flops) for f in front} == pareto
    assert [f.peak_bytes for f in front] == sorted((f.peak_bytes for f in front), reverse=True)


def test_the_chosen_plan_matches_a_real_step():
    model, x, y, loss, b = CASES["resnet"]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"])
    budget = fxmem.analyze(model, x, y, **kw, device="cpu").peak_bytes(b) * 9 // 10
    choice = fxmem.plan_checkpoints(model, x, y, **kw, device="cpu", budget_bytes=budget, B=b)
    assert choice.plan and choice.peak_bytes <= budget
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), choice.plan)
    assert fxmem.measure(wrapped, x, y, **kw, B=b).peak_bytes == choice.peak_bytes


def test_max_batch_size_within_a_recompute_share():
    model, x, y, loss, _ = CASES["stack"]()
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    budget = 4 * 2**20
    plain = report.max_batch_size(budget)
    got = report.max_batch_size(budget, max_recompute=0.25, kinds=["module"])
    assert got.B > plain and got.peak_bytes <= budget
    assert got.recompute_flops <= 0.25 * got.step_flops and got.plan
    assert got.report.peak_bytes(got.B) == got.peak_bytes
    # one more sample does not fit with any plan within the share
    ch = report._chooser(None, ("module",))
    for k in range(len(ch.candidates) + 1):
        for idx in itertools.combinations(range(len(ch.candidates)), k):
            assert (ch.peak(idx, got.B + 1) > budget
                    or ch.costs(idx, got.B + 1) > 0.25 * ch.step_flops(got.B + 1))
    assert report.max_batch_size(budget, max_recompute=0).B == plain


def test_choosing_needs_a_report_without_a_plan():
    model, x, y, loss, b = CASES["stack"]()
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=["0"])
    with pytest.raises(fxmem.InputError, match="without one"):
        r.plan_for(10**6, 4)


# plans as (model peak, model cost, exact peak); the solver's: the cheapest whose model
# peak is within the budget
_PLANS = {"A": (50, 1, 110), "B": (30, 2, 95), "C": (20, 3, 60)}


def _solver(asked: list):
    def solve(budget):
        asked.append(budget)
        name = min((p for p, (m, _, _) in _PLANS.items() if m <= budget),
                   key=lambda p: _PLANS[p][1], default=None)
        if name is None:
            raise fxmem.InfeasibleBudgetError("none", minimum_bytes=20)
        model, cost, _ = _PLANS[name]
        return name, True, model, cost
    return solve


def _exact(name):
    return _PLANS[name][2], _PLANS[name][1]


def test_a_model_short_by_more_than_the_excess_is_not_asked_the_same_plan_again():
    from fxmem.checkpoint.choose import tightened

    asked: list = []
    # A's model peak (50) is 60 bytes short of its exact one, 10 over the budget: the
    # next budget is below A's model peak, where B (exact 95) fits; lowered by the excess
    # alone (90, 80, ...) A came back until the tightenings ran out
    assert tightened(_solver(asked), _exact, 100, None) == ("B", False)
    assert asked == [100, 40]


def test_a_plan_dearer_than_one_found_ends_the_tightening():
    from fxmem.checkpoint.choose import tightened

    asked: list = []
    # a plan costing 1 fits already: after A (cost 1, over), B costs more, and no smaller
    # budget costs less
    assert tightened(_solver(asked), _exact, 100, None, dearer=1) is None
    assert asked == [100, 40]
    assert tightened(_solver([]), _exact, 100, None, dearer=2) == ("B", False)
