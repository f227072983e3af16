"""Automatic mixed precision: the step under torch.autocast (CPU rules), against a real eager
CPU step under the same autocast. CUDA's rules and the GradScaler: test_amp_rules.py."""

import pytest
import torch

import fxmem
from zoo import ZOO

# resnet: batch norm on bf16 inputs keeps its saved statistics in float32 (a rule)
MODELS = ["mlp", "resnet", "transformer_train_mode", "seed_cnn", "unet", "tied_reuse",
          "keeps_locals"]


def _check(name, amp, train=True, batches=(2, 13)):
    model, x, y, loss = ZOO[name]()
    kw = dict(loss=loss, optimizer=lambda p: torch.optim.Adam(p, foreach=False)) if train \
        else dict(train=False)
    yy = y if train else ()
    r = fxmem.analyze(model, x, yy, **kw, device="cpu", amp=amp)
    for b in batches:
        assert r.peak_bytes(b) == fxmem.measure(model, x, yy, **kw, B=b, amp=amp).peak_bytes, b
    return r


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("name", MODELS)
def test_autocast_cpu(name, train, amp):
    _check(name, amp, train)


def test_autocast_lowers_the_activation_slope():
    r32 = fxmem.analyze(*ZOO["seed_cnn"]()[:3], loss=ZOO["seed_cnn"]()[3], device="cpu")
    r16 = _check("seed_cnn", torch.bfloat16)
    assert r16.peak_bytes(256) < r32.peak_bytes(256)
    assert r16.parts["params"] == r32.parts["params"]  # weights stay fp32 under autocast


def test_amp_arguments_are_checked():
    model, x, y, loss = ZOO["mlp"]()
    with pytest.raises(fxmem.InputError, match="bfloat16 or torch.float16"):
        fxmem.analyze(model, x, y, loss=loss, device="cpu", amp=torch.float64)


def test_checkpoint_plan_under_autocast():
    import copy

    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=lambda p: torch.optim.Adam(p, foreach=False))
    plan = ["layer1.0", "layer1.1"]  # derived: the re-run repeats the weight casts too
    r = fxmem.analyze(model, x, y, **kw, device="cpu", amp=torch.bfloat16, checkpoint=plan)
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    for b in (2, 13):
        assert r.peak_bytes(b) == fxmem.measure(wrapped, x, y, **kw, B=b,
                                                amp=torch.bfloat16).peak_bytes
