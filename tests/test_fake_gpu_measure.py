"""fxmem itself on the fake GPU (issue 42): ``fxmem.measure(..., fake_gpu=PYTHON)`` and ``fxmem
validate --device cuda --fake-gpu PYTHON`` run in a CUDA build's Python with the stub driver.

The measured figures are checked three ways: against the fake GPU's own step loop
(``fxmem.validate.fakegpu._child``, which shares no code with fxmem), against fxmem's
prediction, and allocation by allocation (``record_history``). Here the Python is this one
(CI's CUDA-build environments); the refusals need no CUDA build."""

import json
import os
import sys

import pytest
import torch
from click.testing import CliRunner

import fakegpu_targets
import fxmem
from fakegpu_marks import FAKE_GPU
from fxmem.cli import cli
from fxmem.validate.divergence import first_divergence, predicted_allocations

HERE = os.path.dirname(os.path.abspath(__file__))


def _needs_fake_gpu(fn):
    for m in FAKE_GPU:
        fn = m(fn)
    return fn


@_needs_fake_gpu
def test_measure_on_the_fake_gpu_agrees_with_its_own_loop_and_the_prediction():
    from fxmem.validate.fakegpu import measure_step

    model, x, y, loss, opt = fakegpu_targets.mlp(B=8)
    m = fxmem.measure(model, x, y, loss=loss, optimizer=opt, B=64, device="cuda",
                      fake_gpu=sys.executable)
    loop = measure_step(sys.executable, "fakegpu_targets:mlp", kwargs={"B": 64},
                        sys_path=[HERE])
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=opt, device="cuda")
    want = report.cuda_memory(64)
    assert m.torch_version == torch.__version__ and m.device == "cuda" and m.B == 64
    assert (m.peak_bytes, m.peak_reserved_bytes) == (loop.max_allocated, loop.max_reserved)
    assert (m.peak_bytes, m.peak_reserved_bytes) == (want.max_allocated, want.max_reserved)
    assert m.baseline_bytes == want.baseline_allocated
    phases = dict(m.phase_peak_bytes)  # zero_grad(set_to_none=True) allocates nothing
    assert phases.pop("zero_grad") == m.baseline_bytes
    assert phases == want.phase_max_allocated


@_needs_fake_gpu
def test_the_measured_allocations_are_the_predicted_ones_in_order():
    model, x, y, loss, opt = fakegpu_targets.mlp(B=8)
    m = fxmem.measure(model, x, y, loss=loss, optimizer=opt, B=64, device="cuda",
                      fake_gpu=sys.executable, record_history=True)
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=opt, device="cuda")
    assert first_divergence(predicted_allocations(report, 64), m.allocations) is None


def test_a_step_that_cannot_be_sent_is_refused_in_one_line():
    model, x, y, loss, opt = fakegpu_targets.mlp(B=8)
    with pytest.raises(fxmem.InputError, match=r"cannot be pickled .*<lambda>.*top level"):
        fxmem.measure(model, x, y, loss=lambda o, t: o.sum(), optimizer=opt, B=4,
                      device="cuda", fake_gpu=sys.executable)
    with pytest.raises(fxmem.InputError, match="fake_gpu measures a CUDA step"):
        fxmem.measure(model, x, y, loss=loss, optimizer=opt, B=4, fake_gpu=sys.executable)


@_needs_fake_gpu
def test_validate_runs_the_zoo_on_the_fake_gpu(tmp_path):
    out = tmp_path / "v.json"
    r = CliRunner().invoke(cli, ["validate", "--device", "cuda", "--fake-gpu", sys.executable,
                                 "--scale", "small", "--only", "MLP, Adam",
                                 "--out-json", str(out)])
    assert r.exit_code == 0, r.output
    v = json.loads(out.read_text())
    assert v["fake_gpu"] and "fake GPU" in v["device_name"] and v["torch_version"] == \
        torch.__version__
    assert [(row["B"], row["exact"]) for row in v["rows"]] == [(2, True), (13, True)]


def test_validate_on_the_fake_gpu_needs_cuda():
    r = CliRunner().invoke(cli, ["validate", "--device", "cpu", "--fake-gpu", sys.executable])
    assert r.exit_code == 2 and "--fake-gpu runs the CUDA harness" in r.output


# --- the validation zoo (fxmem.validate.zoo, scale "small") on the fake GPU, in one child ---

_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
# case -> (releases where it differs, the cause seen): strict, so a fix fails the run until
# the marker goes
_DIFFERS: dict = {}


def _zoo_names():
    from fxmem.validate.zoo import cases

    return [c.name for c in cases("small")]


@pytest.fixture(scope="module")
def fake_zoo(tmp_path_factory):
    """The whole small zoo and its budget checks, run once by ``fxmem validate --fake-gpu``."""
    out = tmp_path_factory.mktemp("zoo") / "v.json"
    r = CliRunner().invoke(cli, ["validate", "--device", "cuda", "--fake-gpu", sys.executable,
                                 "--scale", "small", "--out-json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def _case_param(name):
    releases, cause = _DIFFERS.get(name, (set(), ""))
    marks = [pytest.mark.xfail(strict=True, reason=cause)] if _TORCH in releases else []
    return pytest.param(name, marks=marks, id=name)


@_needs_fake_gpu
@pytest.mark.parametrize("case", [_case_param(n) for n in _zoo_names()])
def test_the_validation_zoo_is_exact_on_the_fake_gpu(fake_zoo, case):
    rows = [r for r in fake_zoo["rows"] if r["case"] == case]
    assert len(rows) == 2  # two batch sizes each
    assert [(r["B"], r["predicted_allocated"], r["predicted_reserved"]) for r in rows] == \
        [(r["B"], r["measured_allocated"], r["measured_reserved"]) for r in rows]


@_needs_fake_gpu
def test_the_predicted_largest_batch_fits_on_the_fake_gpu_and_one_more_does_not(fake_zoo):
    checks = fake_zoo["budget_checks"]
    assert len(checks) == 3 and all(c["fits"] for c in checks), checks
