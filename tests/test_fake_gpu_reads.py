"""What a read of device memory gives on the fake GPU (docs/validation.md, "The fake GPU").

Kernels do not run, so a value read on the host is what the host last wrote there. Every
block the caching allocator hands out reads as zero until a host->device copy, a memset or
a device->device copy writes it (stub.c ``fakegpu_block_zero``, hooked into the allocator by
``alloc_hook.cpp``), so a read no longer depends on what a block held before."""

import os
import sys

from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))


def _call(target):
    from fxmem.validate.fakegpu import call

    return call(sys.executable, f"fakegpu_reads_targets:{target}", sys_path=[HERE])


def test_a_reused_block_reads_zero_not_the_bytes_an_earlier_copy_left():
    assert _call("stale_block") == {"copied": [7] * 4, "reused": [0] * 4}


def test_a_memset_of_zero_reads_zero_and_keeps_the_bytes_around_it():
    """stub.c's ``cudaMemset`` of zero over a MiB or more gives whole pages back
    (MADV_DONTNEED) rather than writing them; under a MiB it writes: either way every byte
    it covers reads 0, the 10 around it 7."""
    assert _call("zeroed_range") == {"big": {"7": 10, "0": 3 * 2**20 + 3},
                                     "small": {"7": 10, "0": 98}}


def test_value_reads_are_zero():
    """``all`` reads False (a real GPU: True here), ``.item()`` 0.0, a count 0."""
    assert _call("host_reads") == {"all": False, "item": 0.0, "nonzero": 0}


def test_a_grad_scaler_steps():
    """found_inf reads 0: both steps run (a real GPU's finite steps); get_scale() reads 0.0."""
    assert _call("grad_scaler_step") == {"steps": [2, 2], "scale": 0.0}
