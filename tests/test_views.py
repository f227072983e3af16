"""Views of plain-int fake tensors made by their C++ kernel (fxmem.trace.kernels.views) are the
views FakeTensorMode makes: the same sizes, strides, offset, dtype, device and storage."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from fxmem.trace.kernels.views import VIEW_OPS, concrete_view

aten = torch.ops.aten

CASES = [  # (op, input shape, input strides or None, arguments after the input)
    (aten.view.default, (4, 6), None, ([24],)),
    (aten.view.default, (24,), None, ([2, 3, 4],)),
    (aten._unsafe_view.default, (4, 6), None, ([6, 4],)),
    (aten.as_strided.default, (24,), None, ([3, 4], [1, 3], 2)),
    (aten.t.default, (4, 6), None, ()),
    (aten.transpose.int, (2, 3, 4), None, (0, 2)),
    (aten.permute.default, (2, 3, 4), None, ([2, 0, 1],)),
    (aten.expand.default, (1, 6), None, ([5, 6],)),
    (aten.unsqueeze.default, (4, 6), (1, 4), (1,)),
    (aten.squeeze.dim, (4, 1, 6), None, (1,)),
    (aten.slice.Tensor, (8, 6), None, (0, 2, 7, 2)),
    (aten.select.int, (8, 6), None, (1, -1)),
    (aten.alias.default, (4, 6), None, ()),
    (aten.detach.default, (4, 6), (1, 4), ()),
]


def _meta(t):
    return (t.shape, t.stride(), t.storage_offset(), t.dtype, t.device,
            t.untyped_storage()._cdata, type(t))


@pytest.mark.parametrize("op,shape,strides,rest", CASES, ids=[str(c[0]) for c in CASES])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_concrete_view_is_fake_tensor_mode_s(op, shape, strides, rest, device):
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    with mode:
        x = torch.empty_strided(shape, strides or torch.empty(shape).stride(),
                                dtype=torch.bfloat16, device=device)
        got = concrete_view(op, (x, *rest), {})
        want = op(x, *rest)
    assert isinstance(got, FakeTensor) and got.fake_mode is mode
    assert _meta(got) == _meta(want)
    assert got.untyped_storage()._cdata == x.untyped_storage()._cdata


def test_every_view_op_has_a_case():
    assert {c[0] for c in CASES} == VIEW_OPS


def test_fake_tensor_mode_makes_the_others():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    with mode:
        x = torch.empty(4, 6)
        sym = env.create_symbol(4, source=ConstantSource("b"), dynamic_dim=DimDynamic.DYNAMIC)
        n = env.create_symintnode(sym, hint=4)
        s = torch.empty(n, 6)
        assert concrete_view(aten.view.default, (s, [24]), {}) is None  # symbolic sizes
        assert concrete_view(aten.view.default, (x, [n * 6]), {}) is None  # argument
        assert concrete_view(aten.view.default, (x, [24]), {"extra": 1}) is None
        assert concrete_view(aten.add.Tensor, (x, x), {}) is None  # not a view
        c = torch.empty(2)
        c.constant = torch.tensor([1.0, 2.0])  # a value the mode keeps (as for torch.tensor)
        assert concrete_view(aten.view.default, (c, [2, 1]), {}) is None
