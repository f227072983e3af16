"""A model the user wrapped already, over a fake process group of their own (issue 18),
analysed as it is: its rank's prediction equals fxmem's own wrapping of the unwrapped
model with the same spec (``parallel=``) and the real multi-process run of that spec
(gloo, fxmem.measure), to the byte, at batch sizes other than the traced one. The user's
model and process group are left as they were; unsupported wrappings are one-line errors.

Every test that initialises a process group does so through the ``world`` fixture, which
destroys it afterwards."""

import gc
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

import fxmem
from fxmem import DDP, FSDP, TP, Parallel
from fxmem.trace.parallel.strategy import Strategy
from test_fsdp import STEP, Stack, _batch, _hf, _lm_loss
from test_tp import (BLOCK_PLAN, LLAMA_PLAN, MLP, MLP_PLAN, UNEVEN_PLAN, Blocks, _blocks_batch,
                     _mlp_batch, _seq_loss)


@pytest.fixture
def world():
    """``world(rank, size, mesh_shape=None, names=None)``: the user's fake process group
    (torch.testing's FakeStore), and its CPU device mesh; destroyed after the test."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(rank, size, mesh_shape=None, names=None):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)
        return init_device_mesh("cpu", mesh_shape or (size,), mesh_dim_names=names)

    hook = sys.excepthook  # init_process_group wraps it; destroying the group does not undo it
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.excepthook = hook


def _state():
    """What torch.distributed holds: the default group, its rank and size, every group."""
    from torch.distributed.distributed_c10d import _world

    return (dist.is_initialized(), dist.get_rank(), dist.get_world_size(), dist.get_backend(),
            sorted(map(id, _world.pg_map)))


def _model_state(m):
    """The user's model as fxmem must leave it: class of each module, each parameter's
    identity, type, shape, local shape and values, each module's hooks."""
    def local(p):
        return getattr(p, "_local_tensor", p)
    return ([(n, type(x)) for n, x in m.named_modules()],
            [(n, id(p), type(p), tuple(p.shape), tuple(local(p).shape),
              None if p.is_meta else _bytes(local(p))) for n, p in m.named_parameters()],
            [(n, [dict(getattr(x, k)) for k in ("_forward_pre_hooks", "_forward_hooks",
                                                  "_backward_hooks", "_state_dict_hooks")])
             for n, x in m.named_modules()])


def _bytes(t):
    """A tensor's values as bytes (a fake group's scatter leaves shards uninitialised:
    NaNs compare as bytes)."""
    return bytes(t.detach().contiguous().view(-1).view(torch.uint8).numpy())


def _same(a, b):
    assert a == b


def _exact_as_wrapped(world, make, wrap, spec, ranks, inputs, targets, batches=(3, 17),
                      device="meta", mesh=None, **step):
    """For each rank of ``ranks``: the user's model, made by ``make`` on ``device`` and
    wrapped by ``wrap(model, mesh)`` on rank's fake group, analysed as it is, equals the
    unwrapped model analysed with ``parallel=spec`` for that rank and the real gloo run of
    ``spec``, at each of ``batches``. Returns the last rank's report."""
    step = {**STEP, **step}
    reference = fxmem.analyze(make(), inputs, targets, parallel=spec, **step)
    # read before the user's group exists: a B below where the formulas hold is traced
    # over fxmem's own fake group (fxmem.analyze)
    expected = {(b, r): reference.peak_bytes(b, rank=r) for b in batches for r in ranks}
    measured = {b: fxmem.measure(make(), inputs, targets, B=b, parallel=spec, **step)
                for b in batches}
    for rank in ranks:
        m_mesh = world(rank, spec.world_size, *(mesh or ()))
        with torch.device(device):
            model = make()
        model = wrap(model, m_mesh) or model
        before, dist_before = _model_state(model), _state()
        report = fxmem.analyze(model, inputs, targets, **step)
        gc.collect()
        _same(_model_state(model), before)
        assert _state() == dist_before
        assert report.world_size == spec.world_size and report.strategy.rank == rank
        assert report.strategy.name.endswith(f"as wrapped (rank {rank} of "
                                             f"{spec.world_size})")
        assert [g.ranks for g in report.groups] == [(rank,)]
        for b in batches:
            got = report.peak_bytes(b, rank=rank)
            assert got == expected[b, rank] == measured[b][rank].peak_bytes, (rank, b)
        dist.destroy_process_group()
    return report


def _per_block(reshard=True, mp=None, blocks=lambda m: m.layers, root=True):
    """The FSDP2 recipe: fully_shard each block, then the root."""
    def wrap(model, mesh):
        kw = {"mesh": mesh, "reshard_after_forward": reshard,
              "mp_policy": mp or MixedPrecisionPolicy()}
        for block in blocks(model):
            fully_shard(block, **kw)
        fully_shard(model, **kw)
    return wrap


@pytest.mark.parametrize("spec,ranks,device,wrap", [
    (FSDP(4), (0, 3), "meta", _per_block()),
    (FSDP(2, reshard_after_forward=False), (1,), "cpu", _per_block(reshard=False)),
    (FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32), (0,), "cpu",
     _per_block(mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                        reduce_dtype=torch.float32))),
], ids=["W4-reshard-meta", "W2-no-reshard-cpu", "W2-bf16-fp32"])
def test_fsdp2_stack(world, spec, ranks, device, wrap):
    report = _exact_as_wrapped(world, Stack, wrap, spec, ranks, *_batch(), device=device)
    assert report.strategy.name.startswith(f"FSDP2 over {spec.world_size} ranks")


def test_fsdp2_default_options(world):
    """``fully_shard(block)`` then ``fully_shard(model)`` with no options (the root's
    reshard_after_forward left to FSDP2): as fxmem.FSDP(W) wraps it."""
    def wrap(model, mesh):
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
    _exact_as_wrapped(world, Stack, wrap, FSDP(2), (1,), *_batch())


def test_fsdp2_llama(world):
    ids = torch.randint(0, 128, (2, 16))
    _exact_as_wrapped(world, lambda: _hf("llama"),
                      _per_block(blocks=lambda m: m.model.layers), FSDP(2), (1,), ids, ids,
                      batches=(3, 5), loss=_lm_loss, optimizer=torch.optim.AdamW)


class Recipe(Strategy):
    """The user's own wrapping code as a strategy, for the reference and the real run:
    fxmem.analyze(..., parallel=Recipe(...)) runs ``wrap`` on its meta copy over its fake
    group, fxmem.measure in each gloo process on the real copy."""

    def __init__(self, world_size, wrap, name):
        self.world_size, self.wrap, self.name = world_size, wrap, name

    def apply(self, model, mesh):
        self.wrap(model, mesh)
        return model

    def rank_groups(self, model):
        return tuple((r,) for r in range(self.world_size))


def _torchtitan(model, mesh):
    """torchtitan's recipe: every block but the last resharded after forward (the last is
    needed at once in backward), the root's option left to FSDP2, and each block told to
    prefetch the next one's all-gather in forward (FSDPModule's setter, after
    fully_shard)."""
    n = len(model.layers)
    for i, block in enumerate(model.layers):
        fully_shard(block, mesh=mesh, reshard_after_forward=i < n - 1)
    fully_shard(model, mesh=mesh)
    for a, b in zip(model.layers, model.layers[1:]):
        a.set_modules_to_forward_prefetch([b])


def _mixed(model, mesh):
    """Options that change the peak: the first block kept gathered after forward, the
    others not, and prefetching from the first to the third."""
    for i, block in enumerate(model.layers):
        fully_shard(block, mesh=mesh, reshard_after_forward=i > 0)
    fully_shard(model, mesh=mesh)
    model.layers[0].set_modules_to_forward_prefetch([model.layers[2]])


def test_fsdp2_per_block_options(world):
    """Options no fxmem.FSDP spec has (reshard per block, prefetching and resharding set
    after fully_shard) are reproduced: the copy's step equals the real run of the same
    code."""
    _exact_as_wrapped(world, Stack, _torchtitan, Recipe(4, _torchtitan, "torchtitan"), (3,),
                      *_batch())
    mixed = _exact_as_wrapped(world, Stack, _mixed, Recipe(4, _mixed, "mixed"), (3,), *_batch())
    # and these matter: the same blocks with one option for all predict otherwise
    uniform = fxmem.analyze(Stack(), *_batch(), parallel=FSDP(4), **STEP)
    assert uniform.peak_bytes(17, rank=3) != mixed.peak_bytes(17, rank=3)


def test_after_training_steps(world):
    """A wrapped model the user has run steps with (FSDP2's lazy init done, the root's
    reshard option settled, Adam's state made) is analysed as before its first step."""
    x, y = _batch()
    world(1, 2)
    m = Stack()
    for block in m.layers:
        fully_shard(block)
    fully_shard(m)
    before = fxmem.analyze(m, x, y, **STEP)
    opt = torch.optim.Adam(m.parameters())
    for _ in range(2):
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad()
    after = fxmem.analyze(m, x, y, **STEP)
    assert [after.peak_bytes(b) for b in (3, 17)] == [before.peak_bytes(b) for b in (3, 17)]


def test_tp(world):
    """parallelize_module with a plan, evenly (W = 2) and unevenly split (30 rows over 4:
    the last rank holds 6 in a padded storage of 8)."""
    torch.manual_seed(0)
    _exact_as_wrapped(world, MLP, lambda m, mesh: parallelize_module(m, mesh, MLP_PLAN),
                      TP(2, MLP_PLAN), (1,), *_mlp_batch(), device="cpu")
    torch.manual_seed(0)
    _exact_as_wrapped(world, lambda: MLP(hidden=30),
                      lambda m, mesh: parallelize_module(m, mesh, UNEVEN_PLAN),
                      TP(4, UNEVEN_PLAN), (3,), *_mlp_batch(), device="cpu")


def test_tp_llama(world):
    ids = torch.randint(0, 128, (2, 16))
    _exact_as_wrapped(world, lambda: _hf("llama"),
                      lambda m, mesh: parallelize_module(m, mesh, LLAMA_PLAN),
                      TP(2, LLAMA_PLAN), (0,), ids, ids, batches=(3, 5), device="cpu",
                      loss=_lm_loss, optimizer=torch.optim.AdamW)


def test_fsdp_x_tp(world):
    """TP on mesh["tp"], then FSDP2 on mesh["dp"] of a (2, 2) mesh, as torchtitan does."""
    def wrap(model, mesh):
        parallelize_module(model, mesh["tp"], BLOCK_PLAN)
        for block in model.layers:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])

    torch.manual_seed(0)
    r = _exact_as_wrapped(world, Blocks, wrap, Parallel(fsdp=FSDP(2), tp=TP(2, BLOCK_PLAN)),
                          (3,), *_blocks_batch(), device="cpu", mesh=((2, 2), ("dp", "tp")),
                          loss=_seq_loss)
    assert r.strategy.name == "FSDP2 over 2 ranks x TP over 2 ranks, as wrapped (rank 3 of 4)"


@pytest.mark.parametrize("options,spec", [
    (dict(bucket_cap_mb=25), DDP(2)),
    (dict(bucket_cap_mb=0.005, gradient_as_bucket_view=True),
     DDP(2, bucket_cap_mb=0.005, gradient_as_bucket_view=True)),
], ids=["default", "small-buckets-views"])
def test_ddp(world, options, spec):
    """DDP's options read back: every rank (a replica each) reported, as fxmem.DDP."""
    x, y = _batch()
    reference = fxmem.analyze(Stack(), x, y, parallel=spec, **STEP)
    measured = {b: fxmem.measure(Stack(), x, y, B=b, parallel=spec, **STEP) for b in (3, 17)}
    world(1, 2)
    model = torch.nn.parallel.DistributedDataParallel(Stack(), **options)
    before, dist_before = _model_state(model), _state()
    report = fxmem.analyze(model, x, y, **STEP)
    _same(_model_state(model), before)
    assert _state() == dist_before
    assert report.strategy.name == f"{spec.name}, as wrapped"
    assert [g.ranks for g in report.groups] == [(0, 1)]
    for b in (3, 17):
        assert [report.peak_bytes(b, rank=k) for k in (0, 1)] == \
            [reference.peak_bytes(b, rank=k) for k in (0, 1)] == \
            [m.peak_bytes for m in measured[b]]


def test_unsupported(world):
    x, y = _batch()
    mesh = world(0, 2)
    m = Stack()
    for block in m.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    with pytest.raises(fxmem.InputError, match=r"parallel=FSDP2 over 2 ranks was given for "
                       r"a model wrapped already \(FSDP2 over 2 ranks, as wrapped"):
        fxmem.analyze(m, x, y, parallel=FSDP(2), **STEP)
    with pytest.raises(fxmem.InputError, match="measure .*unwrapped model"):
        fxmem.measure(m, x, y, B=2, **STEP)
    with pytest.raises(fxmem.InputError, match="whatif .*unwrapped model"):
        fxmem.whatif(m, x, y, B=2, budget_bytes=2**20, **STEP)
    with pytest.raises(fxmem.InputError, match=r"rank 1 is not in this report \(ranks 0: FSDP2"):
        fxmem.analyze(m, x, y, **STEP).rank(1)
    ddp = torch.nn.parallel.DistributedDataParallel(Stack(), find_unused_parameters=True)
    with pytest.raises(fxmem.InputError, match="find_unused_parameters"):
        fxmem.analyze(ddp, x, y, **STEP)
    with pytest.raises(fxmem.InputError, match="DataParallel"):
        fxmem.analyze(nn.DataParallel(Stack()), x, y, **STEP)
    engine = type("DeepSpeedEngine", (nn.Module,), {"__module__": "deepspeed.runtime.engine"})
    with pytest.raises(fxmem.InputError, match="DeepSpeed engine"):
        fxmem.analyze(engine(), x, y, **STEP)
    dist.destroy_process_group()
    with pytest.raises(fxmem.InputError, match="process group that is destroyed"):
        fxmem.analyze(m, x, y, **STEP)


@pytest.mark.parametrize("wrap,words", [
    (lambda m, mesh: fully_shard(m, mesh=mesh), r"HSDP or on an SPMD mesh"),
    (lambda m, mesh: fully_shard(m, mesh=mesh["b"], reshard_after_forward=2),
     r"reshards after forward to 2 ranks \(an int reshard_after_forward\)"),
    (lambda m, mesh: _replicate(m), r"ReplicateStack at '' is not fully_shard's"),
], ids=["hsdp", "int-reshard", "replicate"])
def test_fsdp2_options_refused(world, wrap, words):
    mesh = world(0, 8, (2, 4), ("a", "b"))
    m = Stack()
    wrap(m, mesh)
    with pytest.raises(fxmem.InputError, match=words) as e:
        fxmem.analyze(m, *_batch(), **STEP)
    assert "\n" not in str(e.value)


def _replicate(m):
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(m)


def test_parallel_with_a_group_of_ones_own(world):
    """parallel= for an unwrapped model while the user's group is initialised: fxmem's own
    fake group cannot be made beside it; the message says what to do."""
    world(0, 2)
    with pytest.raises(fxmem.InputError, match="initialised already.*without parallel="):
        fxmem.analyze(Stack(), *_batch(), parallel=FSDP(2), **STEP)
    assert _state()[:3] == (True, 0, 2)


def test_fsdp1_is_refused(world):
    from torch.distributed.fsdp import FullyShardedDataParallel

    world(0, 2)
    m = FullyShardedDataParallel(Stack(), device_id=torch.device("cpu"))
    with pytest.raises(fxmem.InputError, match=r"FSDP1 \(FullyShardedDataParallel\) .*"
                       r"parallel=fxmem.FSDP"):
        fxmem.analyze(m, *_batch(), **STEP)


def test_a_real_group_is_refused(tmp_path):
    """FSDP2 over a real (gloo) group: a trace cannot run its collectives."""
    hook = sys.excepthook
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        m = Stack()
        fully_shard(m)
        with pytest.raises(fxmem.InputError, match="real 'gloo' process group of 1 ranks"):
            fxmem.analyze(m, *_batch(), **STEP)
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def test_an_unwrapped_model_is_not_touched():
    """No process group, no wrapping: the usual one-GPU report."""
    r = fxmem.analyze(Stack(), *_batch(), **STEP)
    assert isinstance(r, fxmem.Report) and not dist.is_initialized()
