"""Values the data sets (fxmem.trace.kernels.datadep): traced through where they change contents or
a size with a known bound, refused with what to do where Python branches on them."""

import inspect
import types

import pytest
import torch
from torch import nn

import fxmem

HERE = __file__


def _line(fn, text: str) -> int:
    """The line of ``fn``'s source that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, ln in enumerate(lines) if text in ln)


def _sum(o):
    return o.sum()


def _exact(model, inputs, batches=(2, 5), **kw):
    """The report traced at B=4, and its peak against a real CPU step at other batch sizes."""
    r = fxmem.analyze(model, inputs, loss=_sum, optimizer=torch.optim.Adam, device="cpu", **kw)
    for b in batches:
        measured = fxmem.measure(model, inputs, loss=_sum, optimizer=torch.optim.Adam, B=b)
        assert r.peak_bytes(b) == measured.peak_bytes, b
    return r


class MaskedAssign(nn.Module):
    """SpecAugment's pattern: ``h[mask] = embedding`` on a random mask (index_put_ with a
    boolean index), then a wide layer that holds the peak."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.embed = nn.Parameter(torch.randn(8))
        self.wide = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 8))

    def forward(self, x):
        h = self.proj(x)
        mask = torch.rand(h.shape[:2], device=h.device) < 0.3
        h[mask] = self.embed  # no size changes; its backward's grad[mask] is count-sized
        return self.wide(h)


def test_boolean_mask_assignment_traced_and_exact_where_the_count_is_not_at_the_peak():
    r = _exact(MaskedAssign(), torch.randn(4, 12, 8))
    (note,) = [u for u in r.unmodelled if "size the data sets" in u[2]]
    # backward of index_put_: grad.index(mask), one row of 8 floats per True value
    assert note[0] == "aten.index.Tensor" and note[1] == ""
    assert "True values of a mask of 12*B elements" in note[2]
    assert "never live where the peak can be" in note[2]


class SelectMasked(nn.Module):
    """``x[mask]``: a tensor as long as the mask's True values, at the peak."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, mask):
        sel = self.proj(x)[mask]
        return sel * sel


@pytest.mark.parametrize("p", [1.0, 0.5])
def test_count_at_the_peak_is_taken_at_its_largest(p):
    torch.manual_seed(0)
    x, mask = torch.randn(4, 12, 8), torch.rand(4, 12) < p
    m = SelectMasked()
    r = fxmem.analyze(m, (x, mask), loss=_sum, device="cpu")
    notes = {op: what for op, _, what in r.unmodelled if "size the data sets" in what}
    assert "live where the peak can be, which is then an upper bound" in \
        notes["aten.index.Tensor"]  # sel, then sel * sel and their gradients: count-sized
    for b in (2, 5):
        measured = fxmem.measure(m, (x, mask), loss=_sum, B=b).peak_bytes
        if p == 1.0:  # every element True: the largest count, reached
            assert r.peak_bytes(b) == measured
        else:
            assert r.peak_bytes(b) > measured


class ScaledByItem(nn.Module):
    """A value read from a tensor only as a number: contents change, sizes do not."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        scale = self.a(x).abs().mean().item()
        return self.b(x) * scale


def test_value_read_only_as_a_number_is_traced_through():
    _exact(ScaledByItem(), torch.randn(4, 8))


class RandomSkip(nn.Module):
    """LayerDrop's pattern: a Python branch on a random draw."""

    def __init__(self, p=0.5):
        super().__init__()
        self.p, self.fc = p, nn.Linear(8, 8)

    def forward(self, x):
        if torch.rand([]) < self.p:
            return x
        return self.fc(x)


class Net(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.block = block

    def forward(self, x):
        return self.block(self.stem(x))


def test_branch_on_a_random_draw_names_module_line_and_what_to_do():
    with pytest.raises(fxmem.DataDependentError) as e:
        fxmem.analyze(Net(RandomSkip()), torch.randn(4, 8), loss=_sum, device="cpu")
    err, msg = e.value, str(e.value)
    assert isinstance(err, fxmem.TraceError) and "\n" not in msg
    assert err.module == "block" and err.op == "aten._local_scalar_dense.default"
    assert err.source.startswith(f"{HERE}:{_line(RandomSkip.forward, 'torch.rand([])')} ")
    assert "random value (aten.rand)" in msg
    assert "drop probability of 0" in msg and "model.eval()" in msg


class ThresholdBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            h = h * 2
        return h


def test_branch_on_a_value_read_names_it():
    with pytest.raises(fxmem.DataDependentError) as e:
        fxmem.analyze(Net(ThresholdBranch()), torch.randn(4, 8), loss=_sum, device="cpu")
    err, msg = e.value, str(e.value)
    assert err.module == "block" and "random" not in msg
    assert err.source.startswith(f"{HERE}:{_line(ThresholdBranch.forward, 'h.sum() > 0')} ")
    assert "a value read from a tensor" in msg and "depend on shapes" in msg


class SizedByItem(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        n = (x > 0).sum().item()  # an int, unbacked: no bound is known
        return self.fc(x).sum() + torch.zeros(n, device=x.device).sum()


def test_size_from_a_value_read_names_where_it_was_read():
    with pytest.raises(fxmem.DataDependentError) as e:
        fxmem.analyze(SizedByItem(), torch.randn(4, 8), loss=_sum, device="cpu")
    err = e.value
    assert err.source.startswith(f"{HERE}:{_line(SizedByItem.forward, '.item()')} ")
    assert "aten.zeros.default" in str(err) and "no bound" in str(err)
    assert "\n" not in str(err)


class Encoder(nn.Module):
    """A Hugging Face-style module: a ``config`` whose ``layerdrop`` is random in training."""

    def __init__(self, layerdrop):
        super().__init__()
        self.config = types.SimpleNamespace(layerdrop=layerdrop, mask_time_prob=0.05)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            skip = False
            if self.training and self.config.layerdrop > 0.0:
                skip = torch.rand([]) < self.config.layerdrop
            if not skip:
                x = layer(x)
        return x


def test_config_flag_responsible_is_named():
    with pytest.raises(fxmem.DataDependentError) as e:
        fxmem.analyze(Net(Encoder(0.1)), torch.randn(4, 8), loss=_sum, device="cpu")
    msg = str(e.value)
    assert "config.layerdrop = 0.1 (LayerDrop) is random in training" in msg
    assert "set it to 0.0" in msg and "model.eval()" in msg
    assert "; mask_time_prob = 0.05 too" in msg  # active, but not what stopped the trace
    assert e.value.source.startswith(f"{HERE}:{_line(Encoder.forward, 'if not skip')} ")
    # with the flag off (what the message says), the step traces, every layer running
    _exact(Net(Encoder(0.0)), torch.randn(4, 8))
