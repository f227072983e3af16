"""Ops of fake tensors whose sizes are plain ints, run by their own kernel on the fake
tensors as the meta tensors they are.

FakeTensorMode runs some ops through Python written for symbolic sizes: a view through its
``_view_meta`` (torch/_subclasses/fake_impls.py, then ``_reshape_view_helper`` in torch/_refs
and an ``as_strided`` dispatched again), and under PyTorch's Python dispatcher (which the
trace enters for symbolic sizes: :meth:`fxmem.trace.engine.eager_ops.EagerOps.fake_kernel`)
FSDP2's copies through the decompositions of the aten ops their Meta kernels call. Where
every tensor's sizes, strides and offset and every argument are plain ints, the op's own
kernel run on the fake tensors in FakeTensorMode's kernel invocation (as FakeTensorMode
itself runs a meta kernel) gives the same outputs sooner: a view's sizes, strides and offset
are computed by the same code on every device and it shares its input's storage, and
FSDP2's copies only write the tensors they are given (or return a view of one). An output
made so is wrapped as FakeTensorMode wraps a meta kernel's (``from_meta_and_device``).

Most such ops are FSDP2's: each block's all-gathered parameters viewed out of the
all-gather's output (about 640 views per step of Llama-3.1-8B), its copy-in and copy-out,
and the gradients' copy into the reduce-scatter's input.

>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode():
...     x = torch.empty(24)
...     y = meta_kernel(torch.ops.aten.view.default, (x, [4, 6]), {})
>>> y.shape, y.stride(), y.untyped_storage()._cdata == x.untyped_storage()._cdata
(torch.Size([4, 6]), (6, 1), True)
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten

# ops whose output is computed from the input's metadata and the arguments alone
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.as_strided.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.slice.Tensor, aten.select.int, aten.alias.default,
    aten.detach.default,
})
# FSDP2's copies (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), by name: the
# namespace exists once FSDP2 is imported
FSDP_COPIES = frozenset({"all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"})
NOT_RUN = object()  # what meta_kernel returns for an op it leaves to FakeTensorMode


def meta_kernel(func, args: tuple, kwargs: dict):
    """``func`` (one of :data:`VIEW_OPS`, without keyword arguments, or of
    :data:`FSDP_COPIES`) on fake tensors of plain-int metadata, by its own kernel;
    :data:`NOT_RUN` where FakeTensorMode must run it (symbolic sizes or arguments, a tensor
    whose value the mode keeps, a tensor of another kind or mode, another op)."""
    if func in VIEW_OPS:
        if kwargs or not args:
            return NOT_RUN
    elif func.namespace != "fsdp" or func._opname not in FSDP_COPIES:
        return NOT_RUN
    mode = device = None
    for v in tree_leaves((args, kwargs)):
        if isinstance(v, torch.Tensor):
            if type(v) is not FakeTensor or v.constant is not None or \
                    v.real_tensor is not None or v._has_symbolic_sizes_strides or \
                    mode is not None and v.fake_mode is not mode:
                return NOT_RUN
            mode, device = v.fake_mode, device or v.fake_device
        elif not (v is None or type(v) in (int, bool)):
            return NOT_RUN
    if mode is None:
        return NOT_RUN
    with in_kernel_invocation_manager(mode):
        out = func(*args, **kwargs)
    wrap = mode.fake_tensor_converter.from_meta_and_device
    return tree_map(lambda t: wrap(mode, t, device)
                    if isinstance(t, torch.Tensor) and type(t) is not FakeTensor else t, out)


def empty_fake(t: torch.Tensor, mode, device) -> FakeTensor:
    """``torch.empty_like(t, device=device)`` under ``mode`` for the meta tensor ``t``, by its
    meta kernel: FakeTensorMode would first make ``t`` a fake of its own (``from_real_tensor``:
    most of the 0.2 to 0.4 s that ``to_empty`` took over Llama-3.1-8B's shards on a rank).

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> mode = FakeTensorMode()
    >>> x = empty_fake(torch.empty(4, 6, device="meta").t(), mode, "cpu")
    >>> type(x).__name__, x.shape, x.stride(), x.device
    ('FakeTensor', torch.Size([6, 4]), (1, 6), device(type='cpu'))
    """
    with in_kernel_invocation_manager(mode):
        out = torch.empty_like(t)
    return mode.fake_tensor_converter.from_meta_and_device(mode, out, torch.device(device))
