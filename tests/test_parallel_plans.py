"""Activation-checkpoint plans under FSDP2 and DDP (issue 18): plans derived from a rank's
trace equal the same plans traced; the plan ``ParallelReport.plan_for`` chooses (one for
every rank) fits every rank, and the step with it applied for real, in real gloo processes,
takes on each rank the bytes predicted, at batch sizes other than the traced one (4)."""

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.trace.parallel.fsdp import DDP, FSDP
from test_fsdp import STEP, _hf, _lm_loss

B = 17  # the batch size plans are chosen at; the example batch is 4


class Block(nn.Module):
    """Pre-norm attention and an MLP, each with a residual."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Blocks(nn.Module):
    """Three blocks and a classifier head over sequences of 8 tokens."""

    def __init__(self, d=32, heads=4, n=3):
        super().__init__()
        self.layers = nn.ModuleList([Block(d, heads) for _ in range(n)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).mean(1)


def _batch(d=32):
    torch.manual_seed(0)
    return torch.randn(4, 8, d), torch.randint(0, 10, (4,))


def _llama(use_cache=True):
    m = _hf("llama")
    m.config.use_cache = use_cache
    return m


LM = dict(loss=_lm_loss, optimizer=torch.optim.AdamW)
PARALLEL = [FSDP(2), FSDP(2, reshard_after_forward=False), DDP(2)]


def _ids():
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 16))
    return ids, ids


def _ranks(report, b):
    return [report.peak_bytes(b, rank=k) for k in range(report.world_size)]


@pytest.mark.parametrize("parallel", PARALLEL, ids=lambda p: p.name)
def test_derived_plans_are_the_traced_ones(parallel):
    """A plan derived from a rank's trace is the plan traced, to the byte: FSDP2's
    all-gather, run by a block's pre-forward hook, is not re-run with the block (checkpoint
    replaces the forward, inside the hooks), and checkpoint holds every tensor the block
    is given (the Llama's ``cache_position``, read by no op of the block); a module inside
    a block reads the block's gathered parameters, freed by FSDP2's reshard whatever
    checkpoint holds (``layers.0.mlp``)."""
    cases = [(Blocks(), _batch(), {}, [["layers.0"], ["layers.0", "layers.1", "layers.2"],
                                       ["layers.0.mlp"]]),
             (_llama(use_cache=False), _ids(), LM, [["model.layers.1"],
                                                    ["model.layers.0", "model.layers.1"]])]
    for model, args, step, plans in cases:
        base = fxmem.analyze(model, *args, parallel=parallel, **{**STEP, **step})
        for plan in plans:
            traced = fxmem.analyze(model, *args, parallel=parallel, checkpoint=plan,
                                   **{**STEP, **step})
            for b in (3, B):
                assert _ranks(base.with_plan(plan), b) == _ranks(traced, b), (plan, b)


def test_derived_plans_under_tensor_parallelism():
    """TP redistributes a layer's input in a pre-hook of its own (not re-run, but held by
    checkpoint as what the forward is given); under FSDP2 x TP a layer inside a block
    reads the block's gathered parameters, which FSDP2's reshard frees whatever
    checkpoint holds: derived = traced on every rank."""
    from fxmem import TP, Parallel
    from test_tp import BLOCK_PLAN, _blocks_batch, _seq_loss
    from test_tp import Blocks as TPBlocks

    x, y = _blocks_batch()
    for parallel in (TP(2, BLOCK_PLAN), Parallel(fsdp=FSDP(2), tp=TP(2, BLOCK_PLAN))):
        step = {**STEP, "loss": _seq_loss}
        base = fxmem.analyze(TPBlocks(), x, y, parallel=parallel, **step)
        plan = ["layers.0.up", "layers.1"]
        traced = fxmem.analyze(TPBlocks(), x, y, parallel=parallel, checkpoint=plan, **step)
        for b in (3, B):
            assert _ranks(base.with_plan(plan), b) == _ranks(traced, b), (parallel.name, b)


def _measured(model, args, parallel, choice, batches, **step):
    """The step with the plan applied for real, every rank measured at each of ``batches``:
    the choice's prediction on every rank."""
    wrapped = fxmem.apply_checkpoints(model, choice.plan)
    for b in batches:
        got = fxmem.measure(wrapped, *args, B=b, parallel=parallel, **{**STEP, **step})
        assert [m.peak_bytes for m in got] == _ranks(choice.report, b), (choice.plan, b)


def _budget(report, b):
    """Halfway between the peak without a plan and the smallest peak any plan reaches."""
    frontier = report.frontier(b)
    assert len(frontier) > 1
    return (frontier[0].peak_bytes + frontier[-1].peak_bytes) // 2


@pytest.mark.parametrize("parallel", PARALLEL, ids=lambda p: p.name)
def test_the_chosen_plan_is_exact_on_every_rank(parallel):
    x, y = _batch()
    r = fxmem.analyze(Blocks(), x, y, parallel=parallel, **STEP)
    budget = _budget(r, B)
    choice = r.plan_for(budget, B)
    assert choice.plan and choice.B == B
    assert max(_ranks(choice.report, B)) == choice.peak_bytes <= budget < r.peak_bytes(B)
    assert choice.report.plan == choice.plan  # traced with the plan
    derived = r.with_plan(choice.plan)
    assert _ranks(derived, B) == _ranks(choice.report, B) and choice.exact
    _measured(Blocks(), (x, y), parallel, choice, (3, B))


def test_a_plan_left_unconfirmed_is_derived_not_traced():
    """``plan_for(confirm=False)`` (a search's cheap answer, e.g. the fewest GPUs' with a
    plan): the plan chosen on derived steps, none traced; confirmed, the same plan is traced
    once and its ranks are the derived ones."""
    x, y = _batch()
    r = fxmem.analyze(Blocks(), x, y, parallel=FSDP(2), **STEP)
    traced = []
    r = dataclasses.replace(r, retrace=lambda plan, f=r.retrace: traced.append(plan) or f(plan))
    budget = _budget(r, B)
    derived = r.plan_for(budget, B, confirm=False)
    assert derived.plan and traced == []
    assert _ranks(derived.report, B) == _ranks(r.with_plan(derived.plan), B)
    choice = r.plan_for(budget, B)
    assert traced == [choice.plan] == [derived.plan]
    assert _ranks(choice.report, B) == _ranks(derived.report, B)


def test_a_stateful_forward_is_confirmed_by_tracing():
    """transformers' Llama with its key/value cache on (its default): the re-run forward
    appends to the cache, which a plan derived from the trace without it cannot know; the
    plan chosen is traced with the plan applied, and that is what the real ranks take."""
    ids = _ids()
    r = fxmem.analyze(_llama(), *ids, parallel=FSDP(2), **{**STEP, **LM})
    budget = _budget(r, 5)
    choice = r.plan_for(budget, 5)
    assert choice.plan and max(_ranks(choice.report, 5)) == choice.peak_bytes <= budget
    traced = fxmem.analyze(_llama(), *ids, parallel=FSDP(2), checkpoint=choice.plan,
                           **{**STEP, **LM})
    assert _ranks(traced, 5) == _ranks(choice.report, 5)
    _measured(_llama(), ids, FSDP(2), choice, (3, 5), **LM)


def test_frontier_and_max_batch_size():
    x, y = _batch()
    r = fxmem.analyze(Blocks(), x, y, parallel=FSDP(2), **STEP)
    front = r.frontier(B)
    assert front[0].plan == () and front[0].peak_bytes == r.peak_bytes(B)
    for a, b in zip(front, front[1:]):
        assert b.peak_bytes < a.peak_bytes and b.recompute_flops > a.recompute_flops
    for p in front:
        assert p.peak_bytes == max(_ranks(r.with_plan(p.plan), B))
    budget = _budget(r, B)
    most = r.max_batch_size(budget, max_recompute=0.5)
    assert max(_ranks(most.report, most.B)) == most.peak_bytes <= budget
    assert most.recompute_fraction <= 0.5 and most.B > r.max_batch_size(budget)
    try:  # one more does not fit within the recompute
        beyond = r.plan_for(budget, most.B + 1)
        assert beyond.recompute_fraction > 0.5
    except fxmem.InfeasibleBudgetError:
        pass
    with pytest.raises(fxmem.InfeasibleBudgetError, match="no checkpoint plan"):
        r.plan_for(1000, B)


def test_one_plan_fits_every_group():
    """Uneven shards (30 rows over 4 ranks): ranks 0-2 and rank 3 hold different bytes;
    the plan chosen fits both, and is the one plan every rank runs."""
    x, y = _batch(30)
    r = fxmem.analyze(Blocks(30, 3), x, y, parallel=FSDP(4), **STEP)
    assert len(r.groups) > 1
    budget = _budget(r, B)
    choice = r.plan_for(budget, B)
    assert all(p <= budget for p in _ranks(choice.report, B))
    assert {g.report.plan for g in choice.report.groups} == {choice.plan}


def test_command_line_auto_under_fsdp_and_ddp(tmp_path):
    """``--fsdp 2 --checkpoint auto`` and ``--ddp 2 --checkpoint auto``: the plan the
    library chooses, and the per-rank peaks with it."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    x, y = _batch()
    for flag, parallel in (("--fsdp", FSDP(2)), ("--ddp", DDP(2))):
        r = fxmem.analyze(Blocks(), x, y, parallel=parallel, loss=F.cross_entropy,
                          optimizer=torch.optim.Adam, device="cpu")
        budget = _budget(r, B)
        args = ["analyze", "tests/test_parallel_plans.py:Blocks", "--input", "B,8,32",
                "--target", "B:int64:10", "--optimizer", "adam", "--device", "cpu", flag,
                "2", "--checkpoint", "auto", "--budget", str(budget), "--batch", str(B),
                "--format", "json"]
        got = subprocess.run([sys.executable, "-m", "fxmem", *args], cwd=root,
                             capture_output=True, text=True, timeout=600)
        assert got.returncode == 0, got.stderr
        doc = json.loads(got.stdout)
        choice = r.plan_for(budget, B)
        assert doc["plan"] == [str(e) for e in choice.plan] and doc["frontier"]
        assert doc["peak_bytes"] == choice.peak_bytes
        (row,) = doc["ranks"]  # each rank's peak with the plan
        assert row["ranks"] == [0, 1] and row["peak_bytes"] == choice.peak_bytes


def test_no_process_group_state_is_left():
    """``init_process_group`` wraps ``sys.excepthook`` (a ``[rank0]:`` prefix on every
    traceback after it); the fake group's is unwrapped when it is destroyed."""
    import sys

    hook = sys.excepthook
    fxmem.analyze(Blocks(), *_batch(), parallel=FSDP(2), **STEP)
    assert sys.excepthook is hook


def test_the_first_group_s_plan_is_traced_only_when_every_group_runs_it():
    """``plan_for`` lets rank 0's group choose first, alone; when that plan, derived, does
    not fit another group, it is not traced: the plan chosen over every group is, once.
    Here the other group is a rank of FSDP2 over 2 GPUs (more rows than rank 0's over 4),
    so rank 0's cheapest plan leaves it over the budget."""
    from fxmem.report.ranks import ParallelReport, RankGroup

    x, y = _batch()
    four = fxmem.analyze(Blocks(), x, y, parallel=FSDP(4), **STEP)
    two = fxmem.analyze(Blocks(), x, y, parallel=FSDP(2), **STEP)
    traced = []

    def retrace(plan, defer=False):
        traced.append(plan)
        return ParallelReport(four.strategy, (
            RankGroup((0,), four.retrace(plan).groups[0].report),
            RankGroup((1, 2, 3), two.groups[0].report.with_plan(plan))))
    both = ParallelReport(four.strategy, (RankGroup((0,), four.groups[0].report),
                                          RankGroup((1, 2, 3), two.groups[0].report)), retrace)
    budget = _budget(both, B)
    first = both.first_group().plan_for(budget, B, confirm=False)
    assert both.with_plan(first.plan).peak_bytes(B) > budget  # rank 0's plan: not for both
    choice = both.plan_for(budget, B)
    assert traced == [choice.plan] and choice.plan != first.plan
    assert choice.peak_bytes == both.with_plan(choice.plan).peak_bytes(B) <= budget


def test_a_group_only_a_trace_makes_is_not_made_to_check_rank_0_s_plan():
    """The check of rank 0's plan on the other groups (above) reads a group not made yet
    only when it can be derived without a trace: a deferred group that must be traced
    (``make`` alone) is left to the plan's own trace on every group."""
    from fxmem.report.ranks import ParallelReport, RankGroup

    x, y = _batch()
    four = fxmem.analyze(Blocks(), x, y, parallel=FSDP(4), **STEP)
    made = []

    def retrace(plan, defer=False):
        traced = four.retrace(plan).groups[0].report
        return ParallelReport(four.strategy, (RankGroup((0,), traced),
                                              RankGroup((1, 2, 3), traced)))
    lazy = ParallelReport(four.strategy, (
        RankGroup((0,), four.groups[0].report),
        RankGroup((1, 2, 3), make=lambda: made.append(1) or four.groups[0].report)), retrace)
    choice = lazy.plan_for(_budget(four, B), B)
    assert choice.plan and made == []
