"""A zoo of models for accuracy tests and benchmarks: each entry builds (model, inputs,
targets, loss). Sizes are small so the real CPU step used as ground truth is quick."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=(64, 48), d_out=10):
        super().__init__()
        dims = (d_in, *hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(dims[-1], d_out)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class SeedCNN(nn.Module):
    """The seed article's network, at a smaller image size."""

    def __init__(self, c1=8, c2=16, hw=12):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3)
        self.conv2 = nn.Conv2d(c1, c2, 3)
        self.fc = nn.Linear(c2 * (hw - 4) ** 2, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.view(x.size(0), -1))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


class ResNetish(nn.Module):
    def __init__(self, c=8, blocks=2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU(inplace=True))
        self.layer1 = nn.Sequential(*[Block(c) for _ in range(blocks)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        x = self.layer1(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class LSTMNet(nn.Module):
    def __init__(self, vocab=50, d=16, hidden=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, 5)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.fc(out[:, -1])


class Encoder(nn.Module):
    def __init__(self, d=32, heads=4, layers=2, seq=12):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, batch_first=True,
                                           dropout=0.1)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(d, 3)

    def forward(self, x):
        return self.fc(self.enc(x).mean(dim=1))


class TiedReuse(nn.Module):
    """One block applied three times, and an output layer tied to the embedding."""

    def __init__(self, vocab=40, d=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.block = nn.Sequential(nn.Linear(d, d), nn.GELU())
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        h = self.emb(tokens)
        for _ in range(3):
            h = h + self.block(h)
        return self.out(h).flatten(0, 1)


class UNetish(nn.Module):
    def __init__(self, c=6):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        u = self.up(d2)
        return self.head(self.dec(torch.cat([u, d1], dim=1)))


class KeepsLocals(nn.Module):
    """Keeps every intermediate in a local until it returns (eager frees them only then)."""

    def __init__(self, d=32):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, 4 * d), nn.Linear(4 * d, 4 * d), nn.Linear(4 * d, 8)

    def forward(self, x):
        h1 = self.a(x)
        h2 = torch.tanh(h1)
        h3 = self.b(h2)
        h4 = torch.sigmoid(h3) * h2
        out = self.c(h4)
        return out


def _ce(out, y):
    return F.cross_entropy(out, y)


def _mse(out, y):
    return F.mse_loss(out, y)


def _ce_tokens(out, y):
    return F.cross_entropy(out, y.flatten())


def _seg(out, y):
    return F.cross_entropy(out, y)


# name -> builder() -> (model, inputs, targets, loss); batch of the examples is 4
from fxmem.validate.zoo import CausalLM as LM  # noqa: E402 - a HF causal LM called with labels


def gpt2(**config):
    """GPT-2 with random weights from transformers' GPT2Config (default: 124M parameters)."""
    import transformers

    return LM(transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)))


ZOO = {
    "mlp": lambda: (MLP(), (torch.randn(4, 32),), (torch.randint(0, 10, (4,)),), _ce),
    "seed_cnn": lambda: (SeedCNN(), (torch.randn(4, 3, 12, 12),), (torch.randint(0, 10, (4,)),), _ce),
    "resnet": lambda: (ResNetish(), (torch.randn(4, 3, 8, 8),), (torch.randint(0, 10, (4,)),), _ce),
    "lstm": lambda: (LSTMNet(), (torch.randint(0, 50, (4, 7)),), (torch.randint(0, 5, (4,)),), _ce),
    "transformer": lambda: (Encoder().eval(), (torch.randn(4, 12, 32),),
                            (torch.randint(0, 3, (4,)),), _ce),
    "transformer_train_mode": lambda: (Encoder(), (torch.randn(4, 12, 32),),
                                       (torch.randint(0, 3, (4,)),), _ce),
    "tied_reuse": lambda: (TiedReuse(), (torch.randint(0, 40, (4, 5)),),
                           (torch.randint(0, 40, (4, 5)),), _ce_tokens),
    "unet": lambda: (UNetish(), (torch.randn(4, 3, 8, 8),), (torch.randint(0, 2, (4, 8, 8)),), _seg),
    "keeps_locals": lambda: (KeepsLocals(), (torch.randn(4, 32),), (torch.randn(4, 8),), _mse),
    "keeps_locals_eval": lambda: (KeepsLocals().eval(), (torch.randn(4, 32),), (torch.randn(4, 8),),
                                  _mse),
}


def sgd_momentum(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=1e-3)


OPTIMIZERS = {"sgd_momentum": sgd_momentum, "adam": adam}


# decoder-only language models for the checkpointing benchmarks (issue 23) ---------------------
class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one ``nn.Linear`` for q, k and v, PyTorch's SDPA
    (``is_causal=True``), an output projection."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, seq, d = x.shape
        q, k, v = (t.view(b, seq, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, seq, d))


class GPTBlock(nn.Module):
    """A pre-LayerNorm GPT block: x + attn(ln1(x)), then x + mlp(ln2(x)) (4x, GELU)."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Group(nn.Module):
    """Consecutive blocks run as one module, with one block's call signature: the hidden
    state goes through each in turn, every other argument is passed to all of them (the
    attention mask, position embeddings, ...). Chen's segments wrap one Group each."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, hidden, *args, **kwargs):
        for b in self.blocks:
            hidden = b(hidden, *args, **kwargs)
        return hidden


class GPTStack(nn.Module):
    """A GPT-style decoder-only stack: token embedding + learned positions, ``n_layers``
    blocks as ``blocks.0`` .. (an ``nn.Sequential``), a final LayerNorm and an LM head;
    ``forward(ids)`` returns the logits ``(B, L, vocab)``.

    >>> m = GPTStack(vocab=16, d=8, seq=4, n_layers=2, heads=2)
    >>> m(torch.zeros(3, 4, dtype=torch.long)).shape
    torch.Size([3, 4, 16])
    """

    def __init__(self, vocab=512, d=256, seq=128, n_layers=12, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*[GPTBlock(d, heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        return self.head(self.ln_f(self.blocks(x)))


def token_loss(logits, targets):
    """Cross-entropy over every position: ``logits (B, L, V)``, ``targets (B, L)``."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def llama(**config):
    """A Llama causal LM with random weights from transformers' LlamaConfig, called as
    ``model(ids, labels)``; ``use_cache=False`` and SDPA attention unless given."""
    import transformers

    config = {"use_cache": False, "attn_implementation": "sdpa", **config}
    return LM(transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)))
