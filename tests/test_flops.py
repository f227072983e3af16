"""FLOPs from the traced graph, symbolic in B, against PyTorch's FlopCounterMode on a real
eager step."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxmem
from fxmem.validate.measure import batch_of
from zoo import OPTIMIZERS, ZOO


@pytest.mark.parametrize("name", ["mlp", "seed_cnn", "resnet", "transformer_train_mode", "unet"])
def test_pytorch_formulas_match_flop_counter_mode(name):
    model, x, y, loss = ZOO[name]()
    report = fxmem.analyze(model, x, y, loss=loss, device="cpu")  # forward + backward
    for b in (3, 7):
        xs, ys = [batch_of(t, b, "cpu") for t in x], [batch_of(t, b, "cpu") for t in y]
        with FlopCounterMode(display=False) as counter:
            loss(model(*xs), *ys).backward()
        model.zero_grad(set_to_none=True)
        assert report.flop_count.from_pytorch.subs(fxmem.B, b) == counter.get_total_flops()


def test_linear_flops_are_exact_and_symbolic():
    r = fxmem.analyze(torch.nn.Linear(8, 2, bias=False), torch.randn(4, 8), train=False,
                      device="cpu")
    assert r.flop_count.total == 2 * 8 * 2 * fxmem.B
    assert r.flop_count.uncounted == ()


def test_ops_without_a_formula_are_listed_not_zero():
    model, x, y, loss = ZOO["transformer_train_mode"]()
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu")
    listed = dict(r.flop_count.uncounted)
    assert listed["aten.native_layer_norm.default"] == 4  # 2 layers x 2 norms
    assert "aten.view.default" not in listed  # views do no arithmetic


def test_recompute_flops_of_a_plan():
    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    base = fxmem.analyze(model, x, y, **kw)
    plan = fxmem.analyze(model, x, y, **kw, checkpoint=["layer1.0"])
    assert base.recompute_flops == 0
    fwd = plan.flop_count.by_phase["forward"]
    assert fwd == base.flop_count.by_phase["forward"]
    # recomputation re-runs part of layer1.0's forward, never more than all of it
    assert 0 < plan.recompute_flops.subs(fxmem.B, 5) < fwd.subs(fxmem.B, 5)
    assert plan.flop_count.total == base.flop_count.total + plan.recompute_flops
    # a conv-only segment recomputes nothing: conv saves its input (made outside) before its
    # kernel runs, so non-reentrant checkpoint's early stop ends the recomputation there
    model, x, y, loss = ZOO["seed_cnn"]()
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=["conv1", "conv2"])
    assert r.recompute_flops == 0
