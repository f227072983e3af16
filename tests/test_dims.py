"""Named dims beyond B (fxmem.analyze(..., dims=...)): formulas in B and L, against real
eager steps at lengths and batch sizes other than the traced ones."""

import json
import os
import subprocess
import sys

import pytest
import sympy
import torch
from torch import nn

import fxmem
from fxmem.formula.symbols import L
from zoo import gpt2

pytest.importorskip("transformers")


def _seq_mlp():
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())


def test_a_per_token_model_is_linear_in_b_times_l():
    m = _seq_mlp()
    step = dict(loss=lambda o: o.sum(), optimizer=torch.optim.SGD)
    r = fxmem.analyze(m, torch.randn(4, 10, 16), **step, device="cpu", dims={"L": [(0, 1)]})
    assert r.dims == ("L",)
    assert sympy.Poly(r.peak.args[0], fxmem.B, L).total_degree() == 2  # B*L terms
    for b, n in [(2, 2), (3, 7), (8, 100), (13, 50)]:
        real = fxmem.measure(m, torch.randn(4, n, 16), **step, B=b).peak_bytes
        assert r.peak_bytes(b, L=n) == real
        assert int(r.peak.subs({fxmem.B: b, L: n})) == real


@pytest.fixture(scope="module")
def lm():
    m = gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
             bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    ids = torch.randint(0, 128, (4, 16))
    r = fxmem.analyze(m, (ids, ids), optimizer=torch.optim.AdamW, device="cpu",
                      dims={"L": [(0, 1), (1, 1)]})
    return m, r


def test_gpt2_attention_has_b_l_squared_terms_and_is_exact(lm):
    m, r = lm
    assert any(sympy.Poly(a, fxmem.B, L).degree(L) == 2 for a in r.peak.args)  # B*L**2
    for b, n in [(2, 8), (5, 24), (3, 33)]:  # traced at B=4, L=16
        x = torch.randint(0, 128, (4, n))
        real = fxmem.measure(m, (x, x), optimizer=torch.optim.AdamW, B=b).peak_bytes
        assert r.peak_bytes(b, L=n) == real == int(r.peak.subs({fxmem.B: b, L: n}))


def test_each_storage_specialized_is_its_own_substitution(lm):
    """specialize makes what does not hold L once per trace and each size expression once
    per value: every storage as substituting L into it alone gives it, at several
    lengths in turn."""
    from fxmem.formula.symbols import Size
    from fxmem.memory.dims import specialize

    trace = lm[1].named.trace
    assert any(L in s.size.expr.free_symbols for s in trace.storages)
    for n in (8, 24, 16, 9):
        got = specialize(trace, L=n).storages
        assert len(got) == len(trace.storages)
        for s, t in zip(trace.storages, got):
            v = {L: sympy.Integer(n)}
            assert t.size.expr == Size.of(sympy.expand(s.size.expr.xreplace(v))).expr
            assert t.shape == tuple(d.xreplace(v) if isinstance(d, sympy.Basic) else d
                                    for d in s.shape)
            assert (t.sid, t.category, t.created_by, t.freed_after) == \
                (s.sid, s.category, s.created_by, s.freed_after)


def test_a_length_only_replayed_rounds_no_sizes():
    """The longest-length search replays each length it tries through the caching allocator,
    which takes each storage's own bytes: the device sizes (each rounded to the
    allocator's blocks in sympy, a quarter of a specialization's time) are made only when
    something reads them. The reductions' arguments, which the replay stages, are each
    op's own with the length put in."""
    from fxmem.memory.dims import _tree_subs

    m = _seq_mlp()
    r = fxmem.analyze(m, torch.randn(4, 10, 16), loss=lambda o: o.sum(),
                      optimizer=torch.optim.SGD, device="cuda", dims={"L": [(0, 1)]})
    at = r.at(L=24)
    assert at.runs_on_device(4, 2**30).fits
    assert "sizes" not in at.liveness.__dict__
    assert at.peak_bytes(4) == fxmem.analyze(m, torch.randn(4, 24, 16), loss=lambda o: o.sum(),
                                             optimizer=torch.optim.SGD,
                                             device="cuda").peak_bytes(4)
    assert "sizes" in at.liveness.__dict__
    reduced = [(o, t) for o, t in zip(r.named.trace.ops, at.liveness.graph.trace.ops)
               if o.reduce is not None]
    assert reduced
    for o, t in reduced:
        assert t.reduce == _tree_subs(o.reduce, {L: sympy.Integer(24)})


def test_the_longest_length_is_searched_where_the_trace_holds(lm):
    """A condition over B and L together (a compiled step's ``4096*B*L >= 5242880``, where
    inductor chose a kernel by size) bounds L from below at a given B: the search for the
    longest L starts there, not at L's own least value (it had asked B=2, L=2 and ended in
    "B=2, L=2 is outside where the trace holds"); a budget below the peak there is
    infeasible, naming that L."""
    from dataclasses import replace

    from fxmem.memory.dims import DimsFormula

    _, r = lm
    held = DimsFormula(replace(r.named.trace, guards=(*r.named.trace.guards,
                                                      sympy.Ge(4096 * fxmem.B * L, 5242880))),
                       r.named.device)
    budget = r.peak_bytes(2, L=700)
    assert held.max_length(budget, B=2) == r.max_length(budget, B=2) >= 700
    # (a condition over B and L together bounds neither alone: B from 2 at a longer L)
    assert held.least_values == r.named.least_values
    with pytest.raises(fxmem.InfeasibleBudgetError, match=r"at B=2, L=640$"):
        held.max_length(r.peak_bytes(2, L=639), B=2)  # L >= 640 at B=2
    with pytest.raises(fxmem.InputError, match="outside where the trace holds"):
        held.peak_bytes(2, L=639)
    # a condition that ends L (a compiled kernel's 32-bit indices): where the step still
    # fits there, that end, marked; below it, the search as before
    ended = DimsFormula(replace(r.named.trace, guards=(*r.named.trace.guards,
                                                       sympy.Le(fxmem.B * L, 800))),
                        r.named.device)
    top = ended.max_length(r.peak_bytes(2, L=400), B=2)
    assert (top, top.beyond) == (400, True)
    inner = ended.max_length(r.peak_bytes(2, L=300), B=2)
    assert (inner, inner.beyond) == (r.max_length(r.peak_bytes(2, L=300), B=2), False)


def test_a_step_traced_at_one_point_is_the_formula_there(lm):
    """``concrete_batch`` and ``concrete_dims``: B and L plain ints (the inputs made at that
    length), the trace a way's plan is confirmed by (fxmem.report.ways.cheapest_plan): its
    storages, op for op, and peak are the formulas' at that point."""
    from fxmem.analyze import _report
    from fxmem.trace import trace

    m, r = lm
    ids = torch.randint(0, 128, (4, 16))
    for b, n in [(3, 40), (6, 9)]:
        t = trace(m, (ids, ids), optimizer=torch.optim.AdamW, device="cpu",
                  dims={"L": [(0, 1), (1, 1)]}, concrete_batch=b, concrete_dims={"L": n})
        assert not any(s.size.expr.free_symbols for s in t.storages)
        assert _report(t, None, "cpu").peak_bytes(b) == r.peak_bytes(b, L=n)


def test_a_b_below_the_formulas_at_fixed_dims_is_traced_at_that_point(lm, monkeypatch):
    """A report at fixed dims (``at(L=n)``) asked at B=1, below where its formulas hold,
    traces the step at B=1 and L=n alone (both plain ints: a trace in symbols costs more),
    not at B=1 in L; once the step at B=1 in L is traced, each length reads it."""
    import importlib

    analyze = importlib.import_module("fxmem.analyze")  # (fxmem.analyze: the function)
    m, _ = lm
    ids = torch.randint(0, 128, (4, 16))  # a report of its own: nothing traced at B=1 yet
    r = fxmem.analyze(m, (ids, ids), optimizer=torch.optim.AdamW, device="cpu",
                      dims={"L": [(0, 1), (1, 1)]})
    made = []
    real = analyze.trace
    monkeypatch.setattr(analyze, "trace", lambda *a, **k: made.append(k) or real(*a, **k))
    at_9 = r.at(L=9)._small(1)
    assert [(k["concrete_batch"], k["concrete_dims"]) for k in made] == [(1, {"L": 9})]
    assert r._traced_at(1, make=False) is None  # the step at B=1 in L: not traced
    in_l = r._traced_at(1)
    assert at_9.peak_bytes(1) == in_l.at(L=9).peak_bytes(1)
    made.clear()
    assert r.at(L=11)._small(1).peak_bytes(1) == in_l.at(L=11).peak_bytes(1)
    assert made == []  # read from the trace in L


def test_a_b_whose_length_is_searched_is_traced_in_the_dims_alone(lm, monkeypatch):
    """Where the step at B=1 in L is wanted (the longest L at B=1: fit's length way, the
    CLI's setup rows; ``in_dims_at``), a report at fixed dims reads that trace at B=1 rather
    than tracing B=1 at its point too: one trace, not two."""
    import importlib

    from fxmem.report.fit import in_dims_at

    analyze = importlib.import_module("fxmem.analyze")
    m, _ = lm
    ids = torch.randint(0, 128, (4, 16))
    r = fxmem.analyze(m, (ids, ids), optimizer=torch.optim.AdamW, device="cpu",
                      dims={"L": [(0, 1), (1, 1)]})
    made = []
    real = analyze.trace
    monkeypatch.setattr(analyze, "trace", lambda *a, **k: made.append(k) or real(*a, **k))
    in_dims_at(r, 1)
    in_dims_at(r, 3)  # (B=3 is where the formulas hold: nothing to trace)
    assert made == []
    at_9 = r.at(L=9)._small(1)
    r.max_length(10**9, 1)
    assert [(k["concrete_batch"], k["concrete_dims"]) for k in made] == [(1, None)]
    assert at_9.peak_bytes(1) == r._traced_at(1).at(L=9).peak_bytes(1)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_formula_keeps_the_terms_that_can_be_the_peak(lm, device):
    m, r = lm
    if device == "cuda":  # 512-byte blocks: ceiling terms, bounded in the proofs
        ids = torch.randint(0, 128, (4, 16))
        r = fxmem.analyze(m, (ids, ids), optimizer=torch.optim.AdamW, device=device,
                          dims={"L": [(0, 1), (1, 1)]})
    rows = len(r.named._candidates[1])
    assert 1 < len(r.peak.args) < rows  # pruned, and still piecewise
    # peak_bytes takes the maximum over every candidate row: the pruned Max agrees with it
    for b in (2, 3, 5, 17, 64, 1000):
        for n in (2, 3, 7, 31, 64, 65, 129, 1000, 5000):
            assert int(r.peak.xreplace({fxmem.B: b, L: n})) == r.peak_bytes(b, L=n)


def test_largest_batch_and_length(lm):
    _, r = lm
    budget = 3 * 2**20
    b = r.max_batch_size(budget, L=32)
    assert r.peak_bytes(b, L=32) <= budget < r.peak_bytes(b + 1, L=32)
    n = r.max_length(budget, B=4)
    assert r.peak_bytes(4, L=n) <= budget < r.peak_bytes(4, L=n + 1)
    with pytest.raises(fxmem.InfeasibleBudgetError):
        r.max_length(2**20, B=4)
    # the model's own maximum length caps the answer; below it, it changes nothing
    assert r.max_length(budget, B=4, limit=n - 3) == n - 3
    assert r.max_length(budget, B=4, limit=n + 50) == n
    at = r.at(L=32)  # an ordinary Report: regimes, breakdown, plans
    assert at.peak_bytes(b) == r.peak_bytes(b, L=32) and at.regimes


def test_dims_are_checked():
    x = torch.randn(4, 10, 16)
    kw = dict(loss=lambda o: o.sum(), device="cpu")
    for dims, msg in [({"B": [(0, 1)]}, "identifier other than B"),
                      ({"L": [(1, 1)]}, "tensor 1 does not exist"),
                      ({"L": [(0, 0)]}, "has B at dim 0"),
                      ({"L": [(0, 3)]}, "has no such dim at dim 3"),
                      ({"L": [(0, 1), (0, 2)]}, "different sizes"),
                      ({"L": ["x"]}, "a place is (tensor index, dim)")]:
        with pytest.raises(fxmem.InputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            fxmem.analyze(_seq_mlp(), x, **kw, dims=dims)
    r = fxmem.analyze(_seq_mlp(), x, **kw, dims={"L": [(0, 1)]})
    with pytest.raises(fxmem.InputError, match="L=1 is outside where the trace holds"):
        r.peak_bytes(4, L=1)
    with pytest.raises(fxmem.InputError, match="a value for every named dim"):
        r.peak_bytes(4)


def test_a_model_that_fixes_the_length_is_reported():
    class Fixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            return self.lin(x).reshape(x.shape[0], 10 * 16)  # assumes L == 10

    with pytest.raises(fxmem.SpecializationError, match="dim L was specialized to 10"):
        fxmem.analyze(Fixed(), torch.randn(4, 10, 16), loss=lambda o: o.sum(), device="cpu",
                      dims={"L": [(0, 1)]})


def test_cli_named_dims():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fx = os.path.join(os.path.dirname(sys.executable), "fxmem")
    args = [fx, "analyze", "tests/zoo.py:KeepsLocals", "--input", "B,L,32", "--target",
            "B,L,8", "--loss", "mse", "--device", "cpu", "--dim", "L=12", "--budget", "1MiB",
            "--format", "json"]
    r = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=300)
    # B=32 (the default) does not fit 1 MiB: exit 4, the report written all the same
    assert r.returncode == 4 and "does not fit 1.00 MiB" in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert "B*L" in doc["setup"]["peak in B, L"] and doc["setup"]["dim L"] == 12
    assert isinstance(doc["setup"]["largest L within the budget at B=32"], int)
    bad = subprocess.run(args[:5] + ["--target", "B,L,8", "--loss", "mse"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "give the size of dim L with --dim L=SIZE" in bad.stderr


def test_cli_caps_the_largest_length_at_the_models_positions():
    # a Hugging Face model's position limit is no shape: the CLI reads it from the config
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fx = os.path.join(os.path.dirname(sys.executable), "fxmem")
    cfg = [a for kv in ("n_layer=1", "n_embd=32", "n_head=2", "vocab_size=64", "n_positions=40")
           for a in ("--config", kv)]
    r = subprocess.run([fx, "analyze", "tests/zoo.py:gpt2", *cfg, "--input", "B,L:int64:64",
                        "--input", "B,L:int64:64", "--dim", "L=8", "--device", "cpu",
                        "--budget", "1GiB", "--format", "json"],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    setup = json.loads(r.stdout)["setup"]
    assert setup["largest L within the budget at B=32"] == 40  # 1 GiB fits far longer
    assert setup["L limit (the model's positions)"] == 40


def test_mixed_guards_implied_by_the_bounds_are_dropped_soundly():
    from fxmem.formula.guards import implied as _implied

    T = fxmem.formula.symbols.dim_symbol("T")
    lows = {fxmem.B: 2, L: 2, T: 3}
    B = fxmem.B
    for g in [sympy.Ne(B * L, B), B * L >= 4, B * (T - 1) >= 4, sympy.Ne(sympy.Mod(B, B * L), 0),
              B * L / 2 >= 2, sympy.Ne(sympy.Mod(1, L), 0)]:
        assert _implied(g, lows), g
    # false somewhere at or above the bounds: kept (B*L = 4 at B = L = 2; Mod(2, 2) = 0)
    for g in [B * L >= 5, B * L > 4, sympy.Ne(B * L, 4), sympy.Ne(sympy.Mod(2, L), 0),
              B * L / 2 > 2, L <= B, sympy.Ne(B * T, 6)]:
        assert not _implied(g, lows), g


def test_one_report_type_with_one_method_set():
    """analyze returns a Report with or without named dims; every figure at a point takes
    the dims' values, and is the figure of the report at those values (``at``)."""
    m = _seq_mlp()
    step = fxmem.Step(loss=lambda o: o.sum(), optimizer=torch.optim.SGD, device="cpu")
    r = fxmem.analyze(m, torch.randn(4, 10, 16), step=step, dims={"L": [(0, 1)]})
    plain = fxmem.analyze(m, torch.randn(4, 10, 16), step=step)
    assert type(r) is type(plain) is fxmem.Report and fxmem.DimsReport is fxmem.Report
    assert plain.dims == () and plain.at() is plain
    at = r.at(L=10)
    assert at.dims == () and at.peak == plain.peak
    budget = plain.peak_bytes(64)
    assert r.max_batch_size(budget, L=10) == plain.max_batch_size(budget) == 64
    assert r.breakdown(8, L=10) == plain.breakdown(8)
    assert r.timeline(8, L=10) == plain.timeline(8)
    assert r.cuda_memory(8, L=10) == plain.cuda_memory(8)
    assert r.frontier(8, L=10) == plain.frontier(8)
    assert r.max_length(budget, 64) == 10  # the traced length is the largest that fits
    assert r.flop_count.total.free_symbols == {fxmem.B, L}
    with pytest.raises(fxmem.InputError, match="report is in B alone, so L cannot be given"):
        plain.peak_bytes(8, L=10)
    with pytest.raises(fxmem.InputError, match="max_length needs a report in named dims"):
        plain.max_length(budget, 8)
    with pytest.raises(fxmem.InputError, match=r"regimes of a report in B and L: ask "
                                               r"report\.at\(L=\.\.\.\)\.regimes"):
        r.regimes
    with pytest.raises(fxmem.InputError, match="give a value for every named dim"):
        r.breakdown(8)


def test_a_fixed_length_counts_flops_without_copying_the_graph(lm):
    """``Report.at(L=...)`` builds its graph only when asked for: its FLOPs read the
    original graph's nodes with L put in, and come out as from the graph built."""
    from fxmem.checkpoint.flops import op_flops
    from fxmem.memory.dims import Specialized

    _, r = lm
    at = r.at(L=24)
    assert isinstance(at.trace.graph_source, Specialized)
    counted = op_flops(at.trace)
    assert isinstance(at.trace.graph_source, Specialized)  # still not built
    assert counted and all(not f.free_symbols - {fxmem.B} for f, _ in counted.values())
    assert at.flop_count.total.free_symbols == {fxmem.B}
    built = at.trace.graph
    assert len(built.nodes) == len(r.trace.graph.nodes)
    assert op_flops(at.trace) == counted  # now from the built graph's own nodes
    assert counted != op_flops(r.trace)  # in B and L there


def test_where_the_trace_holds_at_multiples_of_l_the_longest_is_one(lm):
    """A trace that holds where L is a multiple of 16 alone (T5's, ``Eq(Mod(L, 16), 0)``)
    is searched over those: the longest length is the largest multiple within the budget
    (the search had asked L=3: "B=4, L=3 is outside where the trace holds"), and says so."""
    from dataclasses import replace

    from torch.utils._sympy.functions import Mod

    from fxmem.memory.dims import DimsFormula

    _, r = lm
    held = DimsFormula(replace(r.named.trace, guards=(*r.named.trace.guards,
                                                      sympy.Eq(Mod(L, 16), 0))),
                       r.named.device)
    budget = r.peak_bytes(2, L=700)
    every = r.max_length(budget, B=2)
    n = held.max_length(budget, B=2)
    assert (n, n.multiple, every.multiple) == (every - every % 16, 16, 1) and n % 16 == 0
    with pytest.raises(fxmem.InputError, match="outside where the trace holds"):
        held.peak_bytes(2, L=n + 1)


class _Sixteens(nn.Module):
    """A view of L as (L // 16, 16): its trace holds where L is a multiple of 16 and
    ``L // 16`` is neither 0 nor 1 (from L = 32), though no guard reads ``L >= 32``."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)

    def forward(self, x):
        b, n, c = x.shape
        y = self.a(x).view(b, -1, 16, c)
        return (y.softmax(-2) * y).sum()


def test_a_length_held_to_multiples_by_a_view_is_searched_from_where_it_holds():
    """The longest length, the formula's pruning and the length way start from the least
    L where every guard holds (L = 32 here): they had evaluated the sizes at L = 2, where
    ``Mod(L, L//16)`` divides by zero (an internal error), or asked the step at L = 16
    ("L=16 is outside where the trace holds"). Its trace had failed before them: sympy's
    inequality solver, given a guard of the view's (``32*(L//(L//16)) == 32*Max(1,
    L//(L//16))``), recursed past Python's limit; such a guard is now kept as it is (as
    T5's, over L padded to a multiple of 8 by memory-efficient attention's mask)."""
    x = torch.randn(4, 128, 32)
    r = fxmem.analyze(_Sixteens(), x, device="cpu", optimizer=torch.optim.SGD,
                      dims={"L": [(0, 1)]})
    assert r.named.least_values[L] == 32 and r.peak.free_symbols == {fxmem.B, L}
    n = r.max_length(10**6, 4)
    assert n % 16 == 0 and n.multiple == 16
    assert r.peak_bytes(4, L=n) <= 10**6 < r.peak_bytes(4, L=n + 16)
    c = fxmem.analyze(_Sixteens(), x, device="cuda", optimizer=torch.optim.SGD,
                      dims={"L": [(0, 1)]})
    budget = c.at(L=144).cuda_memory(64).max_reserved - 1
    f = c.fits(64, budget, L=4096)
    w = f.way("length")
    assert w is not None and w.value % 16 == 0
    assert c.fits(64, budget, L=w.value, ways=False)
    assert not c.fits(64, budget, L=w.value + 16, ways=False)
    assert w.beyond == (f"L={w.value + 16} does not fit (the trace holds where L is a "
                        "multiple of 16)")



def test_a_length_of_one_says_to_give_two_or_more():
    """A named dim traced from a size of 1 is fixed by PyTorch's broadcasting, not by the
    model: the error says to give 2 or more (it had said to compute sizes from the
    tensor's shape, as for a model that fixes the length itself)."""
    from click.testing import CliRunner

    from fxmem.cli.command import cli

    r = CliRunner().invoke(cli, ["analyze", "tests/zoo.py:KeepsLocals", "--input", "B,L,32",
                                 "--target", "B,L,8", "--loss", "mse", "--device", "cpu",
                                 "--dim", "L=1"])
    assert r.exit_code == 3 and "dim L was specialized to 1" in r.output, r.output
    assert "give L = 2 or more (an example input that long; on the command line --seq 2 " \
        "or --dim L=2)" in " ".join(r.output.split())
    ok = CliRunner().invoke(cli, ["analyze", "tests/zoo.py:KeepsLocals", "--input", "B,L,32",
                                  "--target", "B,L,8", "--loss", "mse", "--device", "cpu",
                                  "--dim", "L=2"])
    assert ok.exit_code == 0, ok.output


class _Windowed(nn.Module):
    """Past 64 positions only the last 64 go on (a window, as Gemma 2's past 4,096): the
    trace from L = 128 holds from L = 65."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)

    def forward(self, x):
        y = self.a(x)
        if x.shape[1] > 64:
            y = y[:, -64:]
        return y.square().mean()


def test_no_length_fits_where_the_trace_holds_says_where_that_is():
    """Where no length fits from the least one the trace holds at (L = 65 here; Gemma 2's
    4,095), the way and the setup's row say so, not that no length fits at all: a shorter
    one runs other code, which the trace did not see."""
    from click.testing import CliRunner

    from fxmem.cli.command import cli

    r = fxmem.analyze(_Windowed(), torch.randn(4, 128, 32), device="cpu",
                      optimizer=torch.optim.SGD, dims={"L": [(0, 1)]})
    budget = r.peak_bytes(64, L=65) - 1
    f = r.fits(64, budget, L=128)
    assert not f and f.way("length") is None
    assert ("no L fits at B=64 from L=65 on, where the trace holds (a shorter L is a step "
            "to analyse apart)") in f.none
    run = CliRunner().invoke(cli, [
        "analyze", "tests/test_dims.py:_Windowed", "--input", "B,L,32", "--dim", "L=128",
        "--device", "cpu", "--optimizer", "sgd", "--batch", "64", "--budget", str(budget),
        "--format", "json"])
    assert run.exit_code == 4, run.output
    doc = json.loads(run.stdout)
    assert doc["setup"]["largest L within the budget at B=64"] == \
        "none fits from 65 on (where the trace holds)"


@pytest.mark.parametrize("parallel", [None, 2])
@pytest.mark.parametrize("model", ["sixteens", "mlp"])
def test_a_replay_at_a_length_is_the_report_s_there(model, parallel):
    """``runs_on_device(b, capacity, L=n)`` of a report in L replays the trace in L at that
    point, its sizes computed there (DimsFormula.point), not a report specialized at it (a
    third of a length's replay in the longest length's search over Llama-3.1-8B): the run
    the report at L=n gives, whether it runs or not, where it runs out, every field; on one
    GPU and over FSDP2's two ranks. The reductions' staging is sized with the length put in
    their arguments (without it the MLP's run at B=7, L=2048 in half its need differs).
    Below where the trace holds (B=1), the report there answers, as it did."""
    kw = {} if parallel is None else {"parallel": fxmem.FSDP(parallel)}
    m, x = (_Sixteens(), torch.randn(4, 128, 32)) if model == "sixteens" else \
        (_seq_mlp(), torch.randn(4, 10, 16))
    c = fxmem.analyze(m, x, loss=lambda o: o.sum(), device="cuda",
                      optimizer=torch.optim.SGD, dims={"L": [(0, 1)]}, **kw)
    groups = getattr(c, "groups", None)
    reports = [g.report for g in groups] if groups is not None else [c]
    seen = set()
    for r in reports:
        for b, n in ((64, 144), (64, 512), (7, 2048), (2, 4096)):
            need = r.at(L=n).cuda_memory(b).max_reserved
            for capacity in (need, need - 2**20, need // 2, 2**40):
                assert r.named.point(b, {"L": n}) is not None
                got = r.runs_on_device(b, capacity, L=n)
                assert got == r.at(L=n).runs_on_device(b, capacity), (b, n, capacity)
                seen.add(got.fits)
        assert r.named.point(1, {"L": 8}) is None
    assert seen == {True, False}


@pytest.mark.parametrize("batch", [64, 2])
def test_the_setup_s_longest_length_on_cuda_is_the_allocator_s(batch):
    """On CUDA the setup's longest length is answered as the largest B is, by the caching
    allocator's replay (the length way's own answer where B does not fit: one search), the
    length whose live bytes fit beside it where it differs; the row had given the live
    bytes' answer alone (Llama-3.1-8B over 8 GPUs at B=2: L=2,798, the way L=2,460)."""
    from click.testing import CliRunner

    from fxmem.cli.command import cli

    c = fxmem.analyze(_Sixteens(), torch.randn(4, 128, 32), device="cuda",
                      optimizer=torch.optim.SGD, dims={"L": [(0, 1)]})
    budget = c.at(L=144).cuda_memory(64).max_reserved - 1
    run = CliRunner().invoke(cli, [
        "analyze", "tests/test_dims.py:_Sixteens", "--input", "B,L,32", "--dim", "L=4096",
        "--optimizer", "sgd", "--batch", str(batch), "--budget", str(budget),
        "--format", "json"])
    doc = json.loads(run.stdout)
    row = doc["setup"][f"largest L within the budget at B={batch}"]
    n = int(row.split()[0])
    assert row == f"{n} (L a multiple of 16)" and n % 16 == 0
    assert c.fits(batch, budget, L=n, ways=False)
    assert not c.fits(batch, budget, L=n + 16, ways=False)
    live = doc["setup"]["largest L whose live tensors fit (the formula)"]
    assert int(live.split()[0]) == c.max_length(budget, batch) > n
    ways = [w for w in (doc["fit"] or {}).get("ways", []) if w["kind"] == "length"]
    assert [w["value"] for w in ways] == ([n] if batch == 64 else [])


def test_a_chosen_plan_s_setup_says_its_longest_length_is_the_step_s_without_it():
    """With ``--checkpoint auto`` choosing a plan at the asked length, the setup's longest
    length is the step's without the plan (the report's is with it: B fits there), said
    so, by its live bytes alone (on CUDA the allocator's replay of that step cost 2.1 s of
    Llama-3.1-8B's --fsdp 8 --checkpoint auto, for a row that did not say whose it was)."""
    from click.testing import CliRunner

    from fxmem.cli.command import cli

    args = ["analyze", "hf:gpt2", "--config", "n_layer=4", "--config", "n_embd=64",
            "--config", "n_head=2", "--config", "vocab_size=256", "--seq", "64",
            "--optimizer", "adamw", "--batch", "16", "--device", "cpu", "--format", "json"]
    whole = json.loads(CliRunner().invoke(cli, args).stdout)
    budget = int(whole["peak_bytes"] * 0.9)
    run = CliRunner().invoke(cli, args + ["--budget", str(budget), "--checkpoint", "auto"])
    doc = json.loads(run.stdout)
    assert run.exit_code == 0 and doc["plan"], run.output
    rows = {k: v for k, v in doc["setup"].items() if k.startswith("largest L")}
    assert list(rows) == ["largest L within the budget at B=16 without the plan (live tensors)"]
    n = next(iter(rows.values()))
    bare = json.loads(CliRunner().invoke(cli, args + ["--budget", str(budget)]).stdout)
    assert n == bare["setup"]["largest L within the budget at B=16"] < 64
