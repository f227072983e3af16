"""Hugging Face models built from config classes (random weights, no downloads)."""

import pytest
import torch

import fxmem
from zoo import LM, gpt2 as zoo_gpt2

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2():
    return zoo_gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                    bos_token_id=0, eos_token_id=0)


@pytest.mark.parametrize("train", [True, False])
def test_gpt2_matches_measure(gpt2, train):
    ids = torch.randint(0, 128, (4, 16))
    kw = dict(optimizer=torch.optim.AdamW) if train else dict(train=False)
    r = fxmem.analyze(gpt2, (ids, ids), **kw, device="cpu")
    assert r.valid_when == (fxmem.B >= 2,)  # the label padding stayed symbolic
    for b in (2, 3, 7):
        assert r.peak_bytes(b) == fxmem.measure(gpt2, (ids, ids), **kw, B=b).peak_bytes


V = 100


def _family(name, attn, layers=2):
    """A small config of each family, random weights, with the given attention path."""
    T = transformers
    kw = dict(attn_implementation=attn)
    ids = torch.randint(0, V, (4, 16))
    if name == "llama_gqa":  # grouped-query attention: 4 query heads share 2 key/value heads
        cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=V, **kw)
        return LM(T.LlamaForCausalLM(cfg)), (ids, ids)
    if name == "bert":
        cfg = T.BertConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           intermediate_size=128, vocab_size=V, **kw)
        return LM(T.BertForMaskedLM(cfg)), (ids, ids)
    if name == "t5":  # encoder-decoder
        cfg = T.T5Config(d_model=64, d_ff=128, num_layers=layers, num_heads=4, d_kv=16,
                         vocab_size=V, decoder_start_token_id=0, **kw)
        return LM(T.T5ForConditionalGeneration(cfg)), (ids, ids)
    cfg = T.ViTConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      intermediate_size=128, image_size=32, patch_size=8, num_labels=10, **kw)
    return ViT(T.ViTForImageClassification(cfg)), (torch.randn(4, 3, 32, 32),
                                                    torch.randint(0, 10, (4,)))


class ViT(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels, labels):
        return self.model(pixel_values=pixels, labels=labels)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["llama_gqa", "bert", "t5", "vit"])
def test_model_families_match_measure(name, attn):
    model, inputs = _family(name, attn)
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cpu")  # traced at 4
    for b in (2, 5):
        assert r.peak_bytes(b) == fxmem.measure(model, inputs, optimizer=torch.optim.AdamW,
                                                B=b).peak_bytes, b


def test_llama_7b_width_on_meta_matches_closed_forms():
    # Llama-2-7B's layer sizes (transformers' default LlamaConfig), two layers, on meta:
    # nothing allocated; params, grads and AdamW state as the closed forms (benchmarks/huge.py
    # runs all 32 layers)
    import sys, os  # noqa: E401
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from huge import closed_forms

    with torch.device("meta"):
        model = LM(transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2)))
    n = sum(p.numel() for p in model.parameters())
    ids = torch.empty(1, 256, dtype=torch.int64, device="meta")
    r = fxmem.analyze(model, (ids, ids), optimizer=torch.optim.AdamW)
    for part, (got, want) in closed_forms(r, n).items():
        assert got == want, part
    assert r.peak_bytes(1) > 16 * n  # weights, grads and state, plus the step's own


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name,valid", [
    ("llama_gqa", "(B >= 2, L >= 2)"),
    ("bert", "(B >= 2, L >= 2, L <= 512)"),  # BERT's learned positions end at 512
    ("t5", "(B >= 2, L >= 3)"),
])
def test_families_in_b_and_l_match_measure_at_other_lengths(name, attn, valid):
    model, inputs = _family(name, attn)  # traced at B = 4, L = 16
    step = dict(optimizer=torch.optim.AdamW)
    r = fxmem.analyze(model, inputs, **step, device="cpu", dims={"L": [(0, 1), (1, 1)]})
    # mixed guards that the bounds imply (B*L >= 2, Mod(B, B*L) != 0, ...) are left out
    assert str(r.valid_when) == valid
    for b, n in [(2, 8), (5, 24), (3, 33)]:
        x = torch.randint(0, V, (4, n))
        assert r.peak_bytes(b, L=n) == fxmem.measure(model, (x, x), **step, B=b).peak_bytes


def test_t5_encoder_and_decoder_lengths_as_two_dims():
    model, inputs = _family("t5", "sdpa")
    step = dict(optimizer=torch.optim.AdamW)
    r = fxmem.analyze(model, inputs, **step, device="cpu", dims={"L": [(0, 1)], "T": [(1, 1)]})
    assert r.dims == ("L", "T")
    assert str(r.valid_when) == "(B >= 2, L >= 2, T >= 3)"
    for b, n, m in [(2, 8, 5), (5, 24, 40), (3, 33, 7)]:
        x, y = torch.randint(0, V, (4, n)), torch.randint(0, V, (4, m))
        assert r.peak_bytes(b, L=n, T=m) == fxmem.measure(model, (x, y), **step, B=b).peak_bytes
