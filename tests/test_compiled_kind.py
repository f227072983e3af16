"""The planner's ``"compiled"`` kind (fxmem.checkpoint.compiled) without a GPU: how compiled
candidates join the eager plans in ``frontier``, ``plan_for`` and ``max_batch_size``.

Lowering a compiled step needs a CUDA build with a device (tests/test_fake_gpu_compile.py
checks real compiled candidates on the fake GPU). Here the step "compiled under budget b" is
stood in for by the same step under an eager checkpoint plan (``STANDS_IN``), so that each
candidate's recompute FLOPs, which the kind counts as its step's FLOPs less budget 1.0's,
can be checked against the FLOPs the stand-in's trace marks as recomputed, a count that
does not subtract."""

from dataclasses import replace

import pytest
import torch

import fxmem
from fxmem.checkpoint.compiled import compiled_plans

STANDS_IN = {1.0: None, 0.7: ["0"], 0.5: ["0", "1"], 0.3: ["0", "1", "2", "3"]}
KINDS = ["module", "group", "selective"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 32))
        for _ in range(4)])


def _loss(o):
    return o.square().mean()


@pytest.fixture(scope="module")
def report():
    model, x = _model(), torch.randn(8, 32)
    base = fxmem.analyze(model, x, loss=_loss, device="cuda")
    seen = {}

    def reanalyze(compile):
        b = compile["activation_memory_budget"]
        seen[b] = seen.get(b, 0) + 1
        return fxmem.analyze(model, x, loss=_loss, device="cuda", checkpoint=STANDS_IN[b])

    r = replace(base, reanalyze=reanalyze)
    r.__dict__["_seen"] = seen
    return r


@pytest.mark.parametrize("which", ["report", "sharded"])
def test_candidates_recompute_what_their_steps_recompute(which, request):
    """Each candidate's numbers are its step's; under a strategy (``sharded``) the step is
    the strategy's (every rank), its numbers the largest rank's: the peak, and FLOPs as the
    plans' (each rank runs the same blocks)."""
    r = request.getfixturevalue(which)
    plans = compiled_plans(r)
    assert [p.budget for p in plans] == list(STANDS_IN)
    for p in plans:
        for b in (8, 300):
            assert p.recompute_flops_at(b) == int(p.report.recompute_flops.subs(fxmem.B, b))
            assert p.peak_bytes(b) == p.report.peak_bytes(b)
            if which == "sharded":
                assert isinstance(p.report, fxmem.ParallelReport) and len(r.groups) == 2
                assert p.peak_bytes(b) == max(p.report.peak_bytes(b, rank=k) for k in range(3))
    assert plans[-1].recompute_flops_at(8) > 0
    compiled_plans(r)
    assert all(n == 1 for n in r._seen.values())  # analysed once per budget


def test_frontier_with_compiled_candidates_is_pareto(report):
    b = 300
    eager = report.frontier(b, kinds=KINDS)
    both = report.frontier(b, kinds=[*KINDS, "compiled"])
    alone = report.frontier(b, kinds=["compiled"])
    assert all(p.compiled is None for p in eager) and all(p.compiled for p in alone)
    cands = [*eager, *alone]
    for p in both:
        assert p in cands
        assert not any(q.peak_bytes <= p.peak_bytes and q.recompute_flops <= p.recompute_flops
                       and (q.peak_bytes, q.recompute_flops) != (p.peak_bytes,
                                                                 p.recompute_flops)
                       for q in both if (q.compiled is None) != (p.compiled is None))
    for q in cands:
        assert any(p.peak_bytes <= q.peak_bytes and p.recompute_flops <= q.recompute_flops
                   for p in both)
    assert [p.peak_bytes for p in both] == sorted((p.peak_bytes for p in both), reverse=True)


def test_plan_for_takes_the_cheapest_that_fits_of_either_kind(report):
    b = 300
    for budget in sorted({p.peak_bytes(b) for p in compiled_plans(report)}):
        choice = report.plan_for(budget, b, kinds=[*KINDS, "compiled"], by="live",
                                 confirm=False)
        assert choice.peak_bytes <= budget
        fits = [p for p in compiled_plans(report) if p.peak_bytes(b) <= budget]
        assert choice.recompute_flops <= min(p.recompute_flops_at(b) for p in fits)
        eager = report.plan_for(budget, b, kinds=KINDS, by="live", confirm=False)
        assert choice.recompute_flops <= eager.recompute_flops
        if choice.compiled is not None:
            assert not choice.plan and choice.report.peak_bytes(b) == choice.peak_bytes


def test_compiled_alone_and_max_batch_size(report):
    b = 300
    top = compiled_plans(report)[-1]
    choice = report.plan_for(top.peak_bytes(b), b, kinds=["compiled"], by="live")
    assert choice.compiled is not None and choice.peak_bytes <= top.peak_bytes(b)
    # the step without recomputation is budget 1.0's, as max_batch_size's choices say: the
    # chosen step runs step_flops + recompute_flops
    ours = next(p for p in compiled_plans(report) if p.budget == choice.compiled)
    assert choice.step_flops == compiled_plans(report)[0].step_flops_at(b)
    assert choice.step_flops + choice.recompute_flops == ours.step_flops_at(b)
    assert choice.recompute_flops > 0  # (not budget 1.0 itself)
    with pytest.raises(fxmem.InfeasibleBudgetError):
        report.plan_for(top.peak_bytes(b) - 1, b, kinds=["compiled"], by="live")
    budget = compiled_plans(report)[0].peak_bytes(b)
    most = report.max_batch_size(budget, max_recompute=1.0, kinds=["compiled"], by="live")
    assert most.choice.compiled == 0.3 and int(most) > b
    assert top.report.peak_bytes(int(most)) <= budget < top.report.peak_bytes(int(most) + 1)
    assert report.max_batch_size(budget, max_recompute=0.0, kinds=["compiled"],
                                 by="live") == b


def test_unknown_kind_is_one_line():
    r = fxmem.analyze(_model(), torch.randn(8, 32), loss=_loss, device="cpu")
    with pytest.raises(fxmem.InputError, match="plan kinds are among"):
        r.frontier(8, kinds=["compile"])
    with pytest.raises(fxmem.InputError, match="device='cuda'"):
        r.frontier(8, kinds=["compiled"])


@pytest.fixture(scope="module")
def sharded():
    """The stack under FSDP2 over 3 ranks (two groups: ranks 0-1 and 2, whose shards have
    fewer rows), each budget's step stood in for as above, under FSDP2 too."""
    from fxmem.report.ranks import RankGroup

    model, x = _model(), torch.randn(8, 32)

    def analyzed(plan=None):
        return fxmem.analyze(model, x, loss=_loss, device="cuda", checkpoint=plan,
                             parallel=fxmem.FSDP(3))

    base, seen = analyzed(), {}

    def reanalyze(compile):
        b = compile["activation_memory_budget"]
        seen[b] = seen.get(b, 0) + 1
        return analyzed(STANDS_IN[b])

    first = base.groups[0]
    r = replace(base, groups=(RankGroup(first.ranks, replace(first.report, reanalyze=reanalyze)),
                              *base.groups[1:]))
    r.__dict__["_seen"] = seen
    return r


def test_a_parallel_frontier_and_plan_take_compiled_candidates(sharded):
    b = 300
    eager = sharded.frontier(b, kinds=KINDS)
    both = sharded.frontier(b, kinds=[*KINDS, "compiled"])
    alone = sharded.frontier(b, kinds=["compiled"])
    assert eager == sharded.frontier(b)  # the strategy's own planner's points
    assert alone and all(p.compiled for p in alone) and all(p in [*eager, *alone] for p in both)
    for q in (*eager, *alone):
        assert any(p.peak_bytes <= q.peak_bytes and p.recompute_flops <= q.recompute_flops
                   for p in both)
    def needs(p, by):  # a candidate's: its peak, or its replay's reserved bytes, no limit
        return p.peak_bytes(b) if by == "live" else max(
            g.report.cuda_memory(b).max_reserved for g in p.report.groups)

    for by in ("live", "device"):
        for budget in sorted({needs(p, by) for p in compiled_plans(sharded)}):
            choice = sharded.plan_for(budget, b, kinds=[*KINDS, "compiled"], by=by,
                                      confirm=False)
            fits = [p for p in compiled_plans(sharded) if (
                p.peak_bytes(b) <= budget if by == "live" else
                all(g.report.runs_on_device(b, budget).fits for g in p.report.groups))]
            assert choice.recompute_flops <= min((p.recompute_flops_at(b) for p in fits),
                                                 default=choice.recompute_flops)
            if choice.compiled is not None:
                assert not choice.plan and isinstance(choice.report, fxmem.ParallelReport)
                assert choice.peak_bytes == choice.report.peak_bytes(b) <= budget
                if by == "device":
                    assert choice.run.fits
            else:  # the eager choice, as the strategy's planner alone makes it
                eager = sharded.plan_for(budget, b, kinds=KINDS, by=by, confirm=False)
                assert (choice.plan, choice.peak_bytes) == (eager.plan, eager.peak_bytes)
            assert choice.recompute_flops <= sharded.plan_for(
                budget, b, kinds=KINDS, by=by, confirm=False).recompute_flops


def test_a_parallel_max_batch_size_takes_compiled_candidates(sharded):
    top = compiled_plans(sharded)[-1]
    budget = compiled_plans(sharded)[0].peak_bytes(300)
    most = sharded.max_batch_size(budget, max_recompute=1.0, kinds=["compiled"], by="live")
    assert most.choice.compiled == 0.3 and int(most) > 300
    assert top.report.peak_bytes(int(most)) <= budget < top.report.peak_bytes(int(most) + 1)
    assert sharded.max_batch_size(budget, max_recompute=0.0, kinds=["compiled"],
                                  by="live") == 300
    # with the eager plans too (the strategy's own planner): the larger of the two answers
    eager = sharded.max_batch_size(budget, max_recompute=1.0, kinds=KINDS, by="live")
    both = sharded.max_batch_size(budget, max_recompute=1.0, kinds=[*KINDS, "compiled"],
                                  by="live")
    assert int(both) == max(int(eager), int(most)) and both.choice.B == int(both)
