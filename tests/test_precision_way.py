"""FSDP2's own mixed precision as a way out (fxmem.report.precision): an FSDP2 step under
autocast holds a bf16 copy of every gathered weight until its backward (autocast's weight
cache: until the forward ends, under a checkpoint plan too); with ``param_dtype`` FSDP2
gathers bf16 weights and autocast casts none. The way is the step analysed again with the
policy, checked against a budget; the policy's step is exact against real ranks (and on the
fake GPU: tests/test_fake_gpu_parallel.py's ``fsdp-amp`` cases)."""

import io
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem import DDP, FSDP
from test_fsdp import _exact


class Blocks(nn.Module):
    """Blocks of Linear, GELU, Linear (8x wider inside) and a head: their activations grow
    with B, and the bf16 copies of their weights are the larger part at small B."""

    def __init__(self, d=64, n=8):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(d, 8 * d), nn.GELU(),
                                                   nn.Linear(8 * d, d)) for _ in range(n)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


STEP = dict(loss=F.cross_entropy, optimizer=torch.optim.SGD, device="cpu", amp=torch.bfloat16)
POLICY = FSDP(4, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _batch():
    torch.manual_seed(0)
    return torch.randn(4, 64), torch.randint(0, 10, (4,))


def _reports(model):
    x, y = _batch()
    return (fxmem.analyze(model, x, y, parallel=FSDP(4), **STEP),
            fxmem.analyze(model, x, y, parallel=POLICY, **STEP))


def test_the_policy_under_autocast_is_exact_per_rank():
    _exact(Blocks(), *_batch(), POLICY, batches=(3, 16), **STEP)


def test_the_policy_alone_fits():
    """Between the policy's peak and autocast's: the way is the policy on the same 4 GPUs,
    its need the policy's step's own peak, no plan."""
    model = Blocks()
    amp, policy = _reports(model)
    b = 256
    assert policy.peak_bytes(b) < amp.peak_bytes(b)
    f = amp.fits(b, (policy.peak_bytes(b) + amp.peak_bytes(b)) // 2)
    way = f.way("param_dtype")
    assert not f and way is not None and f.way("param_dtype+checkpoint") is None
    assert (way.value, way.need_bytes, way.plan) == (4, policy.peak_bytes(b), ())
    assert way.line == ("FSDP2's param_dtype=torch.bfloat16, reduce_dtype=torch.float32 "
                        "(autocast kept)")
    assert way.as_dict()["kind"] == "param_dtype"


def test_the_policy_with_a_plan():
    """At B=4 the copies are most of the peak: no plan, batch size or number of GPUs makes
    autocast's step fit a budget under the policy's unplanned peak, and the policy with its
    cheapest plan does; that plan traced with the policy peaks at the way's need."""
    from fxmem.report.world_size import smallest_plan

    model = Blocks()
    amp, policy = _reports(model)
    b = 4
    low = policy.with_plan(smallest_plan(policy, b)).peak_bytes(b)
    assert low < policy.peak_bytes(b)
    budget = (low + policy.peak_bytes(b)) // 2
    f = amp.fits(b, budget)
    assert [w.kind for w in f.ways] == ["param_dtype+checkpoint"]
    way = f.ways[0]
    assert way.plan and way.need_bytes <= budget < policy.peak_bytes(b)
    assert way.beyond.endswith("alone does not fit")
    traced = fxmem.analyze(model, *_batch(), parallel=POLICY, checkpoint=way.plan, **STEP)
    assert traced.peak_bytes(b) == way.need_bytes
    assert "no checkpoint plan fits at B=4" in " ".join(f.none)


def test_not_a_way_without_autocast_or_with_a_policy_or_fsdp2():
    model, (x, y) = Blocks(), _batch()
    plain = {**STEP, "amp": None}
    for parallel, step in ((FSDP(4), plain), (POLICY, STEP), (DDP(2), STEP), (None, STEP)):
        r = fxmem.analyze(model, x, y, parallel=parallel, **step)
        f = r.fits(256, r.peak_bytes(256) // 2)
        assert not f and not {w.kind for w in f.ways} & {"param_dtype", "param_dtype+checkpoint"}
        assert not any("param_dtype" in n for n in f.none)


def test_command_line():
    """``--fsdp 4 --amp bf16 --budget``: the way in the line and in the JSON."""
    import json
    import os
    import subprocess
    import sys

    amp, policy = _reports(Blocks())
    budget = (policy.peak_bytes(256) + amp.peak_bytes(256)) // 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ["analyze", "tests/test_precision_way.py:Blocks", "--input", "B,64", "--target",
            "B:int64:10", "--optimizer", "sgd", "--amp", "bf16", "--device", "cpu", "--fsdp",
            "4", "--batch", "256", "--budget", str(budget), "--format", "json"]
    r = subprocess.run([sys.executable, "-m", "fxmem", *args], cwd=root, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 4, r.stderr  # does not fit
    assert "or FSDP2's param_dtype=torch.bfloat16, reduce_dtype=torch.float32" in r.stderr
    ways = json.loads(r.stdout)["fit"]["ways"]
    assert {"kind": "param_dtype", "need_bytes": policy.peak_bytes(256)} in [
        {k: w[k] for k in ("kind", "need_bytes")} for w in ways]


def test_the_policy_s_step_is_traced_at_b_alone():
    """The way reads the policy's step at B alone: traced there, B a number (the other
    sizes too where the step has named dims), not as a formula in B."""
    from fxmem.report.fit import Check
    from fxmem.report.precision import param_dtype_way

    amp, policy = _reports(Blocks())
    b = 256
    asked = []

    def reanalyze(**options):
        asked.append(options)
        return amp.groups[0].report.reanalyze(**options)
    budget = (policy.peak_bytes(b) + amp.peak_bytes(b)) // 2
    (way,) = param_dtype_way(Check("live", budget, 0), amp, b, reanalyze=reanalyze)
    assert asked[0]["concrete_batch"] == b and "concrete_dims" not in asked[0]
    assert way.need_bytes == policy.peak_bytes(b)


class Wide(Blocks):
    """Blocks under a 4,096-way head: the peak is at the start of the backward (the loss's
    gradient), where the casts autograd saved are live and autocast's cache is gone."""

    def __init__(self):
        super().__init__(d=64, n=4)
        self.head = nn.Linear(64, 4096)


def _saved_casts(model, x, y) -> int:
    """Bytes of the bf16 casts of ``model``'s weights that a real CPU step's forward under
    autocast saves for the backward, each storage once (PyTorch's own saved-tensor hooks, no
    fxmem): what of them is live when the backward starts."""
    weights = [p.detach().to(torch.bfloat16) for p in model.parameters()]
    saved: dict = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", torch.bfloat16):
            out = model(x)
        F.cross_entropy(out, y)
    total = 0
    for st in saved.values():
        t = torch.empty(0, dtype=torch.bfloat16).set_(st) if st.nbytes() % 2 == 0 else None
        if t is not None and any(t.numel() == w.numel() and torch.equal(t.view(w.shape), w)
                                 for w in weights):
            total += st.nbytes()
    return total


def test_the_weights_casts_at_the_peak():
    """The breakdown says what of the peak are the forward's casts of the weights: on one
    GPU what a real step saved (PyTorch's hooks), under FSDP2 the same bytes whatever the
    number of GPUs (casts of the gathered weights), none with FSDP2's param_dtype or in
    fp32; every format gives it."""
    from rich.console import Console

    from fxmem.report.html import render_html
    from fxmem.report.jsonout import render_json
    from fxmem.report.markdown import render_markdown
    from fxmem.report.summary import summarize
    from fxmem.report.terminal import render_terminal

    torch.manual_seed(0)
    model, b = Wide(), 64
    x, y = torch.randn(4, 64), torch.randint(0, 4096, (4,))
    expected = _saved_casts(model, torch.randn(b, 64), torch.randint(0, 4096, (b,)))
    one = fxmem.analyze(model, x, y, **STEP).breakdown(b)
    assert (one.phase, one.op) == ("backward", "aten._log_softmax_backward_data.default")
    assert one.weight_casts.nbytes == expected > 0
    assert one.weight_casts.dtypes == ("bfloat16",) and not one.weight_casts.gathered
    fp32 = {**STEP, "amp": None}
    assert fxmem.analyze(model, x, y, **fp32).breakdown(b).weight_casts is None
    sharded = {w: fxmem.analyze(model, x, y, parallel=FSDP(w), **STEP) for w in (2, 4)}
    for r in sharded.values():
        bd = r.rank(0).breakdown(b)
        assert bd.weight_casts.nbytes == expected and bd.weight_casts.gathered
    policy = fxmem.analyze(model, x, y, parallel=POLICY, **STEP)
    assert policy.rank(0).breakdown(b).weight_casts is None
    s = summarize(sharded[2], B=b)
    assert json.loads(render_json(s))["weight_casts"] == {
        "nbytes": expected, "dtypes": ["bfloat16"], "gathered": True, "autocast": True}
    terminal = io.StringIO()
    Console(file=terminal, width=400).print(render_terminal(s))
    for text in (render_markdown(s), render_html(s), terminal.getvalue()):
        assert text.count("casts of the weights that the forward made") == 1
        assert "whatever the number of GPUs" in text


class CastsItself(nn.Module):
    """A linear that casts its own fp32 weight to bf16 in its forward (no autocast), after
    one whose output needs a gradient: autograd saves the cast for it."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(64, 64)
        self.weight = nn.Parameter(torch.randn(4096, 64))

    def forward(self, x):
        return (self.pre(x).bfloat16() @ self.weight.bfloat16().t()).float()


def test_a_model_s_own_casts_of_its_weights_are_not_called_autocast_s():
    """Without autocast the forward's casts of the weights are the model's own, and the
    report says so, not "autocast's"."""
    from fxmem.report.summary import summarize
    from fxmem.report.text import weight_casts_line

    r = fxmem.analyze(CastsItself(), torch.randn(4, 64), torch.randint(0, 4096, (4,)),
                      loss=F.cross_entropy, optimizer=torch.optim.SGD, device="cpu")
    casts = r.breakdown(64).weight_casts
    assert casts is not None and not casts.autocast and casts.nbytes == 4096 * 64 * 2
    line = weight_casts_line(summarize(r, B=64).weight_casts)
    assert "the model's own" in line and "autocast" not in line
