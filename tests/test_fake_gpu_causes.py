"""Why a prediction's caching-allocator layout parts from PyTorch's (issue 42): small steps
(tests/fakegpu_causes_targets.py), each showing one cause that the allocator-layout
comparison of the zoo found (the GPT-2 baseline of tests/test_fake_gpu.py and three cases of
tests/test_fake_gpu_zoo.py; docs/validation.md, "The fake GPU").

``fxmem.measure(..., record_history=True)`` on the fake GPU gives the measured step's
allocations in order; what PyTorch's own build does is asserted as seen (the same on 2.14.1
and 2.15), and fxmem's prediction (``predicted_allocations``, in order) is a strict xfail
naming what fxmem does instead, until the cause is modelled."""

import sys
from types import SimpleNamespace

import pytest

import fakegpu_causes_targets as causes
import fxmem
from fakegpu_marks import FAKE_CUDNN, FAKE_GPU
from fxmem.validate.divergence import first_divergence, predicted_allocations

pytestmark = FAKE_GPU
B = 4
_seen: dict = {}
_reports: dict = {}


def _run(name):
    """(measured allocation sizes of the step, its measurement, Report) at B, once per case:
    every case measured in one fake-GPU child (``fxmem.measure`` there, in turn)."""
    if not _seen:
        import os

        import torch

        from fxmem.validate.fakegpu import call

        names = [n for n in causes.STEPS
                 if n != "patch_conv" or torch.backends.cudnn.version() is not None]
        got = call(sys.executable, "fakegpu_causes_targets:measure_all",
                   kwargs={"names": names}, sys_path=[os.path.dirname(__file__)])
        _seen.update({n: SimpleNamespace(**v) for n, v in got.items()})
    if name not in _reports:
        model, x = causes.build(name)
        _reports[name] = fxmem.analyze(model, x, loss=causes.square_sum, device="cuda")
    m = _seen[name]
    return [n for n, _ in m.allocations], m, _reports[name]


def _library(n):
    return n in (2**20, 2**25)  # 2.15's per-call cuBLASLt / cuBLAS workspaces


def test_pytorch_allocates_a_dropout_mask_before_its_output():
    """Dropout.cu ``dropout_cuda``: ``mask = at::empty_like(self, kBool)`` first, then
    ``ret = at::empty_like(self)``; ``native_dropout`` returns (output, mask)."""
    sizes = [n for n in _run("dropout")[0] if not _library(n)]
    assert sizes[:3] == [4096, 1024, 4096]  # addmm's output, the mask, the dropout's output


def test_pytorch_sums_two_gradients_in_place():
    """torch/csrc/autograd/input_buffer.cpp ``accumulate``: with grad mode off, the first
    gradient of ``h`` (held only by the input buffer: a plain, dense tensor, not a view) takes
    the second with ``old_var.add_(var)``: no allocation. Backward of ``h * 2 + h.sin()`` after
    the loss: pow, mul, mul (the loss), cos, mul (sin's), mul (``* 2``'s): six blocks of
    4,096 B, then the weight's and bias's gradients."""
    sizes = [n for n in _run("two_paths")[0] if not _library(n)]
    assert sizes[6:] == [4, 4096, 4096, 4096, 4096, 4096, 4096, 65536, 1024]


@pytest.mark.parametrize("mark", [pytest.param(0, marks=FAKE_CUDNN)])
def test_pytorch_copies_a_convolutions_gradient_first_and_frees_it_before_the_bias(mark):
    """cudnn/ConvShared.cpp: ``cudnn_convolution_backward`` copies the strided incoming
    gradient (``grad_output.to(input.suggest_memory_format())``, 8,192 B) before the weight's
    gradient (24,576 B), and the copy is gone when ``convolution_backward`` sums the bias
    gradient (128 B): the peak is 512 B under a step that held it."""
    sizes, m, _ = _run("patch_conv")
    assert sizes[-3:] == [8192, 24576, 128]
    assert m.peak_bytes == 117760


def test_fxmem_allocates_the_dropout_mask_first():
    _, m, r = _run("dropout")
    assert first_divergence(predicted_allocations(r, B), m.allocations, ordered=True) is None


def test_fxmem_sums_two_gradients_in_place():
    _, m, r = _run("two_paths")
    assert first_divergence(predicted_allocations(r, B), m.allocations) is None


@pytest.mark.parametrize("mark", [pytest.param(0, marks=FAKE_CUDNN)])
def test_fxmem_copies_the_convolutions_gradient_first_and_frees_it_before_the_bias(mark):
    _, m, r = _run("patch_conv")
    assert first_divergence(predicted_allocations(r, B), m.allocations, ordered=True) is None
    assert r.cuda_memory(B).max_allocated == m.peak_bytes


def test_pytorch_copies_the_attention_gradient_first_and_frees_deltas_temporaries():
    """attention_backward.cu ``_efficient_attention_backward`` (fp32, GQA, B=4 L=128 H=4
    Hkv=2 D=64): ``grad_out_.contiguous()`` (524,288 B) before the query, key and value
    gradients (524,288, 262,144, 262,144); the key and value gradients at the query's heads;
    ``delta``'s product, its sum and their transposed copy (524,288, 8,192, 8,192); the
    workspace (524,800). The forward made its philox seed and offset (8 B each, dropout 0)
    before its output and logsumexp."""
    sizes = [n for n in _run("efficient_gqa")[0] if not _library(n)]
    backward = [524288, 524288, 262144, 262144, 524288, 524288, 524288, 8192, 8192, 524800]
    at = [i for i in range(len(sizes)) if sizes[i:i + len(backward)] == backward]
    assert len(at) == 1
    assert sizes[2:6] == [8, 8, 524288, 8192]


def test_fxmem_orders_the_efficient_attention_backward():
    _, m, r = _run("efficient_gqa")
    assert first_divergence(predicted_allocations(r, B), m.allocations, ordered=True) is None
    d = r.cuda_memory(B)
    assert (d.max_allocated, d.max_reserved) == (m.peak_bytes, m.peak_reserved_bytes)


def test_fxmem_sums_in_place_in_copied_blocks():
    """Four identical residual blocks, the last a copy of a traced one (fxmem.trace.blocks.reuse):
    each block's sum into its input's gradient runs in place in the copy too (the sums are
    applied after the splice; before, the copy's sum took a block of its own)."""
    _, m, r = _run("residuals")
    assert r.trace.reused == ("blocks.3",)
    assert first_divergence(predicted_allocations(r, B), m.allocations, ordered=True) is None


def test_pytorch_adds_a_linears_bias_in_place_after_matmul():
    """Linear.cpp ``linear``: a non-contiguous 3-D input goes through ``matmul`` (its input
    copied contiguous, 16,384 B, then ``mm``, 49,152 B) and ``output.add_(bias)``: no block
    for the sum; then the loss's ``pow``."""
    sizes = [n for n in _run("strided_linear")[0] if not _library(n)]
    assert sizes[:3] == [16384, 49152, 49152]


def test_fxmem_adds_a_linears_bias_in_place():
    _, m, r = _run("strided_linear")
    assert first_divergence(predicted_allocations(r, B), m.allocations, ordered=True) is None
    assert r.cuda_memory(B).max_allocated == m.peak_bytes


def test_pytorch_copies_expanded_embedding_indices_first():
    """Embedding.cpp ``embedding_symint``: 2-D indices go through ``indices.reshape(-1)``,
    a copy (512 B for 4 x 16 int64) when they are expanded, before the output (16,384 B)."""
    sizes = [n for n in _run("expanded_ids")[0] if not _library(n)]
    assert sizes[:3] == [512, 16384, 16384]  # the copy, the embedding, the sum


def test_fxmem_copies_expanded_embedding_indices_first():
    _, m, r = _run("expanded_ids")
    assert first_divergence(predicted_allocations(r, B), m.allocations, ordered=True) is None
