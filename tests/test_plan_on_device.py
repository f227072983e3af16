"""Checkpoint plans chosen against the caching allocator's replay on a CUDA step (issue 41
item 2, fxmem.checkpoint.on_device): at a budget between a step's live peak and what the
allocator needs for it, the plan of least recompute by live bytes runs out in the replay,
and each entry point (plan_for, max_batch_size(max_recompute=), the parallel planner,
--checkpoint auto) gives a plan that runs there. Budgets are read from the reports."""

import json
import os
import subprocess
import sys

import torch

import fxmem
from fxmem.checkpoint.on_device import device_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = 2048  # the activations outweigh Adam's state (tests/test_fit.py)


def _stack():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
        for _ in range(4)])


def _mse(o, y):
    return torch.nn.functional.mse_loss(o, y)


def _analyze(**options):
    x, y = torch.randn(4, 512), torch.randn(4, 512)
    return fxmem.analyze(_stack(), x, y, loss=_mse, device="cuda", optimizer=torch.optim.Adam,
                         **options)


def _need(report, b: int) -> int:
    """max_memory_reserved() replayed with no limit, the largest rank group's."""
    groups = getattr(report, "groups", None)
    return max(r.cuda_memory(b).max_reserved
               for r in ([g.report for g in groups] if groups else [report]))


def _runs(report, b: int, budget: int) -> bool:
    return device_run(report, b, budget).fits


def _check_plan(r, b: int, budget: int):
    """The live-bytes choice runs out in the replay; the default (on CUDA, by the replay)
    runs, and every cheaper plan of the frontier runs out."""
    live = r.plan_for(budget, b, by="live")
    assert live.by == "live" and live.peak_bytes <= budget
    assert not _runs(live.report, b, budget)
    got = r.plan_for(budget, b)
    assert got.by == "device" and got.run.fits and got.plan != live.plan
    assert _runs(got.report, b, budget) and got.run.max_reserved <= budget
    cheaper = [p for p in r.frontier(b) if p.recompute_flops < got.recompute_flops]
    assert cheaper and not any(_runs(r.with_plan(p.plan), b, budget) for p in cheaper)
    # the first plan ran out, and the walk went down by what it needs over the budget, past
    # the plans between (exact=False): the line above checks that none of those runs
    assert not got.exact
    return got


def test_plan_for_chooses_on_the_replay():
    r = _analyze()
    budget = (_need(r, B // 2) + _need(r, B)) // 2
    assert r.peak_bytes(B) <= budget < _need(r, B)
    _check_plan(r, B, budget)


def test_parallel_planner_chooses_on_the_replay():
    """Under FSDP2 over 2 GPUs: one plan for every rank group, each group's replay runs."""
    r = _analyze(parallel=fxmem.FSDP(2))
    budget = (_need(r, B // 2) + _need(r, B)) // 2
    _check_plan(r, B, budget)


def test_max_batch_size_with_a_plan_runs_in_the_replay():
    r = _analyze()
    budget = _need(r, 1536)
    live = r.max_batch_size(budget, max_recompute=0.5, by="live")
    assert live.by == "live" and not _runs(live.report, int(live), budget)
    got = r.max_batch_size(budget, max_recompute=0.5)
    b = int(got)
    assert got.by == "device" and b < int(live) and got.choice.run.fits
    assert _runs(got.report, b, budget) and got.recompute_fraction <= 0.5
    try:  # one B more: no plan within the share runs (the smallest peak's included)
        more = r.plan_for(budget, b + 1)
    except fxmem.InfeasibleBudgetError as e:
        assert "allocator's replay" in str(e) and e.minimum_bytes > budget
    else:
        assert more.recompute_fraction > 0.5


def test_cli_checkpoint_auto_chooses_on_the_replay(tmp_path):
    """python -m fxmem ... --checkpoint auto on CUDA with --budget: the library's choice by
    the replay, not the one by live bytes."""
    src = tmp_path / "stack.py"
    src.write_text("import torch\n\n\ndef stack():\n    torch.manual_seed(0)\n"
                   "    return torch.nn.Sequential(*[torch.nn.Sequential(\n"
                   "        torch.nn.Linear(512, 2048), torch.nn.GELU(), "
                   "torch.nn.Linear(2048, 512))\n        for _ in range(4)])\n")
    r = _analyze()
    budget = (_need(r, B // 2) + _need(r, B)) // 2
    live, got = r.plan_for(budget, B, by="live"), r.plan_for(budget, B)
    args = [f"{src}:stack", "--input", "B,512", "--target", "B,512", "--loss", "mse",
            "--optimizer", "adam", "--device", "cuda", "--batch", str(B), "--budget",
            str(budget), "--checkpoint", "auto", "--format", "json"]
    p = subprocess.run([sys.executable, "-m", "fxmem", "analyze", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["plan"] == [str(e) for e in got.plan] != [str(e) for e in live.plan]


def test_parallel_step_with_a_named_dim_has_its_ways():
    """A parallel step in B and L that does not fit: its ways (the cheapest plan on every
    rank by the replay, the longest L, which reads each group's guards) are found."""
    emb = torch.nn.Sequential(torch.nn.Embedding(100, 64), *_small())
    ids = torch.randint(0, 100, (4, 16))
    r = fxmem.analyze(emb, ids, loss=lambda o: o.sum(), device="cuda",
                      optimizer=torch.optim.SGD, dims={"L": [(0, 1)]},
                      parallel=fxmem.FSDP(2))
    b, length = 8, 512
    budget = (_need(r.at(L=length // 2), b) + _need(r.at(L=length), b)) // 2
    f = r.fits(b, budget, L=length)
    w = f.way("length")
    assert not f and w is not None and f.way("checkpoint") is not None
    assert r.fits(b, budget, L=w.value, ways=False)
    assert not r.fits(b, budget, L=w.value + 1, ways=False)


def _small():
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)) for _ in range(4)]


def test_the_walk_traces_only_the_plan_it_finds():
    """The walk by the replay is made on the derived steps, and only the plan it finds is
    traced; the walk over traced plans (as before) traced each plan it accepted, and where
    the derivations are exact gives the same answer (fxmem.checkpoint.confirm.on_device).
    Budgets between the needs at B/4 and B, where that walk jumps and accepts two plans."""
    from dataclasses import replace

    from fxmem.checkpoint.confirm import accepting, reserved_need
    from fxmem.checkpoint.on_device import walk

    r = _analyze()
    ch, lo, hi = r._chooser(), _need(r, B // 4), _need(r, B)
    seen = 0
    for k in range(4, 9):
        budget, before = lo + (hi - lo) * k // 10, {}
        walked = walk(lambda live: ch.choose(live, B), accepting(
            B, budget, lambda c: c.report, r.retrace, before), budget, lambda: ch.smallest(B),
            lambda c: reserved_need(c.report, B))
        traced = []

        def retrace(plan, defer=False):
            traced.append(plan)
            return r.retrace(plan)
        got = replace(r, retrace=retrace).plan_for(budget, B)
        assert traced == [got.plan] and got.by == "device" and got.run.fits
        assert (walked.choice.plan, walked.choice.peak_bytes) == (got.plan, got.peak_bytes)
        seen = max(seen, len(before))
    assert seen > 1


def _frontier(points, shares=None):
    """Plans ``p0``, ``p1``, ... of (live peak, need with no limit) in MB, cheapest first;
    ``shares``: each one's ``recompute_fraction`` (else it has none)."""
    from types import SimpleNamespace

    return [SimpleNamespace(plan=f"p{k}", peak_bytes=int(live * 1e6), need=int(need * 1e6),
                            exact=True, **({} if shares is None else
                                           {"recompute_fraction": shares[k]}))
            for k, (live, need) in enumerate(points)]


def _walk(plans, budget: int):
    """:func:`walk` over ``plans`` (a plan runs where its need is within ``budget``):
    (the walk, the live budgets the solver was asked, the plans replayed)."""
    from fxmem.checkpoint.on_device import walk

    solves, accepted = [], []

    def choose(live):
        solves.append(live)
        return next((p for p in plans if p.peak_bytes <= live), None)

    def accept(c):
        accepted.append(c.plan)
        return (c if c.need <= budget else None), None

    return walk(choose, accept, budget, lambda: plans[-1], lambda c: c.need), solves, accepted


def test_the_walk_goes_down_by_the_first_plan_s_need():
    """The first plan runs out; the walk's next step goes down the frontier by what that plan
    needs over the budget, not to the next plan (a plan whose live peak is only a little
    lower needs about as much: on Llama-3.1-8B over 8 GPUs two such steps went 33 MB down
    each for a plan 20 GB over). The frontier (live peak, need with no limit, MB) is that
    of FSDP2 over 3 ranks of tests/test_fit.py's stack at B=4096 on torch 2.15, where only
    the plan of live peak 97.6 runs within 165.7: p1's need, 67.1 over, lands on it; the
    bisection back replays p4, which runs out, and ends."""
    plans = _frontier([(181.5, 249.6), (164.7, 232.8), (147.9, 216.0), (131.2, 199.2),
                       (114.4, 182.5), (97.6, 165.7), (83.7, 182.5)])
    walked, _, accepted = _walk(plans, int(165.7e6))
    assert walked.choice is plans[5] and not walked.exact
    assert accepted == ["p1", "p5", "p4"]
    assert [c.plan for c, _ in walked.ran_out] == ["p1", "p4"]


def test_a_jump_past_every_plan_that_runs_comes_back_to_them():
    """When the step by the first plan's need passes every plan that runs and the smallest
    runs out too, the plans between the lowest that ran out and the first are bisected (the
    walk had ended with "no checkpoint plan runs"). The frontier above with p1 needing more
    than the others, so that its step lands below every plan."""
    plans = _frontier([(181.5, 249.6), (164.7, 262.8), (147.9, 216.0), (131.2, 199.2),
                       (114.4, 182.5), (97.6, 165.7), (83.7, 182.5)])
    walked, _, accepted = _walk(plans, int(165.7e6))
    assert walked.choice is plans[5] and not walked.exact
    assert accepted[:2] == ["p1", "p6"] and "p5" in accepted
    assert [c.plan for c, _ in walked.ran_out] == [p for p in accepted if p != "p5"]


def test_the_bisection_back_ends_when_nothing_cheaper_is_left():
    """After a jump finds a plan that runs, the live budgets up to the lowest plan that ran
    out are bisected; where a halving finds nothing cheaper, the solver's cheapest plan
    below the top is replayed, and when it runs out it is the new top: a solve per plan
    between, not one per halving (the 70B's walks had spent up to 16, converging on
    byte-wide intervals). Cheapest first (live peak, need, MB): p0-p2 run out, the jump by
    p0's need over the budget lands on p3, which runs; p1 and p2, passed over, are
    replayed on the way back, and the solver's cheapest below p2 is p3: the end."""
    plans = _frontier([(240, 300), (235, 295), (230, 290), (150, 200), (140, 190),
                       (130, 180)])
    walked, solves, accepted = _walk(plans, int(250e6))
    assert walked.choice is plans[3] and accepted == ["p0", "p3", "p1", "p2"]
    back = solves[2:]  # after the two that chose p0 and p3
    assert len(back) == 6 and back[-1] == plans[2].peak_bytes - 1, back


def test_the_bisection_back_ends_where_no_plan_between_re_runs_a_part_less():
    """Once no plan between the one found and the lowest that ran out above it can re-run
    1 % less than the one found (``CLOSE``), the bisection ends. Cheapest first (live
    peak, need, MB; share): p0 runs out, the jump by its need lands on p4 (13.00 %), which
    runs; back up, p2 (12.96 %) runs out, so p3 between them (12.98 %, which runs) is not
    sought. Plans with no share: the walk bisects on to p3."""
    from fxmem.checkpoint.on_device import CLOSE

    points = [(240, 300), (230, 280), (210, 255), (195, 245), (180, 230), (100, 150)]
    shares = [0.100, 0.110, 0.1296, 0.1298, 0.1300, 0.200]
    assert 0.1300 - 0.1296 <= CLOSE * 0.1300 < 0.1300 - 0.100
    walked, _, accepted = _walk(_frontier(points, shares), int(250e6))
    assert walked.choice.plan == "p4" and accepted == ["p0", "p4", "p2"]
    walked, _, accepted = _walk(_frontier(points), int(250e6))
    assert walked.choice.plan == "p3" and accepted == ["p0", "p4", "p2", "p3"]


def test_a_walk_over_every_group_replays_no_plan_twice(monkeypatch):
    """``ParallelReport.plan_for`` walks rank 0's group first; when its plan does not run on
    another group, the walk over every group tries rank 0's plans again, first on rank 0's
    group: each (group, plan) is replayed once (a plan's replays are kept as long as the
    group's step), and the groups after one a plan runs out on are not derived for it.
    Rank 0 of FSDP2 over 4 GPUs beside a rank over 2 (more rows): rank 0's cheapest plan
    does not run on the second (the Llama-3.1-8B one-GPU command's search over 5 GPUs had
    replayed 46 times, 32 now)."""
    from fxmem.device import allocator
    from fxmem.report.ranks import ParallelReport, RankGroup
    from fxmem.report.result import Report

    four, two = _analyze(parallel=fxmem.FSDP(4)), _analyze(parallel=fxmem.FSDP(2))
    both = ParallelReport(four.strategy, (RankGroup((0,), four.groups[0].report),
                                          RankGroup((1, 2, 3), two.groups[0].report)))
    of, replays = {}, []  # derived step -> (its group's step, plan); each replay made
    with_plan, run = Report.with_plan, allocator._run

    def tagged(self, plan):
        got = with_plan(self, plan)
        of[id(got.liveness)] = (id(self), got.plan)
        return got

    def counted(liveness, B, config, *rest):  # noqa: N803
        got = run(liveness, B, config, *rest)
        replays.append((of.get(id(liveness)), B, config.capacity_bytes, got.fits))
        return got
    monkeypatch.setattr(Report, "with_plan", tagged)
    monkeypatch.setattr(allocator, "_run", counted)
    budget = (_need(four, B // 4) + _need(two, B)) // 2  # rank 0's cheapest: not two's
    first = both.first_group().plan_for(budget, B, confirm=False)
    assert first.plan and not _runs(both.with_plan(first.plan), B, budget)
    got = both.plan_for(budget, B, confirm=False)
    assert got.plan != first.plan and _runs(got.report, B, budget)
    planned = [r for r in replays if r[0] is not None]
    assert len(planned) > 2 and len(set(planned)) == len(planned), planned
    ran = {plan for (step, plan), *_, fits in planned if step == id(four.groups[0].report)
           and fits}  # on rank 0's group; the other's derived for those alone
    assert {p for step, p in of.values() if step == id(two.groups[0].report)} <= ran


def test_a_copy_traces_the_plan_the_walk_found_while_the_walk_ends(monkeypatch):
    """In a forked child (a way out searched beside the command), the plan the walk's way
    back accepts is traced by a copy of the child while the walk searches on
    (fxmem.report.forked.Ahead, fxmem.checkpoint.confirm._walked); the walk ending on it,
    the copy's answer is the child's: the same plan, peak and replay as the child's own
    (FSDP2 over 2 GPUs; budgets between the needs at B/4 and B, at some of which the walk
    jumps and comes back: four on torch 2.13, one on 2.15)."""
    import sys

    import pytest

    from fxmem.report import forked as forked_module

    if not (forked_module.can_fork() and sys.platform.startswith("linux")):
        pytest.skip("a copy goes ahead in a forked child on Linux alone")
    r = _analyze(parallel=fxmem.FSDP(2))
    lo, hi = _need(r, B // 4), _need(r, B)
    went_ahead = 0
    for k in range(4, 9):
        budget = lo + (hi - lo) * k // 10

        def plan():
            got = r.plan_for(budget, B)
            return got.plan, got.peak_bytes, got.run.max_reserved, got.exact, os.getpid()
        answers = []
        for go in (False, True):
            monkeypatch.setattr(forked_module, "GO_AHEAD", go)
            child = forked_module.forked(plan)
            *answer, pid = child.collect()
            answers.append(answer)
            if pid != child.pid:  # the copy answered
                assert go
                went_ahead += 1
        assert answers[0] == answers[1] and answers[0][2] <= budget
    assert went_ahead
