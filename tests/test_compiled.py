"""A compiled model (``torch.compile``) where it cannot be traced: one line saying what it
needs (issue 39). Its prediction is checked on the fake GPU (tests/test_fake_gpu_compile.py)."""

import pytest
import torch

import fxmem


def _compiled():
    return torch.compile(torch.nn.Linear(8, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is there")
def test_a_compiled_model_needs_a_cuda_build_with_a_device():
    with pytest.raises(fxmem.InputError, match="needs a CUDA build of PyTorch with a device"):
        fxmem.analyze(_compiled(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda")


def test_a_compiled_model_is_traced_for_cuda_only():
    with pytest.raises(fxmem.InputError, match="device='cuda' only"):
        fxmem.analyze(_compiled(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cpu")
