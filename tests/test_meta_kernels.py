"""Ops of plain-int fake tensors run by their own kernel (fxmem.trace.kernels.meta_kernels) give
what FakeTensorMode gives: the same sizes, strides, offset, dtype, device and storage."""

import pytest
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401, E402 (FSDP2's ops)
from fxmem.trace.kernels.meta_kernels import FSDP_COPIES, NOT_RUN, VIEW_OPS, meta_kernel

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
def test_a_plain_view_is_fake_tensor_mode_s(op, shape, strides, rest, device):
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    with mode:
        x = torch.empty_strided(shape, strides or torch.empty(shape).stride(),
                                dtype=torch.bfloat16, device=device)
        got = meta_kernel(op, (x, *rest), {})
        want = op(x, *rest)
    assert isinstance(got, FakeTensor) and got.fake_mode is mode
    assert _meta(got) == _meta(want)
    assert got.untyped_storage()._cdata == x.untyped_storage()._cdata


def test_every_view_op_has_a_case():
    assert {c[0] for c in CASES} == VIEW_OPS


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fsdp2_s_copies_are_fake_tensor_mode_s(device):
    # FSDP2's all-gather copy-in and copy-out and its gradients' copy into the
    # reduce-scatter's input, each run both ways on tensors of the same shapes
    fsdp = torch.ops.fsdp
    sizes, world, rank = [6, 10, 4], 4, 1
    got = []
    for run in (lambda op, *a, **k: meta_kernel(op, a, k), lambda op, *a, **k: op(*a, **k)):
        mode = FakeTensorMode(shape_env=ShapeEnv())
        with mode:
            shards = [torch.empty(n, device=device) for n in sizes]
            out = torch.empty(sum(sizes) * world, device=device)
            gin, gout = run(fsdp.all_gather_copy_in.default, shards, out, sizes, sum(sizes), rank)
            params = [torch.empty(n * world, device=device) for n in sizes]
            done = run(fsdp.split_with_sizes_copy.default, out.view(world, -1),
                       sizes, dim=1, out=[p.view(world, -1) for p in params])
            grads = [torch.empty(n * world, device=device) for n in sizes]
            rs_in = torch.empty(sum(sizes) * world, device=device)
            cat = run(fsdp.chunk_cat.default, grads, 0, world, out=rs_in.view(world, -1))
        got.append((_meta(gin)[:5], gin.untyped_storage()._cdata == out.untyped_storage()._cdata,
                    gout is out, done, cat))
    assert got[0] == got[1]
    assert {"all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"} == FSDP_COPIES


def test_fake_tensor_mode_runs_the_others():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    with mode:
        x = torch.empty(4, 6)
        sym = env.create_symbol(4, source=ConstantSource("b"), dynamic_dim=DimDynamic.DYNAMIC)
        n = env.create_symintnode(sym, hint=4)
        s = torch.empty(n, 6)
        assert meta_kernel(aten.view.default, (s, [24]), {}) is NOT_RUN  # symbolic sizes
        assert meta_kernel(aten.view.default, (x, [n * 6]), {}) is NOT_RUN  # argument
        assert meta_kernel(aten.view.default, (x, [24]), {"extra": 1}) is NOT_RUN
        assert meta_kernel(aten.add.Tensor, (x, x), {}) is NOT_RUN  # another op
        c = torch.empty(2)
        c.constant = torch.tensor([1.0, 2.0])  # a value the mode keeps (as for torch.tensor)
        assert meta_kernel(aten.view.default, (c, [2, 1]), {}) is NOT_RUN
        assert meta_kernel(aten.as_strided.default, (x, [6], [1], 0), {}) is not NOT_RUN
        with FakeTensorMode():
            other = torch.empty(24)  # a tensor of another fake mode
        assert meta_kernel(torch.ops.fsdp.chunk_cat.default, ([x], 0, 1), {"out": other}) \
            is NOT_RUN


def test_a_plain_view_into_a_storage_of_b_elements_adds_no_guard():
    # x[0] of a (B, 8) tensor has plain sizes and strides and a storage of 32 * B bytes: its
    # views made by their kernel check their bounds against it without a guard on B
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    sym = env.create_symbol(4, source=ConstantSource("b"), dynamic_dim=DimDynamic.DYNAMIC)
    with mode:
        row = aten.select.int(torch.empty(env.create_symintnode(sym, hint=4), 8), 0, 0)
        assert not row._has_symbolic_sizes_strides
        for op, rest in [(aten.view.default, ([2, 4],)), (aten.slice.Tensor, (0, 2, 4)),
                         (aten.as_strided.default, ([2], [1], 3)), (aten.select.int, (0, 1))]:
            want = op(row, *rest)
            got = meta_kernel(op, (row, *rest), {})
            assert _meta(got) == _meta(want)
    assert not env.guards and not env.replacements


def _made(t):
    local = getattr(t, "_local_tensor", t)
    return (type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad,
            getattr(t, "placements", None), type(local), local.shape, local.stride(),
            local.storage_offset(), local.untyped_storage().nbytes(), local.device)


@pytest.mark.parametrize("parallel", ["FSDP(2)", "FSDP(3, offload=True)", "FSDP(4, blocks=[])"])
def test_a_rank_s_fakes_are_to_empty_s(parallel):
    # Strategy.materialize makes each fake by the meta kernel (empty_fake), FSDP2's shards
    # DTensors around theirs: what model.to_empty(device=...) makes under the mode
    import copy

    import fxmem
    from fxmem.trace.parallel.fsdp import fake_world, meta_copy

    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(5, 7),
                                                          torch.nn.LayerNorm(7))
                                      for _ in range(3)])
        model.register_buffer("scale", torch.ones(3, 2).t())
    strategy = eval(parallel, {"FSDP": fxmem.FSDP})
    got = []
    for way in ("materialize", "to_empty"):
        with fake_world(strategy.world_size, strategy.world_size - 1) as mesh:
            rank = meta_copy(copy.deepcopy(model))
            strategy.apply(rank, mesh)
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            if way == "materialize":
                strategy.materialize(rank, mode)
            else:
                with mode:
                    rank.to_empty(device="cpu")
            made = [(n, _made(t)) for n, t in [*rank.named_parameters(),
                                               *rank.named_buffers()]]
            assert all(type(getattr(t, "_local_tensor", t)) is FakeTensor
                       for t in [*rank.parameters(), *rank.buffers()])
        got.append(made)
    assert got[0] == got[1] and len(got[0]) == 13


def test_empty_fake_is_empty_like_s():
    from fxmem.trace.kernels.meta_kernels import empty_fake

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for t in (torch.empty(4, 6, device="meta").t(), torch.empty(2, 3, 4, device="meta")[:, 1],
              torch.nn.Parameter(torch.empty(3, device="meta", dtype=torch.float16))):
        with mode:
            want = torch.empty_like(t, device="cpu")
        got = empty_fake(t, mode, "cpu")
        assert type(got) is FakeTensor and got.fake_mode is mode
        assert _made(got) == _made(want)


def test_a_shard_off_its_mesh_s_device_is_to_empty_s():
    """A DTensor's fake on a device other than its mesh's (CPU offload over a CUDA mesh: the
    shards on the host) is what ``empty_like`` makes there, not moved to the mesh's device
    (as ``DTensor.from_local`` would move it: the fake GPU's offload runs failed so)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from fxmem.trace.parallel.fsdp import fake_world
    from fxmem.trace.parallel.strategy import _empty

    with fake_world(2, 0) as mesh:
        t = distribute_tensor(torch.empty(6, 4, device="meta"), mesh, [Shard(0)])
        for device in ("cpu", "cuda"):
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            with mode:  # (as Strategy.materialize runs it)
                got = _empty(t, mode, device)
                want = torch.empty_like(t, device=device)
            assert _made(got) == _made(want) and got._local_tensor.device.type == device



# -- symbolic sizes: a contiguous view as the as_strided it is, a pointwise op's output ------
def _sizes_env():
    env = ShapeEnv()
    b, n = (env.create_symintnode(env.create_symbol(
        v, source=ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC), hint=v)
        for v, name in ((4, "b"), (6, "n")))
    return env, b, n


def _expr(v):
    return v.node.expr if isinstance(v, torch.SymInt) else v


def _sym_meta(t):
    """What a fake tensor is, its sizes and strides as expressions (comparing SymInts would
    guard)."""
    return ([_expr(v) for v in t.shape], [_expr(v) for v in t.stride()],
            _expr(t.storage_offset()), t.dtype, t.device, type(t))


VIEWS = [  # (input sizes, transposed?, the view's sizes), of b and n
    (lambda b, n: (b, 16, 64), False, lambda b, n: [b * 16, 64]),
    (lambda b, n: (b, 16, 64), False, lambda b, n: [b, 16, -1, 8]),
    (lambda b, n: (b, 16, 64), False, lambda b, n: [-1, 64]),
    (lambda b, n: (b, 16, 64), False, lambda b, n: [-1]),
    (lambda b, n: (b, n, 64), False, lambda b, n: [b * n, 64]),
    (lambda b, n: (b, n, 64), False, lambda b, n: [b, -1, 8, 8]),
    (lambda b, n: (b, n, 64), False, lambda b, n: [-1, 64]),
    (lambda b, n: (b, n, 64), True, lambda b, n: [b, n, 64]),  # the same sizes: an alias
]


@pytest.mark.parametrize("case", range(len(VIEWS)))
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_contiguous_view_of_symbolic_sizes_is_fake_tensor_mode_s(case, device):
    from fxmem.trace.kernels.meta_kernels import contiguous_view

    sizes, transposed, view = VIEWS[case]
    env, b, n = _sizes_env()
    mode = FakeTensorMode(shape_env=env)
    with mode:
        x = torch.empty(*sizes(b, n), dtype=torch.bfloat16, device=device)
        if transposed:  # the same sizes, strides not contiguous
            x = torch.empty(n, b, 64, dtype=torch.bfloat16, device=device).transpose(0, 1)
        for op in (aten.view.default, aten._unsafe_view.default):
            guards = len(env.guards)
            got = contiguous_view(op, (x, view(b, n)), {})
            assert got is not NOT_RUN and len(env.guards) == guards  # no guard added
            want = op(x, view(b, n))
            assert _sym_meta(got) == _sym_meta(want)
            assert got.untyped_storage()._cdata == x.untyped_storage()._cdata
            assert got.fake_mode is mode


def test_a_view_it_cannot_tell_is_fake_tensor_mode_s():
    from fxmem.trace.kernels.meta_kernels import contiguous_view

    env, b, n = _sizes_env()
    with FakeTensorMode(shape_env=env):
        x = torch.empty(b, n, 64)
        t = x.transpose(1, 2)  # not contiguous: the strides to compute are FakeTensorMode's
        for args in [(t, [b, -1]), (x, [n, -1]),  # b * 64: no run of x's sizes
                     (x, [b, n, 32]), (x, [-1, -1, 64]),  # fewer elements; two -1s
                     (x, [b, n, 64.0])]:
            assert contiguous_view(aten.view.default, args, {}) is NOT_RUN
        assert contiguous_view(aten.view.default, (torch.empty(4, 6), [24]), {}) is NOT_RUN
        assert contiguous_view(aten.reshape.default, (x, [-1]), {}) is NOT_RUN


POINTWISE = [  # (op, the tensors' sizes and dtypes of b and n, other arguments, keywords)
    (aten.mul.Tensor, lambda b, n: [((b, n, 64), torch.bfloat16), ((64,), torch.float32)], (),
     {}),
    (aten.mul.Tensor, lambda b, n: [((b, 1, 64), torch.float32), ((b, n, 64), torch.float32)],
     (), {}),
    (aten.add.Tensor, lambda b, n: [((b, n), torch.float16), ((b, n), torch.float16)], (),
     {"alpha": 2}),
    (aten.neg.default, lambda b, n: [((b, n, 8), torch.bfloat16)], (), {}),
    (aten.pow.Tensor_Scalar, lambda b, n: [((b, n, 8), torch.float32)], (2,), {}),
    (aten.rsqrt.default, lambda b, n: [((b, 8), torch.int64)], (), {}),  # int to float
    (aten.div.Scalar, lambda b, n: [((b, 8), torch.int32)], (3,), {}),
    (aten.silu_backward.default, lambda b, n: [((b, n), torch.bfloat16)] * 2, (), {}),
    (aten.where.self, lambda b, n: [((b, 1, 8), torch.bool), ((b, n, 8), torch.float32),
                                    ((8,), torch.float16)], (), {}),
    (aten.eq.Tensor, lambda b, n: [((b, n), torch.float32), ((n,), torch.float32)], (), {}),
    (aten._to_copy.default, lambda b, n: [((b, n, 8), torch.float32)], (),
     {"dtype": torch.bfloat16}),
    (aten.clone.default, lambda b, n: [((b, n, 8), torch.float32)], (),
     {"memory_format": torch.contiguous_format}),
    (aten.gelu.default, lambda b, n: [((n, b), torch.float32)], (), {"approximate": "tanh"}),
    (aten.clone.default, lambda b, n: [((n, b, 8), torch.float32, (1, n, n * b))], (),
     {"memory_format": torch.contiguous_format}),  # (any strides in: contiguous out)
    (aten._to_copy.default, lambda b, n: [((b, 0, 8), torch.float32, (8, 8, 1))], (),
     {"dtype": torch.float16, "memory_format": torch.contiguous_format}),  # a size 0
    (aten.neg.default, lambda b, n: [((b, 0, 8), torch.float32)], (), {}),  # contiguous, 0
    # not contiguous: the first tensor's dense layout, where it orders every pair of dims
    (aten.neg.default, lambda b, n: [((n, b, 8), torch.bfloat16, (8, n * 8, 1))], (), {}),
    (aten.mul.Tensor, lambda b, n: [((b, 4, n, 8), torch.bfloat16, (n * 32, 8, 32, 1)),
                                    ((b, 1, n, 8), torch.bfloat16)], (), {}),  # q * cos
    (aten.add.Tensor, lambda b, n: [((b, 4, n, 8), torch.float32),
                                    ((b, 4, n, 8), torch.float32, (n * 32, 8, 32, 1))], (),
     {"alpha": 3}),  # the first contiguous, the second not: contiguous out
    (aten.sub.Tensor, lambda b, n: [((b, 4, n, 8), torch.bfloat16, (n * 32, 8, 32, 1)),
                                    ((b, 4, n, 8), torch.float32)], (), {}),  # promoted
    (aten.div.Tensor, lambda b, n: [((n, b), torch.float32, (1, n)), ((b,), torch.float32)],
     (), {}),
    (aten._to_copy.default, lambda b, n: [((b, 4, n, 8), torch.float32, (n * 32, 8, 32, 1))],
     (), {"dtype": torch.bfloat16}),
    (aten.silu_backward.default, lambda b, n: [((n, b, 8), torch.bfloat16, (8, n * 8, 1))] * 2,
     (), {}),
    (aten.where.self, lambda b, n: [((n, b, 8), torch.bool, (8, n * 8, 1)),
                                    ((n, b, 8), torch.float32, (8, n * 8, 1)),
                                    ((8,), torch.float32)], (), {}),  # the others agree
    # gaps (a slice, rotate_half's of a transposed q): dense in the first tensor's order
    (aten.neg.default, lambda b, n: [((b, 4, n, 4), torch.bfloat16, (n * 32, 8, 32, 1))], (),
     {}),
    (aten.neg.default, lambda b, n: [((n, b), torch.float32, (1, n + 1))], (), {}),
]


@pytest.mark.parametrize("case", range(len(POINTWISE)), ids=[str(c[0]) for c in POINTWISE])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_pointwise_op_of_symbolic_sizes_is_fake_tensor_mode_s(case, device):
    from fxmem.trace.kernels.meta_kernels import pointwise

    op, tensors, rest, kwargs = POINTWISE[case]
    env, b, n = _sizes_env()
    mode = FakeTensorMode(shape_env=env)
    with mode:
        args = [torch.empty_strided(s, *strides, dtype=d, device=device) if strides else
                torch.empty(s, dtype=d, device=device) for s, d, *strides in tensors(b, n)]
        guards = len(env.guards)
        got = pointwise(op, (*args, *rest), dict(kwargs))
        assert got is not NOT_RUN and len(env.guards) == guards
        want = op(*args, *rest, **kwargs)
    assert _sym_meta(got) == _sym_meta(want)
    assert got.fake_mode is mode
    assert all(got.untyped_storage()._cdata != a.untyped_storage()._cdata for a in args)


def test_a_pointwise_op_it_cannot_tell_is_fake_tensor_mode_s():
    from fxmem.trace.kernels.meta_kernels import pointwise

    env, b, n = _sizes_env()
    u = env.create_unbacked_symint()
    with FakeTensorMode(shape_env=env):
        x, y = torch.empty(b, n, 8), torch.empty(n, b, 8)
        t = torch.empty(b, 4, n, 8).transpose(1, 2)  # (b, n, 4, 8), not contiguous
        for op, args, kwargs in [
            (aten.neg.default, (torch.empty(n, 1, b).transpose(0, 2),), {}),  # a size 1
            (aten.mul.Tensor, (torch.empty(b, 1, 4, 8), t), {}),  # the first broadcast
            (aten.where.self, (torch.empty(b, n, 4, 8, dtype=torch.bool), t, t), {}),  # the
            # others' layout not the first's, for an op whose decomposition may reorder them
            (aten.neg.default, (torch.empty(b, 8).expand(n, b, 8).transpose(0, 1),), {}),
            (aten.neg.default, (torch.empty_strided((b, n), (n, b)),), {}),  # b or n first
            (aten.add.Tensor, (x, y), {}),  # b against n: FakeTensorMode says what holds
            (aten.mul.Tensor, (x, torch.tensor(2.0)), {}),  # a tensor of no dimensions
            (aten.add_.Tensor, (x, x), {}),  # in place
            (aten.add.Tensor, (torch.empty(4, 8), torch.empty(4, 8)), {}),  # plain sizes
            (aten.clone.default, (x,), {"memory_format": torch.channels_last}),
            (aten._to_copy.default, (x,), {"device": torch.device("meta")}),
            (aten.mm.default, (x[0], x[0].t()), {}),  # not pointwise
            (aten.mul.Tensor, (torch.empty_strided((1, u), (u, 1)), torch.empty(8, 1)),
             {}),  # a count that may be 0: the output's stride Max(u, 1)
        ]:
            assert pointwise(op, args, kwargs) is NOT_RUN, op


FOREACH = [  # (op, each list's tensors' sizes and dtypes, other arguments)
    (aten._foreach_sqrt.default, [[((4, 6), torch.float32), ((3,), torch.bfloat16)]], ()),
    (aten._foreach_add.Scalar, [[((4, 6), torch.bfloat16), ((2, 3, 5), torch.float32)]],
     (2.0,)),
    (aten._foreach_add.List, [[((4, 6), torch.float32), ((3,), torch.bfloat16)],
                              [((4, 6), torch.bfloat16), ((3,), torch.bfloat16)]], ()),
    (aten._foreach_lerp.Scalar, [[((4, 6), torch.float32)], [((4, 6), torch.float32)]],
     (0.1,)),
    (aten._foreach_abs.default, [[((4, 6), torch.int64)]], ()),
]


@pytest.mark.parametrize("case", range(len(FOREACH)), ids=[str(c[0]) for c in FOREACH])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_pointwise_foreach_op_is_fake_tensor_mode_s(case, device):
    from fxmem.trace.kernels.meta_kernels import foreach

    op, lists, rest = FOREACH[case]
    with FakeTensorMode() as mode:
        args = [[torch.empty(s, dtype=d, device=device) for s, d in xs] for xs in lists]
        got = foreach(op, (*args, *rest), {})
        assert got is not NOT_RUN
        want = op(*args, *rest)
    assert [_made(t) for t in got] == [_made(t) for t in want]
    assert all(t.fake_mode is mode for t in got)


def test_a_foreach_op_it_cannot_tell_is_fake_tensor_mode_s():
    from fxmem.trace.kernels.meta_kernels import foreach

    env, b, n = _sizes_env()
    with FakeTensorMode(shape_env=env):
        xs = [torch.empty(4, 6), torch.empty(3)]
        for op, args in [
            (aten._foreach_norm.Scalar, (xs, 2)),  # a reduction
            (aten._foreach_max.default, (xs,)),
            (aten._foreach_add_.Scalar, (xs, 1.0)),  # in place
            (aten._foreach_sqrt.default, ([torch.empty(6, 4).t()],)),  # not contiguous
            (aten._foreach_sqrt.default, ([torch.empty(b, 4)],)),  # a symbolic size
            (aten._foreach_mul.Tensor, (xs, torch.tensor(2.0))),  # a tensor, not a list
            (aten._foreach_add.List, (xs, [torch.empty(6), torch.empty(3)])),  # broadcast
            (aten._foreach_div.ScalarList, (xs, [2.0, 3.0])),
        ]:
            assert foreach(op, args, {}) is NOT_RUN, op


@pytest.mark.parametrize("device", [None, torch.device("cpu"), torch.device("cuda")])
def test_an_empty_tensor_is_fake_tensor_mode_s(device):
    from fxmem.trace.kernels.meta_kernels import empty

    env, b, n = _sizes_env()
    mode = FakeTensorMode(shape_env=env)
    for op, args, kwargs in [
        (aten.empty.memory_format, ([b, n, 8],), {}),
        (aten.empty.memory_format, ([3, 5],), {"dtype": torch.bfloat16}),
        (aten.empty.memory_format, ([b],), {"memory_format": torch.contiguous_format}),
        (aten.empty_strided.default, ([b, n], [1, b]), {"dtype": torch.int64}),
        (aten.empty_strided.default, ([0, 4], [4, 1]), {"pin_memory": False}),
    ]:
        kwargs = {**kwargs, "device": device} if device is not None else kwargs
        with mode:
            got = empty(op, args, kwargs)
            want = op(*args, **kwargs)
        assert got is not NOT_RUN and got.fake_mode is mode
        assert _sym_meta(got) == _sym_meta(want)
        assert _expr(got.untyped_storage().nbytes()) == _expr(want.untyped_storage().nbytes())


def test_an_empty_tensor_it_does_not_make_is_fake_tensor_mode_s():
    from fxmem.trace.kernels.meta_kernels import empty

    with FakeTensorMode():
        for op, args, kwargs in [
            (aten.empty.memory_format, ([2, 3, 4, 5],), {"memory_format": torch.channels_last}),
            (aten.empty.memory_format, ([4],), {"pin_memory": True}),
            (aten.empty.memory_format, ([4],), {"layout": torch.sparse_coo}),
            (aten.zeros.default, ([4],), {}),
        ]:
            assert empty(op, args, kwargs) is NOT_RUN
    assert empty(aten.empty.memory_format, ([4],), {}) is NOT_RUN  # no fake mode


@pytest.mark.parametrize("kind,step", [
    ("llama", dict(optimizer=torch.optim.AdamW, amp=torch.bfloat16, device="cuda",
                   dims={"L": [(0, 1), (1, 1)]})),
    ("gpt2", dict(optimizer=torch.optim.Adam, device="cpu")),
])
def test_a_trace_made_with_the_symbolic_paths_is_the_one_made_without(kind, step,
                                                                      monkeypatch):
    # the tracer takes each path (EagerOps.fake_kernel), and what it records is what
    # FakeTensorMode's own kernels give: every op, storage, size, saved tensor and FLOP
    pytest.importorskip("transformers")
    import fxmem.trace.engine.eager_ops as eager_ops
    from fxmem.trace import trace
    from fxmem.trace.kernels.meta_kernels import _contiguous
    from test_fsdp import _lm_loss
    from test_reuse import _flops, _shape
    from test_reuse_parallel import _lm

    model, _ = _lm(kind, layers=4)
    ids = torch.randint(0, 128, (2, 16))
    taken = {}
    for name in ("contiguous_view", "pointwise", "empty"):
        def counted(func, args, kwargs, _name=name, _path=getattr(eager_ops, name)):
            out = _path(func, args, kwargs)
            taken[_name] = taken.get(_name, 0) + (out is not NOT_RUN)
            if _name == "pointwise" and out is not NOT_RUN and not _contiguous(out):
                taken["led"] = taken.get("led", 0) + 1  # the first tensor's layout
            return out
        monkeypatch.setattr(eager_ops, name, counted)
    fast = trace(model, ids, ids, loss=_lm_loss, **step)
    assert all(taken.get(n, 0) > 0 for n in ("contiguous_view", "pointwise", "empty")), taken
    if kind == "llama":  # its rotary embedding on the transposed queries and keys
        assert taken.get("led", 0) > 0, taken
    for name in ("contiguous_view", "pointwise", "empty"):
        monkeypatch.setattr(eager_ops, name, lambda func, args, kwargs: NOT_RUN)
    plain = trace(model, ids, ids, loss=_lm_loss, **step)
    assert _shape(fast) == _shape(plain)
    assert _flops(fast) == _flops(plain)
