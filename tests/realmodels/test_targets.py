"""timm: and torchvision: CLI targets (fxmem.cli.families), where those libraries import."""

import pytest
import torch

import fxmem
from fxmem.cli.targets import load_target, parse_tensor

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")


def _analyze(t):
    x = tuple(parse_tensor(s, 4) for s in t.inputs)
    y = tuple(parse_tensor(s, 4) for s in t.targets)
    return fxmem.analyze(t.model, x, y, loss=torch.nn.functional.cross_entropy, device="cpu")


def test_timm_model_with_its_input_size_and_classes():
    t = load_target("timm:resnet18", {"num_classes": 10})
    assert t.inputs == ("B,3,224,224",) and t.targets == ("B:int64:10",)
    assert t.model.fc.out_features == 10 and next(t.model.parameters()).is_meta
    assert _analyze(t).peak_bytes(2) > 0


def test_torchvision_classifier_with_its_crop_size():
    assert load_target("torchvision:inception_v3").inputs == ("B,3,299,299",)
    t = load_target("torchvision:resnet18", {"num_classes": 7})
    assert t.targets == ("B:int64:7",) and _analyze(t).peak_bytes(2) > 0


@pytest.mark.parametrize("target, config, message", [
    ("timm:resnt18", {}, "timm has no model resnt18; did you mean resnet18?"),
    ("timm:resnet18", {"num_class": 10}, "did you mean num_classes?"),
    ("torchvision:resnet19", {}, "no such classifier; did you mean resnet18?"),
    ("torchvision:resnet18", {"num_class": 10}, "did you mean num_classes?"),
    ("torchvision:fasterrcnn_resnet50_fpn", {}, "build it in a file target"),
])
def test_unknown_models_and_keys_name_the_closest(target, config, message):
    with pytest.raises(fxmem.InputError, match=message):
        load_target(target, config)
