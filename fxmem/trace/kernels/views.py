"""Views of fake tensors whose sizes are plain ints, made by the op's own C++ kernel.

FakeTensorMode makes a view through Python (``view``: its ``_view_meta`` in
torch/_subclasses/fake_impls.py, then ``_reshape_view_helper`` in torch/_refs and an
``as_strided`` dispatched again), written for symbolic sizes. Where the input's sizes,
strides and offset and the op's arguments are plain ints, the op's C++ kernel run on the
fake tensor as the meta tensor it is (``in_kernel_invocation_manager``, as FakeTensorMode
itself runs a meta kernel) gives the same view: a view's sizes, strides and offset are
computed by the same code on every device, and it shares its input's storage. The output is
wrapped as FakeTensorMode wraps a meta kernel's (``from_meta_and_device``).

Most such views are FSDP2's: each block's all-gathered parameters viewed out of the
all-gather's output, in the forward and again in the backward (about 640 per step of
Llama-3.1-8B), then their transposes in the block's linear layers.

>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode():
...     x = torch.empty(24)
...     y = concrete_view(torch.ops.aten.view.default, (x, [4, 6]), {})
>>> y.shape, y.stride(), y.untyped_storage()._cdata == x.untyped_storage()._cdata
(torch.Size([4, 6]), (6, 1), True)
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

aten = torch.ops.aten

# ops whose output is computed from the input's metadata and the arguments alone
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.as_strided.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.slice.Tensor, aten.select.int, aten.alias.default,
    aten.detach.default,
})


def concrete_view(func, args: tuple, kwargs: dict):
    """``func`` (one of :data:`VIEW_OPS`) on a fake tensor of plain-int metadata, by its C++
    kernel; None where FakeTensorMode must make it (symbolic sizes or arguments, a tensor
    whose value the mode keeps, keyword arguments, another op)."""
    if func not in VIEW_OPS or kwargs or not args:
        return None
    x = args[0]
    if type(x) is not FakeTensor or x.constant is not None or x.real_tensor is not None \
            or x._has_symbolic_sizes_strides or not all(map(_plain, args[1:])):
        return None
    mode = x.fake_mode
    with in_kernel_invocation_manager(mode):
        out = func(*args)
    return mode.fake_tensor_converter.from_meta_and_device(mode, out, x.fake_device)


def _plain(v) -> bool:
    if isinstance(v, (list, tuple)):
        return all(map(_plain, v))
    return v is None or type(v) in (int, bool)
