"""A two-layer GPT-2 (transformers' ``GPT2LMHeadModel``, random weights, no download):
128-dim embeddings, 4 heads, 1,000-token vocabulary, sequences of 64 tokens, AdamW.
The model computes its own causal-LM loss: ``forward(ids, labels)`` returns Hugging Face's
output, whose ``.loss`` is what backward starts from (``loss=None`` in :func:`fxmem.analyze`).

Analyse it from the command line:

    fxmem analyze examples/gpt2_tiny.py:TinyGPT2 --input B,64:int64:1000 --input B,64:int64:1000 --optimizer adamw --budget 8GiB

Its report is in ``docs/gallery/gpt2_tiny.md`` (``python examples/gallery.py``).
Needs ``transformers`` (``pip install -e ".[hf]"``).
"""

import torch
from torch import nn

SEQ = 64
VOCAB = 1000


class TinyGPT2(nn.Module):
    """``GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
    n_positions=128))`` called with labels: ``forward(ids, labels).loss`` is the loss."""

    def __init__(self):
        super().__init__()
        import transformers

        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB,
                                         n_positions=128, bos_token_id=0, eos_token_id=0,
                                         use_cache=False)
        self.model = transformers.GPT2LMHeadModel(config)

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels)


def example():
    """Model (on the meta device: no weights allocated), token ids and labels."""
    with torch.device("meta"):
        model = TinyGPT2()
    ids = torch.empty(8, SEQ, dtype=torch.int64, device="meta")
    return model, (ids, ids), ()
