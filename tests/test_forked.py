"""The ways out searched two at a time (fxmem.report.forked, fit's jobs=2): the same Fit
as one after the other, some of it found in a forked child, and a child that fails costing
time, not the answer."""

import json
import os
import time
import warnings

import pytest
import torch

import fxmem
from fxmem.report import fit as fit_module
from fxmem.report.forked import can_fork, foreground, forked

pytestmark = pytest.mark.skipif(not can_fork(), reason="no os.fork here")


def test_a_child_s_answer_comes_back_with_its_warnings():
    assert forked(lambda: 6 * 7).collect() == 42
    assert forked(os.getpid).collect() != os.getpid()

    def warns():
        warnings.warn("said in the child")
        return 3
    with pytest.warns(UserWarning, match="said in the child"):
        assert forked(warns).collect() == 3


def test_a_line_saying_no_plan_fits_comes_back_whole():
    """The fewest GPUs' search and the plan's way answer with a NoPlan line (the smallest
    peak a plan reaches beside it): it pickles, so the child's answer is not lost and its
    ways searched again here (Llama-3.1-70B's --fsdp 64: both ways twice)."""
    from fxmem.report.ways import NoPlan

    got = forked(lambda: [NoPlan("no plan fits", 123)]).collect()
    assert got == ["no plan fits"] and isinstance(got[0], NoPlan)
    assert got[0].minimum_bytes == 123


def test_a_child_that_fails_or_cannot_send_gives_none():
    assert forked(lambda: 1 // 0).collect() is None
    assert forked(lambda: (lambda: 0)).collect() is None  # a lambda does not pickle


def test_a_cancelled_child_is_gone():
    child = forked(lambda: time.sleep(60))
    child.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)


def _longest_pause(seconds: float) -> float:
    """The longest gap between ticks 10 ms apart over ``seconds``."""
    start = last = time.monotonic()
    gap = 0.0
    while last - start < seconds:
        time.sleep(0.01)
        now = time.monotonic()
        gap, last = max(gap, now - last), now
    return gap


def test_a_background_child_waits_while_this_process_works_in_the_foreground():
    child = forked(lambda: _longest_pause(1.5)).background()
    time.sleep(0.2)
    with foreground(), foreground():  # nested: continued after the outer block alone
        time.sleep(0.3)
        assert _state(child.pid) == "T"
    assert _state(child.pid) != "T"
    assert child.collect() >= 0.3
    other = forked(lambda: _longest_pause(0.8))  # not marked: it runs on
    with foreground():
        time.sleep(0.3)
    assert other.collect() < 0.2


def test_a_child_stopped_in_the_foreground_is_still_collected_or_cancelled():
    child = forked(lambda: 6 * 7).background()
    with foreground():
        assert child.collect() == 42  # continued to answer
    child = forked(lambda: time.sleep(60)).background()
    with foreground():
        child.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)


def test_a_child_wanted_again_runs_on_in_the_foreground():
    """A way searched ahead whose answer fit awaits (:meth:`Child.wanted`) runs on while
    this process traces a plan: under FSDP2 fit's fewest GPUs trace theirs here."""
    child = forked(lambda: _longest_pause(0.8)).background().wanted()
    with foreground():
        time.sleep(0.3)
        assert _state(child.pid) != "T"
    assert child.collect() < 0.2


def test_a_plan_is_traced_in_the_foreground(monkeypatch):
    """The step traced under a plan (the one --checkpoint auto chose, confirmed) runs with
    the way searched ahead stopped; the step without one does not."""
    import contextlib
    import sys

    A = sys.modules["fxmem.analyze"]  # (the package's fxmem.analyze is the function)
    seen = []

    @contextlib.contextmanager
    def recording():
        seen.append(True)
        yield
    monkeypatch.setattr(A, "foreground", recording)
    m, x = _stack(), torch.randn(4, 64)
    r = fxmem.analyze(m, x, loss=lambda o: o.sum(), device="cpu", parallel=fxmem.FSDP(2))
    assert seen == []
    r.retrace(("0",))
    assert seen


def _state(pid: int) -> str:
    """The process state letter of ``pid`` (/proc; "T": stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _stack():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        for _ in range(4)])


def _where(monkeypatch, tmp_path, fail_in_child=()):
    """Each way's function wrapped to write the process it ran in (``tmp_path``); those
    named in ``fail_in_child`` raise when they run in a child."""
    parent, log = os.getpid(), tmp_path / "pids"
    for name in ("_largest_batch", "_plan_at", "fewest_ranks", "param_dtype_way", "_longest"):
        def wrapped(*a, _name=name, _real=getattr(fit_module, name), **k):
            with open(log, "a") as f:
                f.write(f"{_name} {os.getpid()}\n")
            if _name in fail_in_child and os.getpid() != parent:
                raise RuntimeError("a child that fails")
            yield from _real(*a, **k)
        monkeypatch.setattr(fit_module, name, wrapped)
    return lambda: [(n, int(p) == parent) for n, p in
                    (line.split() for line in log.read_text().splitlines())]


def _fits(jobs, **options):
    m = _stack()
    r = fxmem.analyze(m, torch.randn(4, 64), loss=lambda o: o.sum(), device="cpu",
                      optimizer=torch.optim.Adam, parallel=fxmem.FSDP(2))
    b = 512
    budget = (r.peak_bytes(b // 2) + r.peak_bytes(b)) // 2
    return r.fits(b, budget, jobs=jobs, **options)


def test_two_jobs_find_the_ways_one_finds(monkeypatch, tmp_path):
    """Under FSDP2 the plan and the longest length are searched in the child, the largest
    B, FSDP2's mixed precision and the fewest GPUs here (where the largest B's traces stay
    for the per-rank table), the fewest GPUs last: the same Fit as one job's."""
    alone = _fits(1)
    assert not alone and alone.ways
    where = _where(monkeypatch, tmp_path)
    assert _fits(2) == alone
    assert sorted(where()) == sorted([("_largest_batch", True), ("_plan_at", False),
                                      ("fewest_ranks", True), ("param_dtype_way", True),
                                      ("_longest", False)])
    assert [n for n, here in where() if here][-1] == "fewest_ranks"


def test_the_fewest_gpus_walk_before_the_child_s_plan_is_read(monkeypatch):
    """The fewest GPUs' search makes the walk the checkpoint way's line reads (rank 0's
    cheapest plan on one GPU more) before it waits for that way from the child: the two
    had been one chain in the child (Llama-3.1-8B over 8 GPUs: 12.8 s, this process idle
    for its last 7 s)."""
    from fxmem.report import forked as forked_module
    from fxmem.report import world_size

    seen, here = [], os.getpid()
    walk, collect = world_size.cheapest_plan, forked_module.Child.collect

    def walked(*a, **k):
        seen.append(("walk", os.getpid() == here))
        return walk(*a, **k)

    def collected(self):
        seen.append(("read", os.getpid() == here))
        return collect(self)
    monkeypatch.setattr(world_size, "cheapest_plan", walked)
    monkeypatch.setattr(forked_module.Child, "collect", collected)
    _slow_in_child(monkeypatch, fit_module, "_plan_at")  # (still to come when it is asked)
    got = _fits(2)
    assert "FSDP2 with a checkpoint plan: on 2 GPUs a plan re-running no more fits " \
        "(the checkpoint way)" in got.none
    assert seen == [("walk", True), ("read", True)]


@pytest.mark.parametrize("come", [False, True])
def test_the_walk_is_made_first_only_while_the_checkpoint_way_is_to_come(monkeypatch, come):
    """Given the checkpoint way to come (``later``, fit's child searching it), the fewest
    GPUs' search makes the walk the way's line reads first while it has not come
    (``ready()`` False); where it has, it is read first (where no plan fits as asked that
    walk is not needed: Llama-3.1-70B over 64 GPUs had made a 5 s walk in vain). The same
    lines either way as with the way found before."""
    from fxmem.report import world_size
    from fxmem.report.ways import Check, default_by

    m = _stack()
    r = fxmem.analyze(m, torch.randn(4, 64), loss=lambda o: o.sum(), device="cpu",
                      optimizer=torch.optim.Adam, parallel=fxmem.FSDP(2))
    b = 512
    budget = (r.peak_bytes(b // 2) + r.peak_bytes(b)) // 2
    one = r.fits(b, budget).way("checkpoint")
    check, again = Check(default_by(r), budget, 0), r.groups[0].report.reanalyze
    found = list(world_size.fewest_ranks(check, r, b, reanalyze=again, found=(one,)))
    seen, walk = [], world_size.cheapest_plan
    monkeypatch.setattr(world_size, "cheapest_plan",
                        lambda *a, **k: seen.append("walk") or walk(*a, **k))
    got = list(world_size.fewest_ranks(check, r, b, reanalyze=again,
                                       later=lambda: seen.append("read") or one,
                                       ready=lambda: come))
    assert got == found and one is not None
    assert seen[:2] == (["read", "walk"] if come else ["walk", "read"])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_longest_length_found_in_the_child_is_not_searched_again(monkeypatch, device):
    """The longest length's answers come back with the child's ways (``longest``'s memo;
    on CUDA by live bytes too): the setup's rows, which ask the same, read them here, as
    one job's would."""
    from test_fit import _Embed, _sum

    from fxmem.report.ways import Check, default_by

    def analyzed():
        return fxmem.analyze(_Embed(), torch.randint(0, 100, (4, 16)), loss=_sum,
                             device=device, optimizer=torch.optim.SGD,
                             dims={"L": [(0, 1)]}, parallel=fxmem.FSDP(2))
    r, b, length = analyzed(), 256, 64
    points = r.at(L=length).frontier(b)
    budget = (points[0].peak_bytes + points[-1].peak_bytes) // 2
    alone = r.fits(b, budget, L=length, jobs=1)
    assert alone.way("length") is not None and alone.by == default_by(r)
    lengths = {by: fit_module.longest(Check(by, budget, 0), r, b) for by in {alone.by, "live"}}
    again = analyzed()
    parent, searched = os.getpid(), fit_module._searched

    def here_never(*a, **k):
        assert os.getpid() != parent, "the longest length searched again here"
        return searched(*a, **k)
    monkeypatch.setattr(fit_module, "_searched", here_never)
    assert again.fits(b, budget, L=length, jobs=2) == alone
    for by, length in lengths.items():
        assert fit_module.longest(Check(by, budget, 0), again, b) == length


def test_a_failing_child_s_ways_are_found_here(monkeypatch, tmp_path):
    alone = _fits(1)
    where = _where(monkeypatch, tmp_path, fail_in_child=("_plan_at",))
    assert _fits(2) == alone
    ran = where()
    assert ("_plan_at", False) in ran and ("_plan_at", True) in ran
    assert ("fewest_ranks", True) in ran  # the child's ways all found again here


def test_one_gpu_forks_no_child(monkeypatch, tmp_path):
    """On one GPU the other ways are searches of formulas: no child for them."""
    r = fxmem.analyze(_stack(), torch.randn(4, 64), loss=lambda o: o.sum(), device="cpu",
                      optimizer=torch.optim.Adam)
    budget = (r.peak_bytes(256) + r.peak_bytes(512)) // 2
    where = _where(monkeypatch, tmp_path)
    assert r.fits(512, budget, jobs=2) == r.fits(512, budget, jobs=1)
    assert all(here for _, here in where())


def test_the_command_s_report_is_the_same_with_one_job(capfd, tmp_path):
    """``fxmem analyze --fsdp 2`` over a budget B does not fit: the child forked beside the
    CLI's status line (another thread) gives the report one process gives."""
    texts = _json_reports(capfd, tmp_path)
    assert texts[0] == texts[1] and '"ways": [' in texts[0]


def _json_reports(capfd, tmp_path, *options) -> list:
    """The JSON reports of ``fxmem analyze --fsdp 2`` (and ``options``) over a budget B
    does not fit, with ``--jobs 2`` then ``--jobs 1``."""
    from test_fit import SEED
    from test_mistakes import run_in_process

    texts = []
    for jobs in ("2", "1"):
        out = tmp_path / f"r{jobs}.json"
        code, _, err = run_in_process([*SEED, "--fsdp", "2", "--batch", "256", "--budget",
                                       "200MiB", "--format", "json", "--out", str(out),
                                       "--jobs", jobs, *options], capfd)
        assert code == 4 and "does not fit 200.00 MiB" in err
        texts.append(out.read_text())
    return texts


def _slow_in_child(monkeypatch, module, name, seconds=1.0):
    """``module.name`` (a way, or what a child searching one runs) made ``seconds`` slower
    in a forked child."""
    parent, real = os.getpid(), getattr(module, name)

    def slow(*a, **k):
        if os.getpid() != parent:
            time.sleep(seconds)
        yield from real(*a, **k)
    monkeypatch.setattr(module, name, slow)


def test_work_meanwhile_is_done_while_a_way_searched_ahead_goes_on(monkeypatch, tmp_path):
    """fit's ``meanwhile``: called once, in this process, after its own ways, where a way
    searched ahead is not found yet; not while it waits for its own child's ways (the CLI's
    summary reads the longest length, which that child searches), nor where nothing is
    waited for."""
    import fxmem.report.ahead as ahead_module
    from fxmem.report.ahead import param_dtype_ahead

    alone = _fits(1)
    _slow_in_child(monkeypatch, fit_module, "_plan_at")
    calls = []
    assert _fits(2, meanwhile=lambda: calls.append(os.getpid())) == alone
    assert calls == []  # fit's own child waited for
    assert _fits(1, meanwhile=lambda: calls.append(1)) == alone
    assert calls == []  # one job: no child to wait for
    amp, _, b, budget = _ahead_case()
    alone = amp.fits(b, budget, jobs=1)
    flag = tmp_path / "meanwhile"
    parent, real = os.getpid(), ahead_module.param_dtype_way

    def after_meanwhile(*a, **k):  # (the child searching ahead answers once it is called)
        for _ in range(2000):
            if os.getpid() == parent or flag.exists():
                break
            time.sleep(0.01)
        yield from real(*a, **k)
    monkeypatch.setattr(ahead_module, "param_dtype_way", after_meanwhile)
    ahead = param_dtype_ahead(amp, b, budget)
    assert amp.fits(b, budget, jobs=2, ahead=ahead,
                    meanwhile=lambda: calls.append(os.getpid()) or flag.touch()) == alone
    assert calls == [os.getpid()]


def test_work_while_idle_is_done_while_fit_s_child_searches(monkeypatch, tmp_path):
    """fit's ``idle``: called once, in this process, once its own ways are searched and
    while its child still searches (the longest length, made slower there); not with one
    job, where nothing is waited for."""
    alone = _fits(1)
    parent, real, done = os.getpid(), fit_module._longest, tmp_path / "longest"

    def slow(*a, **k):
        if os.getpid() != parent:
            time.sleep(1.0)
        yield from real(*a, **k)
        if os.getpid() != parent:
            done.touch()
    monkeypatch.setattr(fit_module, "_longest", slow)
    calls = []
    assert _fits(2, idle=lambda: calls.append((os.getpid(), done.exists()))) == alone
    assert calls == [(os.getpid(), False)] and done.exists()
    assert _fits(1, idle=lambda: calls.append(1)) == alone
    assert len(calls) == 1


@pytest.mark.slow
def test_the_summary_made_while_the_child_searches_reads_no_longest_length(capfd, tmp_path,
                                                                            monkeypatch):
    """The CLI makes its summary without the longest length's rows while fit's child
    searches (fit's ``idle``): no length is searched in this process (those rows read the
    child's answer), and the report is the one --jobs 1 gives."""
    from test_mistakes import run_in_process

    texts, parent, searched = [], os.getpid(), fit_module._searched

    def here_never(*a, **k):
        assert os.getpid() != parent, "the longest length searched here"
        return searched(*a, **k)
    for jobs in ("2", "1"):
        if jobs == "2":
            monkeypatch.setattr(fit_module, "_searched", here_never)
        else:
            monkeypatch.undo()
        out = tmp_path / f"r{jobs}.json"
        code, _, err = run_in_process([
            "analyze", "hf:gpt2", "--config", "n_layer=2", "--config", "n_embd=64",
            "--config", "n_head=2", "--seq", "256", "--optimizer", "adamw", "--batch", "8",
            "--device", "cpu", "--fsdp", "2", "--budget", "1GiB", "--format", "json",
            "--out", str(out), "--jobs", jobs], capfd)
        assert code == 4, err
        texts.append(out.read_text())
    assert texts[0] == texts[1] and '"kind": "length"' in texts[0]


def test_the_command_s_summary_made_while_waiting_is_the_one_made_after(capfd, tmp_path,
                                                                         monkeypatch):
    """The CLI makes its summary while a way searched ahead goes on (fit's ``meanwhile``),
    once, after the one it makes while fit's child searches (``idle``): the report is the
    one --jobs 1 gives, which makes its summary once, after fit."""
    import fxmem.report.ahead as ahead_module
    import fxmem.report.summary as summary_module

    _slow_in_child(monkeypatch, ahead_module, "param_dtype_at")
    made, real = [], summary_module.summarize
    monkeypatch.setattr(summary_module, "summarize",
                        lambda *a, **k: made.append(k.get("fit")) or real(*a, **k))
    texts = _json_reports(capfd, tmp_path, "--amp", "bf16")
    assert texts[0] == texts[1] and '"ways": [' in texts[0]
    assert made[:2] == [None, None] and made[2] is not None and len(made) == 3  # early
    # (no fit yet: while fit's child searches, then while the way ahead goes on), then --jobs
    # 1's after fit


def _ahead_case():
    """test_precision_way's blocks under FSDP2 over 4 ranks with autocast, at B=256 within a
    budget between the policy's peak and autocast's: FSDP2's mixed precision is a way."""
    from test_precision_way import Blocks, _reports

    amp, policy = _reports(Blocks())
    b = 256
    return amp, policy, b, (policy.peak_bytes(b) + amp.peak_bytes(b)) // 2


def test_mixed_precision_searched_ahead_is_the_way_fit_finds(monkeypatch, tmp_path):
    """FSDP2's mixed precision started in a child before fit (fxmem.report.ahead, as the CLI
    does after the first trace): fit takes the child's answer, that way searched nowhere
    else, and the Fit is one job's."""
    from fxmem.report.ahead import param_dtype_ahead

    amp, _, b, budget = _ahead_case()
    alone = amp.fits(b, budget, jobs=1)
    assert not alone and alone.way("param_dtype") is not None
    ahead = param_dtype_ahead(amp, b, budget)
    took = []
    monkeypatch.setattr(ahead, "take", lambda real=ahead.take: took.append(1) or real())
    where = _where(monkeypatch, tmp_path)
    assert amp.fits(b, budget, jobs=2, ahead=ahead) == alone
    assert took == [1] and "param_dtype_way" not in [n for n, _ in where()]


def test_a_way_searched_ahead_for_another_budget_is_stopped(monkeypatch, tmp_path):
    """A child that searched another way than fit's (here another budget) is killed, and fit
    searches that way itself: the same Fit."""
    from fxmem.report.ahead import param_dtype_ahead

    amp, _, b, budget = _ahead_case()
    alone = amp.fits(b, budget, jobs=1)
    ahead = param_dtype_ahead(amp, b, budget // 2)
    pid = ahead.child.pid
    where = _where(monkeypatch, tmp_path)
    assert amp.fits(b, budget, jobs=1, ahead=ahead) == alone
    assert ahead.child is None and ("param_dtype_way", True) in where()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped when killed


@pytest.mark.parametrize("first", [False, True])
def test_the_longer_search_runs_at_this_process_s_priority(monkeypatch, first):
    """The way searched ahead runs niced, fit's own child not; ``first`` (the CLI's
    --checkpoint auto, where that way is the longer search) the other way round. The same
    Fit either way."""
    import fxmem.report.ahead as ahead_module
    import fxmem.report.beside as beside_module
    import fxmem.report.forked as forked_module
    from fxmem.report.ahead import NICENESS, param_dtype_ahead

    amp, _, b, budget = _ahead_case()
    alone = amp.fits(b, budget, jobs=1)
    nice = []
    for module in (ahead_module, beside_module):
        monkeypatch.setattr(module, "forked", lambda run, niceness=0, real=module.forked:
                            nice.append(niceness) or real(run, niceness))
    wanted = []
    real = forked_module.Child.wanted
    monkeypatch.setattr(forked_module.Child, "wanted",
                        lambda self: wanted.append(self.pid) or real(self))
    ahead = param_dtype_ahead(amp, b, budget, first=first)
    assert ahead.first is first
    pid = ahead.child.pid
    assert amp.fits(b, budget, jobs=2, ahead=ahead) == alone
    assert nice == ([0, NICENESS] if first else [NICENESS, 0])
    assert wanted == [pid]  # taken by fit: not stopped while it traces a plan


def _early(budget, b, model=None):
    """The way of _ahead_case's step started before any trace of it (as the CLI does)."""
    from test_precision_way import STEP, Blocks, _batch

    from fxmem.analyze import analyzer
    from fxmem.report.ahead import param_dtype_early
    from fxmem.trace.engine import Step

    x, y = _batch()
    step = Step(loss=STEP["loss"], optimizer=STEP["optimizer"], device="cpu", amp=torch.bfloat16)
    return param_dtype_early(analyzer(model or Blocks(), x, y, step=step,
                                      parallel=fxmem.FSDP(4)),
                             step=step, parallel=fxmem.FSDP(4), B=b, budget_bytes=budget)


def test_the_way_started_before_the_trace_is_the_way_fit_finds(monkeypatch, tmp_path):
    """FSDP2's mixed precision started before the step's first trace (the CLI's), taken
    after it with no second child forked: the Fit one job finds, that way searched nowhere
    else."""
    import fxmem.report.ahead as ahead_module

    amp, _, b, budget = _ahead_case()
    alone = amp.fits(b, budget, jobs=1)
    early = _early(budget, b)
    pid = early.child.pid
    monkeypatch.setattr(ahead_module, "forked", lambda *a, **k: pytest.fail("forked again"))
    ahead = ahead_module.param_dtype_ahead(amp, b, budget, early=early)
    assert ahead.child.pid == pid and early.child is None
    where = _where(monkeypatch, tmp_path)
    assert amp.fits(b, budget, jobs=2, ahead=ahead) == alone
    assert "param_dtype_way" not in [n for n, _ in where()]


@pytest.mark.parametrize("guess", ["budget", "B", "traced"])
def test_a_way_started_on_a_guess_that_does_not_hold_is_stopped(guess):
    """A way started before the trace for another budget or B than the step's, or where no
    way is searched after all (the step traced under FSDP2's policy already), is killed;
    a new child searches the step's way where there is one."""
    from fxmem.report.ahead import param_dtype_ahead

    amp, policy, b, budget = _ahead_case()
    early = _early(budget // 2 if guess == "budget" else budget, b + (guess == "B"))
    pid = early.child.pid
    ahead = param_dtype_ahead(policy if guess == "traced" else amp, b, budget, early=early)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped when killed
    assert (ahead is None) == (guess == "traced")
    if ahead is not None:
        assert ahead.child.pid != pid
        ahead.cancel()


def test_nothing_is_searched_ahead_where_the_way_searches_nothing():
    from fxmem.report.ahead import param_dtype_ahead

    amp, policy, b, budget = _ahead_case()
    assert param_dtype_ahead(policy, b, budget) is None  # FSDP2's mixed precision already
    assert param_dtype_ahead(amp, b, None) is None  # no budget
    assert param_dtype_ahead(amp, b, budget, jobs=1) is None


def test_the_command_takes_the_way_searched_ahead(capfd, tmp_path, monkeypatch):
    """``--fsdp 4 --amp bf16`` over a budget: FSDP2's mixed precision searched from the
    first trace on (the CLI's --jobs 2) gives the JSON report --jobs 1 gives."""
    from test_mistakes import run_in_process

    import fxmem.report.ahead as ahead_module

    _, _, b, budget = _ahead_case()
    made, took, real = [], [], ahead_module.param_dtype_ahead
    early = []

    def ahead(*a, **k):  # each child made, and whether fit took its answer
        early.append(k.get("early"))
        got = real(*a, **k)
        if got is not None:
            got.take = lambda take=got.take: took.append(1) or take()
        made.append(got)
        return got
    monkeypatch.setattr(ahead_module, "param_dtype_ahead", ahead)
    texts = []
    for jobs in ("2", "1"):
        out = tmp_path / f"r{jobs}.json"
        code, _, err = run_in_process([
            "analyze", "tests/test_precision_way.py:Blocks", "--input", "B,64", "--target",
            "B:int64:10", "--optimizer", "sgd", "--amp", "bf16", "--device", "cpu", "--fsdp",
            "4", "--batch", str(b), "--budget", str(budget), "--format", "json", "--out",
            str(out), "--jobs", jobs], capfd)
        assert code == 4, err
        texts.append(out.read_text())
    assert texts[0] == texts[1] and '"kind": "param_dtype"' in texts[0]
    assert len(made) == 2 and made[0] is not None and made[1] is None  # --jobs 1: none
    assert took == [1] and made[0].child is None and not made[0].first
    assert [e is not None for e in early] == [True, False]  # started before the trace


@pytest.mark.parametrize("checkpoint", ["none", "auto"])
def test_the_command_searches_ahead_first_under_checkpoint_auto(capfd, monkeypatch, checkpoint):
    """The CLI starts the way ahead as the longer search (``first``) under --checkpoint auto
    alone: fit's plan way reads the walk the choice made."""
    from test_mistakes import run_in_process

    import fxmem.report.ahead as ahead_module

    _, _, b, budget = _ahead_case()
    firsts = []
    monkeypatch.setattr(ahead_module, "param_dtype_ahead",
                        lambda *a, **k: firsts.append(k.get("first")))  # no child
    code, _, err = run_in_process([
        "analyze", "tests/test_precision_way.py:Blocks", "--input", "B,64", "--target",
        "B:int64:10", "--optimizer", "sgd", "--amp", "bf16", "--device", "cpu", "--fsdp", "4",
        "--batch", str(b), "--budget", str(budget), "--checkpoint", checkpoint], capfd)
    assert code in (0, 4), err
    assert firsts == [checkpoint == "auto"]


def test_work_given_meanwhile_is_forked_as_a_foreground_block_begins():
    """``meanwhile(run)``: forked as this process's first foreground block inside it begins
    (the children searching ways ahead are stopped then), its answer collected by
    ``result()``; with no such block, or ``fork=False``, made here; a child whose answer is
    not asked for is killed when the block ends."""
    from fxmem.report.forked import meanwhile

    with meanwhile(os.getpid) as work:
        assert work.child is None  # (nothing forked before a foreground block)
        with foreground():
            child = work.child
            assert child and child.pid != os.getpid()
            with foreground():  # (an inner block forks nothing more)
                assert work.child is child
        assert work.result() == child.pid
    with meanwhile(os.getpid) as work:
        assert work.result() == os.getpid()
        with foreground():  # (its answer made: nothing forked for it after)
            assert work.child is False
    with meanwhile(os.getpid, fork=False) as work:
        with foreground():
            assert work.child is False
        assert work.result() == os.getpid()
    with meanwhile(lambda: time.sleep(60)) as work:
        with foreground():
            child = work.child
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)


def test_checkpoint_auto_s_frontier_is_made_while_the_plan_is_traced(capfd, tmp_path,
                                                                     monkeypatch):
    """``--checkpoint auto`` with a budget a plan fits: the frontier table is made in a child
    forked as the plan chosen is traced (``fxmem.cli.auto.choose``), and the report is the
    one ``--jobs 1`` gives, which makes it here."""
    import runpy

    from test_mistakes import run_in_process

    from fxmem.report.result import Report

    src = tmp_path / "stack.py"
    src.write_text("import torch\n\n\ndef stack():\n    torch.manual_seed(0)\n"
                   "    return torch.nn.Sequential(*[torch.nn.Sequential(\n"
                   "        torch.nn.Linear(64, 256), torch.nn.GELU(), "
                   "torch.nn.Linear(256, 64))\n        for _ in range(4)])\n")
    model = runpy.run_path(str(src))["stack"]()  # the model the command analyses
    r = fxmem.analyze(model, torch.randn(4, 64), torch.randn(4, 64),
                      loss=torch.nn.functional.mse_loss, optimizer=torch.optim.Adam,
                      device="cpu")
    points = r.frontier(512)
    assert len(points) > 2
    budget = points[len(points) // 2].peak_bytes
    made, real = tmp_path / "pids", Report.frontier

    def frontier(self, *a, **k):  # where each frontier is made
        with open(made, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(self, *a, **k)
    monkeypatch.setattr(Report, "frontier", frontier)
    texts, pids = [], []
    for jobs in ("2", "1"):
        made.write_text("")
        out = tmp_path / f"r{jobs}.json"
        code, _, err = run_in_process([
            "analyze", f"{src}:stack", "--input", "B,64", "--target", "B,64", "--loss", "mse",
            "--optimizer", "adam", "--device", "cpu", "--batch", "512", "--budget",
            str(budget), "--checkpoint", "auto", "--format", "json", "--out", str(out),
            "--jobs", jobs], capfd)
        assert code == 0, err
        texts.append(out.read_text())
        pids.append(made.read_text().split())
    assert json.loads(texts[0])["plan"] and texts[0] == texts[1]
    assert pids[1] == [str(os.getpid())]
    assert len(pids[0]) == 1 and pids[0][0] != str(os.getpid())


@pytest.mark.parametrize("fork", [True, False])
def test_the_fewest_gpus_search_asks_a_guess_s_neighbour_while_the_guess_s_plan_is_traced(
        tmp_path, fork):
    """``fewest(..., fork=True)`` (FSDP2's fewest GPUs, ``jobs=2``): the guess's neighbour
    below, which confirms it, is searched in a child forked as the guess's plan is traced
    (its foreground block), not after it; ``fork=False``: here, after it. The answer is the
    same, and a world size the child answered is not searched again here."""
    from fxmem.report.world_search import fewest

    log = tmp_path / "asked"

    def fits(w):
        with foreground():  # (the world size's plan traced)
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {w}\n")
        return w >= 5

    assert fewest(fits, 2, guess=5, fork=fork) == 5
    asked = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    me = os.getpid()
    if fork and can_fork():  # (the two write in either order)
        child = [pid for pid, w in asked if w == 4]
        assert sorted(w for _, w in asked) == [4, 5] and (me, 5) in asked and child != [me]
    else:
        assert asked == [(me, 5), (me, 4)]
    log.unlink()  # the neighbour fits: the search goes on below it, 4 asked once
    assert fewest(lambda w: fits(w) or w == 4, 2, guess=5, fork=fork) == 4
    assert sorted(int(line.split()[1]) for line in log.read_text().splitlines()) == \
        [2, 3, 4, 5]


def _guessing(guesses, found, then=lambda guess: guess):
    """A forked child's search, as a walk going ahead is: each of ``guesses`` (each better
    than the last) given to a copy going ahead, the search ending on ``found``; what the
    process that goes on answers: ``(then(answer), its pid)``."""
    from fxmem.report.forked import Ahead

    ahead = Ahead()
    for guess in guesses:
        if ahead.guess(guess):
            break  # the copy: on with this guess
    else:
        warnings.warn("the search's end")
        ahead.hand_over(found)
        guess = found
    ahead.wait()
    return then(guess), os.getpid()


@pytest.fixture
def going_ahead(monkeypatch):
    import sys

    from fxmem.report import forked as forked_module

    if not sys.platform.startswith("linux"):
        pytest.skip("a copy goes ahead on Linux alone")
    monkeypatch.setattr(forked_module, "GO_AHEAD", True)


def test_the_copy_gone_ahead_on_the_answer_answers(going_ahead):
    """A child whose search ends on its last guess hands over to the copy that went on with
    it: the answer is the copy's, the same as the child's own; the warnings come in the
    order one process raises them (the child's before and after the copy was forked, then
    the copy's)."""
    def then(guess):
        warnings.warn(f"went on with {guess}")
        return guess * 10

    def search():
        warnings.warn("the search's start")
        return _guessing([3, 5, 4], 4, then)

    child = forked(search)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        answer, pid = child.collect()
    assert answer == 40 and pid != child.pid  # the copy's
    assert [str(w.message) for w in seen] == ["the search's start", "the search's end",
                                              "went on with 4"]
    # ending elsewhere (a guess no copy went on with): the child goes on, the copy is gone
    child = forked(lambda: _guessing([3, 5], 4, then))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        answer, pid = child.collect()
    assert answer == 40 and pid == child.pid


def test_a_copy_that_ends_without_answering_leaves_the_work_to_its_child(going_ahead):
    """A copy told to go on that ends before it answers (killed, say): the child goes on
    with the work itself, and answers."""
    def search():
        child = os.getpid()

        def then(guess):
            if os.getpid() != child:
                os._exit(1)  # the copy: gone without a word
            return guess * 10
        return _guessing([3, 5, 4], 4, then)

    child = forked(search)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        answer, pid = child.collect()
    assert answer == 40 and pid == child.pid


def test_a_copy_gone_ahead_ends_with_its_child(going_ahead, tmp_path):
    """The copy on a guess the search did not end on is killed; so are copies whose child
    ends (a way out cancelled), and what a copy forks meanwhile ends with it."""
    from fxmem.report.forked import Ahead, meanwhile

    pids = tmp_path / "pids"

    def search(found):
        ahead = Ahead()
        with meanwhile(lambda: time.sleep(60)) as work:
            if ahead.guess(1):
                with foreground():  # (the copy's block: its meanwhile work forked)
                    (tmp_path / "new").write_text(f"{os.getpid()} {work.child.pid}")
                    (tmp_path / "new").rename(pids)
                    time.sleep(60)
            while not pids.exists():
                time.sleep(0.01)
            ahead.hand_over(found)
        return "on"

    assert forked(lambda: search(2)).collect() == "on"  # ended on 2: the copy on 1 killed
    copy, work = map(int, pids.read_text().split())
    _gone(copy, work)
    pids.unlink()
    child = forked(lambda: search(1))
    while not pids.exists():
        time.sleep(0.01)
    time.sleep(0.1)
    child.cancel()
    copy, work = map(int, pids.read_text().split())
    _gone(copy, work)


def _gone(*pids, within: float = 5.0):
    """Each of ``pids`` ends (or is a zombie) within ``within`` seconds."""
    end = time.monotonic() + within
    while any(_alive(p) for p in pids):
        assert time.monotonic() < end, [p for p in pids if _alive(p)]
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return _state(pid) != "Z"


def test_work_a_copy_forks_meanwhile_is_niced_and_becomes_the_child_s(going_ahead):
    """Work given meanwhile is forked as a copy's foreground block begins (before the search
    ends: its child's own block would have begun then), at a lower priority than the copy's
    block, and is the copy's once the child hands over: its answer collected there."""
    from fxmem.report.forked import Ahead, meanwhile

    def search():
        ahead = Ahead()
        with meanwhile(lambda: (os.getpid(), os.nice(0))) as work:
            if not ahead.guess(1):
                ahead.hand_over(1)
            with foreground():
                pass
            ahead.wait()
            return work.result(), os.getpid(), os.nice(0)

    (pid, nice), copy, mine = forked(search).collect()
    assert pid != copy and nice == mine + 10
