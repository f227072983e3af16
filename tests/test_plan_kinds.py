"""Plans of every kind (whole modules, groups of blocks, selective checkpointing), applied
with fxmem.apply_checkpoints and measured for real: the prediction derived from one trace,
the prediction traced with the plan really running, and fxmem.measure agree to the byte, at
two batch sizes other than the traced one; recompute FLOPs derived == traced, and the step's
PyTorch-counted FLOPs == FlopCounterMode's on the real checkpointed step."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxmem
from fxmem import Plan, Region


def mlp_stack(n=4, d=64, h=256):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d), torch.nn.Tanh())
        for _ in range(n)])


def loss(o):
    return o.square().mean()


X = torch.randn(8, 64)
MM = "aten.addmm.default"
PLANS = {
    "module": ["1"],
    "group": [Region(("1", "2"))],
    "sac one op": [Region(("1",), save=((MM, 0),))],
    "sac group": [Region(("0", "1", "2"), save=((MM, 1), ("aten.gelu.default", 2)))],
    "mixed": [Region(("0",), save=(("aten.tanh.default", 0),)), Region(("2", "3"))],
    "sac after early stop": [Region(("0", "1", "2", "3"), save=((MM, 7),))],
    "sac every block": [Region((str(i),), save=((MM, 0), (MM, 1))) for i in range(4)],
}


@pytest.fixture(scope="module")
def base():
    return fxmem.analyze(mlp_stack(), X, loss=loss, device="cpu")


@pytest.mark.parametrize("name", list(PLANS))
def test_plan_kind_exact(base, name):
    plan = PLANS[name]
    derived = base.with_plan(plan)
    traced = fxmem.analyze(mlp_stack(), X, loss=loss, device="cpu", checkpoint=plan,
                           retrace=True)
    assert derived.recompute_flops == traced.recompute_flops != 0
    for b in (300, 613):
        real = fxmem.measure(fxmem.apply_checkpoints(mlp_stack(), plan), X, loss=loss, B=b)
        assert derived.peak_bytes(b) == traced.peak_bytes(b) == real.peak_bytes, (name, b)
        # forward + backward (no optimizer): PyTorch's count of the real checkpointed step
        m = fxmem.apply_checkpoints(mlp_stack(), plan)
        with FlopCounterMode(display=False) as fc:
            loss(m(torch.randn(b, 64))).backward()
        assert fc.get_total_flops() == _pytorch_flops(derived, b, ("forward", "backward"))


def _pytorch_flops(report, b, phases):
    """FLOPs of the report's ops in ``phases`` that PyTorch's formulas count, at ``b``."""
    per_op = report._op_flops
    total = 0
    for op in report.trace.ops:
        got = per_op.get(op.index if op.source is None else op.source)
        if got is not None and got[1] and op.phase in phases:
            total += int(got[0].subs(fxmem.B, b))
    return total


def test_selective_saves_change_the_plan(base):
    # keeping a matmul's output re-runs fewer FLOPs than recomputing everything
    full, kept = base.with_plan([Region(("1",))]), base.with_plan(PLANS["sac one op"])
    assert kept.recompute_flops.subs(fxmem.B, 64) < full.recompute_flops.subs(fxmem.B, 64)
    assert kept.peak_bytes(613) > full.peak_bytes(613)


def test_gradients_bitwise():
    x = torch.randn(16, 64)
    ref = mlp_stack()
    loss(ref(x)).backward()
    for plan in PLANS.values():
        m = fxmem.apply_checkpoints(mlp_stack(), plan)
        for _ in range(2):  # the second step: a group's state from the first is gone
            m.zero_grad()
            loss(m(x)).backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), m.parameters()))


def test_plan_json_round_trip(tmp_path):
    plan = Plan.of(PLANS["mixed"] + ["1"])
    assert str(plan) == "0 (saving 1 op output), 1, 2..3"
    assert Plan.from_json(plan.to_json()) == plan
    f = tmp_path / "plan.json"
    f.write_text(plan.to_json(indent=1))
    assert fxmem.load_plan(str(f)) == plan
    assert Plan.of(["b", "a"]) == ("a", "b")


@pytest.mark.parametrize("plan, message", [
    ([Region(("0", "2"))], "not one segment"),
    ([Region(("0", "1")), "1"], "is in two of its regions"),
    ([Region(("0", "1.0"))], "not siblings"),
    ([Region(("1",), save=(("aten.mm.default", 0),))], "has no call"),
    ("0", "the string"),
])
def test_bad_plans(base, plan, message):
    with pytest.raises(fxmem.InputError, match=message):
        base.with_plan(plan)


def test_bad_json():
    with pytest.raises(fxmem.InputError, match="not an fxmem checkpoint plan"):
        Plan.from_json('{"regions": []}')
    with pytest.raises(fxmem.InputError, match="does not parse"):
        Plan.from_json("{")


def test_group_needs_its_chain():
    class Skip(torch.nn.Module):  # gives block 1 the input, not block 0's output
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) + self.b(x)
    m = fxmem.apply_checkpoints(Skip(), [Region(("a", "b"))])
    with pytest.raises(fxmem.InputError, match="was not given the output of a"):
        m(torch.randn(2, 4, requires_grad=True))
