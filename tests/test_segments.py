"""Checkpoint candidates: which modules are valid segments, and what checkpointing each one
releases — checked against a trace with the checkpoint really applied."""

import pytest

import fxmem
from zoo import ZOO


def _end_of_forward(report, b):
    return [p.live_bytes for p in report.timeline(b) if p.phase == "forward"][-1]


def test_stack_blocks_are_valid_and_reused_modules_are_not():
    model, x, y, loss = ZOO["resnet"]()
    segs = {s.path: s for s in fxmem.analyze(model, x, y, loss=loss, device="cpu").segments}
    assert segs["layer1.0"].valid and segs["layer1.1"].valid and segs["stem"].valid
    assert not segs["layer1.0.relu"].valid
    assert segs["layer1.0.relu"].reason == "runs 2 times in one step"
    assert len(segs["layer1.0"].inputs) == len(segs["layer1.0"].outputs) == 1
    assert segs["layer1.1"].released_bytes.free_symbols == {fxmem.B}
    model, x, y, loss = ZOO["tied_reuse"]()
    segs = {s.path: s for s in fxmem.analyze(model, x, y, loss=loss, device="cpu").segments}
    assert segs["block"].reason == "runs 3 times in one step"


def test_a_module_with_two_outputs_is_not_a_segment():
    import torch

    class Split(torch.nn.Module):
        def forward(self, x):
            return x * 2, x + 1

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.split, self.b = torch.nn.Linear(4, 4), Split(), torch.nn.Linear(4, 1)

        def forward(self, x):
            p, q = self.split(self.a(x))
            return self.b(p * q)

    r = fxmem.analyze(Net(), torch.randn(3, 4), loss=lambda o: o.sum(), device="cpu")
    segs = {s.path: s for s in r.segments}
    assert segs["split"].reason == "2 activation tensors leave it"
    assert segs["a"].valid and segs["b"].valid


@pytest.mark.parametrize("name,path", [("resnet", "layer1.0"), ("resnet", "layer1.1"),
                                       ("transformer_train_mode", "enc.layers.0"),
                                       ("transformer_train_mode", "enc.layers.1"),
                                       ("mlp", "layers.1"), ("unet", "down2")])
def test_released_bytes_is_what_a_checkpoint_frees_by_the_end_of_forward(name, path):
    model, x, y, loss = ZOO[name]()
    base = fxmem.analyze(model, x, y, loss=loss, device="cpu")
    seg = next(s for s in base.segments if s.path == path)
    ckpt = fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=[path])
    for b in (2, 9):
        released = _end_of_forward(base, b) - _end_of_forward(ckpt, b)
        assert released == int(seg.released_bytes.subs(fxmem.B, b)), (path, b)
