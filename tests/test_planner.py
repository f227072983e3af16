"""The planner over every granularity (fxmem.checkpoint.options): its plans are exact
against a real step, never cost more than the best plan of whole modules, and match or beat
the peers' plans it can represent (torchtitan's selective policy, pointwise-only recompute,
Chen's groups) at their own peak as the budget."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import fxmem
from fxmem import Region
from fxmem.checkpoint.options import policies


class Block(torch.nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d, bias=False), torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, n=4, d=64, vocab=128, seq=16):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Parameter(torch.zeros(seq, d))
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def gpt():
    torch.manual_seed(0)
    return GPT()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.Tanh())
        for _ in range(4)])


def gpt_loss(o, y):
    return F.cross_entropy(o.flatten(0, 1), y.flatten())


MODELS = {
    "mlp": (mlp, lambda b: (torch.randn(b, 64),), lambda o: o.square().mean(), 256),
    "gpt": (gpt, lambda b: (torch.randint(0, 128, (b, 16)), torch.randint(0, 128, (b, 16))),
            gpt_loss, 48),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    build, batch, loss, b = MODELS[request.param]
    inputs = batch(4)
    x, y = inputs[0], inputs[1:]
    r = fxmem.analyze(build(), x, *y, loss=loss, device="cpu")
    return request.param, build, batch, loss, b, r


def _real(build, batch, loss, plan, b):
    """(measured peak, PyTorch-counted FLOPs of forward + backward) of the real step."""
    inputs = batch(4)
    x, y = inputs[0], inputs[1:]
    peak = fxmem.measure(fxmem.apply_checkpoints(build(), plan), x, *y, loss=loss, B=b).peak_bytes
    m = fxmem.apply_checkpoints(build(), plan)
    xb = batch(b)
    with FlopCounterMode(display=False) as fc:
        loss(m(xb[0]), *xb[1:]).backward()
    return peak, fc.get_total_flops()


def _pytorch_recompute(report, b):  # as FlopCounterMode counts the re-run on this CPU
    from fxmem.checkpoint.options import counted_flops

    return counted_flops(report, b, recompute=True, twins=False)


def test_frontier_points_are_exact(case):
    name, build, batch, loss, b, r = case
    front = r.frontier(B=b)
    assert len(front) >= 3 and front[0].recompute_flops == 0
    assert all(p.peak_bytes > q.peak_bytes for p, q in zip(front, front[1:]))
    for p in front:
        assert r.with_plan(p.plan).peak_bytes(b) == p.peak_bytes
    _, none_flops = _real(build, batch, loss, (), b)
    for p in (front[len(front) // 2], front[-1]):  # a middle point and the smallest peak
        peak, flops = _real(build, batch, loss, p.plan, b)
        assert peak == p.peak_bytes, str(fxmem.Plan.of(p.plan))
        assert flops - none_flops == _pytorch_recompute(r.with_plan(p.plan), b)


def test_each_frontier_point_answers_its_own_peak(case):
    """plan_for at a frontier point's exact peak finds a plan no worse, the smallest included
    (the chain model can put that plan a few bytes above its exact peak)."""
    name, build, batch, loss, b, r = case
    planner = r._chooser()
    for p in r.frontier(B=b):
        got = r.plan_for(p.peak_bytes, b)  # no more FLOPs by PyTorch's formulas (the
        # planner's objective; pointwise ops' one FLOP per element only breaks ties)
        assert got.peak_bytes <= p.peak_bytes
        assert planner.exact_numbers(got.plan, b)[2] <= planner.exact_numbers(p.plan, b)[2]
        assert got.peak_bytes == r.with_plan(got.plan).peak_bytes(b)


def test_never_worse_than_whole_modules(case):
    name, build, batch, loss, b, r = case
    for p in r.frontier(B=b, kinds=["module"])[1:]:
        got = r.plan_for(p.peak_bytes, b)
        assert got.peak_bytes <= p.peak_bytes
        assert got.recompute_flops <= p.recompute_flops, (str(got.plan), p.plan)


def _peers(r, b):
    blocks = r._chooser().blocks
    n = len(blocks)
    size = math.ceil(n / math.ceil(math.sqrt(n)))
    out = {"every block": list(blocks),
           "chen": [Region(blocks[i:i + size]) if len(blocks[i:i + size]) > 1 else blocks[i]
                    for i in range(0, n, size)]}
    for kind in ("torchtitan", "pointwise"):
        out[kind] = [Region((p,), policies(r, p, b)[kind]) for p in blocks
                     if kind in policies(r, p, b)]
    return out


def test_beats_each_peer_at_its_peak(case):
    name, build, batch, loss, b, r = case
    for peer, plan in _peers(r, b).items():
        if not plan:
            continue
        rep = r.with_plan(plan)
        budget = rep.peak_bytes(b)
        got = r.plan_for(budget, b)
        cost = int(rep.recompute_flops.subs(fxmem.B, b))
        assert got.peak_bytes <= budget, peer
        # no more FLOPs as PyTorch counts them; at a tie, no more pointwise FLOPs either
        assert (_pytorch_recompute(got.report, b), got.recompute_flops) <= \
            (_pytorch_recompute(rep, b), cost), peer


def test_torchtitan_policy_is_its_own():
    r = fxmem.analyze(gpt(), *MODELS["gpt"][1](4), loss=gpt_loss, device="cpu")
    save = policies(r, "blocks.0", 8)["torchtitan"]
    # the CPU attention kernel, and every other mm of the block (qkv, proj, fc1, fc2: 0, 2)
    assert save == (("aten._scaled_dot_product_flash_attention_for_cpu.default", 0),
                    ("aten.mm.default", 0), ("aten.mm.default", 2))


def test_kinds_are_checked(case):
    r = case[-1]
    with pytest.raises(fxmem.InputError, match="kinds are"):
        r.plan_for(10**9, 8, kinds=["modules"])


def test_max_batch_size_with_every_kind(case):
    """The largest B within a budget and a recompute share: never below what whole modules
    reach, within both limits, and exact against a real step at that B."""
    name, build, batch, loss, b, r = case
    budget = r.peak_bytes(b)
    got = r.max_batch_size(budget, max_recompute=0.05)
    modules = r.max_batch_size(budget, max_recompute=0.05, kinds=["module"])
    assert got.B >= modules.B >= b and got.peak_bytes <= budget
    assert got.recompute_flops <= 0.05 * got.step_flops
    peak, _ = _real(build, batch, loss, got.plan, got.B)
    assert peak == got.peak_bytes


def test_max_batch_size_search_is_the_plain_search(case):
    """``max_batch_size`` follows a plan found at one B up the batch sizes before it bisects
    (fewer solves): its B is the plain doubling-and-bisection's over the planner's answers,
    and at B + 1 no plan of the exact frontier fits the budget within the share."""
    from fxmem.formula.search import largest

    name, build, batch, loss, b, r = case
    budget, ch = r.peak_bytes(b), r._chooser()

    def share(x):
        return int(0.05 * ch.step_flops(x))

    got = r.max_batch_size(budget, max_recompute=0.05, confirm=False)
    assert got.B == largest(lambda x: ch.choose(budget, x, share(x)) is not None,
                            r.min_batch_size)
    assert got.peak_bytes <= budget and got.recompute_flops <= share(got.B)
    assert all(p.peak_bytes > budget or p.recompute_flops > share(got.B + 1)
               for p in ch.frontier(got.B + 1))


def test_lowest_peak_bounds_every_plan(case):
    """``chain.lowest_peak`` of the model below the exact peaks (what ``max_batch_size``
    rules a batch size out with, before deriving its frontier): the model's own smallest
    peak, and no plan's exact peak is below it."""
    from fxmem.checkpoint import chain as C

    name, build, batch, loss, b, r = case
    ch = r._chooser()
    for at in (b, 3 * b):
        problem = ch.problem(at, True)
        low = C.lowest_peak(problem)
        assert low == C.min_peak(problem).peak_bytes
        assert all(low <= p.peak_bytes for p in ch.frontier(at))
        assert low <= ch.smallest(at).peak_bytes


def test_a_budget_under_every_plan_is_refused_without_the_frontier(case, monkeypatch):
    """Below the model's smallest peak under every exact peak, no plan fits: ``choose``
    says so with the smallest plan's peak, and solves no frontier (Llama-3.1-8B's one-GPU
    checkpoint way: 0.37 s, from 0.51 s)."""
    from fxmem.checkpoint import chain as C

    name, build, batch, loss, b, r = case
    ch = r._chooser()
    budget = C.lowest_peak(ch.problem(b, True)) - 1

    def solved(*args):
        raise AssertionError("the frontier was solved")

    monkeypatch.setattr(ch, "_solutions", solved)
    with pytest.raises(fxmem.InfeasibleBudgetError) as e:
        ch.choose(budget, b)
    assert e.value.minimum_bytes == ch.smallest(b).peak_bytes > budget


def test_least_growing_bounds_every_plan(case):
    """``least_growing``: no plan's step holds fewer bytes at once of the storages that grow
    with B (:func:`fxmem.report.ways.batch_floor`, exact, of each plan's derived step): the
    frontier's plans, the smallest peak's, every block whole, each block alone, and none."""
    from fxmem.report.ways import batch_floor

    name, build, batch, loss, b, r = case
    ch = r._chooser()
    for at in (b, 3 * b):
        low = ch.least_growing(at)
        plans = {p.plan for p in ch.frontier(at)} | {ch.smallest(at).plan, tuple(ch.blocks)}
        plans |= {(p,) for p in ch.blocks}
        floors = [batch_floor(r.with_plan(list(p)) if p else r, at) for p in plans | {()}]
        assert 0 < low <= min(floors), (low, min(floors))


def test_a_planners_costs_are_counted_once_per_batch_size(case):
    """The FLOPs counted at a B for the chain model at that B serve ``least_growing``'s
    model too (the one-GPU command works both out before its child's search can begin): no
    FLOP formula asked again, the same bound as a planner counting anew."""
    from fxmem.checkpoint.options import Planner

    name, build, batch, loss, b, r = case
    ch, fresh = r._chooser(), Planner(r)
    ch.problem(b)
    asked = []
    ch._flops = {i: (lambda at, f=f: asked.append(at) or f(at), reg)
                 for i, (f, reg) in ch._flops.items()}
    assert ch.least_growing(b) == fresh.least_growing(b)
    assert not asked


def test_each_ops_flops_are_counted_once_per_batch_size(case):
    """The chain model at a B counts each op's FLOPs at that B once for all the candidates
    re-running it (Planner._op_costs), the same sums as counting them per candidate."""
    from collections import Counter

    name, build, batch, loss, b, r = case
    ch = r._chooser()
    asked = Counter()

    def counting(i, f):
        def count(at):
            asked[i, at] += 1
            return f(at)
        return count
    ch._flops = {i: (counting(i, f), reg) for i, (f, reg) in ch._flops.items()}
    at = 5 * b
    sums = [ch._costs(d, at) for *_, d, _ in ch.entries]
    assert asked and max(asked.values()) == 1
    for (*_, d, _), got in zip(ch.entries, sums):  # as counted per candidate
        want = [0, 0]
        for i in d.recomputed().tolist():
            if i in ch._flops:
                want[0 if ch._flops[i][1] else 1] += int(ch._flops[i][0](at))
        assert got == tuple(want)


def _same_numbers(report, plans, bs):
    """derive_numbers' arrays (what the planner's numbers are made of) against the trace
    derive makes, plan by plan: timelines, the bytes before the step, each op's source and
    whether it re-runs."""
    from fxmem.checkpoint.plans import derive, derive_numbers
    from fxmem.memory.liveness import timeline
    from fxmem.memory.sizes import device_sizes

    for plan in plans:
        t = derive(report.trace, plan)
        d = derive_numbers(report.trace, plan, report.liveness.sizes)
        sizes = device_sizes(t.storages, report.device)
        for b in bs:
            assert d.timeline(b) == timeline(t.storages, sizes, len(t.ops), b), plan
            assert d.start_bytes(b) == sum(z(b) for s, z in zip(t.storages, sizes)
                                           if s.created_by < 0)
        assert list(d.sources) == [o.source for o in t.ops]
        assert list(d.recompute) == [int(o.recompute) for o in t.ops]
        # kept small: runs of ops, and the storages whose indices the move misses
        kept = sum(a.nbytes for a in (d.runs, *d.created_at, *d.freed_at, *d.tail))
        whole = sum(a.nbytes for a in (d.created, d.freed, d.sources, d.recompute))
        assert kept < whole, (kept, whole)


def test_derived_numbers_are_the_derived_trace(case):
    """The planner derives each block, selective policy and group, and each frontier plan,
    as arrays (fxmem.checkpoint.plans.derive_numbers), not as a trace: the same numbers."""
    name, build, batch, loss, b, r = case
    ch = r._chooser()
    plans = [(e,) for _, _, e, _, _ in ch.entries] + [p.plan for p in ch.frontier(b)]
    _same_numbers(r, plans, (1, b, 3 * b))


def test_derived_numbers_under_fsdp():
    """The same under FSDP2 over 3 ranks (padded shards; the gathered parameters freed by a
    resize, whoever holds them), on each rank group's trace, a plan of every kind."""
    from test_parallel_plans import Blocks, _batch

    x, y = _batch()
    r = fxmem.analyze(Blocks(), x, y, loss=F.cross_entropy, optimizer=torch.optim.AdamW,
                      parallel=fxmem.FSDP(3))
    for g in r.groups:
        ch = g.report._chooser()
        plans = [(e,) for _, _, e, _, _ in ch.entries] + [p.plan for p in ch.frontier(17)]
        assert any(isinstance(p[0], Region) and p[0].save for p in plans)
        _same_numbers(g.report, plans, (2, 17))


def test_smallest_is_the_frontier_last(case):
    """``smallest`` derives two plans (each chain model's smallest peak's), not the
    frontier's; on these models, its plan is the frontier's last point, derived whole in a
    new planner (which holds it: no lower in general)."""
    from fxmem.checkpoint.options import Planner

    name, build, batch, loss, b, r = case
    for at in (1, 2, b, 3 * b):
        last = Planner(r).frontier(at)[-1]
        fresh = Planner(r)
        got = fresh.smallest(at)
        assert (got.peak_bytes, got.recompute_flops) == (last.peak_bytes, last.recompute_flops)
        assert len(fresh._peaks) <= 2


def test_a_choice_without_its_report_derives_no_step(case, monkeypatch):
    """``choose`` and ``smallest`` with ``report=False`` (a search over rank groups, which
    reads their numbers) give the same choice with no report, and build none."""
    from fxmem.checkpoint.options import Planner

    name, build, batch, loss, b, r = case
    p = Planner(r)
    low = p.smallest(b)
    budget = (low.peak_bytes + r.peak_bytes(b)) // 2
    full = (p.choose(budget, b), low)
    monkeypatch.setattr(type(r), "with_plan", lambda *a: pytest.fail("a report was built"))
    fresh = Planner(r)
    bare = (fresh.choose(budget, b, report=False), fresh.smallest(b, report=False))
    for got, want in zip(bare, full):
        assert got.report is None and want.report is not None
        assert (got.plan, got.peak_bytes, got.recompute_flops, got.exact) == \
            (want.plan, want.peak_bytes, want.recompute_flops, want.exact)


def test_solve_skips_what_cannot_fit(case):
    """Planner.choose's solver call answers at once when the model's smallest peak is over
    the budget, and as chain.solve does otherwise."""
    from fxmem.checkpoint import chain as C
    from fxmem.checkpoint.options import _solve

    name, build, batch, loss, b, r = case
    for optimistic in (False, True):
        problem = r._chooser().problem(b, optimistic)
        low = C.lowest_peak(problem)
        for budget in (low - 1, low, low + 4096, 10 * low):
            try:
                want = C.solve(problem, budget).names
            except fxmem.InfeasibleBudgetError:
                want = None
            try:
                got = _solve(problem, budget).names
            except fxmem.InfeasibleBudgetError:
                got = None
            assert got == want and (got is None) == (budget < low)


def test_choices_over_a_walks_budgets_are_a_fresh_planners(case, monkeypatch):
    """One planner asked the budgets a walk over plans asks (down, then bisecting back up)
    bounds each solve by the cheapest plan it solved within that budget before, and by the
    model above the exact peaks' answer in the model below them: every choice is the one a
    new planner makes at that budget alone, and the later solves are bounded."""
    from fxmem.checkpoint import options
    from fxmem.checkpoint.options import Planner

    name, build, batch, loss, b, r = case
    low, top = Planner(r).smallest(b).peak_bytes, r.peak_bytes(b)
    budgets = [top - (top - low) * k // 8 for k in (1, 2, 4, 8)]
    budgets += [(budgets[2] + budgets[1]) // 2, (budgets[3] + budgets[2]) // 2, budgets[0] - 1]
    bounds = []
    solve = options.C.solve
    monkeypatch.setattr(options.C, "solve", lambda p, budget, max_cost=None: bounds.append(
        max_cost) or solve(p, budget, max_cost))
    walked = Planner(r)
    for budget in budgets:
        got, want = walked.choose(budget, b, report=False), Planner(r).choose(budget, b,
                                                                               report=False)
        assert (got.plan, got.peak_bytes, got.recompute_flops, got.exact) == \
            (want.plan, want.peak_bytes, want.recompute_flops, want.exact)
    assert sum(m is not None for m in bounds) > len(budgets)
