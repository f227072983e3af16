"""The order in which a CUDA op's call makes its storages, and frees those it makes only for
itself, for ``device="cuda"``: what the caching allocator is asked, in that order.

Where each block lands depends on the order of the requests (a freed block is split or
reused by the next request that fits), so the allocator replay
(:mod:`fxmem.device.allocator`) and the allocation list of
:func:`fxmem.validate.divergence.predicted_allocations` follow the kernel's order, not the
order in which the op returns its outputs:

- ``native_dropout`` (``aten/src/ATen/native/cuda/Dropout.cu``, ``dropout_cuda``): the bool
  mask (``at::empty_like(self, kBool)``), then the output, in training with ``0 < p < 1``;
  the recorder lists the mask first (:func:`new_storage_order`). Its two short cuts make
  the output first: ``train=False`` (``self.clone()``, then ``ones_like``) and ``p == 1``.
- ``convolution_backward`` through cuDNN (``aten/src/ATen/native/cudnn/ConvShared.cpp``,
  ``cudnn_convolution_backward``): the copies of the input and of the incoming gradient in
  the backend's memory format first (:func:`fxmem.trace.kernels.cuda.cudnn.workspace_bytes`), then
  one cuDNN call per gradient wanted, the input's then the weight's, each making its output
  and then the workspace it holds while it runs (the input's call copies the weight and
  the gradient to its format after its output, the weight's call the gradient and the input
  before it, each freeing its copies when it returns); the first copies go when
  ``cudnn_convolution_backward`` returns, before ``convolution_backward`` sums the bias
  gradient (a 1-d output, made last). A forward convolution makes the input's copy before
  its output, the weight's after it.
- ``embedding`` (``aten/src/ATen/native/Embedding.cpp``, ``embedding_symint``): indices of
  more than one dim that cannot be viewed flat are copied by ``indices.reshape(-1)`` before
  ``index_select`` makes the output (:func:`fxmem.trace.kernels.cuda.kernels.workspaces`).
- ``native_layer_norm`` (``layer_norm_kernel.cu``, ``layer_norm_cuda``): the contiguous
  copies of a strided input (weight, bias) before Y, mean and rstd
  (:data:`fxmem.trace.kernels.cuda.norms.LAYER_NORM_COPIES`); its backward's before dX, dgamma and
  dbeta (``NORM_BACKWARD_COPIES``; ``dY.contiguous()`` after them).
- ``_scaled_dot_product_efficient_attention`` (``attention.cu``,
  ``_efficient_attention_forward``): the philox seed and offset (two empty CUDA tensors at
  dropout 0, host tensors otherwise) before the output and the logsumexp.
- ``_scaled_dot_product_efficient_attention_backward`` (``attention_backward.cu``,
  ``_efficient_attention_backward``): the contiguous copy of the incoming gradient before
  the gradients (:data:`MADE_FIRST`); in fp32, ``delta`` is
  ``(grad_out * out).sum(-1).transpose(-2, -1).contiguous()``, whose product and sum are
  freed once ``delta`` is made, before the kernel's workspace (:data:`FREED_AFTER_NEXT`).

Seen on 2.14.1's and 2.15's binaries on the fake GPU (``tests/test_fake_gpu_causes.py``,
``tests/test_fake_gpu_cudnn.py``)."""

from __future__ import annotations

import torch

from . import sdpa_memory
from .cudnn import CONV_INPUT_CALL, CONV_INPUT_COPY, CONV_WEIGHT_CALL
from .norms import LAYER_NORM_COPIES, NORM_BACKWARD_COPIES

aten = torch.ops.aten

CONV_BACKWARD = "aten.convolution_backward.default"
EFFICIENT_FORWARD = frozenset({aten._scaled_dot_product_efficient_attention.default,
                               aten._efficient_attention_forward.default})
# temporaries (by name) a kernel makes before its outputs; those freed once the next
# temporary (not one of these) is made
EMBEDDING_INDEX_COPY = "embedding: indices.reshape(-1), a copy"
MADE_FIRST = frozenset({sdpa_memory.EFF_GRAD_OUT_COPY, EMBEDDING_INDEX_COPY,
                        *LAYER_NORM_COPIES, *NORM_BACKWARD_COPIES, CONV_INPUT_COPY})
FREED_AFTER_NEXT = frozenset({sdpa_memory.EFF_PRODUCT, sdpa_memory.EFF_SUM})
# the ops that run one cuDNN call (forward convolutions): its workspace after its output
CUDNN_CONV_FORWARD = frozenset(f"aten.{n}.default" for n in (
    "convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose"))


def new_storage_order(func, args, kwargs, out, new_sids, sid) -> tuple:
    """``new_sids`` (the op's new storages, in the order it returns them) in the order the
    CUDA kernel allocates them; ``sid(tensor)``: a tensor's storage id."""
    if func in EFFICIENT_FORWARD:  # philox seed and offset, then output and logsumexp
        first = [sid(out[2]), sid(out[3])]
    elif func is aten.native_dropout.default and _dropout_draws(args, kwargs):
        first = [sid(out[1])]  # the mask
    else:
        return tuple(new_sids)
    first = [s for s in first if s in new_sids]
    return (*first, *(s for s in new_sids if s not in first))


def _dropout_draws(args, kwargs) -> bool:
    """Does ``native_dropout(input, p, train)`` take ``dropout_cuda``'s path (not a short
    cut)?"""
    p = args[1] if len(args) > 1 else kwargs.get("p")
    train = args[2] if len(args) > 2 else kwargs.get("train")
    return train is not False and p != 1


def steps(op, storages, made) -> list:
    """The op's call as ``(kind, sid)`` steps in the order it runs them: ``("alloc", sid)``
    for each storage of ``made`` (the storages the op creates), ``("free", sid)`` for one it
    frees before it returns, ``("cudnn", None)`` where a cuDNN call holds its workspace
    (after that call's output). ``storages``: the trace's, by sid."""
    pos = {s: k for k, s in enumerate(op.new_sids)}
    made = sorted(made, key=lambda s: (pos.get(s, len(pos)), s))
    if op.op == CONV_BACKWARD:
        return _conv_backward(op, storages, made)
    name = lambda s: storages[s].name if storages[s].category == "temporary" else ""
    first = [s for s in made if name(s) in MADE_FIRST]
    out, pending = [("alloc", s) for s in first], []
    for s in (s for s in made if s not in first):
        out.append(("alloc", s))
        if name(s) in FREED_AFTER_NEXT:
            pending.append(s)
        elif pending:  # C++ temporaries go as their statement ends: the last made first
            out += [("free", t) for t in reversed(pending)]
            pending = []
    if op.op in CUDNN_CONV_FORWARD and getattr(op, "conv", None) != "depthwise":
        out.append(("cudnn", None))
    return out


def _conv_backward(op, storages, made) -> list:
    """``convolution_backward`` on cuDNN: the temporaries made for both calls (the input's
    and the gradient's copies) first; the input's gradient, then its call's copies
    (:data:`fxmem.trace.kernels.cuda.cudnn.CONV_INPUT_CALL`), its workspace, the copies freed; the
    weight's call's copies (``CONV_WEIGHT_CALL``), the weight's gradient, its workspace, the
    copies freed; the first copies freed; the bias gradient (1-d) last. The native depthwise
    kernel (``op.conv == "depthwise"``) calls no cuDNN and makes the weight's gradient (its
    weight is ``(C * m, 1, kh, kw)``) before the input's, each after its call's copies."""
    outs = set(op.out_sids)
    name = lambda s: storages[s].name if storages[s].category == "temporary" else ""
    temps = [s for s in made if s not in outs]
    for_input = [s for s in temps if name(s).startswith(CONV_INPUT_CALL)]
    for_weight = [s for s in temps if name(s).startswith(CONV_WEIGHT_CALL)]
    copies = [s for s in temps if s not in for_input and s not in for_weight]
    grads = [s for s in made if s in outs and len(storages[s].shape) != 1]
    bias = [s for s in made if s in outs and len(storages[s].shape) == 1]
    if getattr(op, "conv", None) == "depthwise":  # the native kernel: the weight's first
        weight = [s for s in grads if storages[s].shape[1] == 1]
        calls = []
        for before, made_here in ((for_weight, weight),
                                  (for_input, [s for s in grads if s not in weight])):
            calls += [("alloc", t) for t in before] + [("alloc", s) for s in made_here] + \
                [("free", t) for t in before]
        return ([("alloc", s) for s in copies] + calls
                + [("free", s) for s in copies] + [("alloc", s) for s in bias])
    # which gradient each call makes: the input's first when both are wanted
    kinds = (["input", "weight"] if len(grads) == 2 else
             ["weight" if for_weight and not for_input else "input"] * len(grads))
    calls = []
    for s, kind in zip(grads, kinds):
        before, after = ([], for_input) if kind == "input" else (for_weight, [])
        temp = before + after
        calls += [("alloc", t) for t in before] + [("alloc", s)] + \
            [("alloc", t) for t in after] + [("cudnn", None)] + [("free", t) for t in temp]
    return ([("alloc", s) for s in copies] + calls
            + [("free", s) for s in copies] + [("alloc", s) for s in bias])
