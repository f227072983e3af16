"""Low-precision and mixed-dtype models, integer inputs, and inference under no_grad and
inference_mode, against a real eager CPU step."""

import pytest
import torch
from torch import nn

import fxmem
from zoo import ZOO

MODELS = ["mlp", "resnet", "transformer_train_mode", "seed_cnn", "unet", "tied_reuse"]


def _to(dtype, name):
    model, x, y, loss = ZOO[name]()
    cast = lambda ts: tuple(t.to(dtype) if t.is_floating_point() else t for t in ts)  # noqa: E731
    return model.to(dtype), cast(x), cast(y), loss


def _same(model, x, y, loss, batches=(2, 13), **kw):
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu", **kw)
    for b in batches:
        assert r.peak_bytes(b) == fxmem.measure(model, x, y, loss=loss, B=b, **kw).peak_bytes, b
    return r


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", MODELS)
def test_low_precision_models(name, dtype):
    model, x, y, loss = _to(dtype, name)
    r = _same(model, x, y, loss, optimizer=lambda p: torch.optim.Adam(p, foreach=False))
    assert {s.dtype for s in r.trace.storages if s.category == "param"} == {dtype}
    _same(model, x, (), None, train=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_lstm_inference(dtype):
    # eager takes oneDNN when this CPU supports the dtype (fp16: only without grad), as
    # fxmem.trace.kernels.cpu_rnn.uses_onednn asks
    model, x, y, loss = _to(dtype, "lstm")
    _same(model, x, (), None, train=False)


def test_fp16_lstm_training_without_onednn():
    model, x, y, loss = _to(torch.float16, "lstm")  # grad mode: no oneDNN for fp16
    _same(model, x, y, loss, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, foreach=False))


def test_bf16_lstm_training():
    # oneDNN's bf16 LSTM (if this CPU has it): its workspace in 2-byte states, modelled
    model, x, y, loss = _to(torch.bfloat16, "lstm")
    _same(model, x, y, loss, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, foreach=False))


class Mixed(nn.Module):
    """fp32 embedding and head around a bf16 body; integer token inputs."""

    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.body = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)).to(
            torch.bfloat16)
        self.head = nn.Linear(d, 5)

    def forward(self, tokens):
        h = self.body(self.emb(tokens).to(torch.bfloat16))
        return self.head(h.float().mean(dim=1))


def test_mixed_dtypes_inside_a_model():
    x, y = torch.randint(0, 50, (4, 7)), torch.randint(0, 5, (4,))
    r = _same(Mixed(), (x,), (y,), nn.functional.cross_entropy,
              optimizer=lambda p: torch.optim.AdamW(p, foreach=False))
    assert {s.dtype for s in r.trace.storages if s.category == "param"} == {torch.float32,
                                                                             torch.bfloat16}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_inference_mode(name):
    # the LSTM reaches the tracker as one composite aten.lstm.input under inference_mode:
    # fxmem.trace.ledger.tracking runs its C++ body with the tracker active, so measure sees inside
    # it
    model, x, _, _ = ZOO[name]()
    _same(model, x, (), None, train=False, inference_mode=True)


def test_inference_mode_is_for_inference():
    model, x, y, loss = ZOO["mlp"]()
    with pytest.raises(fxmem.InputError, match="train=False"):
        fxmem.analyze(model, x, y, loss=loss, device="cpu", inference_mode=True)
