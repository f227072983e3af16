"""A plan's schedule derived from one trace (fxmem.checkpoint.plans) against the step traced with
torch.utils.checkpoint really running, and against a real eager step with the plan applied."""

import copy

import pytest
import torch

import fxmem
from test_checkpoint import PLANS
from zoo import OPTIMIZERS, ZOO
from zoo import gpt2 as zoo_gpt2

ONCE = [(n, p) for n, p in PLANS if n != "tied_reuse"]  # tied_reuse's block runs 3 times


@pytest.mark.parametrize("name,plan", ONCE, ids=[f"{n}-{'+'.join(p) or 'none'}" for n, p in ONCE])
def test_derived_plan_equals_the_traced_plan(name, plan):
    model, x, y, loss = ZOO[name]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    derived = fxmem.analyze(model, x, y, **kw).with_plan(plan)
    traced = fxmem.analyze(model, x, y, **kw, checkpoint=plan, retrace=True)
    assert derived.plan == traced.plan == tuple(sorted(plan))
    for b in (2, 5, 13, 100):
        assert derived.peak_bytes(b) == traced.peak_bytes(b), b
    assert derived.recompute_flops == traced.recompute_flops
    assert derived.flop_count.total == traced.flop_count.total


@pytest.mark.parametrize("plan", [["enc.layers.0.self_attn"],
                                  ["enc.layers.0.self_attn", "enc.layers.1.linear2"]])
def test_attention_alone_inside_an_encoder_layer(plan):
    # tracing this plan for real fails on fake tensors (checkpoint sees the recomputation save
    # in another order); the derivation needs no second trace
    model, x, y, loss = ZOO["transformer_train_mode"]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"])
    report = fxmem.analyze(model, x, y, **kw, device="cpu", checkpoint=plan)
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    for b in (2, 13):
        assert report.peak_bytes(b) == fxmem.measure(wrapped, x, y, **kw, B=b).peak_bytes


@pytest.mark.parametrize("plan", [["model.transformer.h.0"], ["model.transformer.h.0", "model.transformer.h.1"],
                                  ["model.transformer.h.1.attn", "model.transformer.h.1.mlp"]])
def test_gpt2_blocks(plan):
    pytest.importorskip("transformers")
    # use_cache=False, as transformers sets it itself when it checkpoints: a forward that
    # fills a KV cache re-runs differently from the first time (see docs/checkpointing.md)
    model = zoo_gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                     bos_token_id=0, eos_token_id=0, use_cache=False)
    ids = torch.randint(0, 128, (4, 16))
    kw = dict(optimizer=torch.optim.AdamW)
    base = fxmem.analyze(model, (ids, ids), **kw, device="cpu")
    report = base.with_plan(plan)
    traced = fxmem.analyze(model, (ids, ids), **kw, device="cpu", checkpoint=plan, retrace=True)
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    for b in (2, 7):
        assert report.peak_bytes(b) == traced.peak_bytes(b)
        # Measured gap: 256*B bytes (512 B of 1.99 MB at B=2). On fake tensors transformers
        # builds its B x 1 x T x T bool causal mask (is_tracing() is true for a FakeTensor),
        # eager skips it for SDPA's is_causal; a checkpointed block keeps it as an input.
        measured = fxmem.measure(wrapped, (ids, ids), **kw, B=b).peak_bytes
        assert 0 <= report.peak_bytes(b) - measured <= 0.005 * measured
    assert report.peak_bytes(64) < base.peak_bytes(64)
    assert report.recompute_flops.subs(fxmem.B, 2) > 0


def test_a_plan_with_a_module_that_runs_three_times_is_traced_for_real():
    model, x, y, loss = ZOO["tied_reuse"]()
    kw = dict(loss=loss, device="cpu")
    base = fxmem.analyze(model, x, y, **kw)
    with pytest.raises(fxmem.InputError, match="runs 3 times"):
        base.with_plan(["block"])
    report = fxmem.analyze(model, x, y, **kw, checkpoint=["block"])
    assert report.plan == ("block",) and any(o.recompute for o in report.trace.ops)


def test_a_plan_derived_after_another_is_the_plan_derived_alone():
    """A walk derives plan after plan from one trace, each differing from the last in a few
    blocks: the runs of ops that land as far on in both (the base ops before a re-run, a
    block's re-run itself) are the last derivation's records again, and every record is
    the one a derivation with nothing before it makes."""
    from fxmem.checkpoint import plans as P

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                                      torch.nn.Linear(16, 8))
                                  for _ in range(4)])
    t = fxmem.analyze(model, torch.randn(4, 8), loss=lambda o: o.sum(),
                      optimizer=torch.optim.Adam, device="cpu").trace
    first = P.derive(t, ["2"]).ops
    after = [P.derive(t, plan).ops for plan in (["2", "0"], ["1", "2"], ["2", "3"])]
    assert any(x is y for x, y in zip(first, after[0]))  # the runs both share, made once
    for plan, got in zip((["2", "0"], ["1", "2"], ["2", "3"]), after):
        P._RUNS_MADE.clear()
        P._OPS_MADE.clear()
        alone = P.derive(t, plan).ops
        assert [o.__dict__ for o in got] == [o.__dict__ for o in alone]


def test_with_plan_checks_the_plan():
    model, x, y, loss = ZOO["mlp"]()
    base = fxmem.analyze(model, x, y, loss=loss, device="cpu")
    with pytest.raises(fxmem.InputError, match="no submodule 'layers.7'"):
        base.with_plan(["layers.7"])
    model, x, y, loss = ZOO["resnet"]()
    with pytest.raises(fxmem.InputError, match="nested"):
        fxmem.analyze(model, x, y, loss=loss, device="cpu").with_plan(["layer1", "layer1.0"])
    with pytest.raises(fxmem.InputError, match="without one"):
        base.with_plan(["layers.0"]).with_plan(["layers.1"])


@pytest.mark.parametrize("name", ["transformer_train_mode", "gpt2", "gpt2-edges"])
def test_what_a_re_run_makes_again_is_read_as_op_by_op(name):
    # fxmem.checkpoint.plans._remade (array operations over the trace's storages made and
    # their packs) against its definition read op by op, for every region a planner asks
    # (blocks whole, selective policies, groups of blocks); "edges": the same trace with
    # some packs never let go and some let go before the first op, which no model here has
    import dataclasses

    import numpy as np

    from fxmem.checkpoint.numbers import NEVER
    from fxmem.checkpoint.options import Planner
    from fxmem.checkpoint.plans import _packs_of, _remade
    from fxmem.checkpoint.schedules import _prefixes, schedule
    from fxmem.trace.ledger import latest

    if name.startswith("gpt2"):  # four blocks: groups of them too, and the model's own cache
        ids = torch.randint(0, 128, (4, 16))
        report = fxmem.analyze(zoo_gpt2(n_layer=4, n_embd=64, n_head=4, vocab_size=128,
                                        n_positions=64, bos_token_id=0, eos_token_id=0),
                               (ids, ids), optimizer=torch.optim.AdamW, device="cpu")
    else:
        model, x, y, loss = ZOO[name]()
        report = fxmem.analyze(model, x, y, loss=loss, optimizer=OPTIMIZERS["adam"],
                               device="cpu")
    trace = report.trace
    regions = [sc for sc in (schedule(trace, e) for *_, e, _, _ in Planner(report).entries)
               if sc is not None]
    if name.endswith("edges"):
        trace = dataclasses.replace(trace, packs=tuple(
            dataclasses.replace(p, released_after=None, dropped_after=None) if k % 5 == 0 else
            dataclasses.replace(p, released_after=-1, dropped_after=-1) if k % 5 == 1 else p
            for k, p in enumerate(trace.packs)))
    packs_of, prefixes = _packs_of(trace), _prefixes(trace)
    assert len({(sc.first_op, sc.stop) for sc in regions}) >= 3  # a group among them
    for sc in regions:
        rows, mods, end = [], set(sc.modules), sc.stop - 1
        for j in range(sc.first_op, sc.stop):
            for s in trace.ops[j].new_sids:
                held = [p.dropped_after if p.unpacked_at is not None else p.released_after
                        for p in packs_of.get(s, ()) if not mods.isdisjoint(prefixes[p.module])]
                u = trace.storages[s].unref_after
                rows.append((j, s, True, NEVER if latest(*held) is None else latest(*held))
                            if held else
                            (j, s, False, u if u is not None and u <= end else end))
        want = [np.array(c, t) for c, t in zip(list(zip(*rows)) or [(), (), (), ()],
                                               (np.int64, np.int64, bool, np.int64))]
        got = _remade(trace, sc)
        assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))
