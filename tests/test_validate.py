"""The validation harness (fxmem.validate): on CPU here (the same protocol, live bytes), on a
GPU when one is present (marked cuda: skipped without one)."""

import json

import pytest
import torch

from fxmem.validate import harness as V
from fxmem.validate.zoo import cases


def test_zoo_has_at_least_twelve_setups():
    names = [c.name for c in cases("full")]
    assert len(names) >= 12 and len(set(names)) == len(names)
    assert [c.name for c in cases("small")] == names


def test_cpu_harness_rows_tables_and_budget_check():
    v = V.validate("cpu", only=["seed CNN, fp32, Adam", "GPT-2 small, seq 512, AdamW"],
                   budget_cases=("seed CNN, fp32, Adam",))
    assert v.device == "cpu" and v.scale == "small" and len(v.rows) == 4
    for r in v.rows:
        assert r.predicted_allocated == r.measured_allocated and r.meets_goal
    (check,) = v.budget_checks
    assert check.fits and check.measured_at_B <= check.budget_bytes < check.measured_at_B_plus_1
    md = V.to_markdown(v)
    assert md.count("| seed CNN, fp32, Adam |") == 3 and "fits, and B+1 does not" in md
    doc = json.loads(V.to_json(v))
    assert doc["rows"][0]["meets_goal"] and doc["budget_checks"][0]["fits"]


def test_goal_arithmetic():
    row = V.Row("m", 1, 102, 100, 0.02, 105, 100, 0.05)
    assert row.meets_goal
    assert not V.Row("m", 1, 98, 100, -0.02, None, None, None).meets_goal  # under by > 1 %
    assert not V.Row("m", 1, 100, 100, 0.0, 106, 100, 0.06).meets_goal


def test_cli_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from fxmem.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--device", "cuda"])
    assert exit_.value.code == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_harness_on_two_models():
    v = V.validate("cuda", only=["seed CNN, fp32, Adam", "MLP, Adam"], budget_cases=())
    assert all(r.measured_reserved is not None for r in v.rows)
