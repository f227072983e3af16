"""A step that makes B a Python int (``len(x)``, ``int(x.shape[0])``): the ShapeEnv fixes B,
so the tracer traces the step at several concrete batch sizes and fits every size as a
polynomial in B (:mod:`fxmem.trace.engine.lift`). The fitted formula must equal a real eager CPU
step (``fxmem.measure``) at batch sizes never traced, and the formula of the same step
written with ``x.shape[0]`` (traced symbolically) on CPU and CUDA; a step that is not one
polynomial step is refused, saying why."""

import inspect
import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import fxmem
from fxmem.report.jsonout import render_json
from fxmem.report.markdown import render_markdown
from fxmem.report.summary import summarize
from fxmem.trace import trace
from fxmem.trace.engine.lift import CHECK, FIT

ADAM = {"loss": lambda o: o.float().sum(), "optimizer": torch.optim.Adam}
UNTRACED = (7, 11)  # in none of FIT and CHECK


class Contrastive(nn.Module):
    """CLIP's contrastive loss in a few lines: labels from ``torch.arange(len(x))`` and a
    B x B similarity matrix; ``symbolic=True`` writes the same step with ``x.shape[0]``."""

    def __init__(self, symbolic=False):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(8, 16)
        self.symbolic = symbolic

    def forward(self, x):
        n = x.shape[0] if self.symbolic else len(x)
        u, v = self.a(x), self.b(x)
        logits = u @ v.T
        labels = torch.arange(n)
        return nn.functional.cross_entropy(logits, labels) + logits.mean()


class Eye(nn.Module):
    """A B x B matrix from ``torch.eye(int(x.shape[0]))``, and a buffer sliced by B before
    that (a condition on B the symbolic trace meets first: B <= 64)."""

    def __init__(self, symbolic=False):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("pos", torch.randn(64, 8))
        self.symbolic = symbolic

    def forward(self, x):
        h = self.lin(x) + self.pos[:x.shape[0]]
        n = x.shape[0] if self.symbolic else int(x.shape[0])
        return torch.eye(n) @ torch.relu(h)


def test_len_of_the_batch_is_fitted_and_exact():
    """``torch.arange(len(x))`` and a B x B matrix: the formula (quadratic in B) equals the
    real step at batch sizes none of the traces used."""
    x = torch.randn(4, 8)
    r = fxmem.analyze(Contrastive(), x, **ADAM, device="cpu")
    assert r.peak.has(fxmem.B ** 2)
    for b in UNTRACED:
        assert r.peak_bytes(b) == fxmem.measure(Contrastive(), x, **ADAM, B=b).peak_bytes, b
    lifted = r.trace.lifted
    assert lifted.fitted == FIT and lifted.checked == CHECK  # the example's 4 is in FIT
    # where len(x) is: it makes no op, so the op that notices (aten.t) is a later one
    lines, first = inspect.getsourcelines(Contrastive.forward)
    at = first + next(i for i, line in enumerate(lines) if "len(x)" in line)
    assert lifted.source.startswith(f"{__file__}:{at} in forward")
    assert "test_lift.py" in r.lifted and "fitted" in r.lifted


@pytest.mark.parametrize("model", [Contrastive, Eye])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fitted_formula_is_the_symbolic_one(model, device):
    """The same step written with ``x.shape[0]`` traces symbolically: both formulas give the
    same bytes (and, on CUDA, the same caching-allocator replay) at every batch size tried,
    far beyond the traced ones."""
    x = torch.randn(4, 8)
    fitted = fxmem.analyze(model(), x, **ADAM, device=device)
    derived = fxmem.analyze(model(symbolic=True), x, **ADAM, device=device)
    assert fitted.lifted and not derived.lifted
    for b in (2, *UNTRACED, 64):
        assert fitted.peak_bytes(b) == derived.peak_bytes(b), b
        assert all(int(fitted.parts[p].subs(fxmem.B, b)) == int(derived.parts[p].subs(fxmem.B, b))
                   for p in fitted.parts), b
        if device == "cuda":
            assert fitted.cuda_memory(b) == derived.cuda_memory(b), b
    if model is Contrastive:  # (Eye's symbolic trace knows B <= 64, see below)
        assert fitted.max_batch_size(2**20, by="live") == derived.max_batch_size(2**20, by="live")


def test_cpu_eye_is_exact_and_keeps_the_conditions_met_before_b_was_fixed():
    x = torch.randn(4, 8)
    r = fxmem.analyze(Eye(), x, **ADAM, device="cpu")
    for b in UNTRACED:
        assert r.peak_bytes(b) == fxmem.measure(Eye(), x, **ADAM, B=b).peak_bytes, b
    assert (fxmem.B <= 64) in r.valid_when and (fxmem.B >= 2) in r.valid_when


class Loop(nn.Module):
    """A Python loop over the batch: the ops depend on B, so no one trace holds."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.stack([self.lin(x[i]) for i in range(len(x))])


class Exponential(nn.Module):
    """A size no polynomial in B gives: 2**B elements."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).sum() * torch.ones(2 ** len(x))


@pytest.mark.parametrize("model, why", [
    (Loop(), r"the step runs \d+ ops at B=2 and \d+ at B=3 \(a Python loop"),
    (Exponential(), r"storage \d+ .* is 16, 32, 64, 128, 256, .*: no polynomial in B of degree <= 3"),
])
def test_a_step_that_is_no_polynomial_step_is_refused(model, why):
    """The original error (where B was fixed), then why the traces did not give a formula,
    on one line."""
    with pytest.raises(fxmem.SpecializationError) as e:
        fxmem.analyze(model, torch.randn(4, 8), **ADAM, device="cpu")
    msg = str(e.value)
    assert "specialized to 4" in msg and re.search(why, msg) and "\n" not in msg
    assert e.value.source and e.value.source.startswith(__file__)


def test_named_dims_with_a_fixed_batch():
    """B fixed, L a symbol: the sizes are fitted in B with coefficients in L."""

    class PerPosition(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            return self.lin(x) * torch.arange(len(x))[:, None, None]

    m, x = PerPosition(), torch.randn(4, 10, 16)
    r = fxmem.analyze(m, x, **ADAM, device="cpu", dims={"L": [(0, 1)]})
    assert r.lifted and (fxmem.L >= 2) in r.valid_when
    for b, n in ((7, 5), (11, 13)):
        assert r.peak_bytes(b, L=n) == fxmem.measure(m, torch.randn(4, n, 16), **ADAM,
                                                     B=b).peak_bytes, (b, n)


def test_the_note_is_in_every_rendering():
    r = fxmem.analyze(Contrastive(), torch.randn(4, 8), **ADAM, device="cpu")
    s = summarize(r, B=8)
    assert r.lifted in str(r)
    assert r.lifted[1:] in render_markdown(s)
    assert json.loads(render_json(s))["lifted"] == r.lifted
    assert "\n" not in r.lifted


def test_a_symbolic_trace_is_not_lifted():
    """The normal trace stays the one path when B is never fixed."""
    t = trace(Contrastive(symbolic=True), torch.randn(4, 8), **ADAM, device="cpu")
    assert t.lifted is None


class Numpy(nn.Module):
    """The batch size through numpy and a Python list: ``np.arange`` of a symbolic size makes
    an array of objects (``torch.from_numpy`` refuses it), ``[1.0] * x.size(0)`` fixes B."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        order = torch.from_numpy(np.arange(x.shape[0])[::-1].copy())
        weight = torch.tensor([1.0] * x.size(0))
        return self.lin(x)[order] * weight[:, None]


def test_numpy_and_lists_of_the_batch_size_are_fitted():
    x = torch.randn(4, 8)
    r = fxmem.analyze(Numpy(), x, **ADAM, device="cpu")
    assert "fails with B a symbol" in r.lifted
    for b in UNTRACED:
        assert r.peak_bytes(b) == fxmem.measure(Numpy(), x, **ADAM, B=b).peak_bytes, b


def test_model_code_failing_for_every_batch_size_keeps_its_error():
    """Not for B's sake: the error is the symbolic trace's own."""

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            raise ValueError("no such layer")

    with pytest.raises(fxmem.TraceError) as e:
        fxmem.analyze(Broken(), torch.randn(4, 8), **ADAM, device="cpu")
    assert str(e.value).startswith("cannot trace the step on fake tensors: ValueError: no such "
                                   "layer (module (root), during forward, at ")
    assert "concrete" not in str(e.value)
