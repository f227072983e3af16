"""fxmem.Step: the training-loop options, validated once, taken by every entry point."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fxmem
from fxmem import Step
from fxmem.trace.engine.step import UNSET


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


X, Y = torch.randn(4, 8), torch.randint(0, 3, (4,))


@pytest.mark.parametrize("options, message", [
    (dict(loss=3), "loss must be callable"),
    (dict(optimizer="adam"), "optimizer must be an optimizer class"),
    (dict(device="tpu"), "device must be 'cpu' or 'cuda'"),
    (dict(train=False, optimizer=torch.optim.SGD), "no optimizer step"),
    (dict(set_to_none=1), "set_to_none must be True or False"),
    (dict(grad_accum=True), "grad_accum must be a positive int"),
    (dict(train=False, grad_accum=2), "nothing to accumulate"),
    (dict(inference_mode=True), "pass train=False too"),
    (dict(amp=torch.float32), "amp is torch.bfloat16 or torch.float16"),
    (dict(grad_scaler="yes"), "grad_scaler must be True, False or None"),
    (dict(grad_scaler=True), "needs a training step with an optimizer"),
    (dict(compute_capability=(2, 0)), r"compute_capability is \(major, minor\)"),
])
def test_each_option_is_checked_when_the_step_is_made(options, message):
    with pytest.raises(fxmem.InputError, match=message):
        Step(**options)


def test_a_report_analysed_again_takes_the_steps_options_and_the_traces():
    """``Report.reanalyze(**changes)`` (the ways out, compile budgets as plans) changes the
    step's options (``grad_accum``, ``compile``) as well as how it is traced (``parallel``,
    ``checkpoint``): both go through one :class:`fxmem.trace.engine.TraceRequest`."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    r = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
    again = r.reanalyze(grad_accum=2, checkpoint=["0"])
    assert (again.grad_accum, again.plan, r.grad_accum, r.plan) == (2, ("0",), 1, ())
    with pytest.raises(fxmem.InputError, match="unknown step option set_to_zero"):
        r.reanalyze(set_to_zero=True)


def test_a_step_is_frozen_and_normalised():
    s = Step(compute_capability=8.6, train=1)
    assert s.compute_capability == (8, 6) and s.train is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.device = "cpu"


def test_of_applies_the_options_given_and_only_those():
    base = Step(loss=F.cross_entropy, optimizer=torch.optim.Adam, amp=torch.float16)
    assert base.scaled  # the AMP recipe: float16 training with an optimizer
    s = Step.of(base, device="cpu", amp=UNSET, grad_accum=2)
    assert (s.loss, s.optimizer, s.amp, s.device, s.grad_accum) == (
        F.cross_entropy, torch.optim.Adam, torch.float16, "cpu", 2)
    assert not Step.of(base, amp=None).scaled  # the default is resolved, never stored
    assert Step.of(None, device="cpu") == Step(device="cpu")
    with pytest.raises(fxmem.InputError, match="unknown step option set_to_zero; a Step has"):
        Step.of(base, set_to_zero=True)
    with pytest.raises(fxmem.InputError, match="step must be a fxmem.Step"):
        Step.of({"device": "cpu"})


def test_analyze_takes_a_step_or_the_same_keywords():
    step = Step(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu",
                set_to_none=False, grad_accum=2)
    by_step = fxmem.analyze(_model(), X, Y, step=step)
    by_keywords = fxmem.analyze(_model(), X, Y, loss=F.cross_entropy,
                                optimizer=torch.optim.Adam, device="cpu", set_to_none=False,
                                grad_accum=2)
    assert by_step.peak == by_keywords.peak and by_step.grad_accum == 2
    # keywords given beside a step override it
    plain = fxmem.analyze(_model(), X, Y, step=step, set_to_none=True, grad_accum=1)
    assert plain.peak == fxmem.analyze(_model(), X, Y, loss=F.cross_entropy,
                                       optimizer=torch.optim.Adam, device="cpu").peak
    assert plain.peak != by_step.peak
    with pytest.raises(fxmem.InputError, match="unknown step option"):
        fxmem.analyze(_model(), X, Y, step=step, batchsize=4)


def test_measure_takes_the_same_step():
    step = Step(loss=F.cross_entropy, optimizer=torch.optim.SGD, device="cpu", grad_accum=2)
    r = fxmem.analyze(_model(), X, Y, step=step)
    for b in (3, 17):
        assert fxmem.measure(_model(), X, Y, step=step, B=b).peak_bytes == r.peak_bytes(b)
    # without a device anywhere, measure runs on this machine's CPU
    assert fxmem.measure(_model(), X, Y, loss=F.cross_entropy, B=3).peak_bytes == \
        fxmem.analyze(_model(), X, Y, loss=F.cross_entropy, device="cpu").peak_bytes(3)


ENTRY_POINTS = {
    "analyze": lambda m, **kw: fxmem.analyze(m, X, Y, **kw),
    "measure": lambda m, **kw: fxmem.measure(m, X, Y, B=2, **kw),
    "plan_checkpoints": lambda m, **kw: fxmem.plan_checkpoints(
        m, X, Y, budget_bytes=2**30, B=2, candidates=["0"], **kw),
    "whatif": lambda m, **kw: fxmem.whatif(m, X, Y, B=4, budget_bytes=2**30, **kw),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_takes_every_option_of_a_step(name):
    """A field added to Step reaches every entry point with no change to it: each is called
    with every field, by keyword (a valid training step on the CPU)."""
    values = {f.name: f.default for f in dataclasses.fields(Step)}
    values.update(loss=F.cross_entropy, optimizer=torch.optim.SGD, device="cpu")
    ENTRY_POINTS[name](_model(), **values)
    ENTRY_POINTS[name](_model(), step=Step(**values))


def test_plan_checkpoints_now_sees_the_whole_step():
    kw = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu",
              budget_bytes=2**30, B=64, candidates=["0"])
    kept = fxmem.plan_checkpoints(_model(), X, Y, set_to_none=False, **kw)
    dropped = fxmem.plan_checkpoints(_model(), X, Y, **kw)
    assert kept.peak_bytes > dropped.peak_bytes  # gradients kept between steps


def test_analyze_leaves_attributes_a_forward_sets_as_they_were():
    """A forward that keeps tensors on its module (torchvision's RAFT caches its correlation
    pyramid) would leave fake tensors with autograd history on the user's model."""
    import copy

    class Caching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)
            self.cache = None

        def forward(self, x):
            self.cache = [self.lin(x)]
            self.extra = self.cache[0] * 2
            return self.extra

    m = Caching()
    fxmem.analyze(m, X, Y, loss=F.cross_entropy, device="cpu")
    assert m.cache is None and not hasattr(m, "extra")
    copy.deepcopy(m)  # no fake, non-leaf tensor left behind
    assert fxmem.measure(m, X, Y, loss=F.cross_entropy, B=3).peak_bytes > 0
