"""DDP and ZeRO-1 per rank (issue 18, part 2): each rank's predicted peak equals a real
multi-process run of the same step (gloo, on this machine's CPU,
fxmem.measure(..., parallel=fxmem.DDP(...))), to the byte, at batch sizes other than the
traced one. DDP's gradient buckets (allocated by its C++ Reducer) count in both from the
step's start."""

import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.trace.parallel.fsdp import DDP
from test_fsdp import STEP, Stack, _batch, _exact, _hf, _lm_loss


def _buckets(report, rank=0):
    """Bytes of each storage the Reducer keeps (its buckets; static_graph's used maps)."""
    return [int(s.size.expr) for s in report.rank(rank).trace.storages
            if s.name.startswith("<DDP reducer>")]


@pytest.mark.parametrize("parallel", [
    DDP(2),
    DDP(4),
    DDP(2, bucket_cap_mb=0.005),
    DDP(2, gradient_as_bucket_view=True),
    DDP(2, static_graph=True),
], ids=lambda p: p.name)
def test_stack_per_rank(parallel):
    r = _exact(Stack(), *_batch(), parallel)
    assert [g.ranks for g in r.groups] == [tuple(range(parallel.world_size))]
    params = sum(p.numel() * 4 for p in Stack().parameters())  # 12400 bytes
    buckets = _buckets(r)
    if parallel.static_graph:  # two int32 maps of one entry per parameter
        assert sorted(buckets)[:2] == [32, 32]
        buckets = sorted(buckets)[2:]
    assert sum(buckets) == params
    # bucket_cap_mb=0.005 (5242 bytes): after the rebuild, in the order the gradients
    # came (head first), the buckets close past the cap: 8680 and 3720 bytes
    assert buckets == ([8680, 3720] if parallel.bucket_cap_mb < 1 else [params])
    # the gradients are views of the buckets, or their own storages beside them
    grads = r.parts(0)["grads"]
    extra = 64 if parallel.static_graph else 0
    assert grads == (params if parallel.gradient_as_bucket_view else 2 * params) + extra


@pytest.mark.parametrize("world", [2, 4])
def test_zero1_per_rank(world):
    """ZeRO-1: each rank keeps Adam's state of its own partition only (ZeRO's greedy one);
    the updated parameters are broadcast in place (nothing allocated)."""
    m = Stack()
    p = DDP(world, zero1=True)
    r = _exact(m, *_batch(), p)
    # 900-element weights over 4 ranks: ranks 0-2 own one each, rank 3 the rest
    assert [g.ranks for g in r.groups] == ([(0,), (1,)] if world == 2 else [(0, 1, 2), (3,)])
    params = list(m.parameters())
    for rank, owned in enumerate(p.partition(m)):
        state = sum(2 * params[i].numel() * 4 + 4 for i in owned)  # exp_avg(_sq), step
        assert r.parts(rank)["optimizer_state"] == state
    full = fxmem.analyze(m, *_batch(), parallel=DDP(world), **STEP)
    assert r.peak_bytes(64) < full.peak_bytes(64)


def test_zero1_runs_the_foreach_optimizer_on_cuda():
    """For a CUDA step, each rank's local Adam under ZeRO-1 is the foreach one, as on a
    GPU: ZeroRedundancyOptimizer copies its own groups' settings (``foreach=None``) into
    the local optimizer's before each step, and on fake tensors None had meant the loop
    over the parameters (on the fake GPU, tests/test_fake_gpu_parallel.py ddp-compiled-
    zero1: 73,400,320 B reserved predicted at B=512 with the loop, 71,303,168 measured)."""
    kw = {**STEP, "device": "cuda"}
    r = fxmem.analyze(Stack(), *_batch(), parallel=DDP(2, zero1=True), **kw)
    for rank in (0, 1):
        ops = {o.op for o in r.rank(rank).trace.ops if o.phase == "optimizer"}
        assert "aten._foreach_sqrt.default" in ops and "aten.sqrt.default" not in ops, ops


def test_zero1_partition_is_zeros():
    """DDP.partition is ZeroRedundancyOptimizer's own (traced over a fake group)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from fxmem.trace.parallel.fsdp import fake_world

    m = Stack(d=7, n=5, out=3)
    for world in (2, 3, 4):
        for rank in range(world):
            with fake_world(world, rank):
                z = ZeroRedundancyOptimizer(list(m.parameters()), torch.optim.SGD, lr=0.1)
                index = {id(q): i for i, q in enumerate(m.parameters())}
                got = [[index[id(q)] for q in g[0]["params"]]
                       for g in z._partition_parameters()]
            assert got == DDP(world, zero1=True).partition(m)


@pytest.mark.parametrize("kind,parallel", [("llama", DDP(2)), ("llama", DDP(2, zero1=True)),
                                           ("gpt2", DDP(2)), ("gpt2", DDP(4, zero1=True))],
                         ids=lambda p: p if isinstance(p, str) else p.name)
def test_language_models(kind, parallel):
    m = _hf(kind)
    ids = torch.randint(0, 128, (2, 16))
    r = _exact(m, ids, ids, parallel, batches=(3, 5), loss=_lm_loss,
               optimizer=torch.optim.AdamW)
    w = parallel.world_size
    assert r.peak_bytes(5) == max(r.peak_bytes(5, rank=k) for k in range(w))


def _shifted_loss(out, y):
    """A causal LM's loss as Hugging Face's makes it: the targets shifted into a new integer
    tensor in the step, which the loss saves for backward."""
    return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), y[:, 1:].contiguous().flatten())


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_targets_made_in_the_step(kind):
    """An integer tensor the step makes and autograd saves (the shifted targets) is remade
    as a fake stand-in in backward, not as one of the Reducer's real integer tensors: its
    sizes are B's (``fxmem analyze hf:gpt2 --ddp 2`` failed so, "SymIntArrayRef expected to
    contain only concrete integers", with every Hugging Face model)."""
    ids = torch.randint(0, 128, (2, 16))
    r = _exact(_hf(kind), ids, ids, DDP(2), batches=(3, 5), loss=_shifted_loss,
               optimizer=torch.optim.AdamW)
    assert r.peak_bytes(5) == max(r.peak_bytes(5, rank=k) for k in range(2))


class _Scaled(nn.Module):
    """A forward that makes a constant of its own (``torch.tensor``) each step."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return (self.fc(x) * torch.tensor([0.5] * 16)).square().mean()


def test_a_constant_made_in_the_step_is_the_step_s():
    """The model's own constants are lifted into the trace as on one GPU (made in the step,
    freed after their use), not run as the Reducer's real bookkeeping and first seen as a
    storage the step started with."""
    from fxmem.trace import trace

    x = torch.randn(4, 16)
    for parallel in (None, DDP(2)):
        t = trace(_Scaled(), x, loss=None, optimizer=torch.optim.SGD, device="cpu",
                  parallel=parallel)
        made = [t.ops[s.created_by].op for s in t.storages if s.created_by >= 0]
        assert "aten.lift_fresh.default" in made, parallel
        assert not [s for s in t.storages
                    if s.created_by < 0 and s.category in ("activation", "temporary")]


class _CausalMath(nn.Module):
    """Attention whose CUDA kernel on a V100 is the math one on every PyTorch (a head dim of
    6, which no fused kernel takes), which makes its causal mask, a bool tensor of L x L,
    from no tensor (Mistral's there on 2.13: its grouped-query heads, which 2.14's
    memory-efficient kernel takes)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(32, 24)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 6).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True).square().mean()


def test_a_mask_made_from_no_tensor_is_the_step_s_not_the_reducer_s():
    """A bool mask made from no tensor (the math attention's causal mask, at a symbolic L) is
    a fake tensor of the step as on one GPU, not run for real as the Reducer's bookkeeping
    (Mistral on a V100 under DDP failed to trace: "SymIntArrayRef expected to contain only
    concrete integers"); at a plain L it had been real, its bytes uncounted."""
    from fxmem.trace import trace

    x = torch.randn(2, 64, 32)
    peaks = {}
    for parallel in (None, DDP(2)):
        r = fxmem.analyze(_CausalMath(), x, loss=None, optimizer=torch.optim.SGD,
                          device="cuda", amp=torch.float16, compute_capability=(7, 0),
                          dims={"L": [(0, 1)]}, parallel=parallel)
        peaks[parallel] = r
        t = trace(_CausalMath(), x, loss=None, optimizer=torch.optim.SGD, device="cuda",
                  amp=torch.float16, compute_capability=(7, 0), parallel=parallel,
                  concrete_batch=2)
        masks = [s for s in t.storages if s.created_by >= 0
                 and t.ops[s.created_by].op == "aten.ones.default"]
        assert [int(s.size.expr) for s in masks] == [64 * 64], parallel
    one, two = peaks[None], peaks[DDP(2)]
    assert "L" in str(two.groups[0].report.peak) and "L" in str(one.peak)


def test_nothing_changes_outside():
    """The user's model keeps its parameters and class; no process group is left."""
    m = Stack()
    before = [(id(p), type(p), p.grad) for p in m.parameters()]
    fxmem.analyze(m, *_batch(), parallel=DDP(2, zero1=True), **STEP)
    fxmem.measure(m, *_batch(), B=2, parallel=DDP(2), **STEP)
    gc.collect()
    assert [(id(p), type(p), p.grad) for p in m.parameters()] == before
    assert type(m) is Stack and not dist.is_initialized()
    assert not hasattr(m, "reducer") and "resize_" not in vars(torch.UntypedStorage)


@pytest.mark.parametrize("make,words", [
    (lambda: DDP(0), "DDP: world_size is a positive int"),
    (lambda: DDP("2"), "DDP: world_size is a positive int"),
    (lambda: DDP(2, bucket_cap_mb=0), "DDP: bucket_cap_mb is a positive number"),
    (lambda: DDP(2, bucket_cap_mb="25"), "DDP: bucket_cap_mb is a positive number"),
    (lambda: DDP(2, static_graph=1), "DDP: static_graph is True or False"),
    (lambda: DDP(2, zero1="yes"), "DDP: zero1 is True or False"),
])
def test_bad_strategies(make, words):
    with pytest.raises(fxmem.InputError, match=words) as e:
        make()
    assert "\n" not in str(e.value)


def test_bad_uses():
    x, y = _batch()
    with pytest.raises(fxmem.InputError, match=r"fxmem.FSDP\(world_size, ...\), "
                                               r"fxmem.DDP\(world_size, ...\)"):
        fxmem.analyze(Stack(), x, y, parallel="ddp", **STEP)
    with pytest.raises(fxmem.InputError, match="on the CPU"):
        fxmem.measure(Stack(), x, y, B=2, parallel=DDP(2), **{**STEP, "device": "cuda"})
    r = fxmem.analyze(Stack(), x, y, parallel=DDP(2), **STEP)
    with pytest.raises(fxmem.InputError, match="rank is an int from 0 to 1"):
        r.rank(2)


def test_names():
    assert fxmem.DDP is DDP and "DDP" in fxmem.__all__
    assert DDP(2, bucket_cap_mb=1, gradient_as_bucket_view=True, zero1=True).name == (
        "DDP over 2 ranks (bucket_cap_mb=1, gradient_as_bucket_view=True, ZeRO-1)")
    assert DDP(2).rank_groups(nn.Linear(2, 2)) == ((0, 1),)


def test_names_and_plans_are_the_users():
    """Parameters are named, and plans written, as in the user's model (``layers.0``, not
    DDP's ``module.layers.0``); a checkpointed DDP step is exact per rank."""
    x, y = _batch()
    m = Stack()
    plan = ["layers.0", "layers.1"]
    r = fxmem.analyze(m, x, y, parallel=DDP(2), checkpoint=plan, **STEP)
    names = [s.name for s in r.rank(0).trace.storages if s.category == "param"]
    assert names[0] == "layers.0.0.weight" and not any(n.startswith("module.") for n in names)
    wrapped = fxmem.apply_checkpoints(Stack(), plan)
    for b in (3, 17):
        measured = fxmem.measure(wrapped, x, y, B=b, parallel=DDP(2), **STEP)
        assert [r.peak_bytes(b, rank=k) for k in range(2)] == [v.peak_bytes for v in measured]
