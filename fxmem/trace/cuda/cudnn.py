"""What PyTorch's host code allocates around cuDNN calls, beyond the ops' outputs, for
``device="cuda"``: the temporaries of :func:`workspace_bytes`, served through
:meth:`fxmem.trace.cuda.kernels.CudaKernels.workspaces` (made by the op, freed when it ends).

The step is traced on CPU fake tensors, whose ops are the CPU's: a batch norm is
``native_batch_norm`` there and its backward ``native_batch_norm_backward``, where CUDA runs
``cudnn_batch_norm`` and ``cudnn_batch_norm_backward`` (chosen by
:func:`fxmem.trace.cuda.kernels._cudnn_batch_norm`). What cuDNN itself sizes (workspaces,
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
    from .workspaces import _contiguous

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

    from .workspaces import _cudnn_batch_norm_backward

    names = [a.name for a in aten.native_batch_norm_backward.default._schema.arguments]
    a = {**dict(zip(names, args)), **(kwargs or {})}
    grad, x = a["grad_out"], a["input"]
    if not a["train"] or grad is None or not _cudnn_batch_norm_backward(a):
        return []
    if _dense_in(grad, suggest_memory_format(x)):
        return []
    return [("cuDNN batch norm backward: grad.contiguous(input.suggest_memory_format())",
             _nbytes(grad))]


def workspace_bytes(func, args, kwargs, out) -> list:
    """``[(what, nbytes)]`` of the temporaries PyTorch makes around the cuDNN call that
    ``func`` stands for, freed when it returns; ``[]`` for other ops."""
    if func is aten.native_batch_norm_backward.default:
        return _batch_norm_backward(args, kwargs)
    return []
