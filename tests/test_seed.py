"""The seed article's CNN (docs/seed-example.md): exact parts and the peak vs measure."""

import os
import subprocess
import sys

import pytest
import sympy
import torch
from torch import nn

import fxmem

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from seed_convnet import SimpleConvNet, seed_step  # noqa: E402

B = fxmem.B


@pytest.fixture(scope="module")
def report():
    model, x, y = seed_step()
    return fxmem.analyze(model, x, y, loss=nn.functional.cross_entropy,
                         optimizer=torch.optim.Adam, device="cpu")


def test_parts_exact(report):
    n_params = 3 * 3 * 3 * 64 + 64 + 64 * 3 * 3 * 128 + 128 + 128 * 28 * 28 * 10 + 10
    assert n_params == 1_079_178
    p = report.parts
    assert p["params"] == 4 * n_params == 4_316_712
    assert p["grads"] == 4 * n_params
    # Adam: exp_avg and exp_avg_sq per parameter, plus a 4-byte float32 step per tensor (6)
    assert p["optimizer_state"] == 2 * 4 * n_params + 6 * 4
    assert p["inputs"] == 4 * 3 * 32 * 32 * B + 8 * B  # the images and int64 labels
    # saved for backward: relu1 and relu2 outputs (conv2 and fc read them), log_softmax's
    # output and nll_loss's total_weight (a float32 scalar)
    relu1, relu2 = 64 * 30 * 30 * 4, 128 * 28 * 28 * 4
    assert sympy_eq(p["activations"], (relu1 + relu2 + 10 * 4) * B + 4)
    assert p["buffers"] == 0


def sympy_eq(a, b):
    import sympy

    return sympy.simplify(a - b) == 0


def test_peak_matches_measure_and_moves_with_B(report):
    torch.manual_seed(0)
    model = SimpleConvNet()
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    for b in (2, 9, 64):
        measured = fxmem.measure(model, x, y, loss=nn.functional.cross_entropy,
                                 optimizer=torch.optim.Adam, B=b)
        assert report.peak_bytes(b) == measured.peak_bytes
    assert report.breakdown(2).phase == "optimizer"
    assert report.breakdown(64).phase == "backward"
    assert report.breakdown(64).op == "aten.threshold_backward.default"
    assert [r.phase for r in report.regimes] == ["optimizer", "backward"]


def test_regimes_start_at_integer_batch_sizes(report):
    first, second = report.regimes
    assert first.B_from == report.min_batch_size == 2
    # the switch is where the two live-byte lines cross, the first integer after it
    assert sympy.simplify(first.expr.subs(fxmem.B, second.crossing)
                          - second.expr.subs(fxmem.B, second.crossing)) == 0
    assert second.B_from == sympy.ceiling(second.crossing)
    for b in range(2, 12):
        regime = first if b < second.B_from else second
        assert report.breakdown(b).op_index == regime.op_index


def test_breakdown_adds_up(report):
    bd = report.breakdown(64)
    assert sum(bd.by_category.values()) == bd.peak_bytes == report.peak_bytes(64)
    assert sum(bd.by_module.values()) == bd.peak_bytes
    assert bd.by_category["param"] == 4_316_712


def test_example_script_runs():
    out = subprocess.run([sys.executable, "examples/seed_convnet.py"], capture_output=True,
                         text=True, check=True,
                         cwd=os.path.join(os.path.dirname(__file__), "..")).stdout
    assert "peak(B) = Max(" in out and "largest B for a 16 GiB budget" in out
    assert "4,316,712" in out
