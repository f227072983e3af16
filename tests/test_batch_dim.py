"""Where B is: ``batch_dim=`` for sequence-first models (``nn.LSTM``/``nn.GRU`` and
``nn.TransformerEncoder`` with ``batch_first=False``), an RNN's ``h0`` with B at dim 1, an
input with no batch dim; the CLI's specs with B at any position; and the mistakes.

Every step is traced at B=4 (the example tensors) and measured by a real eager CPU step at
two other batch sizes: the same bytes."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmem
from fxmem.cli.targets import batch_dim_of, named_dims, parse_tensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L, FEAT, HID, CLASSES = 6, 16, 32, 10
BATCHES = (3, 7)  # traced at 4


class Tagger(nn.Module):
    """An RNN tagger; sequence-first unless ``batch_first``. With ``h0``, the initial state
    is an input: ``(layers, B, H)`` whatever ``batch_first`` says (an LSTM's ``h0, c0``)."""

    def __init__(self, cls, batch_first=False, layers=1):
        super().__init__()
        self.rnn = cls(FEAT, HID, num_layers=layers, batch_first=batch_first)
        self.head = nn.Linear(HID, CLASSES)

    def forward(self, x, *state):
        state = (None if not state else state[0] if len(state) == 1 else tuple(state))
        return self.head(self.rnn(x, state)[0])


class Encoder(nn.Module):
    """Token ids through an embedding and a TransformerEncoder (sequence-first unless
    ``batch_first``); ``mask``: an ``(L, L)`` attention mask, an input with no batch dim."""

    def __init__(self, batch_first=False):
        super().__init__()
        self.emb = nn.Embedding(50, HID)
        layer = nn.TransformerEncoderLayer(HID, 4, 64, dropout=0.0, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(HID, 50)  # the next token

    def forward(self, ids, mask=None):
        causal = True if mask is not None else None  # else: compares the mask's values
        return self.head(self.enc(self.emb(ids), mask=mask, is_causal=causal))


def flat_ce(out, y):
    """Cross-entropy over every token: logits and labels flattened over (L, B) or (B, L)."""
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


STEP = dict(loss=flat_ce, optimizer=torch.optim.Adam, device="cpu")


def _exact(model, inputs, targets, batch_dim, **step):
    """analyze once, measure at each of BATCHES: the same bytes."""
    step = {**STEP, **step}
    r = fxmem.analyze(model, inputs, targets, batch_dim=batch_dim, **step)
    got = {b: r.peak_bytes(b) for b in BATCHES}
    real = {b: fxmem.measure(model, inputs, targets, B=b, batch_dim=batch_dim,
                             **step).peak_bytes for b in BATCHES}
    assert got == real
    return r


def _seq(b=4):
    torch.manual_seed(0)
    return torch.randn(L, b, FEAT), torch.randint(0, CLASSES, (L, b))


# --- sequence-first models, exact against eager ------------------------------------------------

@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_sequence_first_rnn(cls):
    x, y = _seq()
    _exact(Tagger(cls, layers=2), x, y, batch_dim=1)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_initial_state_with_b_at_dim_1(cls):
    """x (L, B, F), h0 (and c0) (layers, B, H), target (L, B): B at dim 1 of all."""
    x, y = _seq()
    state = [torch.randn(2, 4, HID) for _ in range(2 if cls is nn.LSTM else 1)]
    _exact(Tagger(cls, layers=2), (x, *state), y, batch_dim=1)


def test_transformer_encoder_with_a_mask_without_b():
    """Token ids (L, B), labels (L, B), a causal mask (L, L) with no batch dim: tiled by
    neither the trace nor the measurement."""
    ids = torch.randint(0, 50, (L, 4))
    mask = nn.Transformer.generate_square_subsequent_mask(L)
    r = _exact(Encoder(), (ids, mask), ids, batch_dim=(1, None, 1))
    sizes = {s.name: s.size.expr for s in r.trace.storages if s.category == "input"}
    assert sizes["inputs[1]"] == L * L * 4  # the mask: its own size, no B
    assert sizes["inputs[0]"] == L * 8 * fxmem.B


def test_batch_first_is_the_same_step_where_it_is_by_construction():
    """nn.MultiheadAttention runs sequence-first inside (a batch-first input is transposed to
    a view), so the batch-first encoder's step is the sequence-first one's: the same formula."""
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (L, 4))
    seq_first = fxmem.analyze(Encoder(), ids, ids, batch_dim=1, **STEP)
    batch_first = fxmem.analyze(Encoder(batch_first=True), ids.t(), ids.t(), **STEP)
    assert seq_first.peak == batch_first.peak


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_batch_first_rnn_adds_copies_only(cls):
    """A batch-first RNN runs RNN.cpp time-major on ``input.transpose(0, 1)``: the transposed
    views make contiguous copies (the layer's input, saved for backward; gradients and
    outputs in the batch-first layout) that the sequence-first step does not make. So the
    sequence-first step's storages are the batch-first one's minus those copies, and its peak
    is never above it; both are exact against eager."""
    x, y = _seq()
    sf = _exact(Tagger(cls), x, y, batch_dim=1)
    bf = _exact(Tagger(cls, batch_first=True), x.transpose(0, 1), y.t(), batch_dim=0)
    kinds = [Counter((s.size.expr, s.category) for s in r.trace.storages) for r in (sf, bf)]
    assert not kinds[0] - kinds[1]
    extra = kinds[1] - kinds[0]
    copy = L * FEAT * 4 * fxmem.B  # the input, time-major
    assert extra[(copy, "activation")] == 1
    assert all(sf.peak_bytes(b) <= bf.peak_bytes(b) for b in (1, *BATCHES, 100))


def test_sequence_length_as_a_named_dim_at_dim_0():
    """oneDNN's LSTM runs the whole sequence in one primitive: L at dim 0, B at dim 1, one
    formula in B and L."""
    x, y = _seq()
    m = Tagger(nn.LSTM)
    r = fxmem.analyze(m, x, y, batch_dim=1, dims={"L": [(0, 0), (1, 0)]}, **STEP)
    for b, n in [(3, 2), (7, 9)]:
        xs, ys = torch.randn(n, 4, FEAT), torch.randint(0, CLASSES, (n, 4))
        assert r.peak_bytes(b, L=n) == fxmem.measure(m, xs, ys, B=b, batch_dim=1,
                                                     **STEP).peak_bytes


def test_a_step_that_reads_b_as_an_int_is_lifted_at_dim_1():
    """``int(x.shape[1])``: traced at concrete batch sizes along dim 1 and fitted."""

    class Fixed(Tagger):
        def forward(self, x):
            h0 = torch.zeros(1, int(x.shape[1]), HID)
            return self.head(self.rnn(x, h0)[0])

    x, y = _seq()
    r = _exact(Fixed(nn.GRU), x, y, batch_dim=1)
    assert r.lifted


def test_gru_stepping_over_b_says_where_b_is():
    """Without batch_dim, a sequence-first GRU's steps are B: the refusal says what to do."""
    x, y = _seq()
    with pytest.raises(fxmem.TraceError) as e:
        fxmem.analyze(Tagger(nn.GRU), x, y, **STEP)
    assert "not B: say where B is with batch_dim=1" in str(e.value)
    assert "\n" not in str(e.value)


def test_whatif_and_plan_checkpoints_take_batch_dim():
    ids = torch.randint(0, 50, (L, 4))
    m = Encoder()
    base = fxmem.analyze(m, ids, ids, batch_dim=1, **STEP)
    rows = fxmem.whatif(m, ids, ids, B=64, budget_bytes=2**24, batch_dim=1, **STEP)
    assert rows[0].method == "baseline" and rows[0].peak == base.peak
    evaluation = fxmem.analyze(m, ids, batch_dim=1, device="cpu", train=False)
    assert [r.peak for r in rows if r.method == "no_grad evaluation"] == [evaluation.peak]
    budget = (base.peak_bytes(64) + base.with_plan(["enc.layers.0"]).peak_bytes(64)) // 2
    c = fxmem.plan_checkpoints(m, ids, ids, budget_bytes=budget, B=64, batch_dim=1,
                               candidates=["enc.layers.0", "enc.layers.1"], **STEP)
    assert c.plan and c.peak_bytes <= budget
    assert c.peak_bytes == base.with_plan(c.plan).peak_bytes(64)


def test_measure_tiles_along_the_batch_dim():
    from fxmem.validate.measure import batch_of

    y = torch.arange(12).reshape(3, 4)
    assert torch.equal(batch_of(y, 6, "cpu", dim=1), torch.cat([y, y[:, :2]], 1))
    assert batch_of(y, 6, "cpu", dim=None) is y  # no batch dim: left as it is
    assert batch_of(y.to("meta"), 6, "cpu", dim=1).shape == (3, 6)


# --- mistakes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,text", [
    (dict(batch_dim=2), "batch_dim=2 is out of range for targets[0] of shape (6, 4): it has "
                        "dims 0 to 1"),
    (dict(batch_dim=(1, 1)), "batch_dim has 2 entries; it needs 3, one per input then target "
                             "(2 inputs, 1 target)"),
    (dict(batch_dim=(1, None, 5)), "batch_dim=5 is out of range for targets[0] of shape (6, 4)"),
    (dict(batch_dim=(1, 0, 1)), "the batch dim's size differs between tensors: inputs[0] dim "
                                "1=4, inputs[1] dim 0=2, targets[0] dim 1=4"),
    (dict(batch_dim=(None, None, None)), "gives no input or target a batch dim"),
    (dict(batch_dim=True), "batch_dim is an int"),
    (dict(batch_dim="1"), "batch_dim is an int"),
    (dict(batch_dim=(1, 1.0, 1)), "batch_dim for inputs[1] is 1.0"),
    (dict(batch_dim=1, dims={"L": [(0, 1)]}), "dim L: tensor 0 of shape (6, 4, 16) has B at "
                                              "dim 1"),
])
def test_bad_batch_dims_fail_before_tracing(kwargs, text):
    x, y = _seq()
    h0 = torch.randn(2, 4, HID)
    for call in (fxmem.analyze, fxmem.measure):
        if call is fxmem.measure and "dims" in kwargs:
            continue
        extra = {"B": 3} if call is fxmem.measure else {}
        with pytest.raises(fxmem.InputError) as e:
            call(Tagger(nn.GRU, layers=2), (x, h0), y, **STEP, **kwargs, **extra)
        assert text in str(e.value)
        assert "\n" not in str(e.value)


def test_a_scalar_input_needs_none():
    x = torch.randn(4, 3)
    with pytest.raises(fxmem.InputError, match="inputs.1. is 0-dimensional, so it has no "
                                               "batch dim: give None for it"):
        fxmem.analyze(nn.Bilinear(3, 1, 2), (x, torch.tensor(2.0)), device="cpu")


# --- the command line ------------------------------------------------------------------------------

def test_specs_with_b_anywhere():
    assert [batch_dim_of(s) for s in ("B,3,32,32", "L,B,64", "2,B,64", "64,B", "10,64",
                                      "L,B:int64:10")] == [0, 1, 1, 1, None, 1]
    assert tuple(parse_tensor("L,B,64", 8, {"L": 5}).shape) == (5, 8, 64)
    assert tuple(parse_tensor("2,B,64", 8).shape) == (2, 8, 64)
    assert tuple(parse_tensor("10,64", 8).shape) == (10, 64)
    # named dims before B and after it
    assert named_dims(["L,B,64", "L,B:int64:10", "B,T,L"]) == {
        "L": [(0, 0), (1, 0), (2, 2)], "T": [(2, 1)]}
    with pytest.raises(fxmem.InputError, match="may stand at one dim only"):
        parse_tensor("B,L,B", 8, {"L": 5})


MODEL_FILE = '''
import torch
from torch import nn


class SeqGRU(nn.Module):
    """A sequence-first GRU tagger given its h0: logits (L, classes, B) for cross_entropy
    against (L, B) labels."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(16, 32, num_layers=2)
        self.head = nn.Linear(32, 10)

    def forward(self, x, h0):
        return self.head(self.rnn(x, h0)[0]).permute(0, 2, 1)
'''


def test_cli_sequence_first_specs(tmp_path):
    """--input 6,B,16 --input 2,B,32 --target 6,B:int64:10: the library's figure with
    batch_dim=1, and the real step's."""
    path = tmp_path / "seqgru.py"
    path.write_text(MODEL_FILE)
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-m", "fxmem", "analyze", f"{path}:SeqGRU",
                        "--input", "6,B,16", "--input", "2,B,32", "--target", "6,B:int64:10",
                        "--optimizer", "adam", "--device", "cpu", "--batch", "5",
                        "--format", "json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sys.path.insert(0, str(tmp_path))
    try:
        from seqgru import SeqGRU
    finally:
        sys.path.remove(str(tmp_path))
    torch.manual_seed(0)
    inputs, y = (torch.randn(6, 4, 16), torch.randn(2, 4, 32)), torch.randint(0, 10, (6, 4))
    step = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu", batch_dim=1)
    report = fxmem.analyze(SeqGRU(), inputs, y, **step)
    assert doc["peak_bytes"] == report.peak_bytes(5) == fxmem.measure(
        SeqGRU(), inputs, y, B=5, **step).peak_bytes
