"""Activation-checkpoint plans: the traced prediction against a real eager step with the
plan applied by PyTorch's own checkpoint_wrapper (fxmem.apply_checkpoints)."""

import copy

import pytest
import torch

import fxmem
from fxmem.trace.plans.checkpointing import normalize_plan
from zoo import OPTIMIZERS, ZOO

PLANS = [  # (model, plan): none, first and last block, all blocks, nested modules, reuse
    ("mlp", []),
    ("mlp", ["layers.0"]),
    ("mlp", ["layers.0", "layers.1", "head"]),
    ("seed_cnn", ["conv1", "conv2"]),
    ("resnet", ["layer1.0"]),
    ("resnet", ["layer1.1"]),
    ("resnet", ["stem", "layer1.0", "layer1.1"]),
    ("resnet", ["layer1.0.conv1", "layer1.1.bn2"]),
    ("transformer_train_mode", ["enc.layers.0", "enc.layers.1"]),
    ("transformer_train_mode", ["enc.layers.1.linear1"]),
    ("tied_reuse", ["block"]),
    ("unet", ["down1", "down2", "dec"]),
    ("keeps_locals", ["a"]),
]

# plans whose blocks save tensors they make themselves, so their forward really re-runs
RERUN = {("resnet", ("layer1.0",)), ("resnet", ("layer1.1",)),
         ("resnet", ("stem", "layer1.0", "layer1.1")), ("unet", ("down1", "down2", "dec")),
         ("transformer_train_mode", ("enc.layers.0", "enc.layers.1"))}


@pytest.mark.parametrize("name,plan", PLANS, ids=[f"{n}-{'+'.join(p) or 'none'}" for n, p in PLANS])
def test_plan_matches_measure_with_the_wrapper_applied(name, plan):
    model, x, y, loss = ZOO[name]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"])
    report = fxmem.analyze(model, x, y, **kw, device="cpu", checkpoint=plan)
    assert report.trace.plan == tuple(sorted(plan))
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    for b in (2, 13):
        assert report.peak_bytes(b) == fxmem.measure(wrapped, x, y, **kw, B=b).peak_bytes
    recomputed = {o.module for o in report.trace.ops if o.recompute}
    assert all(any(m == p or m.startswith(p + ".") for p in plan) for m in recomputed)
    if (name, tuple(plan)) in RERUN:
        assert recomputed and report.recompute_flops.subs(fxmem.B, 2) > 0


def test_checkpointing_lowers_the_peak_of_a_deep_net():
    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["sgd_momentum"], device="cpu")
    base = fxmem.analyze(model, x, y, **kw)
    ckpt = fxmem.analyze(model, x, y, **kw, checkpoint=["layer1.0", "layer1.1"])
    assert ckpt.peak_bytes(64) < base.peak_bytes(64)


def test_a_model_wrapped_by_the_user_is_analysed_with_its_plan():
    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    planned = fxmem.analyze(model, x, y, **kw, checkpoint=["layer1.1"])
    wrapped = fxmem.analyze(fxmem.apply_checkpoints(copy.deepcopy(model), ["layer1.1"]), x, y, **kw)
    assert wrapped.trace.plan == ("layer1.1",)
    assert wrapped.peak == planned.peak
    names = {s.name for s in wrapped.trace.storages if s.category == "param"}
    assert "layer1.1.conv1.weight" in names  # the user's names, not the wrapper's


def test_gradients_are_bitwise_identical_with_dropout():
    model, x, y, loss = ZOO["transformer_train_mode"]()  # dropout in train mode
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), ["enc.layers.0", "enc.layers.1"])
    assert type(wrapped.enc.layers[0]).__name__ == "CheckpointWrapper"
    grads = []
    for m in (model, wrapped):
        torch.manual_seed(123)
        loss(m(*x), *y).backward()
        grads.append([p.grad for p in m.parameters()])
    assert len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_trace_leaves_no_patched_forward():
    model, x, y, loss = ZOO["mlp"]()
    fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=["layers.0"])
    assert "forward" not in vars(model.layers[0])


@pytest.mark.parametrize("plan,text", [
    ("layers.0", "collection of module paths"),
    (["layers.7"], "no submodule 'layers.7'"),
    (["layers", "layers.0"], "nested checkpoints"),
    ([""], "non-empty module paths"),
])
def test_bad_plans_are_rejected_before_tracing(plan, text):
    model, *_ = ZOO["mlp"]()
    with pytest.raises(fxmem.InputError, match=text):
        normalize_plan(model, plan)
    model, x, y, loss = ZOO["mlp"]()
    with pytest.raises(fxmem.InputError, match=text):
        fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=plan)
