"""One checkpoint plan for every rank group (fxmem.checkpoint.ranks.choose): the other groups'
choices are made only where the first group's own plan does not fit them all."""

import pytest

from fxmem.checkpoint.ranks import choose
from fxmem.errors import InfeasibleBudgetError


class Group:
    """A chooser over plans ``{plan: (peak, cost)}`` (cheapest first): its own choice is
    the cheapest plan within the budget, proven so (``exact``) or not; the choices it was
    asked for are kept in ``asked``."""

    def __init__(self, plans: dict, exact: bool = True):
        self.plans, self.exact, self.asked = plans, exact, []

    def choose(self, budget, b, limit=None, report=True):
        from fxmem.checkpoint.choose import PlanChoice

        self.asked.append(budget)
        for plan, (peak, cost) in self.plans.items():
            if peak <= budget and (limit is None or cost <= limit):
                return PlanChoice(b, plan, peak, cost, 100, None, self.exact)
        if limit is not None:
            return None
        raise InfeasibleBudgetError("none fits", minimum_bytes=budget + 1)

    def exact_numbers(self, plan, b):
        peak, cost = self.plans[plan]
        return peak, cost, cost

    def step_flops(self, b):
        return 100


def test_the_first_group_s_plan_that_fits_every_group_is_the_answer():
    """Rank 0's group holds more at every plan (a padded shard): its own plan fits the
    other group too, and the other group's chooser is not asked (each of its choices a
    solve or more)."""
    first = Group({("a",): (90, 5), ("b",): (70, 10), ("c",): (50, 20)})
    other = Group({("a",): (85, 5), ("b",): (65, 10), ("c",): (45, 20)})
    assert choose([None, None], [first, other], 80, 4) == (("b",), 70, 10, 100, True)
    assert first.asked == [80] and other.asked == []


def test_where_the_first_group_s_plan_does_not_fit_the_others_decide():
    """The other group holds more at plan b (110 > 80): its own choice, the dearer c, is
    the answer (it fits both), as before the shortcut; proven cheapest only as the dearest
    group's own, exact choice."""
    first = Group({("a",): (90, 5), ("b",): (70, 10), ("c",): (50, 20)})
    other = Group({("a",): (95, 5), ("b",): (110, 10), ("c",): (60, 20)})
    assert choose([None, None], [first, other], 80, 4) == (("c",), 60, 20, 100, True)
    assert first.asked == [80] and other.asked == [80]  # the first group's choice made once


def test_not_proven_cheapest_for_the_first_group_it_is_not_proven_for_all():
    first = Group({("a",): (90, 5), ("b",): (70, 10)}, exact=False)
    other = Group({("a",): (85, 5), ("b",): (65, 10)})
    assert choose([None, None], [first, other], 80, 4)[-1] is False


def test_a_recompute_limit_asks_every_group():
    """With ``max_recompute`` each group's choice is made within its own limit (a group
    with no plan within it: no answer), as before."""
    first = Group({("a",): (90, 5), ("b",): (70, 10)})
    other = Group({("a",): (85, 5), ("b",): (65, 10)})
    assert choose([None, None], [first, other], 80, 4, max_recompute=0.5)[0] == ("b",)
    assert other.asked == [80]


def test_no_plan_fitting_the_first_group_raises():
    first = Group({("a",): (90, 5)})
    with pytest.raises(InfeasibleBudgetError):
        choose([None, None], [first, Group({("a",): (10, 5)})], 80, 4)


def test_a_first_group_with_no_answer_gives_none():
    """A chooser may give no plan without raising (its tightening found none): no answer,
    as when every group was asked."""
    first = Group({("a",): (90, 5)})
    first.choose = lambda *a, **k: None
    assert choose([None, None], [first, Group({("a",): (10, 5)})], 80, 4) is None
