"""PyTorch's CPU RNNs with ``device="cpu"`` (fxmem.trace.kernels.cpu_rnn): which kernel eager runs,
what it allocates, and the predicted peak against a real eager step (fxmem.measure), exact
to the byte at batch sizes other than the traced one (4).

- LSTM: oneDNN (mkldnn/RNN.cpp ``mkldnn_rnn``, one ``mkldnn_rnn_layer`` per layer and
  direction) for float32, and bfloat16 on a CPU with the instructions; its training
  workspace is oneDNN v3.12's own arithmetic (``onednn_workspace_nbytes``). With projections,
  oneDNN off or float16 with grad: RNN.cpp's native layers.
- GRU, RNN (tanh, relu): RNN.cpp's native layers always (no oneDNN branch on CPU).
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import fxmem
from fxmem.trace.kernels import cpu_rnn

BATCHES = (2, 3, 7)  # the trace uses B=4
aten = torch.ops.aten
BF16 = cpu_rnn._cpu_supports("bf16")


class Seq(nn.Module):
    """An RNN over a (B, T, I) batch: batch_first, or time-major with the model transposing
    (B at dim 0 here; tests/test_batch_dim.py gives time-major inputs with batch_dim=1)."""

    def __init__(self, cls, input_size, batch_first=True, **kw):
        super().__init__()
        self.batch_first = batch_first
        self.rnn = cls(input_size, batch_first=batch_first, **kw)

    def forward(self, x):
        if not self.batch_first:
            x = x.transpose(0, 1)
        y, _ = self.rnn(x)
        return y if self.batch_first else y.transpose(0, 1)


def _loss(o):
    return o.float().sum()


def _exact(model, x, dtype=torch.float32, batches=BATCHES, **step):
    """analyze once, measure at each B: the same bytes."""
    model, x = model.to(dtype), x.to(dtype)
    step = {"loss": _loss, "optimizer": torch.optim.Adam, "device": "cpu", **step}
    if step.get("train") is False:
        step.pop("loss"), step.pop("optimizer")
    r = fxmem.analyze(model, x, **step)
    got = {b: r.peak_bytes(b) for b in batches}
    real = {b: fxmem.measure(model, x, **step, B=b).peak_bytes for b in batches}
    assert got == real
    return r


def _ops(report) -> set:
    return {o.op for o in report.trace.ops}


# --- the oneDNN workspace: oneDNN's arithmetic against the kernel ---------------------------------

def _kernel_workspace(T, N, I, H, dtype):
    x = torch.randn(T, N, I, dtype=dtype)
    w0, w1 = torch.randn(4 * H, I, dtype=dtype), torch.randn(4 * H, H, dtype=dtype)
    b0, b1 = torch.randn(4 * H, dtype=dtype), torch.randn(4 * H, dtype=dtype)
    h, c = torch.randn(N, H, dtype=dtype), torch.randn(N, H, dtype=dtype)
    with torch.enable_grad():
        out = aten.mkldnn_rnn_layer(x, w0, w1, b0, b1, h, c, False, [], 2, H, 1, True, False,
                                    False, True)
    return out[3].untyped_storage().nbytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_workspace_formula_is_the_kernels(dtype):
    """Every part's leading dimension case of get_good_ld: H*4 a multiple of 256 (padded by
    64 bytes), not a multiple of 16 (rounded up), I above and below H; and B on both sides of
    page boundaries."""
    if dtype == torch.bfloat16 and not BF16:
        pytest.skip("this CPU has no bfloat16 oneDNN")
    for T, N, I, H in itertools.product((1, 5, 30), (1, 2, 3, 7, 33), (3, 64, 300),
                                        (1, 13, 64, 100, 128)):
        x = torch.empty(T, N, I, dtype=dtype)
        assert cpu_rnn.onednn_workspace_nbytes(x, H, dtype) == _kernel_workspace(
            T, N, I, H, dtype), (T, N, I, H)


def test_onednn_workspace_follows_grad_mode_not_train():
    """mkldnn/RNN.cpp allocates the workspace when GradMode is on, whatever ``train`` says."""
    m = nn.LSTM(8, 16).eval()
    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is aten.mkldnn_rnn_layer.default:
                seen.append((args[15], out[3] is not None and out[3].numel() > 0))
            return out

    with Spy():
        m(torch.randn(5, 3, 8))
        with torch.no_grad():
            m.train()(torch.randn(5, 3, 8))
    assert seen == [(False, True), (True, False)]


# --- which kernel runs ------------------------------------------------------------------------

@pytest.mark.parametrize("cls,kw,onednn", [
    (nn.LSTM, {}, True),
    (nn.LSTM, {"proj_size": 8}, False),  # RNN.cpp lstm: no oneDNN with projections
    (nn.GRU, {}, False),  # only lstm has a oneDNN branch on CPU
    (nn.RNN, {}, False),
])
def test_the_kernel_eager_runs(cls, kw, onednn):
    r = _exact(Seq(cls, 12, hidden_size=16, **kw), torch.randn(4, 5, 12))
    assert ("aten.mkldnn_rnn_layer.default" in _ops(r)) == onednn
    assert ("aten.mkldnn_rnn_layer_backward.default" in _ops(r)) == onednn
    notes = [what for _, _, what in r.unmodelled]
    assert len(notes) == onednn and all("oneDNN RNN scratchpad" in n for n in notes)


def test_onednn_off_runs_the_native_lstm():
    with torch.backends.mkldnn.flags(enabled=False):
        r = _exact(Seq(nn.LSTM, 12, hidden_size=16, num_layers=2), torch.randn(4, 5, 12))
    assert "aten.mkldnn_rnn_layer.default" not in _ops(r) and r.unmodelled == ()


def test_the_workspace_is_kept_for_backward():
    """One workspace per layer and direction, as oneDNN sizes it, saved until backward."""
    T, I, H = 6, 12, 20
    r = _exact(Seq(nn.LSTM, I, hidden_size=H, num_layers=2, bidirectional=True),
               torch.randn(4, T, I))
    ws = [s for s in r.trace.storages if s.dtype == torch.uint8 and s.category == "activation"]
    assert len(ws) == 4
    for b in BATCHES:
        sizes = sorted(s.size(b) for s in ws)
        want = sorted(cpu_rnn.onednn_workspace_nbytes(torch.empty(T, b, i), H, torch.float32)
                      for i in (I, I, 2 * H, 2 * H))
        assert sizes == want


# --- exact against eager: the variants ----------------------------------------------------------

VARIANTS = [  # (layers, bidirectional, batch_first, hidden, seq)
    (1, False, True, 128, 5),  # 4*128 = 512: a padded leading dimension
    (1, True, False, 64, 4),  # 4*64 = 256: padded too
    (2, False, False, 24, 6),
    (2, True, True, 13, 3),  # 4*13 = 52: rounded up to 64
]


@pytest.mark.parametrize("layers,bidirectional,batch_first,hidden,seq", VARIANTS)
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_training_step_is_exact(cls, layers, bidirectional, batch_first, hidden, seq):
    _exact(Seq(cls, 12, batch_first=batch_first, hidden_size=hidden, num_layers=layers,
               bidirectional=bidirectional), torch.randn(4, seq, 12))


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_no_bias_dropout_and_relu(cls):
    kw = {"nonlinearity": "relu"} if cls is nn.RNN else {}
    _exact(Seq(cls, 12, hidden_size=20, num_layers=3, bias=False, dropout=0.3, **kw),
           torch.randn(4, 6, 12), optimizer=torch.optim.SGD)


def test_lstm_with_projections_bidirectional():
    _exact(Seq(nn.LSTM, 12, batch_first=False, hidden_size=20, proj_size=8, num_layers=2,
               bidirectional=True), torch.randn(4, 6, 12))


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_bfloat16_training(cls):
    """bfloat16 weights and inputs: oneDNN's bf16 LSTM (its workspace in 2-byte states,
    float32 gradients cast back by autograd) when the CPU has it, the native kernels else."""
    r = _exact(Seq(cls, 12, hidden_size=20, num_layers=2, bidirectional=True),
               torch.randn(4, 6, 12), dtype=torch.bfloat16)
    assert ("aten.mkldnn_rnn_layer.default" in _ops(r)) == (cls is nn.LSTM and BF16)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_bfloat16_autocast(cls):
    """CPU autocast casts mkldnn_rnn_layer's arguments (the LSTM's, layer by layer); GRU and
    RNN have no autocast kernel, their linears are cast one by one. On a CPU without
    bfloat16 oneDNN the LSTM's real step fails (autocast casts the layer's arguments
    whatever the CPU has; oneDNN then finds no primitive), so there is nothing to check."""
    if cls is nn.LSTM and not BF16:
        pytest.skip("this CPU has no bfloat16 oneDNN: eager's autocast LSTM step fails here")
    _exact(Seq(cls, 12, hidden_size=20, num_layers=2, bidirectional=True),
           torch.randn(4, 6, 12), amp=torch.bfloat16, optimizer=torch.optim.SGD)


def test_float16_training_runs_the_native_lstm():
    r = _exact(Seq(nn.LSTM, 12, hidden_size=20, num_layers=2), torch.randn(4, 6, 12),
               dtype=torch.float16, optimizer=torch.optim.SGD)
    assert "aten.mkldnn_rnn_layer.default" not in _ops(r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_inference(cls, dtype):
    """No grad: oneDNN keeps no workspace; float16 takes oneDNN only if the CPU has it."""
    _exact(Seq(cls, 12, hidden_size=20, num_layers=2, bidirectional=True),
           torch.randn(4, 6, 12), dtype=dtype, train=False)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_inference_mode(cls):
    """Under inference_mode the composite reaches fxmem.measure whole and its C++ body runs
    with the tracker active; the trace runs the transcription: the same ops."""
    _exact(Seq(cls, 12, hidden_size=20, num_layers=2, bidirectional=True),
           torch.randn(4, 6, 12), train=False, inference_mode=True)


def test_lstm_sequence_length_as_a_named_dim():
    """oneDNN runs the whole sequence in one primitive: the workspace is a formula in B and
    L (``ceiling`` terms of B*L)."""
    m = Seq(nn.LSTM, 12, hidden_size=20, num_layers=2, bidirectional=True)
    step = dict(loss=_loss, optimizer=torch.optim.SGD, device="cpu")
    r = fxmem.analyze(m, torch.randn(4, 6, 12), **step, dims={"L": [(0, 1)]})
    for b, n in [(2, 3), (3, 9), (7, 17)]:
        assert r.peak_bytes(b, L=n) == fxmem.measure(m, torch.randn(4, n, 12), **step,
                                                     B=b).peak_bytes


def test_native_rnn_needs_a_static_sequence_length():
    m = Seq(nn.GRU, 12, hidden_size=20)
    with pytest.raises(fxmem.TraceError, match="one cell per time step"):
        fxmem.analyze(m, torch.randn(4, 6, 12), loss=_loss, device="cpu",
                      dims={"L": [(0, 1)]})


def test_float16_autocast_lstm_training_is_refused_as_eager_fails():
    m = Seq(nn.LSTM, 12, hidden_size=20)
    with pytest.raises(fxmem.TraceError, match="no float16 LSTM training"):
        fxmem.analyze(m, torch.randn(4, 6, 12), loss=_loss, device="cpu", amp=torch.float16)


class Cells(nn.Module):
    """A cell stepped over the sequence in Python."""

    def __init__(self, cls, **kw):
        super().__init__()
        self.cell = cls(12, 20, **kw)

    def forward(self, x):
        h = None
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return h[0] if isinstance(h, tuple) else h


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_cells(cls, bias):
    """RNN.cpp lstm_cell / gru_cell (no precomputed input: linear_ih per call); the native
    kernels before could not run on fake tensors (unsafe_chunk reads concrete sizes)."""
    _exact(Cells(cls, bias=bias), torch.randn(4, 5, 12))


class Tagger(nn.Module):
    """A sequence tagger: embedding, bidirectional LSTM, a tag per token."""

    def __init__(self, vocab=1000, d=64, hidden=100, tags=17):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, tags)

    def forward(self, tokens):
        return self.fc(self.lstm(self.emb(tokens))[0])


def test_lstm_tagger_at_batch_512():
    """The audit's case: the workspace is most of the peak at large B (before it was left
    out: 80 % under for this tagger)."""
    m = Tagger()
    x, y = torch.randint(0, 1000, (4, 20)), torch.randint(0, 17, (4, 20))
    step = dict(loss=lambda o, t: F.cross_entropy(o.flatten(0, 1), t.flatten()),
                optimizer=torch.optim.Adam, device="cpu")
    r = fxmem.analyze(m, x, y, **step)
    assert r.peak_bytes(512) == fxmem.measure(m, x, y, **step, B=512).peak_bytes


# --- the transcriptions against eager, op by op ------------------------------------------------

class _Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((str(func), tuple((tuple(o.shape), o.dtype, o.untyped_storage().nbytes())
                                          for o in outs if isinstance(o, torch.Tensor))))
        return out


def _run(m, x, name, transcribed, backward):
    vf = getattr(torch._VF, name)

    class Route(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is vf and transcribed:
                return cpu_rnn.route(name, args)(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    log = _Log()
    with Route(), log:
        y = m(x)
        y = y[0] if isinstance(y, tuple) else y
        if backward:
            y.float().sum().backward()
    grads = [p.grad for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return log.ops, y.detach(), grads


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("cls,kw", [
    (nn.LSTM, {}), (nn.LSTM, {"bias": False}), (nn.LSTM, {"proj_size": 3}),
    (nn.GRU, {}), (nn.GRU, {"bias": False}),
    (nn.RNN, {}), (nn.RNN, {"nonlinearity": "relu", "bias": False}),
])
def test_transcription_runs_eagers_ops(cls, kw, grad):
    """On real tensors, the transcription and eager's C++ kernel dispatch the same aten ops
    in the same order, with outputs of the same shapes, dtypes and storage sizes, and
    compute the same values (bitwise)."""
    name = {nn.LSTM: "lstm", nn.GRU: "gru"}.get(cls) or f"rnn_{kw.get('nonlinearity', 'tanh')}"
    for layers, bidirectional, batch_first in itertools.product((1, 2), (False, True),
                                                                (False, True)):
        m = cls(5, 7, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first,
                **kw)
        x = torch.randn(3, 4, 5)
        with torch.set_grad_enabled(grad):
            eager = _run(m, x, name, False, grad)
            ours = _run(m, x, name, True, grad)
        assert ours[0] == eager[0], (layers, bidirectional, batch_first)
        assert torch.equal(ours[1], eager[1])
        assert all(a is None and b is None or torch.equal(a, b)
                   for a, b in zip(ours[2], eager[2]))


@pytest.mark.parametrize("cls,name", [(nn.LSTMCell, "lstm_cell"), (nn.GRUCell, "gru_cell")])
def test_cell_transcription_runs_eagers_ops(cls, name):
    for bias in (True, False):
        m = cls(5, 7, bias=bias)
        x = torch.randn(3, 5)
        eager, ours = _run(m, x, name, False, True), _run(m, x, name, True, True)
        assert ours[0] == eager[0] and torch.equal(ours[1], eager[1])
        assert all(a is None and b is None or torch.equal(a, b)
                   for a, b in zip(ours[2], eager[2]))


def test_the_report_headline_names_what_is_not_modelled():
    r = fxmem.analyze(Seq(nn.LSTM, 12, hidden_size=20), torch.randn(4, 6, 12), loss=_loss,
                      device="cpu")
    head = str(r).splitlines()[:4]
    assert head[1].startswith("peak bytes = ") and head[3].startswith(
        "not modelled: oneDNN RNN scratchpad, outside PyTorch's storages")
    assert "(about 1920*B bytes of gates" in head[3]  # 4 bytes * 6 steps * ld(4*20) = 80
