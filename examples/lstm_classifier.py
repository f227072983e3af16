"""A text classifier: token embedding, a two-layer LSTM over 32 tokens, and a linear head on
the last hidden state; 5,000-token vocabulary, 4 classes, cross-entropy, Adam.

Analyse it from the command line:

    fxmem analyze examples/lstm_classifier.py:LSTMClassifier --input B,32:int64:5000 --target B:int64:4 --optimizer adam --budget 8GiB

Its report is in ``docs/gallery/lstm_classifier.md`` (``python examples/gallery.py``).
"""

import torch
from torch import nn

SEQ = 32
VOCAB = 5000


class LSTMClassifier(nn.Module):
    """Embedding(5000, 128) -> LSTM(128, 256, 2 layers, batch_first) -> Linear(256, 4)."""

    def __init__(self, vocab: int = VOCAB, d: int = 128, hidden: int = 256,
                 num_classes: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out[:, -1])


def example():
    """Model (on the meta device: no weights allocated), token ids and labels."""
    with torch.device("meta"):
        model = LSTMClassifier()
    tokens = torch.empty(8, SEQ, dtype=torch.int64, device="meta")
    y = torch.empty(8, dtype=torch.int64, device="meta")
    return model, (tokens,), (y,)
