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
        assert d.report.flop_count == t.report.flop_count  # the optimizer's on its own rows
        if not t.report.plan and t.report.grad_accum == 1:  # and under a plan derived on each
            plan = ["model.model.layers.0"]
            assert d.report.with_plan(plan).flop_count == t.report.with_plan(plan).flop_count
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


# --- another world size (fxmem.trace.parallel.other_ranks.at_world_size) -----------------------

def _over(parallel, model, inputs, **options):
    options.setdefault("optimizer", torch.optim.AdamW)
    return fxmem.analyze(model, inputs, parallel=parallel, **options).groups[0].report


def _derived_as_traced(parallel, sizes, device="cpu", model=None, **options):
    """Rank 0 over each of ``sizes`` derived from its trace over ``parallel``'s world size ==
    rank 0 traced there: storage by storage, the peak formula, the peak at two B, the FLOPs
    (under a plan derived on each too) and, on CUDA, the caching allocator's replay."""
    from dataclasses import replace

    from fxmem.analyze import _report
    from fxmem.trace.parallel import at_world_size

    plan = ["model.model.layers.0"] if model is None and "checkpoint" not in options \
        and options.get("grad_accum", 1) == 1 else None  # (a plan derived from one trace)
    model, inputs = model or _llama()
    source = _over(parallel, model, inputs, device=device, **options).trace
    assert any(s.fsdp_buffer is not None for s in source.storages)
    for w in sizes:
        now = replace(parallel, world_size=w)
        d = at_world_size(source, parallel, now, model)
        t = _over(now, model, inputs, device=device, **options).trace
        assert d is not None and d.derived_world_size == parallel.world_size, w
        assert t.derived_world_size is None
        assert [o.op for o in d.ops] == [o.op for o in t.ops]
        assert _storages(d) == _storages(t), w
        assert sum(x.size.expr != y.size.expr for x, y in zip(d.storages, source.storages))
        a, b = _report(d, (), device), _report(t, (), device)
        assert a.peak == b.peak
        assert a.flop_count == b.flop_count  # the optimizer's on its own shards
        if plan:  # and under a plan derived on each
            assert a.with_plan(plan).flop_count == b.with_plan(plan).flop_count
        for n in (2, 5):
            assert a.peak_bytes(n) == b.peak_bytes(n)
            if device == "cuda":
                x, y = a.cuda_memory(n), b.cuda_memory(n)
                assert (x.max_allocated, x.max_reserved, x.phase_max_reserved) == \
                    (y.max_allocated, y.max_reserved, y.phase_max_reserved)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_rank_0_over_another_world_size_derived_as_traced(device):
    # 4 GPUs -> 2, 3 (shards of 50 -> 34 rows of the 100-row embedding), 8 and 128 (one
    # row of the norms on rank 0, none on the last ranks); CUDA: FSDP2's copy kernels'
    # packed vectors too
    _derived_as_traced(fxmem.FSDP(4), (2, 3, 8, 128) if device == "cpu" else (3, 8), device)


@pytest.mark.parametrize("parallel,options", [
    (fxmem.FSDP(3, param_dtype=torch.bfloat16, reduce_dtype=torch.float32), {}),
    (fxmem.FSDP(4, reshard_after_forward=2), {}),
    (fxmem.FSDP(4, reshard_after_forward=False), {}),
    (fxmem.FSDP(3), dict(amp=torch.bfloat16, grad_accum=2)),
    (fxmem.FSDP(3), dict(checkpoint=["model.model.layers.0", "model.model.layers.1"])),
    (fxmem.FSDP(3), dict(optimizer=functools.partial(torch.optim.SGD, momentum=0.9)))],
    ids=["mixed", "reshard-int", "no-reshard", "amp-accum", "checkpoint", "sgd"])
def test_other_steps_over_another_world_size_derived_as_traced(parallel, options):
    device = "cuda" if parallel.param_dtype is not None else "cpu"
    sizes = (6, 8) if parallel.reshard_after_forward == 2 else (2, 7)
    _derived_as_traced(parallel, sizes, device, **options)


def test_a_rank_derived_from_a_derived_trace_counts_its_own_flops():
    """4 GPUs -> 3 -> 8: the optimizer's FLOPs are rank 0's over 8 GPUs, as traced."""
    from fxmem.analyze import _report
    from fxmem.trace.parallel import at_world_size

    model, inputs = _llama()
    four, three, eight = fxmem.FSDP(4), fxmem.FSDP(3), fxmem.FSDP(8)
    d = at_world_size(at_world_size(_over(four, model, inputs, device="cpu").trace, four,
                                    three, model), three, eight, model)
    got = _report(d, (), "cpu").flop_count
    assert got == _over(eight, model, inputs, device="cpu").flop_count
    assert got != _over(four, model, inputs, device="cpu").flop_count


def test_copied_blocks_over_another_world_size_derived_as_traced():
    # four layers: the last two copied from the second's ops (fxmem.trace.blocks), FSDP2's
    # buffers of the copies told apart as the second's
    transformers = pytest.importorskip("transformers")
    from fxmem.validate.zoo import CausalLM

    cfg = transformers.GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=100,
                                  n_positions=64)  # (the head tied to the embedding)
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (4, 16))
    model = (CausalLM(transformers.GPT2LMHeadModel(cfg)), (ids, ids))
    assert _over(fxmem.FSDP(4), *model, device="cpu").trace.reused
    _derived_as_traced(fxmem.FSDP(4), (3,), "cuda", model)


def test_where_another_world_size_is_traced():
    # FSDP2 over one rank (no collectives), reshard_after_forward=k at k ranks (FSDP2's
    # True), CPU offload, HSDP, another option: not derived
    from fxmem.trace.parallel import at_world_size

    model, inputs = _llama()
    for was, now in [(fxmem.FSDP(2), fxmem.FSDP(1)),
                     (fxmem.FSDP(4, reshard_after_forward=2),
                      fxmem.FSDP(2, reshard_after_forward=2)),
                     (fxmem.FSDP(2, offload=True), fxmem.FSDP(3, offload=True)),
                     (fxmem.FSDP(4, replicate=2), fxmem.FSDP(6, replicate=2)),
                     (fxmem.FSDP(2), fxmem.FSDP(3, reshard_after_forward=False))]:
        t = _over(was, model, inputs, device="cpu").trace
        assert at_world_size(t, was, now, model) is None, (was, now)


def test_the_fewest_ranks_traces_one_world_size(monkeypatch):
    # min_world_size's doubling and bisection: each world size's rank 0 derived from the
    # last one's where it can be, the answer as when each is traced
    model, inputs = _llama()
    calls = []
    traced = ANALYZE._trace
    monkeypatch.setattr(ANALYZE, "_trace",
                        lambda r: calls.append(r.parallel.world_size) or traced(r))
    kw = dict(optimizer=torch.optim.AdamW, device="cpu", B=4, parallel=fxmem.FSDP(2),
              budget_bytes=1_350_000)  # (rank 0's peak: 1,413,100 B on 3 GPUs, 1,311,836 on 4)
    assert fxmem.min_world_size(model, inputs, **kw) == 4
    # 1 and 2 GPUs traced (FSDP2 over one rank has no collectives: not derived from or to),
    # 4 and 3 derived (each rank's group: ranks 0-2 and 3 on 4 GPUs, 0-1 and 2 on 3)
    assert sorted(set(calls)) == [1, 2], calls
    calls.clear()
    monkeypatch.setattr(ANALYZE, "at_world_size", lambda *a: None)
    assert fxmem.min_world_size(model, inputs, **kw) == 4
    assert sorted(set(calls)) == [1, 2, 3, 4], calls


def test_the_ways_trace_a_world_size_s_groups_where_it_may_be_the_answer(monkeypatch):
    """The world-size searches of a step over a budget (Fit's FSDP2 ways, with and without
    a plan) ask rank 0's step of each world size tried (derived); the other groups of ranks
    are traced only where a world size may be the answer: every world size traced, after
    the first (what the others are derived from), is a way's answer."""
    from fxmem.trace.engine import Step

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        for _ in range(4)])
    step = Step(loss=lambda o: o.sum(), optimizer=torch.optim.Adam, device="cpu")
    r = fxmem.analyze(model, torch.randn(4, 64), step=step)
    calls, real = [], ANALYZE.trace
    monkeypatch.setattr(ANALYZE, "trace", lambda *a, **k: calls.append(
        k["parallel"].world_size if k.get("parallel") else 1) or real(*a, **k))
    fit = r.fits(64, r.peak_bytes(64) // 2, jobs=1)
    ways = {w.kind: w.value for w in fit.ways}
    assert set(ways) == {"fsdp", "fsdp+checkpoint"}
    assert calls and set(calls[1:]) <= set(ways.values()), (calls, ways)
    # (each answer as the ways' other tests check it: it fits there, not one GPU fewer)
    for kind, w in ways.items():
        plan = fit.way(kind).plan
        at = r.reanalyze(parallel=fxmem.FSDP(w), **({"checkpoint": plan} if plan else {}))
        fewer = r.reanalyze(parallel=fxmem.FSDP(w - 1),
                            **({"checkpoint": plan} if plan else {}))
        assert at.peak_bytes(64) <= r.peak_bytes(64) // 2 < fewer.peak_bytes(64), kind


def test_another_world_size_at_an_int_b_derived_from_rank_0_there(monkeypatch):
    # a way out asks FSDP2 over more GPUs at a B below where the formulas hold (the 70B at
    # B=1): rank 0 there is derived from rank 0 traced at that B, made already; and is what
    # tracing it gives
    model, inputs = _llama()
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu",
                      parallel=fxmem.FSDP(2))
    lead = r.groups[0].report
    assert lead._traced_at(1, make=False) is None  # (nothing traced to ask it)
    lead._traced_at(1)
    calls = []
    traced = ANALYZE._trace
    monkeypatch.setattr(ANALYZE, "_trace", lambda q: calls.append(q) or traced(q))
    derived = lead.reanalyze(parallel=fxmem.FSDP(3), concrete_batch=1).groups[0].report.trace
    assert calls == [] and derived.derived_world_size == 2
    monkeypatch.setattr(ANALYZE, "at_world_size", lambda *a: None)
    again = r.groups[0].report.reanalyze(parallel=fxmem.FSDP(3), concrete_batch=1)
    assert [(q.parallel.world_size, q.concrete_batch) for q in calls] == [(3, 1)]
    assert _storages(derived) == _storages(again.groups[0].report.trace)


def test_a_model_wrapped_by_checkpoint_wrapper_derived_as_traced():
    # the blocks wrapped (fxmem.apply_checkpoints: checkpoint_wrapper's inserted component in
    # the parameters' names, not in the names fxmem gives their storages)
    model, inputs = _llama()
    fxmem.apply_checkpoints(model, ["model.model.layers.0", "model.model.layers.1"])
    _derived_as_traced(fxmem.FSDP(3), (2,), "cpu", (model, inputs))


def test_fsdp2_s_sites_are_put_back():
    # fxmem.trace.parallel.fsdp_buffers wraps FSDP2's allocation sites while a rank is
    # traced: after the trace, and after one that fails, they are FSDP2's own again
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as co
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    def sites():
        return (pg.foreach_all_gather, pg.foreach_reduce, co._get_param_all_gather_inputs,
                FSDPParam.alloc_all_gather_outputs, FSDPParam.to_sharded_post_forward)
    before = sites()
    model, inputs = _llama()
    _over(fxmem.FSDP(2), model, inputs, device="cpu")
    assert sites() == before
    with pytest.raises(fxmem.FxmemError):
        _over(fxmem.FSDP(2), model, inputs, device="cpu", loss=lambda out: out.no_such)
    assert sites() == before


def test_a_plans_ops_are_made_once_for_the_rank_groups_that_share_them():
    """A plan derived on each rank group (a walk over a world size's plans derives each
    candidate on each group): the groups' traces share their ops, and so do the plan's
    steps (fxmem.checkpoint.plans._derived_ops), each as a derivation of its own makes them;
    rank 0 over another world size (the same ops, other storages) too. The derivations are
    held weakly."""
    import gc
    import weakref

    from fxmem.checkpoint import plans
    from fxmem.trace.parallel import at_world_size

    model, inputs = _llama()
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu",
                      parallel=fxmem.FSDP(3))
    first, other = (g.report.trace for g in r.groups)
    assert first.ops is other.ops  # rank 2's derived from rank 0's
    five = at_world_size(first, fxmem.FSDP(3), fxmem.FSDP(5), model)
    for plan in (["model.model.layers.0"], ["model.model.layers.0", "model.model.layers.1"]):
        derived = [plans.derive(t, plan) for t in (first, other, five)]
        assert derived[0].ops is derived[1].ops
        for t, d in zip((first, other, five), derived):
            plans._OPS_MADE.clear()
            assert plans.derive(t, plan).ops == d.ops
    gone = weakref.ref(plans.derive(first, ["model.model.layers.1"]))
    gc.collect()  # a derivation no longer used is not kept for the next one, nor its ops
    assert gone() is None and plans._OPS_MADE[-1][2]() is None


def test_a_planner_over_another_world_size_reads_the_numbers_derived_there(monkeypatch):
    """A planner over a world size derived from rank 0's trace (the same ops, calls and saved
    tensors, other sizes) takes each candidate's numbers from the planner built on that
    trace, with its own sizes (fxmem.checkpoint.plans.derive_numbers): it derives none, and
    its numbers and chain models are a planner's built with nothing before it. Both traces
    read at one length share their ops (fxmem.memory.dims.specialize), as the search for
    the fewest GPUs reads them."""
    import numpy as np

    from fxmem.analyze import _report
    from fxmem.checkpoint import plans
    from fxmem.checkpoint.options import Planner
    from fxmem.trace.parallel import at_world_size

    model, inputs = _llama()
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu",
                      parallel=fxmem.FSDP(3), dims={"L": [(0, 1), (1, 1)]})
    source = r.groups[0].report
    three = source.at(L=16)
    made, real = [], plans._numbers
    monkeypatch.setattr(plans, "_numbers", lambda *a: made.append(1) or real(*a))

    def five():
        t = at_world_size(source.trace, fxmem.FSDP(3), fxmem.FSDP(5), model)
        return _report(t, ("L",), "cpu").at(L=16)
    plans._NUMBERS_MADE.clear()
    Planner(three)
    n = len(made)
    at_five = five()
    assert at_five.trace.ops is three.trace.ops and n > 0
    warm = Planner(at_five)
    assert len(made) == n  # every candidate's numbers read, none derived
    plans._NUMBERS_MADE.clear()
    cold = Planner(five())
    assert len(made) == 2 * n
    assert len(warm.entries) == len(cold.entries)
    for a, b in zip(warm.entries, cold.entries):
        assert a[:3] == b[:3] and a[4] == b[4]
        for b_ in (2, 5):
            assert np.array_equal(a[3].live(b_), b[3].live(b_))
    for b_ in (2, 5):
        assert warm.problem(b_) == cold.problem(b_)
        assert warm.problem(b_, True) == cold.problem(b_, True)
