"""Bad input: one clear error, naming the op, the module path and the user's line, and no
changed global state (checked for every test by conftest.py)."""

import pytest
import torch
from torch import nn

import fxmem


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent control flow
            h = h * 2
        return h


class CallsItem(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x):
        scale = self.inner(x).mean().item()  # traced through while only computed with
        if scale > 0:  # a Python branch on the value read
            x = x * scale
        return self.inner(x)


@torch.library.custom_op("fxmem_test::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class CustomOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return no_fake(self.fc(x))


class FixedBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 2)

    def forward(self, x):
        return self.fc(x.reshape(4, -1))  # the batch size written as a constant


def _loss(o):
    return o.sum()


@pytest.mark.parametrize("model, op", [
    (DataDependent(), None),
    (CallsItem(), "aten._local_scalar_dense.default"),
    (CustomOp(), "fxmem_test.no_fake.default"),
])
def test_untraceable_models_raise_trace_error(model, op):
    with pytest.raises(fxmem.TraceError) as e:
        fxmem.analyze(model, torch.randn(4, 4), loss=_loss, device="cpu")
    err = e.value
    msg = str(err)
    assert "\n" not in msg
    assert err.source is not None and err.source.startswith(__file__), msg
    if op is not None:
        assert err.op == op, msg
    assert "test_errors.py:" in msg


def test_item_error_names_the_module():
    with pytest.raises(fxmem.TraceError) as e:
        fxmem.analyze(CallsItem(), torch.randn(4, 4), loss=_loss, device="cpu")
    assert e.value.module == ""  # .item() is called in the root module's forward
    assert "line" not in e.value.source and ":" in e.value.source


def test_specialized_batch_raises_specialization_error():
    with pytest.raises(fxmem.SpecializationError) as e:
        fxmem.analyze(FixedBatch(), torch.randn(4, 3, 4), loss=_loss, device="cpu")
    assert "specialized to 4" in str(e.value)
    assert e.value.source and e.value.source.startswith(__file__)
    assert isinstance(e.value, fxmem.TraceError)


@pytest.mark.parametrize("kwargs, text", [
    (dict(inputs=(torch.randn(4, 4), torch.randn(5, 4))), "the batch dim's size differs"),
    (dict(inputs=torch.randn(4, 4), targets=torch.randn(3)), "the batch dim's size differs"),
    (dict(inputs=(torch.randn(4, 4), 3.0)), "inputs[1] is a float, not a tensor"),
    (dict(inputs=[]), "at least one tensor"),
    (dict(inputs=torch.tensor(1.0)), "0-dimensional"),
    (dict(inputs=torch.randn(4, 4), device="tpu"), "device must be"),
    (dict(inputs=torch.randn(4, 4), targets=torch.randn(4)), "no loss function"),
])
def test_bad_arguments_fail_before_tracing(kwargs, text):
    with pytest.raises(fxmem.InputError, match=None) as e:
        fxmem.analyze(nn.Linear(4, 4), **kwargs)
    assert text in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_model_and_optimizer_arguments():
    with pytest.raises(fxmem.InputError):
        fxmem.analyze(lambda x: x, torch.randn(4, 4))
    with pytest.raises(fxmem.InputError, match="not an Optimizer"):
        fxmem.analyze(nn.Linear(4, 4), torch.randn(4, 4), loss=_loss, optimizer=lambda p: 3,
                      device="cpu")
    with pytest.raises(fxmem.InputError, match="no backward pass"):
        fxmem.analyze(nn.Linear(4, 4), torch.randn(4, 4), train=False,
                      optimizer=torch.optim.SGD)


def test_loss_none_needs_a_scalar():
    with pytest.raises(fxmem.InputError, match="scalar loss"):
        fxmem.analyze(nn.Linear(4, 4), torch.randn(4, 4), device="cpu")


def test_budget_below_fixed_memory_is_infeasible():
    r = fxmem.analyze(nn.Linear(64, 64), torch.randn(4, 64), loss=_loss,
                      optimizer=torch.optim.Adam, device="cpu")
    assert (r.min_batch_size, r.least_batch_size) == (2, 1)  # B = 1: traced at 1
    smallest = r.peak_bytes(1)
    with pytest.raises(fxmem.InfeasibleBudgetError) as e:
        r.max_batch_size(smallest - 1)
    assert e.value.minimum_bytes == smallest
    assert f"{smallest:,}" in str(e.value) and "(at B=1)" in str(e.value)
    assert r.max_batch_size(smallest) == 1
    with pytest.raises(fxmem.InputError):
        r.max_batch_size(1.5e9)
    with pytest.raises(fxmem.InputError):
        r.peak_bytes(0)


def test_failed_trace_leaves_model_untouched():
    model = CallsItem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(fxmem.TraceError):
        fxmem.analyze(model, torch.randn(4, 4), loss=_loss, optimizer=torch.optim.SGD,
                      device="cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_default_dtype_restored_after_failure():
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(fxmem.TraceError):
            fxmem.analyze(DataDependent().double(), torch.randn(4, 4, dtype=torch.float64),
                          loss=_loss, device="cpu")
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
