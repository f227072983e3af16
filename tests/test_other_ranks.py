"""Another rank's step under FSDP2 derived from the first rank's trace of the same world size
(fxmem.trace.parallel.other_ranks) == that rank traced: storage by storage, the peak
formula, the caching allocator's replay; and traced wherever the derivation's conditions
fail. (tests/test_fsdp.py checks every rank, derived ones included, against gloo.)"""

import functools
import importlib

import pytest
import torch

import fxmem

ANALYZE = importlib.import_module("fxmem.analyze")


def _llama():
    transformers = pytest.importorskip("transformers")
    from fxmem.validate.zoo import CausalLM

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=100, max_position_embeddings=64, use_cache=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (4, 16))
    return CausalLM(transformers.LlamaForCausalLM(cfg)), (ids, ids)


def _both(monkeypatch, parallel, **options):
    """The step's report with the other groups derived, and with each traced."""
    model, inputs = _llama()
    kw = {"optimizer": torch.optim.AdamW, "parallel": parallel, **options}
    derived = fxmem.analyze(model, inputs, **kw)
    with monkeypatch.context() as m:
        m.setattr(ANALYZE, "other_rank", lambda *a: None)
        traced = fxmem.analyze(model, inputs, **kw)
    return derived, traced


def _storages(t):
    return [(s.sid, s.size.expr, tuple(s.shape), s.category, s.name, s.created_by,
             s.freed_after, s.unref_after, s.stream, s.dtype) for s in t.storages]


def _same(derived, traced, batches=(2, 5)):
    assert [g.ranks for g in derived.groups] == [g.ranks for g in traced.groups]
    assert len(derived.groups) > 1
    for d, t in zip(derived.groups[1:], traced.groups[1:]):
        dt, tt = d.report.trace, t.report.trace
        assert dt.derived_from == derived.groups[0].ranks[0] and tt.derived_from is None
        assert [o.op for o in dt.ops] == [o.op for o in tt.ops]
        assert _storages(dt) == _storages(tt), d.ranks
        assert d.report.peak == t.report.peak
        for b in batches:
            assert d.report.peak_bytes(b) == t.report.peak_bytes(b)
    return derived


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_rank_of_shorter_shards_derived_as_traced(device, monkeypatch):
    # 3 ranks: rank 2 holds fewer rows of every parameter (100 -> 34, 34, 32; 64 -> 22,
    # 22, 20): its optimizer state and the optimizer step's temporaries are its own rows
    derived, traced = _both(monkeypatch, fxmem.FSDP(3), device=device)
    _same(derived, traced)
    if device == "cuda":
        for d, t in zip(derived.groups, traced.groups):
            for b in (2, 5):
                x, y = d.report.cuda_memory(b), t.report.cuda_memory(b)
                assert (x.max_allocated, x.max_reserved) == (y.max_allocated, y.max_reserved)


@pytest.mark.parametrize("options", [
    dict(optimizer=functools.partial(torch.optim.SGD, momentum=0.9)),
    dict(optimizer=torch.optim.Adamax),  # not elementwise: its step runs through DTensor
    dict(checkpoint=["model.model.layers.0", "model.model.layers.1"]),
    dict(amp=torch.bfloat16),
    dict(grad_accum=2)], ids=["sgd", "adamax", "checkpoint", "amp", "accum"])
def test_other_steps_derived_as_traced(options, monkeypatch):
    _same(*_both(monkeypatch, fxmem.FSDP(3), device="cpu", **options))


@pytest.mark.parametrize("parallel", [
    fxmem.FSDP(3, param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    fxmem.FSDP(3, reshard_after_forward=False)], ids=["mixed", "no-reshard"])
def test_fsdp_options_derived_as_traced(parallel, monkeypatch):
    _same(*_both(monkeypatch, parallel, device="cpu"))


def test_a_rank_with_no_rows_is_traced():
    # 128 GPUs over a 100-row embedding: the last ranks hold none of it, their steps differ
    # in more than sizes (FSDP2's empty shards): traced, not derived
    model, inputs = _llama()
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu",
                      parallel=fxmem.FSDP(128))
    last = [g for g in r.groups if 127 in g.ranks][0]
    assert last.report.trace.derived_from is None


def test_hsdp_and_offload_are_traced():
    from fxmem.trace.parallel import other_rank

    model, inputs = _llama()
    for parallel in (fxmem.FSDP(6, replicate=2), fxmem.FSDP(3, offload=True)):
        r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu",
                          parallel=parallel)
        assert all(g.report.trace.derived_from is None for g in r.groups)
        assert other_rank(r.groups[0].report.trace, parallel, model, 2, 0) is None
