"""When a step does not fit: by how much, and the ways that make it fit (fxmem.report.fit),
each checked here by running fxmem again at it (it fits) and one step beyond it (it does
not), on the CPU (live bytes) and on CUDA (the caching allocator's replay). Budgets are
read from the reports, never written in."""

import dataclasses
import json

import pytest
import torch
import torch.nn as nn

import fxmem
from fxmem.report.fit import Fit
from fxmem.report.text import fmt_share


def _stack(width=64, hidden=256, depth=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width))
        for _ in range(depth)])


def _sum(o):
    return o.sum()


def _analyze(model, device="cpu", **options):
    x = torch.randn(4, model[0][0].in_features)
    return fxmem.analyze(model, x, loss=_sum, device=device, optimizer=torch.optim.Adam,
                         **options)


def _check_ways(model, report, f: Fit, device="cpu"):
    """Every way of ``f`` fits when fxmem runs again at it, and not one step beyond."""
    b, budget = f.B, f.budget_bytes
    assert not f and f.over_bytes > 0 and f.ways
    for w in f.ways:
        if w.kind == "batch":
            assert report.fits(w.value, budget, ways=False)
            assert not report.fits(w.value + 1, budget, ways=False)
        elif w.kind == "checkpoint":
            again = _analyze(model, device, checkpoint=list(w.plan))
            assert again.fits(b, budget, ways=False)
            cheaper = [p for p in report.frontier(b)
                       if p.recompute_flops < again.recompute_flops.subs(fxmem.B, b)]
            assert cheaper and all(not report.with_plan(p.plan).fits(b, budget, ways=False)
                                   for p in cheaper)
        elif w.kind in ("fsdp", "fsdp+checkpoint"):
            plan = {"checkpoint": list(w.plan)} if w.plan else {}
            at = _analyze(model, device, parallel=fxmem.FSDP(w.value), **plan)
            assert at.fits(b, budget, ways=False)
            fewer = _analyze(model, device, parallel=fxmem.FSDP(w.value - 1))
            if w.kind == "fsdp":
                assert not fewer.fits(b, budget, ways=False)
            elif w.beyond.endswith("(the checkpoint way)"):  # one GPU fewer: the step asked
                one = f.way("checkpoint")
                assert w.value == 2 and one.recompute_share > w.recompute_share
            else:  # no plan at all fits on one GPU fewer
                with pytest.raises(fxmem.InfeasibleBudgetError):
                    fewer.plan_for(budget, b)
        else:
            raise AssertionError(f"unexpected way {w}")


@pytest.mark.parametrize("B, budget", [(512, 4_000_000), (128, 2_200_000)])
def test_cpu_ways_are_checked(B, budget):  # noqa: N803
    m = _stack()
    r = _analyze(m)
    f = r.fits(B, budget)
    assert f.need_bytes == r.peak_bytes(B) and f.by == "live"
    kinds = [w.kind for w in f.ways]
    assert kinds == (["batch", "checkpoint", "fsdp+checkpoint"] if B == 512
                     else ["fsdp", "fsdp+checkpoint"])
    _check_ways(m, r, f)
    assert all(line.startswith(("no ", "FSDP2 with")) for line in f.none)


def test_the_ways_on_one_gpu_build_one_planner_of_its_step(monkeypatch):
    """The checkpoint way (its plan traced at B alone: the report with another retrace) and
    FSDP2's fewest GPUs with a plan (the smallest plan on one GPU, its guess) ask the same
    planner of the one-GPU step: it is built once (Llama-3.1-8B's: 0.4 s)."""
    from fxmem.checkpoint.options import Planner

    m = _stack()
    r = _analyze(m)
    built, init = [], Planner.__init__

    def counted(self, report, *args, **kwargs):
        built.append(report.trace)
        init(self, report, *args, **kwargs)

    monkeypatch.setattr(Planner, "__init__", counted)
    f = r.fits(512, 4_000_000)
    assert f.way("checkpoint") and f.way("fsdp+checkpoint")
    assert sum(t is r.trace for t in built) == 1, len(built)


def test_a_way_s_plan_follows_whole_only_where_its_line_summarised_it():
    """After the ways' table, a way's plan is given in full only where its line summarised
    it (more than three runs of blocks), its runs as ranges; a plan the line gives whole is
    not repeated (each was, entry by entry: Llama-3.1-8B's 32 blocks one by one, under a
    line that had them as ranges)."""
    import dataclasses
    import io

    from rich.console import Console

    from fxmem.report.markdown import render_markdown
    from fxmem.report.summary import summarize
    from fxmem.report.terminal import render_terminal

    r = _analyze(_stack())
    s = summarize(r, B=512, budget_bytes=4_000_000, fit=r.fits(512, 4_000_000))
    planned = [w for w in s.fit["ways"] if w["plan"]]
    assert planned and all(len(w["plan"]) <= 3 for w in planned)

    def rendered(summary):
        out = io.StringIO()
        Console(file=out, width=400).print(render_terminal(summary))
        return render_markdown(summary), out.getvalue()

    assert all("plan, whole" not in text for text in rendered(s))
    long = [f"{i}" + (" (saving 1 op output)" if i % 2 else "") for i in range(4)]
    ways = [dict(w, plan=long) if w is planned[0] else w for w in s.fit["ways"]]
    s = dataclasses.replace(s, fit=dict(s.fit, ways=ways))
    whole = f"the {planned[0]['kind']} way's plan, whole: 0, 1 (saving 1 op output), 2, " \
            "3 (saving 1 op output)"
    for text in rendered(s):
        assert text.count("plan, whole") == 1 and whole in text


def test_fits_has_no_ways():
    r = _analyze(_stack())
    f = r.fits(8, r.peak_bytes(8))
    assert f and f.ways == () and f.over_bytes == 0 and "fits" in f.line


def test_cuda_ways_are_checked_by_the_replay():
    """On CUDA the budget is what the allocator can get: each way runs in the replay. At
    B=2048 the activations outweigh Adam's state (at B=256 the step runs out in Adam's
    foreach temporaries, which no plan changes), and the plan of least recompute by live
    bytes (none: the live peak fits) runs out in the replay."""
    m = _stack(width=512, hidden=2048, depth=4)
    r = _analyze(m, "cuda")
    b = 2048
    budget = (r.cuda_memory(b // 2).max_reserved + r.cuda_memory(b).max_reserved) // 2
    f = r.fits(b, budget)
    assert f.by == "device" and f.need_bytes == r.cuda_memory(b).max_reserved
    assert f.oom.startswith(("at ", "while ")) and not r.runs_on_device(b, budget).fits
    assert f.way("batch") and f.way("checkpoint")
    live = r.plan_for(budget, b, by="live")
    assert live.peak_bytes <= budget and not live.report.runs_on_device(b, budget).fits
    _check_ways(m, r, f, "cuda")


class _Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 64)
        self.body = _stack()

    def forward(self, ids):
        return self.body(self.emb(ids))


def test_longest_length_at_b():
    m = _Embed()
    ids = torch.randint(0, 100, (4, 16))
    r = fxmem.analyze(m, ids, loss=_sum, device="cuda", optimizer=torch.optim.SGD,
                      dims={"L": [(0, 1)]})
    b, length = 8, 512
    budget = (r.at(L=length // 2).cuda_memory(b).max_reserved
              + r.at(L=length).cuda_memory(b).max_reserved) // 2
    f = r.fits(b, budget, L=length)
    w = f.way("length")
    assert not f and f.dims == {"L": length} and w is not None
    assert r.fits(b, budget, L=w.value, ways=False)
    assert not r.fits(b, budget, L=w.value + 1, ways=False)
    assert f.way("length").beyond == f"L={w.value + 1} does not fit"


def test_the_longest_length_is_searched_from_below_the_live_bound(monkeypatch):
    """The longest L that runs is searched from where the live peak fits the budget less the
    allocator's overhead at the longest L whose live bytes fit (``_below_top``), bisecting
    up from there, not stepping down from that bound: the same L in fewer replays."""
    import fxmem.report.fit as fit_module
    from fxmem.report.ways import Check, WayOut

    real, counts = fit_module._down, []

    def spy(fits, top, floor, below=None):
        asked, stepped = [], []

        def replayed(n):
            asked.append(n)
            return fits(n)
        got = real(replayed, top, floor, below)
        assert below is not None and got is not None
        # stepping down from the bound, the replays answered by the L found (the search
        # is over a monotone fits: those up to it run, those above do not)
        assert real(lambda n: stepped.append(n) or n <= got, top, floor) == got
        counts.extend([len(asked), len(stepped)])
        return got
    monkeypatch.setattr(fit_module, "_down", spy)
    r = fxmem.analyze(_Embed(), torch.randint(0, 100, (4, 16)), loss=_sum, device="cuda",
                      optimizer=torch.optim.SGD, dims={"L": [(0, 1)]})
    b, length = 8, 2048
    budget = (r.at(L=length // 2).cuda_memory(b).max_reserved
              + r.at(L=length).cuda_memory(b).max_reserved) // 2
    check = Check("device", budget, 0)  # the length way alone (fit searches every way)
    [w] = fit_module._longest(check, r.at(L=length), b, named=r, dims={"L": length})
    assert isinstance(w, WayOut) and w.kind == "length"
    assert len(counts) == 2 and counts[0] < counts[1], counts
    assert r.fits(b, budget, L=w.value, ways=False)
    assert not r.fits(b, budget, L=w.value + 1, ways=False)


def test_a_parallel_way_s_plan_is_traced_at_its_point_alone(monkeypatch):
    """A way is read at the asked B and L alone, so the trace that confirms its checkpoint
    plan under FSDP2 is made there, B and L plain ints (no size a symbol: a cheaper trace);
    the way's figures are those of the step analysed again with the plan, in B and L."""
    m = _Embed()
    ids = torch.randint(0, 100, (4, 16))
    options = dict(loss=_sum, device="cpu", optimizer=torch.optim.SGD, dims={"L": [(0, 1)]})
    r = fxmem.analyze(m, ids, parallel=fxmem.FSDP(2), **options)
    b, length = 256, 64
    points = r.at(L=length).frontier(b)
    budget = (points[0].peak_bytes + points[-1].peak_bytes) // 2
    traced = _counting(monkeypatch)
    f = r.fits(b, budget, L=length, by="live")
    way = f.way("checkpoint")
    assert way is not None and way.plan, (f.line, f.none)
    confirms = [t for t in traced if t.get("checkpoint")]
    assert confirms and all((t["concrete_batch"], t["concrete_dims"]) == (b, {"L": length})
                            for t in confirms), confirms
    monkeypatch.undo()
    again = fxmem.analyze(m, ids, parallel=fxmem.FSDP(2), checkpoint=list(way.plan), **options)
    assert again.peak_bytes(b, L=length) == way.need_bytes <= budget


def test_a_one_gpu_plan_in_named_dims_is_traced(monkeypatch):
    """A report in B and L read at one L (``r.at(L=...)``) confirms its plans by tracing
    them, as a report in B alone does: ``plan_for`` traces the plan in B and L, the
    checkpoint way at the asked B and L alone (both had been derived only); the figures
    are those of the step analysed again with the plan."""
    m = _Embed()
    ids = torch.randint(0, 100, (4, 16))
    options = dict(loss=_sum, device="cpu", optimizer=torch.optim.SGD, dims={"L": [(0, 1)]})
    r = fxmem.analyze(m, ids, **options)
    b, length = 256, 64
    points = r.at(L=length).frontier(b)
    budget = (points[0].peak_bytes + points[-1].peak_bytes) // 2
    traced = _counting(monkeypatch)
    choice = r.at(L=length).plan_for(budget, b)
    assert [(t["checkpoint"], t["concrete_batch"]) for t in traced] == [(choice.plan, None)]
    del traced[:]
    way = r.fits(b, budget, L=length, by="live").way("checkpoint")
    assert way is not None and way.plan == choice.plan
    assert [(t["concrete_batch"], t["concrete_dims"]) for t in traced
            if t.get("checkpoint")] == [(b, {"L": length})], traced
    monkeypatch.undo()
    again = fxmem.analyze(m, ids, checkpoint=list(way.plan), **options)
    assert again.peak_bytes(b, L=length) == way.need_bytes == choice.peak_bytes <= budget


def test_parallel_report_fits_with_more_ranks():
    m = _stack()
    r = _analyze(m, parallel=fxmem.FSDP(2))
    b = 128
    budget = (r.peak_bytes(b) + _analyze(m, parallel=fxmem.FSDP(8)).peak_bytes(b)) // 2
    f = r.fits(b, budget)
    w = f.way("fsdp")
    assert w is not None and w.value > 2
    assert _analyze(m, parallel=fxmem.FSDP(w.value)).fits(b, budget, ways=False)
    assert not _analyze(m, parallel=fxmem.FSDP(w.value - 1)).fits(b, budget, ways=False)


def test_bad_arguments_are_one_line_errors():
    r = _analyze(_stack())
    with pytest.raises(fxmem.InputError, match="B must be a positive int"):
        r.fits(0, 10**6)
    with pytest.raises(fxmem.InputError, match="budget_bytes must be a positive int"):
        r.fits(8, 1.5e6)
    with pytest.raises(fxmem.InputError, match="either budget_bytes or gpu"):
        r.fits(8, 10**6, gpu="A100-40GB")


SEED = ["analyze", "examples/seed_convnet.py:SimpleConvNet", "--input", "B,3,32,32",
        "--target", "B:int64:10", "--optimizer", "adam"]


@pytest.mark.parametrize("fmt", ["table", "md", "json", "html"])
def test_cli_report_still_comes_with_exit_4(fmt, capfd, tmp_path):
    """B does not fit: the report in every format with the ways out, one line on stderr,
    exit 4 (scripts keep their code)."""
    from test_mistakes import run_in_process

    out_file = tmp_path / f"r.{fmt}"
    code, out, err = run_in_process([*SEED, "--batch", "256", "--budget", "200MiB",
                                     "--format", fmt, "--out", str(out_file)], capfd)
    assert code == 4 and out == ""
    assert err.count("\n") == 2 and "does not fit 200.00 MiB" in err and "B=" in err
    text = out_file.read_text()
    if fmt == "json":
        fit = json.loads(text)["fit"]
        assert fit["fits"] is False and fit["over_bytes"] > 0
        assert [w["kind"] for w in fit["ways"]][0] == "batch"
    else:
        assert "does not fit" in text and "one step beyond" in text


@pytest.mark.parametrize("flag", ["--fsdp", "--ddp"])
def test_cli_nothing_fits_a_parallel_step(flag, capfd):
    """--checkpoint auto finds no plan within 100 bytes: the report of the step without one,
    saying so, exit 4 (this was a one-line error)."""
    from test_mistakes import NET, run_in_process

    code, out, err = run_in_process([*NET, flag, "2", "--checkpoint", "auto", "--budget",
                                     "100", "--format", "md"], capfd)
    assert code == 4 and err.count("\n") == 1 and "does not fit 100 B" in err
    assert "no checkpoint plan fits at B=" in out and "## Per rank" in out


@pytest.mark.parametrize("extra", [["--out", "{out}"], ["--checkpoint", "auto"], ["--whatif"]],
                         ids=["out", "checkpoint_auto", "whatif"])
def test_cli_a_budget_nothing_fits(extra, capfd, tmp_path):
    """100 bytes: no B, no plan, no number of GPUs; the report says so, exit 4."""
    from test_mistakes import NET, run_in_process

    out = tmp_path / "report.txt"
    code, stdout, err = run_in_process(
        [*NET, "--budget", "100", *(a.replace("{out}", str(out)) for a in extra)], capfd)
    assert code == 4 and "does not fit 100 B" in err
    assert "nothing fxmem searched makes it fit" in err
    text = out.read_text() if "--out" in extra else stdout
    assert "does not fit" in text and "no batch size fits, not even B=1" in text


@pytest.mark.parametrize("a, s, budget", [(100, 6400, 150), (10, 10**6, 11), (0, 999, 1),
                                          (500, 64, 520)])
def test_fewest_ranks_search_is_exact_and_short(a, s, budget):
    """The world-size search returns the smallest w that fits, exactly, and with a need of
    the FSDP2 shape (a + s / w, rounded up as blocks are) tries few world sizes."""
    from fxmem.report.world_search import MAX_WORLD_SIZE, fewest

    def need(w):
        return a + -(-s // w) + (w % 3)  # not exactly on the line

    tried = []

    def fits(w):
        tried.append(w)
        return max(need(v) for v in range(w, MAX_WORLD_SIZE + 1)) <= budget  # monotone

    want = next((w for w in range(2, MAX_WORLD_SIZE + 1) if fits(w)), None)
    tried.clear()
    got = fewest(fits, 2, need=need, budget=budget)
    assert got == want
    assert len(set(tried)) <= 8, tried


def test_fewest_ranks_search_guesses_by_the_floor_once_one_fits():
    """On CUDA a world size can fit within the budget while its replay with no limit needs
    more (the allocator frees its cache and retries): past the first w that fits, the need's
    line says nothing, the floor's (``max_memory_allocated()``, which no budget lowers) does.
    Here 2 and 4 do not fit, the need's line guesses 8 (it fits), and the floor's line
    through 4 and 8 points at 5, which fits where 4 does not: four analyses, not six (8's
    neighbours down to 5)."""
    from fxmem.report.world_search import fewest

    tried = []

    def fits(w):
        tried.append(w)
        return w >= 5

    got = fewest(fits, 2, need=lambda w: 80 + 160 / w, budget=100,
                  floor=lambda w: 60 + 160 / w)
    assert got == 5 and tried == [2, 4, 8, 5]


@pytest.mark.parametrize("first", [None, 300, 1024])
def test_a_need_falling_towards_a_limit_over_the_budget_is_tried_at_the_search_s_end(first):
    """Where the need's line through the world sizes that do not fit falls towards a limit
    over the budget while the floor's falls under it (on CUDA: the replay with no limit
    needs more than a step within the budget may), the search tries its end next, not
    every doubling up to it: none fitting, three analyses (Qwen2.5-3B's with a plan had
    been ten); a world size that does fit there, found from it as from any other."""
    from fxmem.report.world_search import MAX_WORLD_SIZE, fewest, towards

    tried = []

    def fits(w):
        tried.append(w)
        return first is not None and w >= first

    seen = []
    got = fewest(fits, 2, need=lambda w: 100 + 40 // w, budget=90,
                 floor=lambda w: 50 + 40 // w, seen=seen)
    assert got == first
    if first is None:  # (the end tried, and said so: its need stays over the budget)
        assert tried == [2, 4, MAX_WORLD_SIZE]
        assert towards(seen, "live") == f"not even {MAX_WORLD_SIZE} GPUs do (a rank needs " \
            "100 B there)"
    assert len(set(tried)) <= 14, tried


def test_fewest_ranks_search_starts_from_the_world_size_asked():
    """Given the world size asked as a point that does not fit and twice it as the guess,
    the search goes on from the line through them: where it meets the budget (16 GPUs here,
    then 15, which does not fit), or, when its limit is over the budget, nowhere (one world
    size analysed: Llama-3.1-70B over 64 GPUs had been analysed at 65 and 130)."""
    from fxmem.report.world_search import fewest

    def need(w):
        return 80 + 160 / w

    tried = []

    def fits(w):
        tried.append(w)
        return need(w) <= 90

    got = fewest(fits, 5, need=need, budget=90, seen=[(4, need(4), need(4))], guess=8)
    assert got == 16 and tried == [8, 16, 15]
    tried.clear()
    got = fewest(fits, 5, need=need, budget=79, seen=[(4, need(4), need(4))], guess=8)
    assert got is None and tried == [8]
    tried.clear()  # a guess past the search's end is tried at its end
    assert fewest(fits, 5, 6, need=need, budget=79, seen=[(4, 120, 120)], guess=8) is None
    assert tried == [6]


def test_fewest_ranks_counts_the_optimizer_temporaries_that_shard():
    """Twelve Linear blocks at B=1: at 2 GPUs AdamW's foreach temporaries (half the model)
    make the peak, so what is left beside the shards (1.58 MB) is over a 1.5 MB budget, yet
    those temporaries shrink with more GPUs too: 32 GPUs fit. The way found is checked here
    by analysing again at it and one GPU fewer."""
    from fxmem.report.fit import fit
    from fxmem.report.ways import rank_reports

    m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(12)])
    r = fxmem.analyze(m, torch.randn(4, 256), loss=lambda o: o.sum(),
                      optimizer=torch.optim.AdamW)
    budget, analysed = 1_500_000, {}

    def again(parallel, **kw):  # each world size analysed once by the search (B=1 alone:
        key = parallel.world_size, tuple(kw.items())  # concrete_batch), once by this test
        if key not in analysed:
            analysed[key] = r.reanalyze(parallel=parallel, **kw)
        return analysed[key]

    def need(w):
        return max(g.peak_bytes(1) for g in rank_reports(again(fxmem.FSDP(w))))

    two = again(fxmem.FSDP(2))
    assert need(2) - max(g.fixed_bytes for g in rank_reports(two)) > budget
    f = fit(r, 1, budget, by="live", reanalyze=again)
    way = f.way("fsdp")
    assert way is not None, f.none
    assert need(way.value) <= budget < need(way.value - 1)
    assert way.beyond == f"{way.value - 1} GPUs do not fit"


def test_no_world_size_is_analysed_when_what_grows_with_b_is_over_the_budget():
    """FSDP2 shards parameters, gradients and optimizer state, never the tensors that grow
    with B: their live bytes peak the same at 2 and at 8 GPUs, under each rank's peak. When
    they alone are over the budget, with the smallest plan too, the fewest-GPUs search
    analyses no world size and says why."""
    from fxmem.report.fit import fit
    from fxmem.report.ways import batch_floor
    from fxmem.report.world_size import smallest_plan

    m = _stack()
    r = _analyze(m)
    b = 512
    least = batch_floor(r, b)
    for w in (2, 8):
        at = _analyze(m, parallel=fxmem.FSDP(w))
        assert batch_floor(at, b) == least < at.peak_bytes(b)
    planned = batch_floor(r.with_plan(smallest_plan(r, b)), b)
    assert 0 < planned < least
    analysed = []

    def again(**options):
        analysed.append(options)
        return r.reanalyze(**options)

    f = fit(r, b, planned - 1, by="live", reanalyze=again)
    assert analysed == []
    grows = [n for n in f.none if "the tensors that grow with B alone peak at" in n]
    assert len(grows) == 2 and "with a checkpoint plan either" in grows[1], f.none


def test_more_gpus_with_a_plan_are_not_traced_when_the_checkpoint_way_re_runs_less(monkeypatch):
    """On FSDP2 over 2 GPUs, the step as asked, a plan fits, and no number of GPUs fits
    without one (what grows with B alone is over the budget): the search with a plan stops at
    3 GPUs, where the cheapest plan, derived, re-runs no less than the checkpoint way's, and
    says so with no step traced under a plan there (the checkpoint way's plan is, once). On
    3 GPUs the shards are uneven (ranks 0-1 and rank 2): rank 0's cheapest plan re-running
    no less, no plan running on every rank re-runs less, and rank 2 is not traced; rank 0
    there is derived from its step on 2 GPUs (fxmem.trace.parallel.other_ranks)."""
    import importlib

    from fxmem.report.fit import fit
    from fxmem.report.ways import batch_floor
    from fxmem.report.world_size import smallest_plan

    analyze_module = importlib.import_module("fxmem.analyze")
    m = _stack()
    r = _analyze(m, parallel=fxmem.FSDP(2))
    b = 512
    least = batch_floor(r, b)
    planned = r.with_plan(smallest_plan(r, b)).peak_bytes(b)
    assert planned < least
    traced, real = [], analyze_module.trace

    def counted(*args, **kwargs):
        traced.append((kwargs["parallel"].world_size, kwargs["rank"],
                       bool(kwargs.get("checkpoint"))))
        return real(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "trace", counted)
    again = r.groups[0].report.reanalyze
    assert again is not None
    f = fit(r, b, planned + (least - planned) // 2, by="live", reanalyze=again)
    assert f.way("checkpoint") is not None and f.way("fsdp+checkpoint") is None
    assert ("FSDP2 with a checkpoint plan: on 2 GPUs a plan re-running no more fits "
            "(the checkpoint way)") in f.none
    assert sorted(traced) == [(2, 0, True)], traced


def test_the_plan_on_one_gpu_more_traces_no_other_rank_without_it(monkeypatch):
    """FSDP2 over 2 GPUs: at a budget where a plan fits (the checkpoint way) and one GPU
    more fits with a plan re-running less (the stack on 3 GPUs: ranks 0-1 and rank 2),
    rank 2 is not traced: the way's comparison with the checkpoint way had derived the
    cheapest plan over every rank there, tracing rank 2 without a plan (Llama-3.1-8B
    --fsdp 8: rank 8 of 9), then traced it with the plan; its step is now derived from
    rank 0's (fxmem.trace.parallel.other_ranks), with the plan and without, and rank 0's
    without the plan from rank 0's on 2 GPUs. (The stack's plan there re-runs under a point
    less than the checkpoint way's, no way out of its own: WORTH set to 0 for this test.)"""
    from fxmem.report import world_size

    monkeypatch.setattr(world_size, "WORTH", 0.0)
    m, b = _stack(), 512
    r = _analyze(m, parallel=fxmem.FSDP(2))
    traced = _counting(monkeypatch)
    f = r.fits(b, 5_069_736, by="live")  # a peak of the frontier on 3 GPUs (the stack's)
    way, one = f.way("fsdp+checkpoint"), f.way("checkpoint")
    assert way is not None and way.value == 3 and one is not None, (f.line, f.none)
    assert way.recompute_share < one.recompute_share
    assert [(t["rank"], bool(t["checkpoint"])) for t in traced
            if t["parallel"].world_size == 3] == [(0, True)], traced


def test_one_gpu_more_saving_under_a_point_is_said_not_traced(monkeypatch):
    """The same budget, WORTH as it is (a point of the FLOPs): the stack's plan on 3 GPUs
    re-runs under a point less than the checkpoint way's on 2, so it is no way out, a line
    in the ways not found saying so with both shares, and its plan is not traced
    (its trace had confirmed a way a GPU more for a fraction of a point: Llama-3.1-8B over
    8 GPUs, 13.3 % and 13.1 % on 9)."""
    m, b = _stack(), 512
    r = _analyze(m, parallel=fxmem.FSDP(2))
    traced = _counting(monkeypatch)
    f = r.fits(b, 5_069_736, by="live")
    one = f.way("checkpoint")
    assert one is not None and f.way("fsdp+checkpoint") is None, (f.line, f.none)
    line = next(n for n in f.none if n.startswith("FSDP2 with a checkpoint plan: on 3 GPUs"))
    assert line.endswith(f"under a point less than the checkpoint way on 2 GPUs "
                         f"({fmt_share(one.recompute_share)})"), line
    assert [t for t in traced if t["parallel"].world_size == 3
            and t["checkpoint"]] == [], traced


def test_a_world_size_whose_rank_0_does_not_fit_traces_no_other_rank(monkeypatch):
    """On 3 GPUs the stack's rows (256, 64) shard unevenly: ranks 0-1 and rank 2 are two
    groups, two traces. Where rank 0 does not fit, the step on 3 GPUs does not, whatever
    rank 2 holds: the fewest-GPUs search (4 here, between the peaks at 3 and 4 GPUs) traces
    rank 0 alone there, with and without a plan, and derives it from its step on 2 GPUs
    (fxmem.trace.parallel.other_ranks): nothing over more than 2 GPUs is traced. Its answer
    is checked by analysing again at it (all ranks) and one GPU fewer."""
    m, b = _stack(), 4
    three = _analyze(m, parallel=fxmem.FSDP(3))
    assert [g.ranks for g in three.groups] == [(0, 1), (2,)]
    four = _analyze(m, parallel=fxmem.FSDP(4))
    r = _analyze(m, parallel=fxmem.FSDP(2))
    traced = _counting(monkeypatch)
    f = r.fits(b, (three.peak_bytes(b) + four.peak_bytes(b)) // 2, by="live")
    assert f.way("fsdp").value == 4, (f.line, f.none)
    assert [(t["parallel"].world_size, t["rank"]) for t in traced
            if t["parallel"].world_size > 2] == [], traced
    monkeypatch.undo()
    _check_ways(m, r, f)


def test_a_plan_on_uneven_ranks_is_chosen_on_rank_0_and_traced_on_the_others(monkeypatch):
    """The stack on one GPU, a budget only FSDP2 over 3 GPUs with a plan fits (by live
    bytes): on 3 GPUs ranks 0-1 and rank 2 hold unlike shards. Rank 0's plans are derived
    from its trace; the cheapest that fits it, traced on rank 0 (rank 2's step derived from
    that trace: fxmem.trace.parallel.other_ranks), runs on both, so no plan fitting every
    rank re-runs less and rank 2 is never traced. The answer is checked by analysing again
    at it (all ranks) and one GPU fewer."""
    m, b = _stack(), 512
    three = _analyze(m, parallel=fxmem.FSDP(3))
    assert [g.ranks for g in three.groups] == [(0, 1), (2,)]
    two = _analyze(m, parallel=fxmem.FSDP(2))
    low = [min(p.peak_bytes for p in r.frontier(b)) for r in (two, three)]
    r = _analyze(m)
    traced = _counting(monkeypatch)
    f = r.fits(b, sum(low) // 2, by="live")
    way = f.way("fsdp+checkpoint")
    assert way is not None and way.value == 3, (f.line, f.none)
    got = [(t["parallel"].world_size, t["rank"], bool(t.get("checkpoint"))) for t in traced]
    assert (3, 0, True) in got and all(k != 2 for _, k, _ in got), got
    monkeypatch.undo()
    assert way.plan == three.plan_for(sum(low) // 2, b, by="live").plan
    _check_ways(m, r, f)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_plan_chosen_on_rank_0_is_the_one_chosen_over_every_rank(device, monkeypatch):
    """ParallelReport.plan_for chooses on the first group of ranks, then traces its plan on
    every group: on 3 GPUs (two unlike groups), at three of the frontier's peaks (on the
    CPU, by live bytes) or replayed needs (on CUDA, by the caching allocator's replay), the
    highest that needs a plan, the lowest and one between, the plan, its peak, its replay
    and its recompute FLOPs are those of the choice over every group's planner."""
    from fxmem.report.ranks import ParallelReport

    m, b = _stack(width=256, hidden=1024), 4096
    three = _analyze(m, device, parallel=fxmem.FSDP(3))
    assert len(three.groups) == 2
    if device == "cuda":
        needs = {max(g.report.cuda_memory(b).max_reserved for g in three.with_plan(p.plan).groups)
                 for p in three.frontier(b)}
    else:
        needs = {p.peak_bytes for p in three.frontier(b)}
    ordered = sorted(needs, reverse=True)[1:]  # the largest needs no plan; three others
    for budget in dict.fromkeys([ordered[0], ordered[len(ordered) // 2], ordered[-1]]):
        first = three.plan_for(budget, b)
        with monkeypatch.context() as mp:
            mp.setattr(ParallelReport, "_first_chooses", lambda *a, **k: None)
            every = three.plan_for(budget, b)
        assert (first.plan, first.peak_bytes, first.recompute_flops) == \
            (every.plan, every.peak_bytes, every.recompute_flops)
        assert first.report.peak_bytes(b) == every.report.peak_bytes(b)
        if device == "cuda":
            assert first.run.max_reserved == every.run.max_reserved <= budget
    with pytest.raises(fxmem.InfeasibleBudgetError) as first:
        three.plan_for(min(needs) // 2, b)
    with monkeypatch.context() as mp, pytest.raises(fxmem.InfeasibleBudgetError) as every:
        mp.setattr(ParallelReport, "_first_chooses", lambda *a, **k: None)
        three.plan_for(min(needs) // 2, b)
    assert str(first.value) == str(every.value)


def test_rank_0_s_walk_is_made_once_derived_then_traced(monkeypatch):
    """A search asks rank 0's cheapest plan derived (confirm=False), then the plan over
    every rank, which chooses on rank 0 first with the plan traced: the walk by the
    allocator's replay over the derived steps is the same, made once (the 8B --fsdp 8
    command walked it twice at 9 GPUs: 12 replays more), and the trace confirms its plan."""
    from fxmem.checkpoint import confirm

    m, b = _stack(width=256, hidden=1024), 4096
    three = _analyze(m, "cuda", parallel=fxmem.FSDP(3))
    needs = sorted({max(g.report.cuda_memory(b).max_reserved
                        for g in three.with_plan(p.plan).groups) for p in three.frontier(b)})
    budget, walks, real = needs[len(needs) // 2], [], confirm.walk
    monkeypatch.setattr(confirm, "walk", lambda *a, **k: walks.append(1) or real(*a, **k))
    derived = three.first_group().plan_for(budget, b, confirm=False)
    assert len(walks) == 1 and derived.plan
    traced = three.plan_for(budget, b)
    assert len(walks) == 1 and traced.plan == derived.plan and traced.run.fits


def test_rank_0_s_walk_accepts_only_plans_the_other_ranks_run(monkeypatch):
    """Over 5 GPUs the stack of 6 blocks has two groups of ranks (0-3, 4). At a budget where
    the cheapest plan that runs on rank 0 alone, derived, runs out on rank 4 (the
    allocator's blocks fall otherwise there), as Llama-3.1-8B's did over 5 GPUs: the walk
    over rank 0's plans accepts a plan only where it runs on rank 4 too (derived from rank
    0's trace), so one walk finds the plan, not one on rank 0 then one over both groups'
    planners; the plan, its peak and its replay are those of the choice over both."""
    from fxmem.checkpoint import confirm
    from fxmem.report.ranks import ParallelReport

    m, b = _stack(width=256, hidden=1024, depth=6), 2048
    five = _analyze(m, "cuda", parallel=fxmem.FSDP(5))
    assert [g.ranks for g in five.groups] == [(0, 1, 2, 3), (4,)]
    budget = _rank_0_s_plan_runs_out_on_rank_4(m, b, five)
    walks, real = [], confirm.walk
    monkeypatch.setattr(confirm, "walk", lambda *a, **k: walks.append(1) or real(*a, **k))
    got = five.plan_for(budget, b)
    assert len(walks) == 1 and got.run.fits, walks
    with monkeypatch.context() as mp:
        mp.setattr(ParallelReport, "_first_chooses", lambda *a, **k: None)
        every = _analyze(m, "cuda", parallel=fxmem.FSDP(5)).plan_for(budget, b)
    assert (got.plan, got.peak_bytes, got.recompute_flops, got.run.max_reserved) == \
        (every.plan, every.peak_bytes, every.recompute_flops, every.run.max_reserved)


def _rank_0_s_plan_runs_out_on_rank_4(m, b: int, five) -> int:
    """A budget at which the cheapest plan running on rank 0 alone (derived) runs out on
    rank 4: 182,871,654 bytes on torch 2.13's trace; else the first of 40 budgets across the
    frontier's needs that does, or the test is skipped (none on 2.15's trace: a chance of
    the allocator's blocks, which other builds size otherwise)."""
    from fxmem.report.first_group import derived_runs

    needs = sorted({max(g.report.cuda_memory(b).max_reserved
                        for g in five.with_plan(p.plan).groups) for p in five.frontier(b)})
    probe = _analyze(m, "cuda", parallel=fxmem.FSDP(5))  # one trace for every budget (a
    # trace each took the 2.15 tier 156 s to skip); its plans are chosen per budget
    for budget in [182_871_654] + [needs[0] + (needs[-1] - needs[0]) * k // 40
                                   for k in range(40)]:
        try:
            alone = probe.first_group().plan_for(budget, b, confirm=False)
        except fxmem.FxmemError:
            continue
        if alone.plan and not derived_runs(five, alone.plan, b, budget, "device", 0):
            return budget
    pytest.skip("on this build no budget tried makes rank 0's plan run out on rank 4")


def _counting(monkeypatch) -> list:
    """The keyword options of every trace fxmem.analyze's module makes from now on."""
    import importlib

    analyze_module = importlib.import_module("fxmem.analyze")
    traced, real = [], analyze_module.trace

    def counted(*args, **kwargs):
        traced.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "trace", counted)
    return traced


def test_a_batch_below_the_formulas_is_traced_once(monkeypatch):
    """A Llama's formulas hold from B=2; B=1 is traced as an int, once for the analysis,
    whichever report derived from it asks (its length's, its plans')."""
    from test_fsdp import _hf, _lm_loss

    ids = torch.randint(0, 128, (2, 16))
    r = fxmem.analyze(_hf("llama"), ids, ids, loss=_lm_loss, device="cpu",
                      dims={"L": [(0, 1), (1, 1)]})
    assert r.at(L=16).min_batch_size == 2
    traced = _counting(monkeypatch)
    one = r.peak_bytes(1, L=16)
    assert [t.get("concrete_batch") for t in traced] == [1]
    at = r.at(L=16)
    plan = ["model.layers.0"]
    assert at.peak_bytes(1) == one and at.with_plan(plan).peak_bytes(1) <= one
    assert len(traced) == 1


def test_fewest_gpus_of_a_one_gpu_step_trace_each_world_size_at_b_and_l_alone(monkeypatch):
    """A step on one GPU: the FSDP2 search reads each number of GPUs it tries at the B and
    length asked alone, so it traces them there (every size a number, the cheaper trace),
    not for the formulas in B and L; its answer is checked by analyses of its own in B and
    L: it fits and one GPU fewer does not."""
    from test_fsdp import _hf, _lm_loss

    ids = torch.randint(0, 128, (2, 16))
    model, dims = _hf("llama"), {"L": [(0, 1), (1, 1)]}
    step = dict(loss=_lm_loss, device="cpu", optimizer=torch.optim.AdamW, dims=dims)

    peaks = {}

    def peak(w):  # (each world size analysed once)
        if w not in peaks:
            peaks[w] = fxmem.analyze(model, ids, ids, parallel=fxmem.FSDP(w),
                                     **step).peak_bytes(2, L=16)
        return peaks[w]
    two, four = peak(2), peak(4)
    budget = (two + four) // 2
    r = fxmem.analyze(model, ids, ids, **step)
    assert four < budget < two < r.peak_bytes(2, L=16)
    traced = _counting(monkeypatch)
    f = r.fits(2, budget, by="live", L=16)
    way = f.way("fsdp")
    assert not f and way is not None and 2 < way.value <= 4, f.none
    searched = [t for t in traced if t.get("parallel") is not None]
    assert searched and all((t.get("concrete_batch"), t.get("concrete_dims")) == (2, {"L": 16})
                            for t in searched), searched
    assert peak(way.value) <= budget < peak(way.value - 1)


def test_fewest_gpus_at_a_batch_below_the_formulas_traces_that_batch_alone(monkeypatch):
    """At B=1, below where the Llama's formulas hold, each number of GPUs the FSDP2 search
    tries is traced at B=1 alone (one trace a rank group), not first for the formulas; its
    answer is checked by analyses of its own: it fits and one GPU fewer does not."""
    from test_fsdp import _hf, _lm_loss

    ids = torch.randint(0, 128, (2, 16))
    model, step = _hf("llama"), dict(loss=_lm_loss, device="cpu", optimizer=torch.optim.AdamW)
    two, four = (fxmem.analyze(model, ids, ids, parallel=fxmem.FSDP(w), **step).peak_bytes(1)
                 for w in (2, 4))
    assert four < two
    r = fxmem.analyze(model, ids, ids, parallel=fxmem.FSDP(2), **step)
    budget = (two + four) // 2
    traced = _counting(monkeypatch)
    f = r.fits(1, budget, by="live")
    way = f.way("fsdp")
    assert not f and way is not None and 2 < way.value <= 4
    assert traced and all(t.get("concrete_batch") == 1 for t in traced), traced
    assert len(traced) == len({(t["parallel"].world_size, t["rank"], bool(t.get("checkpoint")))
                               for t in traced})
    fits, fewer = (fxmem.analyze(model, ids, ids, parallel=fxmem.FSDP(w), **step).peak_bytes(1)
                   for w in (way.value, way.value - 1))
    assert fits <= budget < fewer


def test_an_inference_step_searches_no_checkpoint_plan():
    """No backward, so a checkpoint plan keeps nothing less: the ways say they were not
    searched for an inference step (Mistral-7B's --inference command had said "no
    checkpoint plan fits at B=32: the smallest peak is 90.40 GiB"), FSDP2's own
    mixed precision included, and none carries a plan."""
    m = nn.Sequential(*[nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                        for _ in range(4)])
    x = torch.randn(4, 256)
    for parallel in (None, fxmem.FSDP(2)):
        r = fxmem.analyze(m, x, train=False, device="cuda", amp=torch.bfloat16,
                          parallel=parallel)
        b = 4096
        f = r.fits(b, r.peak_bytes(b) // 2)
        assert not f.fits and not any(w.plan for w in f.ways)
        said = [n for n in f.none if "not searched for an inference step" in n]
        assert any(n.startswith(f"the cheapest checkpoint plan at B={b}") for n in said)
        assert any(n.startswith("the fewest GPUs under FSDP2 with a checkpoint plan")
                   for n in said)
        if parallel is not None:  # its param_dtype way does not fit without a plan either
            assert any(n.startswith("FSDP2's param_dtype") for n in said), f.none


def test_a_b_below_the_asked_one_is_the_batch_way_where_a_larger_one_runs(monkeypatch):
    """Whether a step runs within the budget need not be monotone in B (the caching
    allocator's blocks): where the asked B runs out and a larger B runs, the batch way is
    the largest B below the asked one that runs, one more not, and says the larger runs too
    (Qwen3-8B with 2 layers, --inference over 2 GPUs at B=8 on an L40S: B=8 ran out, B=10
    ran, and the command failed with "the largest B within the budget is 10, yet B=8 does
    not fit")."""
    from fxmem.report.result import Report
    from fxmem.report.ways import Check

    r = _analyze(_stack(), device="cuda")
    budget = r.runs_on_device(12, 2**40).max_reserved + 2**20  # B = 12 and below run
    real = Report.runs_on_device

    def runs(self, b, *args, **kwargs):  # B = 5 and 8 run out; the rest as replayed
        got = real(self, b, *args, **kwargs)
        return dataclasses.replace(got, fits=False, oom=(1, 0, "aten.mm.default", "forward",
                                                        "0")) if b in (5, 8) else got
    monkeypatch.setattr(Report, "runs_on_device", runs)
    f = r.fits(8, budget)
    assert not f.fits
    (way,) = [w for w in f.ways if w.kind == "batch"]
    assert way.value < 8 and way.value != 5 and (way.value + 1 == 5 or way.value == 7)
    check = Check("device", budget, 0)
    assert check.fits(r, way.value) and not check.fits(r, way.value + 1)
    assert "below B=8" in way.line and "runs too" in way.line


def test_no_b_fits_gives_b_1_s_peak():
    """Where no B fits, the headline says what B = 1 needs where a search traced the step at
    B = 1 (the formulas hold from B = 2 on CUDA), else what the formulas' least B needs, and
    says which B: it had given the peak at the least B as "the smallest B" (Gemma-2-27B over
    8 GPUs: 1,992.48 GiB, B = 2's). No trace is made for the sentence alone (the one-GPU
    Llama-3.1-8B command took 1.5 s longer when B = 1 was traced for it)."""
    from fxmem.report.headline import largest_b
    from fxmem.report.summary import summarize
    from fxmem.report.text import fmt_bytes

    m = _stack(hidden=65536, depth=2)  # no optimizer: its activations are the peak
    r = fxmem.analyze(m, torch.randn(4, 64), loss=_sum, device="cuda")
    s = summarize(r, B=4, budget_bytes=2**20)  # the weights alone are over it: B = 1 untraced
    assert s.max_batch_size is None and r._traced_at(1, make=False) is None
    assert (s.min_peak_b, s.min_peak_bytes) == (2, r.peak_bytes(2))
    assert f"B = 2 runs out of memory (its live tensors alone peak at " \
           f"{fmt_bytes(r.peak_bytes(2))})" in largest_b(s).lead
    assert r.min_batch_size == 2 and r.peak_bytes(1) < r.peak_bytes(2)  # B = 1 traced now
    s = summarize(r, B=4, budget_bytes=2**20)
    assert (s.min_peak_b, s.min_peak_bytes) == (1, r.peak_bytes(1))
    assert f"B = 1 runs out of memory (its live tensors alone peak at " \
           f"{fmt_bytes(r.peak_bytes(1))})" in largest_b(s).lead


def test_the_headline_says_the_asked_b_runs_out_where_a_larger_one_runs():
    """Where the largest B the headline gives is above the asked B, which runs out (the
    caching allocator's blocks are not monotone in B), the headline says so beside it: it
    had said "Largest B ...: 10" over a report whose B=8 does not fit, with no word why."""
    from fxmem.report.headline import largest_b
    from fxmem.report.summary import summarize

    r = _analyze(_stack(), device="cuda")
    budget = r.runs_on_device(12, 2**40).max_reserved + 2**20
    s = summarize(r, B=8, budget_bytes=budget)
    assert s.max_batch_size_by == "device" and s.max_batch_size >= 12
    fit = {**r.fits(8, budget).as_dict(), "fits": False}
    h = largest_b(dataclasses.replace(s, fit=fit))
    assert h.tail.endswith("; B = 8, asked, runs out: the caching allocator's blocks are not "
                           "monotone in B")
    assert "asked" not in largest_b(s).tail and "asked" not in largest_b(
        dataclasses.replace(s, fit={**fit, "B": s.max_batch_size + 1})).tail
