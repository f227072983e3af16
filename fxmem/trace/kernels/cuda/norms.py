"""Temporaries of the normalisation kernels on CUDA (GroupNorm, native batch norm's backward,
LayerNorm / RMSNorm backward): the rules :mod:`fxmem.trace.kernels.cuda.workspaces` serves for them.

>>> import torch
>>> x = torch.empty(2, 96)
>>> a = {"input": x, "output_mask": [True, True, True], "train": True, "weight": None,
...      "running_mean": None, "running_var": None}
>>> [n for _, n in _batch_norm_backward(a, (9, 0), 132)]   # a 2-d input: channels-last kernels
[384, 384]
"""

from __future__ import annotations

import math

import torch

from ..compat import TORCH
from .sizing import _acc, _and, _cdiv, _clean, _contiguous, _decide, _ite, _known

# --- 3. GroupNorm (group_norm_kernel.cu) --------------------------------------------------------

def nhwc_group_norm(x) -> bool:
    """2.15's channels-last GroupNorm kernels run (a 4-d input laid out channels_last, not also
    contiguous): ``native_group_norm`` keeps X's memory format for Y and dX and copies
    nothing of X; its backward makes dY channels_last (a copy when it is not). Seen on
    2.15.0's binary on the fake GPU (``tests/test_fake_gpu.py``); 2.14.1 copies X to the
    default format and runs the NCHW kernels."""
    if TORCH < (2, 15) or x.dim() != 4 or _contiguous(x):
        return False
    order = (0, 2, 3, 1)
    return _contiguous([x.shape[i] for i in order], [x.stride()[i] for i in order])


def _group_norm(a, cap, sms):
    """``GroupNormKernelImplInternal``: a, b = empty({N, C}, acc) when N != 0, HxW != 1 and
    gamma or beta is defined; X made contiguous first (none on 2.15's channels-last path)."""
    N, C, HxW = a["N"], a["C"], a["HxW"]
    affine = a["weight"] is not None or a["bias"] is not None
    n = _ite(_and(N != 0, HxW != 1, affine), N * C * _acc(a["input"]), 0)
    copies = [] if nhwc_group_norm(a["input"]) else _made_contiguous(a, ("input",))
    return _clean(copies + [("a = empty({N, C}, acc)", n), ("b = empty({N, C}, acc)", n)])


def _made_contiguous(a, names) -> list:
    """``t.contiguous()`` of each named input, in the default memory format, alive until the
    op returns; a copy only for a tensor not already contiguous (a channels_last one).
    group_norm.cpp ``native_group_norm(_backward)``: on CUDA, ``X`` (and ``dY``)."""
    return [(f"{name}.contiguous()", a[name].numel() * a[name].element_size())
            for name in names if not _contiguous(a[name])]


def _group_norm_backward(a, cap, sms):
    """``GroupNormBackwardKernelImplInternal`` (N != 0): ds, db = empty({N, C}, acc), all
    along; with dX also c2, c3 {N, G} acc and, when gamma is defined and HxW != 1, c1 = rstd *
    gamma {N, G, D} acc (GroupNorm1dBackward, HxW == 1, has no c1)."""
    N, C, HxW, G, acc = a["N"], a["C"], a["HxW"], a["group"], _acc(a["input"])
    dx = a["output_mask"][0]
    nc, ng = _ite(N != 0, N * C * acc, 0), _ite(N != 0, N * G * acc, 0) if dx else 0
    if nhwc_group_norm(a["input"]):  # 2.15, seen on the fake GPU: dY in X's format; ds, db,
        dy = a["grad_out"]           # c2, c3 as below, no c1
        copy = [] if nhwc_group_norm(dy) else [("grad_out in channels_last",
                                                dy.numel() * dy.element_size())]
        return _clean(copy + [("ds = empty({N, C}, acc)", nc), ("db = empty({N, C}, acc)", nc),
                              ("c2 = empty({N, G}, acc)", ng), ("c3 = empty({N, G}, acc)", ng)])
    return _clean(_made_contiguous(a, ("grad_out", "input")) + [
                  ("ds = empty({N, C}, acc)", nc), ("db = empty({N, C}, acc)", nc),
                   ("c1 = rstd * gamma, {N, G, D} acc",
                    _ite(HxW != 1, nc, 0) if dx and a["weight"] is not None else 0),
                   ("c2 = empty({N, G}, acc)", ng), ("c3 = empty({N, G}, acc)", ng)])


def _channels_last_kernels(x) -> bool:
    """Normalization.cuh ``batch_norm_use_channels_last_kernels``: a channels_last(_3d) input,
    or a contiguous one whose dim 1 has stride 1 (a 2-D ``{N, C}``, or ``{N, C, 1}``)."""
    order = {4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}.get(x.dim())
    if order and _contiguous([x.shape[i] for i in order], [x.stride()[i] for i in order]):
        return True
    return x.dim() >= 2 and _contiguous(x) and _known(x.stride()[1] == 1)


def _batch_norm_backward(a, cap, sms):
    """cuda/Normalization.cu ``batch_norm_backward_cuda`` (the native kernel; a cuDNN batch
    norm has its own backward, whose temporaries cuDNN sizes): with a reduction to make
    (training, or the weight's or bias's gradient wanted), the fused kernel runs when the input's
    gradient is wanted and the input is not laid out for the channels-last kernels; otherwise
    ``batch_norm_backward_reduce_cuda`` returns ``sum_dy`` and ``sum_dy_xmu``, ``{C}`` in the
    accumulate type, which ``batch_norm_backward_elemt_cuda`` reads, freed when the op returns
    (seen on 2.14.1's and 2.15's binaries on the fake GPU, a 2-D ``{N, C}`` input)."""
    x, mask, train = a["input"], a["output_mask"], a["train"]
    reduce = train or mask[1] or mask[2]
    if not reduce or (mask[0] and not _channels_last_kernels(x)):
        return []
    if _cudnn_batch_norm_backward(a):
        return []
    c = x.shape[1] if x.dim() > 1 else 1
    n = c * _acc(x)
    return [("sum_dy = empty({C}, acc)", n), ("sum_dy_xmu = empty({C}, acc)", n)]


def _cudnn_batch_norm(args) -> bool:
    """Normalization.cpp ``_select_batch_norm_backend``: cuDNN runs a batch norm of a >= 3-d
    input that is not bfloat16 (float16 only with float32 weights), with weight and bias, and
    running statistics (or none, in training), while ``torch.backends.cudnn.enabled``; past
    880,801 samples in training (65,535 in eval) the native kernel runs instead, which
    allocates the same but for cuDNN's reserve space and workspaces."""
    x, weight, bias, mean, var = args[:5]
    training = args[5]
    return (torch.backends.cudnn.enabled and x.dim() >= 3 and weight is not None
            and bias is not None and torch.bfloat16 not in (x.dtype, weight.dtype)
            and (x.dtype != torch.float16 or weight.dtype == torch.float32)
            and ((mean is not None and var is not None)
                 or (mean is None and var is None and training)))


def _cudnn_batch_norm_backward(a) -> bool:
    """The forward ran cuDNN (:func:`_cudnn_batch_norm`, with a bias whenever there is a
    weight: affine batch norms have both)."""
    x, w = a["input"], a["weight"]
    return _cudnn_batch_norm((x, w, w, a["running_mean"], a["running_var"], a["train"]))


# --- 4a. LayerNorm forward (layer_norm_kernel.cu) ------------------------------------------------

#: the copies ``layer_norm_cuda`` makes before its outputs (fxmem.trace.kernels.cuda.call_order)
LAYER_NORM_COPIES = frozenset(f"layer_norm: {n}.expect_contiguous()"
                              for n in ("input", "weight", "bias"))


def _layer_norm(a, cap, sms):
    """``layer_norm_cuda``: ``X = input.expect_contiguous()`` (then the weight's and the
    bias's) before Y, mean and rstd are made; a copy only of a tensor not contiguous (timm's
    LayerNorm2d normalises ``x.permute(0, 2, 3, 1)``), freed when the op returns. Seen on
    2.14.1's binary on the fake GPU (timm's ConvNeXt, ``tests/realmodels/test_fast_cuda.py``:
    one block the size of the input before the output)."""
    return _clean([(f"layer_norm: {name}.expect_contiguous()", t.numel() * t.element_size())
                   for name in ("input", "weight", "bias")
                   if (t := a.get(name)) is not None and not _contiguous(t)])


# --- 4. LayerNorm / RMSNorm backward (layer_norm_kernel.cu) ------------------------------------

#: the copies the backward makes before its outputs (fxmem.trace.kernels.cuda.call_order): seen on
#: 2.14.1's binary on the fake GPU (timm's ConvNeXt: the copy of the saved permuted input
#: before dX)
NORM_BACKWARD_COPIES = frozenset(f"{n}.expect_contiguous()"
                                 for n in ("input", "weight", "bias"))

def _large_m(a, sms, rms):
    """M, N and LaunchGammaBetaBackwardCUDAKernel's condition M > 65536 && N / 32 < sms / 2
    (reached when M > 0, N > 0 and dgamma or dbeta is wanted)."""
    x, mask = a["input"], a["output_mask"]
    axis = x.dim() - len(a["normalized_shape"])
    M, N = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    wanted = (mask[1] and a["weight"] is not None) or (
        not rms and mask[2] and a["bias"] is not None)
    return M, N, _and(wanted, M > 0, N > 0, M > 64 * 1024, N // 32 < sms // 2)


def _norm_backward(a, cap, sms, rms):
    """``layer_norm_backward_cuda`` / ``_fused_rms_norm_backward_cuda``: input, weight (bias)
    ``expect_contiguous()`` before the outputs; ``LayerNormBackwardKernelImpl`` or
    ``RMSNormBackwardKernelImpl``: ``dY.contiguous()``; ``LaunchGammaBetaBackwardCUDAKernel``'s
    large-M branch: dgamma_blocks (and dbeta_blocks, LayerNorm) = empty({blocks.y,
    dgamma.size(-1)}), blocks.y =
    min(32768 / ceil(N / 32), ceil(M / 32)), then ``*dgamma = dgamma_blocks.sum(0)``: the
    preallocated dgamma (then dbeta) is freed once its sum exists, one of them more."""
    dy, x, w, mask = a["grad_out"], a["input"], a["weight"], a["output_mask"]
    b = None if rms else a["bias"]
    M, N, large = _large_m(a, sms, rms)
    ws = [(f"{name}.expect_contiguous()", t.numel() * t.element_size())
          for name, t in (("input", x), ("weight", w), ("bias", b))
          if t is not None and not _contiguous(t)]
    if not _contiguous(dy):
        ws.append(("dY.contiguous()", _ite(_and(M > 0, N > 0), M * N * dy.element_size(), 0)))
    grads = [t for t, k in ((w, 1), (b, 2)) if t is not None and mask[k]]
    if _decide(large) is False:
        return _clean(ws)
    by = torch.sym_min(32768 // _cdiv(N, 32), _cdiv(M, 32))
    cols = (w if w is not None else grads[0]).size(-1)
    ws += [(f"d{name}_blocks", _ite(large, by * cols * t.element_size(), 0))
           for name, t in (("gamma", w), ("beta", b)) if any(t is g for g in grads)]
    ws.append(("preallocated dgamma/dbeta, replaced by the blocks' sum(0)",
               _ite(large, grads[0].numel() * grads[0].element_size(), 0)))
    return _clean(ws)
