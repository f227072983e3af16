"""The fake GPU's model zoo (issue 42 item 2): GPT-2, Llama, Mistral, BERT and ViT built from
their Hugging Face config classes (2 layers, hidden 128, random weights, nothing downloaded)
in fp32, bf16 autocast and fp16 autocast with a GradScaler, SDPA and eager attention,
dropout (GPT-2, BERT and ViT keep their 0.1), checkpoint plans (whole blocks, a group,
selective), gradient accumulation, ``set_to_none=False`` and several optimizers
(tests/fakegpu_zoo_targets.py ``CASES``), each at two batch sizes: fxmem's predicted
``max_allocated`` and ``max_reserved`` equal the ones PyTorch's own CUDA build reports on the
fake GPU (``fxmem.measure`` in one child for every case), or the case is a strict xfail
naming its cause and the figures seen.

GradScaler cases: kernels do not run, so the scale and ``found_inf`` are what the memory
held; the child records what GradScaler read and how many optimizer steps ran, and the test
checks that the measured step (and its warm-up) took the optimizer step: what was read is in
the assertion. Runs where the installed torch is a CUDA build (CI's 2.14.1 and 2.15).

Llama with its key/value cache on (``zoo.CACHE_CASES``): a checkpointed layer runs without
it, so ``analyze(..., checkpoint=)`` traces the plan; the plan derived from the step
without it (``Report.with_plan``, :mod:`fxmem.checkpoint.uncached`) is checked here too,
phase by phase and allocation by allocation (the cache is freed with the step's output,
before the backward's peak: only the forward shows a cache kept by mistake)."""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fakegpu_zoo_targets as zoo
import fxmem
from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

# case -> (releases where it differs, the cause and the figures seen): strict, so a fix
# fails the run until the marker goes
DIFFERS = {
}
# case -> the exception fxmem's prediction raises, and why (strict xfails too)
RAISES: dict = {}


def _measure_all():
    from fxmem.validate.fakegpu import call

    # the first case again at the end: what earlier cases leave must not change a case
    names = [*zoo.CASES, next(iter(zoo.CASES))]
    return call(sys.executable, "fakegpu_zoo_targets:run",
                kwargs={"cases": names, "record_history": list(zoo.CACHE_CASES)},
                sys_path=[HERE])


_pool = ThreadPoolExecutor(1)
_pending = {}


@pytest.fixture(scope="module")
def measured():
    """Every case at every B, measured in one child (started at the first test, so that it
    runs beside the predictions of this process): a future of its rows."""
    if "all" not in _pending:
        _pending["all"] = _pool.submit(_measure_all)
    return _pending["all"]


def _predict(name):
    model, inputs, targets, step, plan = zoo.build(name)
    report = fxmem.analyze(model, inputs, targets, step=step, checkpoint=plan)
    return {b: report.cuda_memory(b) for b in zoo.BATCHES}


def _param(name):
    releases, cause = DIFFERS.get(name, (set(), ""))
    marks = [pytest.mark.xfail(strict=True, reason=cause)] if _TORCH in releases else []
    if name in RAISES:
        marks.append(pytest.mark.xfail(strict=True, raises=RAISES[name][0],
                                       reason=RAISES[name][1]))
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(scope="module", autouse=True)
def _start_child():
    if "all" not in _pending:
        _pending["all"] = _pool.submit(_measure_all)
    yield


@pytest.mark.parametrize("name", [_param(n) for n in zoo.CASES])
def test_the_zoo_case_is_exact_on_the_fake_gpu(measured, name):
    want = _predict(name)
    rows = [r for r in measured.result() if r["case"] == name][:len(zoo.BATCHES)]
    assert rows and "error" not in rows[0], rows
    assert [r["B"] for r in rows] == list(zoo.BATCHES)
    step = zoo.build(name)[3]
    for r in rows:  # the optimizer stepped in the warm-up and in the measured step
        assert r["optimizer_steps"] == 2, r
        if step.scaled:  # its inf check ran at both (what it read: in the message)
            assert len(r["found_inf"]) == 2, r
    assert [(r["B"], r["max_allocated"], r["max_reserved"]) for r in rows] == \
        [(b, want[b].max_allocated, want[b].max_reserved) for b in zoo.BATCHES]


def test_a_case_measures_the_same_after_every_other(measured):
    """The child measures the cases one after another (one start-up for all): the first case,
    measured again after all the others, gives the same figures (fxmem.measure lets earlier
    cuBLAS workspaces go, fakegpu_zoo_targets.fresh empties the cache)."""
    first = next(iter(zoo.CASES))
    rows = [r for r in measured.result() if r["case"] == first]
    keys = ("B", "max_allocated", "max_reserved", "baseline_allocated", "baseline_reserved")
    assert len(rows) == 2 * len(zoo.BATCHES)
    assert [[r[k] for k in keys] for r in rows[:2]] == [[r[k] for k in keys] for r in rows[2:]]


@pytest.mark.parametrize("name", zoo.CACHE_CASES)
def test_a_plan_over_layers_with_a_cache_derived_is_exact_on_the_fake_gpu(measured, name):
    # the plan derived from the step with the cache (its layers' keys and values concatenated
    # into it, held until the output goes) == the step apply_checkpoints makes, where the
    # checkpointed layers write no cache. Without fxmem.checkpoint.uncached the derived
    # forward kept the cache's concatenations (torch 2.15, whole layers: its phase 131,072
    # bytes above at B=2, 327,680 at B=5; the allocations differ from the first cat on)
    from fxmem.validate.divergence import first_divergence, predicted_allocations

    model, inputs, targets, step, plan = zoo.build(name)
    assert model.model.config.use_cache
    report = fxmem.analyze(model, inputs, targets, step=step)
    assert set(zoo.LLAMA_LAYERS) <= set(report.trace.cache_layers)
    derived = report.with_plan(plan)
    rows = [r for r in measured.result() if r["case"] == name]
    assert rows and "error" not in rows[0], rows
    assert [r["B"] for r in rows] == list(zoo.BATCHES)
    for r in rows:
        want = derived.cuda_memory(r["B"])
        allocated, reserved = dict(r["phase_allocated"]), dict(r["phase_reserved"])
        del allocated["zero_grad"], reserved["zero_grad"]
        assert (r["max_allocated"], r["max_reserved"], allocated, reserved) == \
            (want.max_allocated, want.max_reserved, want.phase_max_allocated,
             want.phase_max_reserved), r["B"]
        assert first_divergence(predicted_allocations(derived, r["B"]),
                                r["allocations"]) is None, r["B"]
