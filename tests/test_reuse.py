"""Repeated blocks traced once and copied (fxmem.trace.blocks.reuse) read exactly as a
block-by-block trace
and as a real step."""

import copy
import gc
import inspect

import pytest
import torch

import fxmem
from fxmem.trace.plans.regions import Region
from fxmem.trace.blocks.reuse import find_runs
from fxmem.trace import trace
from fxmem.trace.ledger.tracking import freeze_more, frozen_gc
from test_optimizers import OPTIMIZERS
from witness import witness_step
from zoo import gpt2 as zoo_gpt2

transformers = pytest.importorskip("transformers")


def _shape(t):
    """A trace without its storage ids: what liveness, plans and FLOPs read."""
    def n(v):
        return -1 if v is None else v
    ops = [(o.op, o.phase, o.module, o.autograd_node, o.recompute, len(o.out_sids),
            len(o.new_sids), len(o.in_sids), len(o.written_sids)) for o in t.ops]
    st = sorted((s.created_by, str(s.size.expr), n(s.freed_after), s.category, s.name, s.module,
                 s.saved, n(s.unref_after), s.saved_by, str(s.dtype), str(s.shape))
                for s in t.storages)
    packs = sorted((p.at, p.module, n(p.released_after), n(p.unpacked_at), n(p.unpack_order),
                    n(p.dropped_after), t.storages[p.sid].created_by) for p in t.packs)
    calls = sorted((c.path, c.first_op, c.last_op) for c in t.calls)
    # which op reads which storage, by creator op
    reads = [tuple(sorted(t.storages[s].created_by for s in o.in_sids)) for o in t.ops]
    return ops, st, packs, calls, reads, t.guards


def _both(model, inputs, **kw):
    a = trace(model, inputs, **kw)
    b = trace(model, inputs, reuse_blocks=False, **kw)
    return a, b


def _flops(t):
    from fxmem.checkpoint.flops import count_flops
    return count_flops(t)


@pytest.fixture(scope="module")
def gpt2():
    return zoo_gpt2(n_layer=5, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                    bos_token_id=0, eos_token_id=0)


@pytest.mark.parametrize("setup", ["adam", "sgd_no_optimizer", "inference", "bf16", "dims"])
def test_gpt2_copies_equal_a_block_by_block_trace(gpt2, setup):
    ids = torch.randint(0, 128, (4, 16))
    kw = {"adam": dict(optimizer=torch.optim.Adam, device="cuda"),
          "sgd_no_optimizer": dict(device="cpu"),
          "inference": dict(train=False, device="cuda"),
          "bf16": dict(optimizer=torch.optim.AdamW, amp=torch.bfloat16, device="cuda"),
          "dims": dict(optimizer=torch.optim.Adam, device="cuda", dims={"L": [(0, 1), (1, 1)]}),
          }[setup]
    a, b = _both(gpt2, (ids, ids), **kw)
    assert a.reused == tuple(f"model.transformer.h.{i}" for i in (2, 3, 4))
    assert b.reused == ()
    assert _shape(a) == _shape(b)
    assert _flops(a) == _flops(b)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["llama_gqa", "bert", "vit"])
def test_families_with_copied_blocks_match_measure(name, attn):
    from test_hf import _family

    model, inputs = _family(name, attn, layers=4)
    a, b = _both(model, inputs, optimizer=torch.optim.AdamW, device="cpu")
    assert len(a.reused) == 2
    assert _shape(a) == _shape(b)
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu")  # traced at 4
    for bs in (2, 5):
        assert r.peak_bytes(bs) == fxmem.measure(model, inputs, optimizer=torch.optim.AdamW,
                                                 B=bs).peak_bytes, bs


def test_t5_shared_position_bias_is_traced_block_by_block():
    # T5's blocks after the first share one position bias that needs a gradient: the
    # stand-in's gradient for it is not the whole one, so the step is traced again
    from test_hf import _family

    model, inputs = _family("t5", "eager", layers=4)
    t = trace(model, inputs, optimizer=torch.optim.AdamW, device="cpu")
    assert t.reused == ()
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu")
    assert r.peak_bytes(3) == fxmem.measure(model, inputs, optimizer=torch.optim.AdamW,
                                            B=3).peak_bytes


class _Block(torch.nn.Module):
    def __init__(self, idx, odd_wider=False):
        super().__init__()
        self.layer_idx = idx
        self.odd_wider = odd_wider
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        if self.odd_wider and self.layer_idx % 2:  # index-dependent: not a copy of block 1
            y = torch.cat([y, y], 1)[:, :16].contiguous()
        return x + y


class _Stack(torch.nn.Module):
    def __init__(self, n=5, odd_wider=False, keep=False, proj=True):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16) if proj else torch.nn.Identity()
        self.blocks = torch.nn.ModuleList(_Block(i, odd_wider) for i in range(n))
        self.keep = keep

    def forward(self, x):
        kept = []
        x = self.proj(x)
        for b in self.blocks:
            x = b(x)
            if self.keep:
                kept.append(x * 2)  # reads each block's output outside the next block
        # x.square(): the last block's gradient is dense, as the others' (a .sum()'s is
        # expanded, and blocks with gradients laid out otherwise are not copied)
        x = x.square()
        return x.sum() + sum(k.sum() for k in kept) if kept else x.sum()


DIFFERING = ["plain", "index_dependent", "output_read_outside", "first_input_needs_no_grad"]


def differing(kind: str) -> tuple:
    """A :class:`_Stack` of ``kind`` (one of :data:`DIFFERING`) and the blocks reuse copies
    in it: the first block of a stack fed the model's input computes no input gradient, so
    it does not run the ops the second does (the run starts at the second block); blocks
    whose sizes depend on their index, or whose outputs are read outside the next block,
    are not copied."""
    model = _Stack(odd_wider=kind == "index_dependent", keep=kind == "output_read_outside",
                   proj=kind != "first_input_needs_no_grad")
    return model, {"plain": ("blocks.2", "blocks.3", "blocks.4"),
                   "first_input_needs_no_grad": ("blocks.3", "blocks.4")}.get(kind, ())


@pytest.mark.parametrize("kind", DIFFERING)
def test_blocks_that_differ_fall_back_and_stay_exact(kind):
    model, copied = differing(kind)
    x = torch.randn(4, 16)
    a, b = _both(model, (x,), loss=None, optimizer=torch.optim.SGD, device="cpu")
    assert a.reused == copied
    assert _shape(a) == _shape(b)
    r = fxmem.analyze(model, x, optimizer=torch.optim.SGD, device="cpu")
    for bs in (2, 7):
        assert r.peak_bytes(bs) == fxmem.measure(model, x, optimizer=torch.optim.SGD,
                                                 B=bs).peak_bytes


H = "model.transformer.h"
PLANS = {  # plan -> the blocks copied: a run is cut where the plan treats blocks otherwise
    "whole": ([f"{H}.{i}" for i in range(5)], (2, 3, 4)),
    "first_three": ([f"{H}.{i}" for i in range(3)], (2,)),
    "inner": ([f"{H}.{i}.mlp" for i in range(5)], (2, 3, 4)),
    "selective": ([Region((f"{H}.{i}",), save=(("aten.mm.default", 0),)) for i in range(5)],
                  (2, 3, 4)),
    "group": ([Region((f"{H}.0", f"{H}.1")), *(f"{H}.{i}" for i in range(2, 5))], (4,)),
    # blocks treated alike are one run wherever they are: 0, 1, 3 and 4 checkpointed whole
    "mixed": ([f"{H}.0", f"{H}.1", f"{H}.2.mlp", f"{H}.3", f"{H}.4"], (3, 4)),
    "apart": ([f"{H}.0", f"{H}.2", f"{H}.4"], (4,)),  # and 1 and 3, none: traced
}


@pytest.mark.parametrize("name", PLANS)
def test_checkpointed_blocks_are_copied_as_the_plan_runs_them(gpt2, name):
    # a copy of the second block, its re-run in backward included, reads as each later
    # block of the same treatment
    plan, copied = PLANS[name]
    ids = torch.randint(0, 128, (4, 16))
    a, b = _both(gpt2, (ids, ids), optimizer=torch.optim.Adam, device="cuda", checkpoint=plan)
    assert a.reused == tuple(f"{H}.{i}" for i in copied)
    assert _shape(a) == _shape(b)
    assert _flops(a) == _flops(b)


def test_a_copied_checkpointed_stack_matches_measure():
    model, x = _Stack(6), torch.randn(4, 16)
    plan = [f"blocks.{i}" for i in range(6)]
    kw = dict(loss=None, optimizer=torch.optim.SGD)
    r = fxmem.analyze(model, x, **kw, device="cpu", checkpoint=plan)
    assert r.trace.reused == ("blocks.2", "blocks.3", "blocks.4", "blocks.5")
    assert any(o.recompute for o in r.trace.ops if o.module == "blocks.5")
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    for bs in (2, 7):
        assert r.peak_bytes(bs) == fxmem.measure(wrapped, x, **kw, B=bs).peak_bytes
        # and the witness, which shares no code with the trace (tests/witness.py)
        assert r.peak_bytes(bs) == witness_step(wrapped, (x,), (), None, torch.optim.SGD,
                                                B=bs).peak_bytes


class _Gelu(torch.nn.Module):
    """A GELU holding a ``functools.partial`` of its own, as Hugging Face's ``GELUTanh``
    (Gemma's ``gelu_pytorch_tanh``) does in every block."""

    def __init__(self, approximate="tanh"):
        super().__init__()
        import functools

        self.act = functools.partial(torch.nn.functional.gelu, approximate=approximate)

    def forward(self, x):
        return self.act(x)


def test_blocks_holding_partials_of_their_own_are_copied_as_alike():
    """Blocks whose attributes are ``functools.partial`` objects of their own, of the same
    function and arguments, are alike (copied, the trace as a block-by-block one); of other
    arguments, not."""
    def stack(*approx):  # (a head after the blocks: the last one's gradient not sum()'s)
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), _Gelu(a))
                                     for a in approx], torch.nn.Linear(8, 2))
    assert [r.paths for r in find_runs(stack(*["tanh"] * 4))] == [("0", "1", "2", "3")]
    assert find_runs(stack("tanh", "none", "tanh", "none")) == []
    a, b = _both(stack(*["tanh"] * 4), torch.randn(4, 8), loss=lambda o: o.sum(),
                 optimizer=torch.optim.Adam, device="cpu")
    assert a.reused and not b.reused
    assert _shape(a) == _shape(b)


def test_find_runs_groups_identical_siblings_only():
    seq = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)], torch.nn.Linear(4, 8),
                              *[torch.nn.Linear(8, 8) for _ in range(2)])
    assert [r.paths for r in find_runs(seq)] == [("0", "1", "2")]
    stack = _Stack(4)
    assert [r.paths for r in find_runs(stack)] == [tuple(f"blocks.{i}" for i in range(4))]
    stack.blocks[3].register_forward_hook(lambda *a: None)  # a hook makes a block different
    assert [r.paths for r in find_runs(stack)] == [("blocks.0", "blocks.1", "blocks.2")]
    shared = torch.nn.Linear(4, 4)
    assert find_runs(torch.nn.Sequential(shared, shared, shared)) == []  # one module thrice


def test_frozen_gc_freezes_once_when_nested_and_still_collects_new_garbage():
    # A frozen object freed by reference counting leaves the permanent generation (another
    # thread, such as pytest-xdist's, can free some at any time: CI saw the count fall by 2),
    # so inside the block the count can only fall; a second freeze would add made's lists.
    freeze = gc.get_freeze_count()
    with frozen_gc():
        inner = gc.get_freeze_count()
        assert inner >= freeze
        made = [[] for _ in range(1000)]  # a second freeze would take these too
        with frozen_gc():  # analyze runs trace: one freeze, one unfreeze
            assert inner - len(made) < gc.get_freeze_count() <= inner
        del made
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # garbage made inside the block is collected
        assert gc.get_freeze_count() <= inner
    assert gc.get_freeze_count() == freeze
    fxmem.measure(torch.nn.Linear(4, 2), torch.randn(3, 4), loss=lambda o: o.sum(), B=2)
    assert gc.get_freeze_count() == freeze


def test_freeze_more_exempts_what_was_made_until_the_block_ends():
    """Inside fxmem's outermost frozen_gc block (one that froze), freeze_more adds the
    objects made since (a finished trace) to the frozen ones; the block's end unfreezes
    them all, and outside one it does nothing."""
    freeze = gc.get_freeze_count()
    assert freeze == 0  # no test leaves objects frozen
    with frozen_gc():
        inner = gc.get_freeze_count()
        made = [[] for _ in range(1000)]
        with frozen_gc():
            freeze_more()  # nested: the outer block froze, so this one may freeze more
        assert gc.get_freeze_count() >= inner + len(made) - 10  # (a few freed by others)
    assert gc.get_freeze_count() == freeze
    freeze_more()
    assert gc.get_freeze_count() == freeze


def test_tracing_leaves_the_model_and_the_collector_as_they_were(gpt2):
    ids = torch.randint(0, 128, (4, 16))
    freeze = gc.get_freeze_count()
    trace(gpt2, (ids, ids), optimizer=torch.optim.Adam, device="cpu")
    assert all("forward" not in vars(m) for m in gpt2.modules())
    assert gc.get_freeze_count() == freeze
    model = _Stack(odd_wider=True)  # the fall-back path too
    trace(model, (torch.randn(4, 16),), optimizer=torch.optim.SGD, device="cpu")
    assert all("forward" not in vars(m) for m in model.modules())
    assert gc.get_freeze_count() == freeze


class _AttentionBlock(torch.nn.Module):
    """torchvision's ViT block in small: nn.MultiheadAttention(batch_first=True) returns
    its output transposed back from (S, B, D), so the block's output is laid out (S, B, D)
    while its gradient is contiguous."""

    def __init__(self, d=16):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        h = self.ln(x)
        h, _ = self.attn(h, h, h, need_weights=False)
        x = h + x
        return x + self.fc(x)


class _CatBiasBlock(torch.nn.Module):
    """BEiT's attention bias: ``cat(q_bias, k_bias, v_bias)`` with a zero ``k_bias`` buffer,
    so q_bias's and v_bias's gradients are views of one buffer three times their size."""

    def __init__(self, d=16):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.q_bias = torch.nn.Parameter(torch.zeros(d))
        self.v_bias = torch.nn.Parameter(torch.zeros(d))
        self.register_buffer("k_bias", torch.zeros(d), persistent=False)

    def forward(self, x):
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        q, k, v = torch.nn.functional.linear(x, self.qkv.weight, bias).chunk(3, -1)
        return x + torch.tanh(q) * k + v


@pytest.mark.parametrize("block", [_AttentionBlock, _CatBiasBlock])
def test_blocks_whose_gradients_a_stand_in_cannot_make_are_traced_one_by_one(block):
    # a stand-in makes its input's gradient with the input's strides and each parameter's
    # gradient as a tensor of its own; where the real block's differ, the step is traced
    # block by block (else ViT's blocks copy a reshape's clone, BEiT's lose 2/3 of the
    # q/v bias gradients' buffer)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), *[block() for _ in range(5)])
    x = torch.randn(4, 6, 16)
    kw = dict(loss=lambda out: out.square().mean(), optimizer=torch.optim.Adam, device="cpu")
    a, b = _both(model, (x,), **kw)
    assert _shape(a) == _shape(b)
    r = fxmem.analyze(model, x, **kw)
    for bs in (2, 5):
        assert r.peak_bytes(bs) == fxmem.measure(model, x, **kw, B=bs).peak_bytes


class _PairBlock(torch.nn.Module):
    """A block returning ``(hidden, None)``, as Hugging Face layers do with
    ``output_attentions=False`` (transformers' Hiera)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.fc(x)), None


class _PairStack(torch.nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_PairBlock() for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x, attn = b(x)
        return x


def test_copied_blocks_that_return_none_beside_a_tensor():
    m, x = _PairStack(), torch.randn(4, 16)
    kw = dict(loss=lambda o: o.sum(), optimizer=torch.optim.Adam, device="cpu")
    r = fxmem.analyze(m, (x,), **kw)
    for b in (3, 7):
        assert r.peak_bytes(b) == fxmem.measure(m, (x,), **kw, B=b).peak_bytes


def _through_the_fake_cache(monkeypatch) -> list:
    """The ops FakeTensorMode's dispatch cache is asked for from now on, in order."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = []
    orig = FakeTensorMode._cached_dispatch_impl

    def spy(self, func, *args):
        seen.append(func)
        return orig(self, func, *args)
    monkeypatch.setattr(FakeTensorMode, "_cached_dispatch_impl", spy)
    return seen


@pytest.mark.parametrize("plan, real, cached, copied",
                         [((), 2, False, range(2, 7)), ((2, 3), 4, True, (4, 5, 6))])
def test_the_fake_cache_is_on_where_enough_blocks_are_traced_for_real(monkeypatch, plan,
                                                                     real, cached, copied):
    # FakeTensorMode's dispatch cache costs more than it saves where a forward op repeats
    # about twice (two blocks traced, the others copied) and pays where a plan cuts the
    # runs into pieces whose blocks are traced for real (tracer.CACHED_FROM)
    from fxmem.trace.blocks.reuse import by_plan, traced_for_real

    seen = _through_the_fake_cache(monkeypatch)
    model, plan = _Stack(7), [f"blocks.{i}" for i in plan]
    runs = find_runs(model)
    assert traced_for_real(runs, by_plan(runs, plan)) == real
    t = trace(model, torch.randn(4, 16), loss=None, optimizer=torch.optim.SGD, device="cpu",
              checkpoint=plan)
    assert t.reused == tuple(f"blocks.{i}" for i in copied)
    assert (torch.ops.aten.addmm.default in seen) == cached


def test_views_are_made_without_the_fake_cache_where_it_is_on(monkeypatch):
    # a view found in FakeTensorMode's cache is rebuilt from the entry's size expressions,
    # dearer than making it (fxmem.trace.engine.eager_ops._cache_off_for): with the cache
    # on (four blocks traced for real), the step's other ops use it and its views do not
    # (the weights' transposes; a view inside another op's kernel is that op's)
    seen = _through_the_fake_cache(monkeypatch)
    t = trace(_Stack(7), torch.randn(4, 16), loss=None, optimizer=torch.optim.SGD,
              device="cpu", checkpoint=["blocks.2", "blocks.3"])
    assert "aten.t.default" in {op.op for op in t.ops}
    assert torch.ops.aten.addmm.default in seen and torch.ops.aten.t.default not in seen


def _stack_of_blocks(n=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
                                 for _ in range(n)], torch.nn.Linear(8, 2))


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_optimizer_state_of_copied_blocks_is_the_state_of_a_full_step(name, impl):
    """The optimizer's state step over the blocks traced for real, the stand-ins' state
    copied from their pattern block's (fxmem.trace.blocks.optimizer_state): the trace is
    the one where every parameter was stepped, for every torch.optim optimizer it copies,
    foreach or not, fused where the optimizer has it."""
    from fxmem.trace.blocks.optimizer_state import COPIED

    flag = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True),
            "fused": dict(fused=True)}[impl]
    make = OPTIMIZERS[name]
    if impl == "fused" and "fused" not in inspect.signature(
            type(make(torch.nn.Linear(1, 1).parameters())).__init__).parameters:
        pytest.skip(f"{name} has no fused implementation")
    assert type(make(torch.nn.Linear(1, 1).parameters())) in COPIED
    a, b = _both(_stack_of_blocks(5), torch.randn(4, 8), loss=lambda o: o.sum(),
                 optimizer=lambda p: make(p, **flag), device="cpu")
    assert a.reused == ("3", "4") and not b.reused  # (block 0, fed the input, runs as is)
    assert _shape(a) == _shape(b)
