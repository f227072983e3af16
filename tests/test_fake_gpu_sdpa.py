"""SDPA on PyTorch's own CUDA build (the fake GPU, an H100 sm90): the backend its
``select_sdp_backend`` picks (``torch._fused_sdp_choice``) for every case of
tests/fakegpu_sdpa_targets.py against fxmem's port (:func:`fxmem.trace.cuda.sdpa.choose` on CPU
tensors of the same shapes, strides, dtypes and requires_grad, under the same ``sdpa_kernel``
flags, determinism and grad mode), and the memory of a training step forced onto each backend.

Runs where the installed torch is a CUDA build and gcc can build the stub (2.14.1, 2.15);
skipped on the CPU build. One fake-GPU child answers the whole choice grid."""

import os
import shutil
import sys

import pytest
import torch

from fxmem.trace.cuda import sdpa

pytestmark = [
    pytest.mark.skipif(torch.version.cuda is None,
                       reason=f"torch {torch.__version__} is not a CUDA build"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the stub"),
]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fakegpu_sdpa_targets as targets  # noqa: E402


@pytest.fixture(scope="module")
def seen():
    from fxmem.validate.fakegpu import call

    return call(sys.executable, "fakegpu_sdpa_targets:choices", kwargs={"cases": targets.CASES},
                sys_path=[HERE])


def _fxmem(case, cudnn_version):
    q, k, v, mask = targets.build(case, "cpu")
    c = {**targets.DEFAULT, **case}
    try:
        with targets.context(case):
            return sdpa.choose(q, k, v, mask, c["dropout"], c["causal"], c["gqa"],
                               capability=(9, 0), cudnn_version=cudnn_version).backend
    except Exception as exc:  # noqa: BLE001 (the child records any exception the same way)
        return f"error: {type(exc).__name__}"


def test_the_child_is_the_release_on_an_h100(seen):
    assert seen["torch"] == torch.__version__
    assert seen["sm"] == [9, 0]
    assert seen["enum"] == {n: i for n, i in targets.BACKENDS.items() if n != "overrideable"}


def test_cudnn_version_is_the_wheels(seen):
    """sdpa.CUDNN_VERSION (fxmem's default) is the cuDNN the release's wheel ships."""
    assert sdpa.CUDNN_VERSION == seen["cudnn"]


def test_every_case_picks_the_backend_pytorch_picks(seen):
    wrong = []
    for case, real in zip(targets.CASES, seen["choices"]):
        mine = _fxmem(case, seen["cudnn"])
        if mine != (real.split(":")[0] + ": " + real.split(":")[1].strip()
                    if real.startswith("error") else real):
            wrong.append((case, real, mine))
    assert not wrong, (f"{len(wrong)} of {len(targets.CASES)} disagree "
                       f"(case, PyTorch, fxmem):\n" + "\n".join(map(str, wrong)))


def test_the_grid_is_not_vacuous(seen):
    """Every backend, and both kinds of failure, occur in the grid."""
    kinds = {c.split(":")[0] + (":" + c.split(":")[1] if c.startswith("error") else "")
             for c in seen["choices"]}
    assert {"math", "flash", "efficient", "cudnn", "error: RuntimeError",
            "error: IndexError"} <= kinds
