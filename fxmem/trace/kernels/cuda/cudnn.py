"""What PyTorch's host code allocates around cuDNN calls, beyond the ops' outputs, for
``device="cuda"``: the temporaries of :func:`workspace_bytes`, served through
:meth:`fxmem.trace.kernels.cuda.kernels.CudaKernels.workspaces` (made by the op, freed when it
ends).

The step is traced on CPU fake tensors, whose ops are the CPU's: a batch norm is
``native_batch_norm`` there and its backward ``native_batch_norm_backward``, where CUDA runs
``cudnn_batch_norm`` and ``cudnn_batch_norm_backward`` (chosen by
:func:`fxmem.trace.kernels.cuda.kernels._cudnn_batch_norm`); ``convolution_backward`` is the
same op on both, but CUDA's goes to ``cudnn_convolution_backward``, which may copy its
gradient. What cuDNN itself sizes (workspaces, reserve spaces) is not here
(``Report.unmodelled``, and ``cuda_memory(cudnn_workspace=)`` for the convolutions'
workspaces). Seen on 2.14.1's and 2.15's binaries on the fake GPU
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


#: Convolution.cpp ``_convolution`` and ``convolution_backward`` call cuDNN with
#: ``input.contiguous(backend_memory_format)``: a copy made before anything else of the op
CONV_INPUT_COPY = "cuDNN convolution: input.contiguous(backend_memory_format)"
#: ConvShared.cpp: ``weight->contiguous(memory_format)`` for the forward's call, after its
#: output
CONV_WEIGHT_COPY = "cuDNN convolution: weight.contiguous(memory_format)"


def _cudnn_conv(x, w, groups, transposed) -> bool:
    """The convolutions these rules follow: through cuDNN, not transposed
    (``cudnn_convolution_transpose`` is not checked), floating point, 4-d or 5-d (a 3-d input
    is viewed 4-d, contiguous), not depthwise (native kernels or cuDNN's, not checked)."""
    return (not transposed and torch.backends.cudnn.enabled and x.dtype in _CUDNN_CONV_DTYPES
            and x.dim() in (4, 5) and not (groups > 1 and groups == x.shape[1]))


def _conv_format(x, w):
    """ConvUtils.h ``cudnn_conv_suggest_memory_format(input, weight)``: channels_last (3d)
    when either suggests it, contiguous for float64."""
    from torch._prims_common import suggest_memory_format

    if torch.float64 in (x.dtype, w.dtype):
        return torch.contiguous_format
    cl = torch.channels_last if w.dim() == 4 else torch.channels_last_3d
    return cl if cl in (suggest_memory_format(x), suggest_memory_format(w)) else \
        torch.contiguous_format


def _conv_copies(x, w, fmt) -> list:
    """The input's copy (first) and the weight's (after the output) where either is not
    laid out in ``fmt``."""
    return ([(CONV_INPUT_COPY, _nbytes(x))] if not _dense_in(x, fmt) else []) + \
        ([(CONV_WEIGHT_COPY, _nbytes(w))] if not _dense_in(w, fmt) else [])


def _conv_forward(args, kwargs) -> list:
    """Convolution.cpp ``_convolution``: ``cudnn_convolution(input.contiguous(
    backend_memory_format), ...)``; ConvShared.cpp ``cudnn_convolution_forward_out``: the
    output, then ``weight->contiguous(memory_format)`` for the call, freed when it returns.
    A copy only of a tensor not laid out so: timm's ConvNeXt downsamples a channels_last view
    (its LayerNorm2d's output) with a contiguous 2x2 weight. Seen on 2.14.1's binary on the
    fake GPU (``tests/realmodels/test_fast_cuda.py``)."""
    names = [a.name for a in aten.convolution.default._schema.arguments]
    a = {**dict(zip(names, args)), **(kwargs or {})}
    x, w = a["input"], a["weight"]
    if _depthwise(x, w, a["groups"], a["transposed"]):
        return _depthwise_copies(x, w)
    if not _cudnn_conv(x, w, a["groups"], a["transposed"]):
        return []
    return _conv_copies(x, w, _conv_format(x, w))


def _depthwise(x, w, groups, transposed) -> bool:
    """ConvUtils.h ``is_depthwise``: a 4-d or 5-d input, not transposed, one group a
    channel (more than one)."""
    return (not transposed and x.dim() in (4, 5) and groups > 1 and x.shape[1] == groups
            and x.dtype in _CUDNN_CONV_DTYPES)


def _depthwise_backend(x, w) -> str | None:
    """What a depthwise convolution runs: "cudnn", "depthwise" (the native 2-d kernel) or
    None (not followed: float16 and bfloat16, whose backend ``use_cudnn_depthwise`` picks by
    workload, and 5-d inputs off cuDNN)."""
    if x.dtype not in (torch.float32, torch.float64):
        return None
    if torch.backends.cudnn.enabled and _conv_format(x, w) != torch.contiguous_format:
        return "cudnn"
    return "depthwise" if x.dim() == 4 else None


def conv_backend(func, args, kwargs) -> str | None:
    """``"depthwise"`` for a convolution (forward or backward) that runs the native
    depthwise kernel (no cuDNN call, no cuDNN workspace; its backward makes the weight's
    gradient first), else None."""
    if func not in (aten.convolution.default, aten.convolution_backward.default):
        return None
    op = func._schema.arguments
    a = {**dict(zip([x.name for x in op], args)), **(kwargs or {})}
    x, w = a["input"], a["weight"]
    if not _depthwise(x, w, a["groups"], a["transposed"]):
        return None
    return "depthwise" if _depthwise_backend(x, w) == "depthwise" else None


def _depthwise_backward(g, x, w, mask) -> list:
    """DepthwiseConv2d.cu ``conv_depthwise2d_backward_cuda_out``: ``grad_output.
    expect_contiguous()`` first; the weight's gradient (made first) on
    ``input.expect_contiguous()``, the input's on ``weight.expect_contiguous()``, each copy
    made before its gradient and freed after it. Seen on 2.14.1's binary on the fake GPU
    (timm's EfficientNet: the weight's gradient before the input's)."""
    from .sizing import _contiguous

    out = [] if _contiguous(g) else [("depthwise backward: grad_output.expect_contiguous()",
                                      _nbytes(g))]
    if mask[1] and not _contiguous(x):
        out.append((CONV_WEIGHT_CALL + "input.expect_contiguous()", _nbytes(x)))
    if mask[0] and not _contiguous(w):
        out.append((CONV_INPUT_CALL + "weight.expect_contiguous()", _nbytes(w)))
    return out


def _depthwise_copies(x, w) -> list:
    """Convolution.cpp ``_select_conv_backend`` for a depthwise convolution in float32 or
    float64 (``use_cudnn_depthwise`` weighs cuDNN's kernels for float16 only): cuDNN when the
    suggested format is channels_last (as :func:`_conv_forward`), else the native 2-d kernel
    on ``input.contiguous()``, a copy made first (coat's convolutional position encodings:
    a depthwise convolution of a transposed view of the tokens, and of a slice of channels).
    Seen on 2.14.1's binary on the fake GPU (``tests/realmodels/test_fast_cuda.py``)."""
    from .sizing import _contiguous

    backend = _depthwise_backend(x, w)
    if backend == "cudnn":
        return _conv_copies(x, w, _conv_format(x, w))
    if backend is None:
        return []
    return [] if _contiguous(x) else [(CONV_INPUT_COPY, _nbytes(x))]


#: temporaries of ``cudnn_convolution_backward_input`` (after the input's gradient) and of
#: ``cudnn_convolution_backward_weight`` (before the weight's), each freed when its call
#: returns; the native depthwise kernel's both before its gradient
CONV_INPUT_CALL = "convolution backward, the input's gradient's call: "
CONV_WEIGHT_CALL = "convolution backward, the weight's gradient's call: "


def _conv_backward(args, kwargs) -> list:
    """Convolution.cpp ``convolution_backward``: ``input.contiguous(backend_memory_format)``
    first; cudnn/ConvShared.cpp ``cudnn_convolution_backward``: ``grad_output_t.to(
    input.suggest_memory_format())`` before the cuDNN calls: a copy when the gradient's
    suggested format differs from the (copied) input's (``to_will_alias``), e.g. the
    contiguous gradient an average pool's backward gives a channels_last convolution; both
    freed after the weight's call, before the bias gradient (a 1-d output the replay makes
    last). ``cudnn_convolution_backward_input`` makes the input's gradient in
    ``cudnn_conv_suggest_memory_format(grad_output, weight)``, then ``weight->contiguous``
    and ``grad_output->contiguous`` in it for the call; ``cudnn_convolution_backward_weight``
    makes ``grad_output.contiguous(layout)`` and ``input.contiguous(layout)`` (layout from
    the input and the gradient) before the weight's gradient; each call frees its copies
    when it returns (:mod:`.call_order`). A copy only of a tensor not laid out so: seen on
    2.14.1's binary on the fake GPU (timm's ConvNeXt and coat, ``tests/realmodels/
    test_fast_cuda.py``). For the convolutions of :func:`_cudnn_conv`, and depthwise ones
    that run cuDNN (:func:`_depthwise_copies`)."""
    from torch._prims_common import suggest_memory_format

    names = [a.name for a in aten.convolution_backward.default._schema.arguments]
    a = {**dict(zip(names, args)), **(kwargs or {})}
    g, x, w, groups, mask = (a["grad_output"], a["input"], a["weight"], a["groups"],
                             a["output_mask"])
    if not (mask[0] or mask[1]):
        return []
    fmt = _conv_format(x, w) if x.dim() in (4, 5) else None
    if _depthwise(x, w, groups, a["transposed"]):
        backend = _depthwise_backend(x, w)
        if backend == "depthwise":
            return _depthwise_backward(g, x, w, mask)
        if backend is None:
            return []  # the native 3-d kernel, or cuDNN's by workload: not followed
    elif not _cudnn_conv(x, w, groups, a["transposed"]):
        return []
    x_copied = not _dense_in(x, fmt)
    out = [(CONV_INPUT_COPY, _nbytes(x))] if x_copied else []
    x_fmt = fmt if x_copied else suggest_memory_format(x)
    g_copied = suggest_memory_format(g) != x_fmt
    if g_copied:
        out.append((f"cuDNN convolution backward: grad_output.to({str(x_fmt).split('.')[-1]})",
                    _nbytes(g)))

    def dense(t, copied, as_fmt, layout):  # a tensor, or its copy made in as_fmt
        return layout == as_fmt if copied else _dense_in(t, layout)

    cl = torch.channels_last if w.dim() == 4 else torch.channels_last_3d
    f64 = torch.float64 in (x.dtype, w.dtype)
    if mask[0]:
        layout = torch.contiguous_format if f64 else (
            cl if cl in (x_fmt, suggest_memory_format(w)) else torch.contiguous_format)
        if not _dense_in(w, layout):
            out.append((CONV_INPUT_CALL + "weight.contiguous(memory_format)", _nbytes(w)))
        if not dense(g, g_copied, x_fmt, layout):
            out.append((CONV_INPUT_CALL + "grad_output.contiguous(memory_format)", _nbytes(g)))
    if mask[1]:
        layout = cl if x_fmt == cl and not f64 else torch.contiguous_format
        if not dense(g, g_copied, x_fmt, layout):
            out.append((CONV_WEIGHT_CALL + "grad_output.contiguous(layout)", _nbytes(g)))
        if not dense(x, x_copied, fmt, layout):
            out.append((CONV_WEIGHT_CALL + "input.contiguous(layout)", _nbytes(x)))
    return out


_CUDNN_CONV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def workspace_bytes(func, args, kwargs, out) -> list:
    """``[(what, nbytes)]`` of the temporaries PyTorch makes around the cuDNN call that
    ``func`` stands for, freed when it returns; ``[]`` for other ops."""
    if func is aten.native_batch_norm_backward.default:
        return _batch_norm_backward(args, kwargs)
    if func is aten.convolution_backward.default:
        return _conv_backward(args, kwargs)
    if func is aten.convolution.default:
        return _conv_forward(args, kwargs)
    return []
