"""Report semantics: formulas, numbers, timeline, max batch size, valid_when, rendering."""

import pytest
import sympy
import torch

import fxmem
from fxmem.formula.symbols import B, Size
from fxmem.formula.guards import valid_when
from zoo import ZOO, adam


@pytest.fixture(scope="module")
def report():
    model, x, y, loss = ZOO["resnet"]()
    return fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device="cpu")


def test_peak_formula_is_exact_integers_and_short(report):
    peak = report.peak
    assert peak.free_symbols == {B}
    assert not peak.atoms(sympy.Float)
    args = peak.args if isinstance(peak, sympy.Max) else (peak,)
    assert len(args) <= 4  # pruned: only candidates that are the max for some B
    assert report.liveness.n_candidates_before_pruning > len(args)


def test_peak_is_max_of_timeline(report):
    for b in (2, 5, 31):
        tl = report.timeline(b)
        assert max(p.live_bytes for p in tl) == report.peak_bytes(b)
        assert {p.phase for p in tl} == {"forward", "backward", "optimizer"}


def test_max_batch_size_is_the_largest_fitting(report):
    for budget in (10**6, 3 * 10**6, 2**30):
        b = report.max_batch_size(budget)
        assert report.peak_bytes(b) <= budget < report.peak_bytes(b + 1)


def test_parts_and_valid_when(report):
    assert set(report.parts) == {"params", "buffers", "inputs", "grads", "optimizer_state",
                                 "activations"}
    n = sum(p.numel() for p in ZOO["resnet"]()[0].parameters())
    assert report.parts["params"] == 4 * n == report.parts["grads"]
    assert report.parts["buffers"] > 0  # BatchNorm statistics
    assert report.valid_when[0] == (B >= 2)
    assert report.min_batch_size == 2


def test_str_is_short_and_readable(report):
    text = str(report)
    assert "peak bytes = " in text and "valid when: B >= 2" in text
    assert len(text.splitlines()) < 25


def test_inference_under_no_grad_is_smaller():
    model, x, y, loss = ZOO["mlp"]()
    train = fxmem.analyze(model, x, y, loss=loss, device="cpu")
    infer = fxmem.analyze(model, x, train=False, device="cpu")
    assert infer.parts["activations"] == 0 and infer.parts["grads"] == 0
    assert infer.peak_bytes(64) < train.peak_bytes(64)


def test_meta_model_and_real_model_give_the_same_report():
    model, x, y, loss = ZOO["seed_cnn"]()
    meta = ZOO["seed_cnn"]()[0].to("meta")
    a = fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device="cpu")
    b = fxmem.analyze(meta, x[0].to("meta"), y[0].to("meta"), loss=loss, optimizer=adam,
                      device="cpu")
    assert sympy.simplify(a.peak - b.peak) == 0
    assert all(p.device.type == "meta" for p in meta.parameters())


def test_analyze_does_not_touch_the_model():
    model, x, y, loss = ZOO["resnet"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device="cpu")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def test_valid_when_folding():
    assert valid_when([sympy.Ne(B, 1)]) == (B >= 2,)
    assert valid_when([B < 16, B > 3]) == (B >= 4, B <= 15)
    assert valid_when([], 1) == (B >= 1,)


def test_cuda_rounding_sizes():
    s = Size.of(12 * B + 4).rounded(512)
    assert [s(b) for b in (1, 42, 43)] == [512, 512, 1024]
    assert Size.of(1024 * B).rounded(512) is not None
    assert Size.of(1024 * B).rounded(512).expr == 1024 * B  # already whole blocks
    assert Size.of(0).rounded(512)(5) == 0


def test_cuda_peak_is_exact_over_rounded_storages():
    model, x, y, loss = ZOO["mlp"]()
    r = fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device="cuda")
    for b in (1, 2, 3, 17, 100, 1000):
        assert r.peak_bytes(b) == max(p.live_bytes for p in r.timeline(b))
        assert int(r.peak.subs(B, b)) == r.peak_bytes(b)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", ["mlp", "resnet", "lstm", "tied_reuse", "keeps_locals"])
def test_a_peak_read_off_the_timeline_is_the_formulas(name, device):
    """Before its candidates are made, a liveness answers a few B's peaks from the timeline
    at that B (what a searched plan's step is asked), then from the formulas: the same
    numbers, on a plan's derived step too."""
    from fxmem.memory.liveness import NUMERIC_PEAKS, Liveness

    model, x, y, loss = ZOO[name]()
    r = fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device=device)
    plan = [c.path for c in r.trace.calls if c.path.count(".") == 0 and c.path][:1]
    for lv in (r.liveness, r.with_plan(plan).liveness if plan else r.liveness):
        bs = (1, 2, 3, 17, 100, 1000)
        fresh = Liveness(lv.graph, lv.device, lv.sizes)
        got = [fresh.peak_bytes(b) for b in bs[:NUMERIC_PEAKS]]
        assert "_pruned" not in fresh.__dict__  # no formula made
        assert got == [lv.peak_candidate(b)(b) for b in bs[:NUMERIC_PEAKS]]
        assert [fresh.peak_bytes(b) for b in bs] == [int(lv.peak.subs(B, b)) for b in bs]
        assert "_pruned" in fresh.__dict__  # a search over B: the formulas answer



def test_a_peak_read_off_the_timeline_counts_what_goes_before_the_first_op():
    """Storages the step frees before its first op (none in the zoo's steps) count at the
    start, for the timeline's peak as for the formulas'."""
    import dataclasses

    from fxmem.memory.graph import build_graph
    from fxmem.memory.liveness import Liveness

    model, x, y, loss = ZOO["mlp"]()
    r = fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device="cpu")
    t = r.trace
    k = next(i for i, s in enumerate(t.storages) if s.created_by < 0)
    gone = dataclasses.replace(t.storages[k], freed_after=-1)
    g = build_graph(dataclasses.replace(t, storages=t.storages[:k] + (gone,) + t.storages[k + 1:]))
    sizes = r.liveness.sizes[:k] + (Size.of(10**9),) + r.liveness.sizes[k + 1:]
    fresh, formula = Liveness(g, "cpu", sizes), Liveness(g, "cpu", sizes)
    start = sum(z(4) for s, z in zip(g.storages, sizes) if s.created_by < 0)
    assert fresh.peak_bytes(4) == formula.peak_candidate(4)(4) == start > max(fresh.timeline(4))


def test_a_derived_plan_answers_without_its_networkx_graph():
    """A plan's derived step is replayed and its peak read, dozens of times in a search,
    from the trace's storages and ops: the networkx graph of its ops is built only when
    read (``StorageGraph.nx``), and is the same graph then."""
    model, x, y, loss = ZOO["mlp"]()
    r = fxmem.analyze(model, x, y, loss=loss, optimizer=adam, device="cuda")
    planned = r.with_plan(r.frontier(8)[-1].plan)
    graph = planned.liveness.graph
    planned.peak_bytes(8), planned.cuda_memory(8), planned.runs_on_device(8, 2**30)
    assert "nx" not in graph.__dict__
    ops = graph.nx.nodes
    assert len(ops) == len(graph.ops) and ops[0]["op"] == graph.ops[0].op


def test_str_names_the_checkpoint_plan():
    model, x, y, loss = ZOO["resnet"]()
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=["layer1.0"])
    text = str(r)
    assert "checkpoint plan: layer1.0; recompute FLOPs = " in text
    assert str(r.recompute_flops) in text
    assert "checkpoint plan" not in str(fxmem.analyze(model, x, y, loss=loss, device="cpu"))
