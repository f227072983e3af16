"""FSDP2's fewest GPUs for a step on one GPU, searched by a child forked before the step's
first trace (fxmem.report.ranks_ahead): the Fit one process finds, every FSDP2 step traced
in the child, and a child whose guess does not hold, or that fails, costing time, not the
answer."""

import os
import pickle
import sys

import pytest
import torch

import fxmem
from fxmem.report import fit as fit_module
from fxmem.report.forked import can_fork
from fxmem.report.ranks_ahead import WORLD_SIZE, fewest_early
from fxmem.trace.engine import Step

pytestmark = pytest.mark.skipif(not can_fork(), reason="no os.fork here")

ANALYZE = sys.modules["fxmem.analyze"]


def _stack():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        for _ in range(4)])


def _case():
    """A stack on one GPU at B=64 within two thirds of its peak: FSDP2 is a way, without a
    plan and with one."""
    m, x = _stack(), torch.randn(4, 64)
    step = Step(loss=lambda o: o.sum(), optimizer=torch.optim.Adam, device="cpu")
    r = fxmem.analyze(m, x, step=step)
    b = 64
    return m, x, step, r, b, r.peak_bytes(b) * 2 // 3


def _early(case, budget=None, b=None):
    """The way started as the CLI starts it, before any trace (here: after the report's)."""
    m, x, step, _, b0, budget0 = case
    return fewest_early(ANALYZE.analyzer(m, x, step=step), step=step, parallel=None,
                        B=b or b0, budget_bytes=budget or budget0)


def _traces(monkeypatch, tmp_path):
    """Each step fxmem.analyze traces from now on, logged as (in this process, world size:
    0 on one GPU); a function reading the log (``batch=True``: each with the B it was
    traced at as an int, or None)."""
    parent, log, real = os.getpid(), tmp_path / "traces", ANALYZE.trace

    def logged(*a, **k):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {getattr(k.get('parallel'), 'world_size', 0)} "
                    f"{k.get('concrete_batch')}\n")
        return real(*a, **k)
    monkeypatch.setattr(ANALYZE, "trace", logged)

    def read(batch=False):
        lines = [line.split() for line in log.read_text().splitlines()] \
            if log.exists() else []
        return [(int(p) == parent, int(w), *((None if b == "None" else int(b),) if batch
                                             else ())) for p, w, b in lines]
    return read


def test_the_fewest_gpus_searched_ahead_are_the_ones_fit_finds(monkeypatch, tmp_path):
    """fit gives the child what the search reads of the step and takes its answer: the Fit
    one job finds, the way searched nowhere else, no FSDP2 step traced here, the child's
    first over WORLD_SIZE GPUs, each at the B asked alone."""
    case = _case()
    _, _, _, r, b, budget = case
    alone = r.fits(b, budget, jobs=1)
    assert alone.way("fsdp") and alone.way("fsdp+checkpoint")
    traces = _traces(monkeypatch, tmp_path)
    early = _early(case)
    here = []
    monkeypatch.setattr(fit_module, "fewest_ranks", lambda *a, **k: here.append(1) or iter(()))
    assert r.fits(b, budget, jobs=2, ranks_ahead=early) == alone
    assert here == [] and early.child is None
    got = traces()
    assert (False, WORLD_SIZE) in got and not any(mine and w for mine, w in got)
    # the child's steps are read at b alone: traced there, not for the formulas in B
    assert all(at == b for mine, w, at in traces(batch=True) if w), traces(batch=True)


def test_the_child_is_given_what_it_reads_before_any_way_is_searched_here(monkeypatch):
    """The child waits for what its search reads (its search is the command's longest): fit
    resolves it before its own ways (the largest B first)."""
    case = _case()
    _, _, _, r, b, budget = case
    order, give, largest = [], fit_module._give, fit_module._largest_batch
    monkeypatch.setattr(fit_module, "_give", lambda *a: order.append("give") or give(*a))
    monkeypatch.setattr(fit_module, "_largest_batch",
                        lambda *a, **k: order.append("largest B") or largest(*a, **k))
    assert r.fits(b, budget, jobs=2, ranks_ahead=_early(case)) == r.fits(b, budget, jobs=1)
    assert order[:2] == ["give", "largest B"], order


def test_the_child_builds_its_trace_s_planner_while_it_waits():
    """While nothing has come from fit, the child builds the planner of its trace's rank 0
    (the world sizes its search derives share its candidates' numbers); once something has,
    it does not make fit wait."""
    from fxmem.report.ranks_ahead import _meanwhile

    m, x, step, *_ = _case()
    for waiting in (True, False):
        first = fxmem.analyze(m, x, step=step, parallel=fxmem.FSDP(2))
        r, w = os.pipe()
        if not waiting:
            os.write(w, b"x")
        _meanwhile(first, {}, r)
        assert ("_choosers" in first.groups[0].report.__dict__) is waiting
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("guess", ["budget", "B"])
def test_a_way_started_on_a_guess_that_does_not_hold_is_stopped(guess):
    """Started for another budget or B than fit asks: the child is killed and fit searches
    the way itself."""
    case = _case()
    _, _, _, r, b, budget = case
    early = _early(case, budget=budget // 2 if guess == "budget" else None,
                   b=b + 1 if guess == "B" else None)
    pid = early.child.pid
    assert r.fits(b, budget, jobs=2, ranks_ahead=early) == r.fits(b, budget, jobs=1)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped when killed
    assert early.child is None


def test_a_failing_child_s_way_is_found_here(monkeypatch):
    import fxmem.report.world_size as world_size

    case = _case()
    _, _, _, r, b, budget = case
    parent, real = os.getpid(), world_size.search_ranks

    def failing(*a, **k):
        if os.getpid() != parent:
            raise RuntimeError("a child that fails")
        yield from real(*a, **k)
    monkeypatch.setattr(world_size, "search_ranks", failing)
    early = _early(case)
    assert r.fits(b, budget, jobs=2, ranks_ahead=early) == r.fits(b, budget, jobs=1)


def test_nothing_is_started_where_the_way_is_not_searched_so():
    case = _case()
    m, x, step = case[:3]
    again = ANALYZE.analyzer(m, x, step=step)
    for changed in (dict(budget_bytes=None), dict(jobs=1), dict(parallel=fxmem.FSDP(2)),
                    dict(step=Step(device="cpu", train=False)),
                    dict(step=Step(loss=lambda o: o.sum(), compile=True))):
        kw = {**dict(step=step, parallel=None, B=64, budget_bytes=10**6), **changed}
        assert fewest_early(again, **kw) is None, changed


def test_nothing_is_started_on_one_cpu(monkeypatch):
    """A child would share the one CPU with the step's trace, for a way not wanted where the
    step fits."""
    import fxmem.report.ranks_ahead as ranks_ahead

    m, x, step = _case()[:3]
    monkeypatch.setattr(ranks_ahead, "cpus", lambda: 1)
    assert fewest_early(ANALYZE.analyzer(m, x, step=step), step=step, parallel=None, B=64,
                        budget_bytes=10**6) is None


def test_what_the_search_reads_of_the_step_pickles_and_searches_alike():
    """Asked, resolved, gives the search the figures the report gives it."""
    from fxmem.report.ways import Check
    from fxmem.report.world_size import Asked, search_ranks

    _, _, _, r, b, budget = _case()
    check = Check("live", budget, 0)
    again = pickle.loads(pickle.dumps(Asked(check, r, b).resolved()))
    assert again.report is None
    assert list(search_ranks(check, again, b, reanalyze=r.reanalyze)) == \
        list(search_ranks(check, Asked(check, r, b), b, reanalyze=r.reanalyze))


def test_the_command_on_one_gpu_traces_fsdp2_in_the_child_alone(capfd, tmp_path,
                                                                 monkeypatch):
    """``fxmem analyze`` on one GPU over a budget: the JSON report --jobs 1 gives, with
    --jobs 2 no FSDP2 step traced in the command's process."""
    from test_mistakes import run_in_process

    texts, seen = [], []
    for jobs in ("2", "1"):
        traces = _traces(monkeypatch, tmp_path / jobs)
        (tmp_path / jobs).mkdir()
        out = tmp_path / f"r{jobs}.json"
        code, _, err = run_in_process([
            "analyze", "tests/test_precision_way.py:Blocks", "--input", "B,64", "--target",
            "B:int64:10", "--optimizer", "adam", "--device", "cpu", "--batch", "64",
            "--budget", "4432408", "--format", "json", "--out", str(out), "--jobs", jobs],
            capfd)
        assert code == 4, err
        texts.append(out.read_text())
        seen.append(traces())
    assert texts[0] == texts[1] and '"kind": "fsdp+checkpoint"' in texts[0]
    assert not any(mine and w for mine, w in seen[0]) and (False, WORLD_SIZE) in seen[0]
    assert any(mine and w for mine, w in seen[1])  # --jobs 1: here


@pytest.mark.parametrize("share", [0.85, 0.9])  # the checkpoint way's line; FSDP2 with a plan
def test_the_checkpoint_way_given_later_is_read_once_the_search_needs_it(share):
    """The child is given what its search reads before this process has walked the
    one-GPU plans (fxmem.report.fit), the checkpoint way after: the search reads it only
    once it has analysed a world size, and answers as given it first, whether the
    checkpoint way ends the search with a plan (85 % of the peak) or not (90 %)."""
    from fxmem.report.ways import Check
    from fxmem.report.world_size import Asked, search_ranks

    _, _, _, r, _, _ = _case()
    b = 2048  # (the activations, not the optimizer's state, make the peak)
    check = Check("live", int(r.peak_bytes(b) * share), 0)
    one = [w for w in fit_module._plan_at(check, r, b) if not isinstance(w, str)]
    assert one  # a plan fits on one GPU
    want = list(search_ranks(check, Asked(check, r, b, one), b, reanalyze=r.reanalyze))
    analysed, read_after = [], []

    def again(**kw):
        analysed.append(kw)
        return r.reanalyze(**kw)
    asked = pickle.loads(pickle.dumps(Asked(check, r, b).resolved()))
    asked.later(lambda: read_after.append(len(analysed)) or one[0])
    assert list(search_ranks(check, asked, b, reanalyze=again)) == want
    assert len(read_after) == 1 and read_after[0] > 0
    # (at 90 %, one GPU more's plan re-runs less: under a point, a line saying so)
    assert any("a plan re-running no more fits (the checkpoint way)" in w
               for w in want if isinstance(w, str)) == (share == 0.85)
