"""Whole Hugging Face models on device="cuda": with SDPA, CUDA runs a fused attention kernel
(fxmem.trace.kernels.cuda.sdpa) that never materialises the B·H·L² probabilities or their dropout
mask, so the step saves no such tensor; with eager attention it does. On device="cpu" the same
models stay
exact against fxmem.measure (test_hf.py)."""

import pytest
import sympy
import torch

import fxmem
from fxmem.trace.kernels.cuda import sdpa
from fxmem.formula.symbols import B, L
from fxmem.trace import trace
from zoo import LM

transformers = pytest.importorskip("transformers")

V, SEQ, HEADS = 100, 24, 4  # head dim 16: unlike any length


class ViT(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, labels):
        return self.m(pixel_values=x, labels=labels).loss


def _model(family, attn):
    """A small config of each family, dropout on, with the given attention path."""
    T = transformers
    kw = dict(attn_implementation=attn)
    ids = torch.randint(0, V, (4, SEQ))
    if family == "gpt2":
        cfg = T.GPT2Config(n_layer=2, n_embd=64, n_head=HEADS, vocab_size=V, n_positions=64,
                           bos_token_id=0, eos_token_id=0, **kw)  # dropouts 0.1 by default
        return LM(T.GPT2LMHeadModel(cfg)), (ids, ids), SEQ
    if family == "bert":
        cfg = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=HEADS,
                           intermediate_size=128, vocab_size=V, **kw)  # dropouts 0.1
        return LM(T.BertForMaskedLM(cfg)), (ids, ids), SEQ
    if family == "llama":  # grouped-query attention, dropout turned on
        cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=HEADS, num_key_value_heads=2, vocab_size=V,
                            attention_dropout=0.1, **kw)
        return LM(T.LlamaForCausalLM(cfg)), (ids, ids), SEQ
    cfg = T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=HEADS,
                      intermediate_size=128, image_size=32, patch_size=8, num_labels=10,
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, **kw)
    return (ViT(T.ViTForImageClassification(cfg)),
            (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))), 16 + 1)  # patches + CLS


def _attention_sized(t, seq):
    """Storages saved for backward shaped like attention probabilities, [B, H, L, L]."""
    return [s for s in t.storages if s.saved and len(s.shape) == 4
            and tuple(s.shape[1:]) == (HEADS, seq, seq)]


# What CUDA (torch 2.13, sm90, cuDNN 9.20) runs for each family's SDPA call
# (fxmem.trace.kernels.cuda.sdpa): fp32 rules out flash and cuDNN, and memory-efficient attention
# takes no grouped-query attention, so Llama's fp32 step (transformers passes enable_gqa=True when
# there is no mask) runs the math backend, B·H·L² probabilities and all; bf16 would prefer cuDNN on
# sm90 with cuDNN > 9.15, but cuDNN takes only dropout probabilities that are multiples of 1/16
# (these use 0.1): flash.
BACKEND = {("gpt2", None): "efficient", ("bert", None): "efficient",
           ("vit", None): "efficient", ("llama", None): "math"}
FUSED = {"aten._scaled_dot_product_efficient_attention.default",
         "aten._scaled_dot_product_flash_attention.default",
         "aten._scaled_dot_product_cudnn_attention.default"}


def _backends(t):
    return {what.split(" ")[0] for op, what in t.kernel_choices
            if op == "aten.scaled_dot_product_attention"}


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
@pytest.mark.parametrize("family", ["gpt2", "bert", "llama", "vit"])
def test_sdpa_on_cuda_saves_no_attention_probabilities(family, amp):
    model, inputs, seq = _model(family, "sdpa")
    t = trace(model, inputs, optimizer=torch.optim.AdamW, device="cuda", amp=amp)
    # bf16: cuDNN would lead, but from 2.12 it refuses p = 0.1 (not a multiple of 1/16)
    want = BACKEND.get((family, amp), "flash" if sdpa.TORCH >= (2, 12) else "cuDNN")
    assert _backends(t) == {"memory-efficient" if want == "efficient" else want}
    ops = {o.op for o in t.ops}
    if want == "math":  # the unfused path: CUDA saves the probabilities and a bool mask
        assert not FUSED & ops and "aten._safe_softmax.default" in ops
        assert {s.dtype for s in _attention_sized(t, seq)} == {torch.float32, torch.bool}
    else:
        assert FUSED & ops and "aten._safe_softmax.default" not in ops
        assert not _attention_sized(t, seq)
    eager_model, inputs, seq = _model(family, "eager")
    eager = trace(eager_model, inputs, optimizer=torch.optim.AdamW, device="cuda", amp=amp)
    assert _attention_sized(eager, seq)  # eager attention keeps its probabilities


def _activations_in_b_and_l(family, attn, amp):
    model, inputs, _ = _model(family, attn)
    r = fxmem.analyze(model, inputs, optimizer=torch.optim.AdamW, device="cuda", amp=amp,
                      dims={"L": [(0, 1), (1, 1)]})
    # a kernel's padding (ceiling(L/32)*32) is within a constant of its argument: same degree
    expr = sympy.expand(r.parts["activations"]).replace(sympy.ceiling, lambda a: a)
    assert not expr.has(sympy.floor, sympy.Function), expr
    return sympy.Poly(sympy.expand(expr), B, L)


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
def test_sdpa_activations_have_no_b_l_squared_term_on_cuda(family, amp):
    sdpa = _activations_in_b_and_l(family, "sdpa", amp)
    eager = _activations_in_b_and_l(family, "eager", amp)
    assert eager.coeff_monomial(B * L**2) > 0, eager.as_expr()
    if BACKEND.get((family, amp)) == "math":
        assert sdpa.coeff_monomial(B * L**2) > 0, sdpa.as_expr()
    else:
        assert sdpa.degree(L) == 1, sdpa.as_expr()
