"""What PyTorch's host code allocates around cuDNN calls, beyond the ops' outputs, for
``device="cuda"``: the temporaries of :func:`workspace_bytes`, served through
:meth:`fxmem.trace.cuda.kernels.CudaKernels.workspaces` (made by the op, freed when it ends).

The step is traced on CPU fake tensors, whose ops are the CPU's: a batch norm is
``native_batch_norm`` there and its backward ``native_batch_norm_backward``, where CUDA runs
``cudnn_batch_norm`` and ``cudnn_batch_norm_backward`` (chosen by
:func:`fxmem.trace.cuda.kernels._cudnn_batch_norm`); ``convolution_backward`` is the same op
on both, but CUDA's goes to ``cudnn_convolution_backward``, which may copy its gradient. What cuDNN itself sizes (workspaces,
reserve spaces) is not here (``Report.unmodelled``, and ``cuda_memory(cudnn_workspace=)`` for
the convolutions' workspaces). Seen on 2.14.1's and 2.15's binaries on the fake GPU
(``tests/test_fake_gpu_cudnn.py``).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

# dims in memory order for the channels-last formats (suggest_memory_format)
_ORDER = {torch.channels_last: (0, 2, 3, 1), torch.channels_last_3d: (0, 2, 3, 4, 1)}


def _dense_in(t, fmt) -> bool:
    """``t.is_contiguous(memory_format=fmt)`` when provable, no guard on the symbols."""
    from .sizing import _contiguous

    order = _ORDER.get(fmt)
    if order is None or t.dim() != len(order):
        return _contiguous(t)
    return _contiguous([t.shape[i] for i in order], [t.stride()[i] for i in order])


def _nbytes(t):
    return t.numel() * t.element_size()


def _batch_norm_backward(args, kwargs) -> list:
    """derivatives.yaml ``cudnn_batch_norm``: in training, the backward is
    ``cudnn_batch_norm_backward(input, grad.contiguous(input.suggest_memory_format()), ...)``:
    a gradient not laid out so (the stride-0 gradient of a sum, a contiguous gradient of a
    channels_last input) is copied, the copy freed when the backward node's call returns
    (CudnnBatchNormBackward0_apply_functional). The CPU trace's ``native_batch_norm_backward``
    stands for that call."""
    from torch._prims_common import suggest_memory_format

    from .norms import _cudnn_batch_norm_backward

    names = [a.name for a in aten.native_batch_norm_backward.default._schema.arguments]
    a = {**dict(zip(names, args)), **(kwargs or {})}
    grad, x = a["grad_out"], a["input"]
    if not a["train"] or grad is None or not _cudnn_batch_norm_backward(a):
        return []
    if _dense_in(grad, suggest_memory_format(x)):
        return []
    return [("cuDNN batch norm backward: grad.contiguous(input.suggest_memory_format())",
             _nbytes(grad))]


def _conv_backward(args, kwargs) -> list:
    """cudnn/ConvShared.cpp ``cudnn_convolution_backward``: ``grad_output_t.to(
    input.suggest_memory_format())`` before the cuDNN calls: a copy when the gradient's
    suggested format differs from the input's (``to_will_alias``), e.g. the contiguous
    gradient an average pool's backward gives a channels_last convolution; freed after the
    weight's call, before the bias gradient (a 1-d output the replay makes last). For the
    convolutions cuDNN runs: not transposed (``cudnn_convolution_transpose_backward`` is not
    checked), floating point, 4-d or 5-d (a 3-d input is viewed 4-d, contiguous), not
    depthwise (native kernels or cuDNN's, not checked), cuDNN enabled."""
    from torch._prims_common import suggest_memory_format

    names = [a.name for a in aten.convolution_backward.default._schema.arguments]
    a = {**dict(zip(names, args)), **(kwargs or {})}
    g, x, w, groups, mask = (a["grad_output"], a["input"], a["weight"], a["groups"],
                             a["output_mask"])
    if (a["transposed"] or not (mask[0] or mask[1]) or not torch.backends.cudnn.enabled
            or x.dtype not in _CUDNN_CONV_DTYPES or x.dim() not in (4, 5)):
        return []
    if groups > 1 and groups == x.shape[1]:  # depthwise
        return []
    fmt = suggest_memory_format(x)
    if suggest_memory_format(g) == fmt:
        return []
    return [(f"cuDNN convolution backward: grad_output.to({str(fmt).split('.')[-1]})",
             _nbytes(g))]


_CUDNN_CONV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def workspace_bytes(func, args, kwargs, out) -> list:
    """``[(what, nbytes)]`` of the temporaries PyTorch makes around the cuDNN call that
    ``func`` stands for, freed when it returns; ``[]`` for other ops."""
    if func is aten.native_batch_norm_backward.default:
        return _batch_norm_backward(args, kwargs)
    if func is aten.convolution_backward.default:
        return _conv_backward(args, kwargs)
    return []
