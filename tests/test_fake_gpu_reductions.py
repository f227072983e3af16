"""ATen's CUDA reductions (fxmem.trace.kernels.cuda.reductions) against PyTorch's own CUDA build on
the fake GPU: every case of tests/fakegpu_reduction_targets.py (sum, mean, amax/amin, max/min,
argmax/argmin, var/std/var_mean/std_mean, vector norms, any/all, logsumexp, the mean-reduced
losses; 2-D and 4-D, reduced over the first, last, several or all dims, keepdim, transposed,
strided, offset and channels-last inputs, float32/float16/bfloat16 and bool, 1e2 to 3e7
elements, 1 to 1e5 outputs) frees, before it returns, exactly the blocks fxmem says: Reduce.cuh's
global-reduce staging and semaphores, make_reduction's casts, reshape/contiguous copies.
One fake-GPU subprocess runs the whole grid (seconds).

A known difference is a strict xfail naming its numbers: it fails the run the day it is
fixed, until the marker goes."""

import os
import sys

import pytest
import torch

from fxmem.trace.kernels.cuda import reductions
from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fakegpu_reduction_targets as targets  # noqa: E402

# ops that run several kernels in sequence: fxmem gives the temporaries of the call's peak,
# checked against the most transient bytes alive at once
COMPOSITE = {"logsumexp"}
# the recorder already gives these ops' output the unreduced loss's storage
# (fxmem.trace.kernels.rules.UNREDUCED_STORAGE_LOSSES), the block CUDA frees before returning
LOSS_IN_OUTPUT = {"mse_loss", "smooth_l1_loss"}
KNOWN = {}  # case name -> reason (strict xfail)


@pytest.fixture(scope="module")
def seen():
    from fxmem.validate.fakegpu import call

    return call(sys.executable, "fakegpu_reduction_targets:transients", sys_path=[HERE])


def _check(case, seen):
    n = targets.name(case)
    got = seen[n]
    assert not isinstance(got, str), got
    x = targets.make(case[1], case[2], "meta")
    op, args, kwargs = targets.build(case, x)
    want = [b for _, b in reductions.workspace_bytes(op, args, kwargs)]
    if case[0] in COMPOSITE:
        return got["peak"], sum(want)
    if case[0] in LOSS_IN_OUTPUT:
        want.append(x.numel() * x.element_size())
    return sorted(got["transients"]), sorted(want)


def test_every_case_frees_what_fxmem_says(seen):
    cases = [c for c in targets.CASES if targets.name(c) not in KNOWN]
    wrong = [(targets.name(c), *_check(c, seen)) for c in cases]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, f"{len(wrong)} of {len(cases)} (case, seen, fxmem): {wrong[:20]}"


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_differences(name, seen):
    case = next(c for c in targets.CASES if targets.name(c) == name)
    got, want = _check(case, seen)
    if got != want:
        pytest.xfail(KNOWN[name])


def test_the_grid_reduces_across_blocks(seen):
    """Not vacuous: many cases take the global-reduce staging, many do not."""
    staged = [n for n, v in seen.items() if not isinstance(v, str) and v["transients"]]
    assert 500 < len(staged) < len(seen) - 500
