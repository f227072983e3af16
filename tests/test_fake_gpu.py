"""The fake GPU (issue 42): PyTorch's own CUDA build runs the step in a subprocess with a stub
driver, runtime and cuBLAS (``fxmem.validate.fakegpu``), and its caching allocator's
``max_memory_allocated`` / ``max_memory_reserved`` are checked against fxmem's prediction.

Runs where the installed torch is a CUDA build and gcc can build the stub (CI's 2.14.1 and
2.15 environments); skipped on the CPU build. A known difference is a strict xfail naming
its cause: it fails the run the day it is fixed, until the marker goes."""

import os
import shutil

import pytest
import torch

import fxmem
from fxmem.trace.compat import TORCH

pytestmark = [
    pytest.mark.skipif(torch.version.cuda is None,
                       reason=f"torch {torch.__version__} is not a CUDA build"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the stub"),
]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE_215 = pytest.mark.xfail(
    TORCH >= (2, 15), strict=True,
    reason="2.15 keeps cuBLAS's workspace out of memory_allocated (still in reserved), and "
           "addmm takes none; fxmem's rule is 2.14's (seen: the MLP 64 MiB under)")


def _fake(target, **kwargs):
    import sys

    from fxmem.validate.fakegpu import measure_step

    return measure_step(sys.executable, f"fakegpu_targets:{target}", kwargs=kwargs,
                        sys_path=[HERE])


def _predicted(target, B, **kwargs):
    import fakegpu_targets

    model, x, y, loss, opt = getattr(fakegpu_targets, target)(B=B, **kwargs)
    inputs = x if isinstance(x, tuple) else (x,)
    targets = () if y is None else (y,)
    return fxmem.analyze(model, inputs, targets, loss=loss, optimizer=opt).cuda_memory(B)


@WORKSPACE_215
@pytest.mark.parametrize("B", [32, 64])
def test_mlp_is_exact_on_the_fake_gpu(B):
    got, want = _fake("mlp", B=B), _predicted("mlp", B)
    assert got.device_name and got.torch_version == torch.__version__
    assert (got.max_allocated, got.max_reserved) == (want.max_allocated, want.max_reserved)


@WORKSPACE_215
def test_gpt2_allocated_is_exact_on_the_fake_gpu():
    got, want = _fake("gpt2", B=4), _predicted("gpt2", 4)
    assert got.max_allocated == want.max_allocated


@pytest.mark.xfail(strict=True, reason="max_memory_reserved one 2 MiB segment over (2.14.1: "
                   "650,117,120 B on the fake GPU, 648,019,968 predicted); the replay parts "
                   "from PyTorch's allocations in the backward: cause not found yet")
def test_gpt2_reserved_is_exact_on_the_fake_gpu():
    got, want = _fake("gpt2", B=4), _predicted("gpt2", 4)
    assert got.max_reserved == want.max_reserved


def test_the_fake_gpu_is_pytorchs_own_allocator():
    """Not vacuous: a bigger batch takes more, and reserved covers allocated."""
    small, big = _fake("mlp", B=8), _fake("mlp", B=128)
    assert big.max_allocated > small.max_allocated
    assert big.max_reserved >= big.max_allocated > 0
