"""The cuBLAS / cuBLASLt choice and workspaces (fxmem.trace.kernels.cuda.blas) against PyTorch's own
CUDA build on the fake GPU: every case of tests/fakegpu_blas_targets.py takes, beyond its
output, exactly the workspace fxmem says (2.15: 32 MiB for a cuBLAS call, 1 MiB for a
cuBLASLt one, freed after it; 2.14: none after the handle's first use, which keeps its own)."""

import os
import sys

import pytest
import torch

from fxmem.device.allocator import cublas_workspace_bytes
from fxmem.trace.kernels.cuda import blas
from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fakegpu_blas_targets as targets  # noqa: E402


@pytest.fixture(scope="module")
def seen():
    from fxmem.validate.fakegpu import call

    return call(sys.executable, "fakegpu_blas_targets:transients", sys_path=[HERE])


def _expected(case):
    if not blas.PER_CALL:
        return 0
    op, args, kwargs = targets.build(case, "cpu")
    prefer = torch.backends.cuda.preferred_blas_library()
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt" if case[5] else "cublas")
        lib = blas.library(op, args, kwargs)
    finally:
        torch.backends.cuda.preferred_blas_library(prefer)
    return blas.lt_workspace_bytes() if lib == "cublaslt" else cublas_workspace_bytes((9, 0))


def test_every_matmul_takes_the_workspace_fxmem_says(seen):
    wrong = [(c[0], seen[c[0]], _expected(c)) for c in targets.CASES
             if seen[c[0]] != _expected(c)]
    assert not wrong, f"{len(wrong)} of {len(targets.CASES)} (case, seen, fxmem): {wrong}"


def test_the_grid_tells_the_libraries_apart(seen):
    """Not vacuous: on 2.15 both libraries occur in the grid (and on 2.14 none takes any)."""
    sizes = set(seen.values())
    assert sizes == ({2**20, 32 * 2**20} if blas.PER_CALL else {0})
