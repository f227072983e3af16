"""Repeated blocks that take turns with other blocks (fxmem.trace.blocks.reuse.find_runs):
Gemma 2's layers alternate sliding-window and full attention, Gemma 3's take five sliding
ones to each full one. Each kind is a run of its own, its first two blocks traced and the
rest copied; the trace reads exactly as a block-by-block one, on one GPU, under a
checkpoint plan, FSDP2 and DDP, and as a real step."""

import pytest
import torch

import fxmem
from fxmem.trace import trace
from fxmem.trace.blocks.reuse import find_runs
from fxmem.trace.parallel.fsdp import DDP, FSDP
from test_fsdp import _lm_loss
from test_reuse import _flops
from test_reuse_ddp_tp import _named
from test_reuse_parallel import _full

transformers = pytest.importorskip("transformers")

S = "model.layers"


def _gemma(kind: str, layers: int):
    torch.manual_seed(0)
    small = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 max_position_embeddings=64, sliding_window=8)
    if kind == "gemma2":
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**small))
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**small))


def test_blocks_that_take_turns_make_a_run_each_copied_exactly():
    alternating = torch.nn.Sequential(*[torch.nn.Linear(4, 5) if k % 2 else
                                        torch.nn.Linear(5, 4) for k in range(7)])
    assert [r.paths for r in find_runs(alternating)] == [("0", "2", "4", "6"), ("1", "3", "5")]
    assert [r.nexts for r in find_runs(alternating)] == [("1", "3", "5", None), ("2", "4", "6")]
    x = torch.randn(4, 5)
    kw = dict(loss=lambda out: out.square().sum(), optimizer=torch.optim.Adam, device="cpu")
    a, b = trace(alternating, x, **kw), trace(alternating, x, reuse_blocks=False, **kw)
    # (the first block gets the model's input, no gradient: its run starts at its second)
    assert a.reused == ("5", "6")
    assert _full(a) == _full(b)
    # blocks without parameters make runs of neighbours only
    acts = torch.nn.Sequential(*[torch.nn.Linear(4, 4) if k % 2 else torch.nn.ReLU()
                                 for k in range(6)], *[torch.nn.ReLU() for _ in range(3)])
    assert [r.paths for r in find_runs(acts)] == [("1", "3", "5"), ("6", "7", "8")]
    model = _gemma("gemma3", 13)  # full attention at 5 and 11 only: no run of its own
    assert [r.paths for r in find_runs(model)] == [
        tuple(f"{S}.{i}" for i in range(13) if i not in (5, 11))]


CASES = [("gemma2", 7, dict(device="cpu"), (4, 5, 6)),
         ("gemma2", 8, dict(device="cuda", amp=torch.bfloat16), (4, 5, 6, 7)),
         ("gemma3", 13, dict(device="cpu"), (2, 3, 4, 6, 7, 8, 9, 10, 12))]


@pytest.mark.parametrize("kind,layers,step,copied", CASES,
                         ids=[f"{k}-{n}-{s['device']}" for k, n, s, _ in CASES])
def test_blocks_that_take_turns_are_copied_exactly(kind, layers, step, copied):
    model = _gemma(kind, layers)
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, **step)
    a = trace(model, ids, ids, **kw)
    b = trace(model, ids, ids, reuse_blocks=False, **kw)
    assert a.reused == tuple(f"{S}.{i}" for i in copied)
    assert _full(a) == _full(b)
    assert _flops(a) == _flops(b)


PLANS = {  # plan -> the blocks copied (each kind's run cut where the plan treats it otherwise)
    "whole": ([f"{S}.{i}" for i in range(9)], (4, 5, 6, 7, 8)),
    "first_five": ([f"{S}.{i}" for i in range(5)], (4,)),
    "even_mlps": ([f"{S}.{i}.mlp" for i in range(0, 9, 2)], (4, 5, 6, 7, 8)),
}


@pytest.mark.parametrize("name", PLANS)
def test_checkpointed_blocks_that_take_turns_are_copied_exactly(name):
    plan, copied = PLANS[name]
    model = _gemma("gemma2", 9)
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu", checkpoint=plan)
    a = trace(model, ids, ids, **kw)
    b = trace(model, ids, ids, reuse_blocks=False, **kw)
    assert a.reused == tuple(f"{S}.{i}" for i in copied)
    assert _full(a) == _full(b)
    assert _flops(a) == _flops(b)


@pytest.mark.parametrize("parallel,rank", [
    (FSDP(3), 1), (DDP(2, bucket_cap_mb=0.01), 0),
    (DDP(2, bucket_cap_mb=0.01, gradient_as_bucket_view=True), 1)],
    ids=["fsdp", "ddp", "ddp-views"])
def test_blocks_that_take_turns_are_copied_exactly_on_a_rank(parallel, rank):
    model = _gemma("gemma2", 7)
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu", parallel=parallel,
              rank=rank)
    a = trace(model, ids, ids, **kw)
    b = trace(model, ids, ids, reuse_blocks=False, **kw)
    assert a.reused == tuple(f"{S}.{i}" for i in (4, 5, 6))
    assert _full(a) == _full(b)
    assert _named(a) == _named(b)
    assert _flops(a) == _flops(b)


def test_a_copied_gemma_matches_measure():
    model = _gemma("gemma2", 7)
    ids = torch.randint(0, 128, (2, 16))
    r = fxmem.analyze(model, (ids,), (ids,), loss=_lm_loss, optimizer=torch.optim.AdamW,
                      device="cpu")
    assert r.trace.reused == tuple(f"{S}.{i}" for i in (4, 5, 6))
    for bs in (2, 5):
        assert r.peak_bytes(bs) == fxmem.measure(model, (ids,), (ids,), loss=_lm_loss,
                                                 optimizer=torch.optim.AdamW,
                                                 B=bs).peak_bytes, bs
