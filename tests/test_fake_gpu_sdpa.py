"""SDPA on PyTorch's own CUDA build (the fake GPU, an H100 sm90): the backend its
``select_sdp_backend`` picks (``torch._fused_sdp_choice``) for every case of
tests/fakegpu_sdpa_targets.py against fxmem's port (:func:`fxmem.trace.kernels.cuda.sdpa.choose` on
CPU tensors of the same shapes, strides, dtypes and requires_grad, under the same ``sdpa_kernel``
flags, determinism and grad mode), and the memory of a training step forced onto each backend.

Runs where the installed torch is a CUDA build and gcc can build the stub (2.14.1, 2.15);
skipped on the CPU build. One fake-GPU child answers the whole choice grid."""

import os
import sys

import pytest
import torch

from fxmem.trace.kernels.cuda import sdpa
from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
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


# --- memory: a training step forced onto each backend -----------------------------------------

# The math backend's steps were off until fxmem followed the binaries (seen on 2.14.1's and
# 2.15's on the fake GPU): causal's ones are freed as tril returns; _safe_softmax's temporaries
# (a B.H.L.L bool, a (B, H, L) bool, a 0-dim zero); fp32's backward bmm's clone the expanded
# gradient of out.sum() for cuBLAS (prepare_batch_matrix_for_cublas).
# cuDNN attention runs on the stub's cuDNN, whose execution plans need no workspace
# (FAKEGPU_CUDNN_WORKSPACE unset): the backward's workspace is then cudnn_frontend's own dQ
# accumulator and softmax_sum, which fxmem sizes; the plan's part on a real GPU is cuDNN's
# choice, not modelled.


@pytest.fixture(scope="module")
def measured():
    """max_memory_allocated of every memory case at each B, from one fake-GPU child."""
    from fxmem.validate.fakegpu import call

    out = {}
    # the math backend's matmuls make cuBLAS workspaces that stay: a child of their own
    for math in (False, True):
        cases = [dict(B=B, **kw) for kw in targets.MEMORY.values() for B in targets.MEMORY_B
                 if (kw["backend"] == "math") == math]
        if not cases:
            continue
        got = call(sys.executable, "fakegpu_sdpa_targets:steps", kwargs={"cases": cases},
                   sys_path=[HERE])
        out.update({(c["B"], tuple(sorted((k, v) for k, v in c.items() if k != "B"))): g
                    for c, g in zip(cases, got)})
    return out


@pytest.mark.parametrize("name", list(targets.MEMORY))
def test_attention_step_memory_is_exact(name, measured):
    """A training step of one attention forced onto a backend: PyTorch's max_memory_allocated
    on the fake GPU equals fxmem's prediction at two batch sizes."""
    import fxmem

    kw = targets.MEMORY[name]
    model, x, _, loss, _ = targets.attention(B=targets.MEMORY_B[0], **kw)
    report = fxmem.analyze(model, (x,), (), loss=loss, optimizer=None)
    for B in targets.MEMORY_B:
        got = measured[(B, tuple(sorted(kw.items())))]
        want = report.cuda_memory(B).max_allocated
        assert got == want, (B, got, want)


def test_a_batched_step_is_measure_steps_step():
    """The memory cases share one child (fakegpu_sdpa_targets.steps); the same step alone
    through fxmem.validate.fakegpu.measure_step gives the same peak."""
    from fxmem.validate.fakegpu import call, measure_step

    kw = dict(B=2, backend="flash", dtype="float16", dropout=0.125)
    alone = measure_step(sys.executable, "fakegpu_sdpa_targets:attention", kwargs=kw,
                         sys_path=[HERE])
    batched = call(sys.executable, "fakegpu_sdpa_targets:steps", kwargs={"cases": [kw]},
                   sys_path=[HERE])
    assert batched == [alone.max_allocated]
