"""The validation zoo (:mod:`fxmem.validate`): models people train, each as a :class:`Case`
that builds the model with real weights and an example batch.

Sizes are the real ones (ResNet-50's bottlenecks, GPT-2 small at sequence 512, BERT-base)
for a GPU; ``scale="small"`` shrinks them for a CPU run of the same harness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


@dataclass(frozen=True)
class Case:
    """One row group of the validation table: ``build(scale)`` returns (model, inputs,
    targets); ``loss`` of (output, *targets) or None (the model returns ``.loss``);
    ``batches``: the B values measured; ``options``: extra keyword arguments for
    :func:`fxmem.analyze` and :func:`fxmem.measure` (amp, checkpoint plan)."""

    name: str
    build: Callable
    loss: Callable | None
    optimizer: Callable
    batches: tuple
    options: dict = field(default_factory=dict)
    plan: tuple = ()  # checkpoint plan applied (module paths)


class CausalLM(torch.nn.Module):
    """A Hugging Face language model called as ``model(ids, labels)``: its output has
    ``.loss`` (causal LMs shift the labels themselves; masked LMs take them as given)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels=None):
        return self.model(input_ids=ids, labels=labels)


class SeedCNN(nn.Module):
    """The seed article's CNN (two 3x3 convolutions, a linear head, 32x32 inputs)."""

    def __init__(self, c1=64, c2=128, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(c2 * 32 * 32, num_classes)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    """ResNet-50's layout (3, 4, 6, 3 bottlenecks); ``base`` channels scale it."""

    def __init__(self, base=64, layers=(3, 4, 6, 3), num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], base
        for i, n in enumerate(layers):
            width = base * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class UNet(nn.Module):
    """A two-level U-Net for segmentation."""

    def __init__(self, c=32, classes=2):
        super().__init__()
        conv = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(),  # noqa: E731
                                          nn.Conv2d(o, o, 3, padding=1), nn.ReLU())
        self.down1, self.down2, self.mid = conv(3, c), conv(c, 2 * c), conv(2 * c, 4 * c)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2), conv(4 * c, 2 * c)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * c, c, 2, 2), conv(2 * c, c)
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        m = self.mid(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], 1))
        return self.head(self.dec1(torch.cat([self.up1(u2), d1], 1)))


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=10000, d=256, hidden=512, layers=2, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, layers, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out[:, -1])


class MegatronLayer(nn.Module):
    """A transformer layer as Megatron-LM writes it (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", section 4.1): activations
    ``[s, b, h]``, LayerNorm, one QKV linear, ``baddbmm`` for the scores, softmax, dropout,
    ``bmm`` with the values, the output projection, dropout, residual; LayerNorm, a 4h MLP with
    GELU, dropout, residual. Without tensor parallelism."""

    def __init__(self, h=1024, heads=16, p=0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        s, b, h = x.shape
        a = self.heads
        hn = h // a
        q, k, v = self.qkv(self.ln1(x)).view(s, b * a, 3 * hn).split(hn, dim=-1)
        scores = torch.baddbmm(q.new_empty(b * a, s, s), q.transpose(0, 1),
                               k.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=hn ** -0.5)
        probs = F.dropout(F.softmax(scores, dim=-1), self.p, self.training)
        ctx = torch.bmm(probs, v.transpose(0, 1))  # [b*a, s, hn]
        ctx = ctx.view(b, a, s, hn).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + F.dropout(self.proj(ctx), self.p, self.training)
        y = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + F.dropout(y, self.p, self.training)


class MegatronStack(nn.Module):
    """Layers of :class:`MegatronLayer` on inputs ``[b, s, h]`` (fxmem's batch is dim 0),
    moved once to Megatron's ``[s, b, h]`` layout."""

    def __init__(self, layers=2, h=1024, heads=16, p=0.1):
        super().__init__()
        self.layers = nn.ModuleList(MegatronLayer(h, heads, p) for _ in range(layers))

    def forward(self, x):
        x = x.transpose(0, 1).contiguous()
        for layer in self.layers:
            x = layer(x)
        return x


def _images(b, size, classes):
    return (torch.randn(b, 3, size, size),), (torch.randint(0, classes, (b,)),)


def _seed(scale):
    m = SeedCNN() if scale == "full" else SeedCNN(8, 16)
    return (m, *_images(4, 32, 10))


def _resnet(scale):
    m = ResNet50() if scale == "full" else ResNet50(base=4, layers=(1, 1, 1, 1), num_classes=10)
    return (m, *_images(4, 224 if scale == "full" else 32, 1000 if scale == "full" else 10))


def _unet(scale):
    m = UNet() if scale == "full" else UNet(c=4)
    size = 256 if scale == "full" else 16
    return m, (torch.randn(4, 3, size, size),), (torch.randint(0, 2, (4, size, size)),)


def _lstm(scale):
    m = LSTMClassifier() if scale == "full" else LSTMClassifier(100, 8, 16)
    vocab, seq = (10000, 128) if scale == "full" else (100, 7)
    return m, (torch.randint(0, vocab, (4, seq)),), (torch.randint(0, 5, (4,)),)


def _mlp(scale):
    d = 4096 if scale == "full" else 64
    m = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.GELU(),
                      nn.Linear(d, 10))
    return m, (torch.randn(4, d),), (torch.randint(0, 10, (4,)),)


def _encoder(scale):
    d, seq = (512, 256) if scale == "full" else (32, 12)
    layer = nn.TransformerEncoderLayer(d, 8 if scale == "full" else 4, 4 * d, batch_first=True)
    m = nn.Sequential(nn.TransformerEncoder(layer, 6 if scale == "full" else 2,
                                            enable_nested_tensor=False), nn.Flatten(),
                      nn.Linear(d * seq, 10))
    return m, (torch.randn(4, seq, d),), (torch.randint(0, 10, (4,)),)


def _hf(config_name, model_name, full: dict, small: dict, seq_full, seq_small):
    def build(scale):
        import transformers

        cfg = getattr(transformers, config_name)(**(full if scale == "full" else small))
        m = CausalLM(getattr(transformers, model_name)(cfg))
        seq = seq_full if scale == "full" else seq_small
        ids = torch.randint(0, cfg.vocab_size, (4, seq))
        return m, (ids, ids.clone()), ()
    return build


_gpt2 = _hf("GPT2Config", "GPT2LMHeadModel", {}, dict(n_layer=2, n_embd=64, n_head=4,
                                                   vocab_size=500, n_positions=64,
                                                   bos_token_id=0, eos_token_id=0), 512, 32)
# HF turns the KV cache off when it checkpoints (a re-run must repeat the forward): so do we
_gpt2_nocache = _hf("GPT2Config", "GPT2LMHeadModel", dict(use_cache=False),
                    dict(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                         bos_token_id=0, eos_token_id=0, use_cache=False), 512, 32)
_bert = _hf("BertConfig", "BertForMaskedLM", {}, dict(num_hidden_layers=2, hidden_size=64,
            num_attention_heads=4, intermediate_size=128, vocab_size=500), 512, 32)
_llama = _hf("LlamaConfig", "LlamaForCausalLM",
             dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=4, vocab_size=32000),
             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=500), 1024, 32)


# GPT-2 small with SDPA (transformers' default) and its dropout 0.1, at a long sequence: the
# attention backend CUDA picks decides whether a B·H·L² term exists (fxmem.trace.kernels.cuda.sdpa)
_gpt2_long = _hf("GPT2Config", "GPT2LMHeadModel", dict(n_positions=2048),
                 dict(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                      bos_token_id=0, eos_token_id=0), 2048, 48)


def _megatron(scale):
    h, heads, layers, seq = (1024, 16, 4, 1024) if scale == "full" else (64, 4, 2, 16)
    m = MegatronStack(layers, h, heads).half()
    return m, (torch.randn(4, seq, h, dtype=torch.float16),), ()


class EmbeddingBag(nn.Module):
    """Token embeddings averaged, then a linear head: training's cost is the embedding's
    backward (on CUDA: sorting the indices, a kernel with temporaries of its own)."""

    def __init__(self, vocab=50000, d=512, classes=10):
        super().__init__()
        self.emb, self.fc = nn.Embedding(vocab, d), nn.Linear(d, classes)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def _embedding(scale):
    vocab, d, seq = (50000, 512, 256) if scale == "full" else (300, 16, 9)
    return (EmbeddingBag(vocab, d), (torch.randint(0, vocab, (4, seq)),),
            (torch.randint(0, 10, (4,)),))


def _adam(p):
    return torch.optim.Adam(p, lr=1e-4)


def _adamw(p):
    return torch.optim.AdamW(p, lr=1e-4)


def _sgd(p):
    return torch.optim.SGD(p, lr=0.01, momentum=0.9)


def cases(scale: str = "full") -> tuple:
    """The zoo: at least 12 setups, each at several batch sizes."""
    ce = F.cross_entropy
    big = scale == "full"
    return (
        Case("seed CNN, fp32, Adam", _seed, ce, _adam, (16, 64, 256) if big else (2, 13)),
        Case("seed CNN, AMP fp16 + GradScaler", _seed, ce, _adam,
             (16, 64, 256) if big else (2, 13), {"amp": torch.float16}),
        Case("ResNet-50, SGD momentum", _resnet, ce, _sgd, (16, 64) if big else (2, 13)),
        Case("ResNet-50, AMP bf16", _resnet, ce, _sgd, (16, 64) if big else (2, 13),
             {"amp": torch.bfloat16}),
        Case("ResNet-50, checkpointed blocks 0-5", _resnet, ce, _sgd,
             (16, 64) if big else (2, 13), plan=tuple(f"blocks.{i}" for i in range(6))
             if big else ("blocks.0", "blocks.1")),
        Case("GPT-2 small, seq 512, AdamW", _gpt2, None, _adamw, (4, 8) if big else (2, 5)),
        Case("GPT-2 small, seq 512, AMP bf16, AdamW", _gpt2, None, _adamw,
             (4, 8) if big else (2, 5), {"amp": torch.bfloat16}),
        Case("GPT-2 small, seq 2048, AdamW", _gpt2_long, None, _adamw,
             (1, 2) if big else (2, 5)),
        Case("GPT-2 small, seq 2048, AMP bf16, AdamW", _gpt2_long, None, _adamw,
             (1, 2) if big else (2, 5), {"amp": torch.bfloat16}),
        Case("GPT-2 small, every block checkpointed", _gpt2_nocache, None, _adamw,
             (4, 8) if big else (2, 5),
             plan=tuple(f"model.transformer.h.{i}" for i in range(12 if big else 2))),
        Case("BERT-base, seq 512, AdamW", _bert, None, _adamw, (4, 8) if big else (2, 5)),
        Case("Llama (8 layers, GQA), seq 1024, AdamW", _llama, None, _adamw,
             (2, 4) if big else (2, 5)),
        Case("LSTM classifier, Adam", _lstm, ce, _adam, (32, 128) if big else (2, 13)),
        Case("Megatron layers, fp16 weights, Adam", _megatron, lambda o: o.float().square().mean(),
             _adam, (2, 8) if big else (2, 5)),
        Case("Embedding classifier, Adam", _embedding, ce, _adam, (64, 512) if big else (2, 13)),
        Case("U-Net, Adam", _unet, ce, _adam, (4, 16) if big else (2, 13)),
        Case("MLP, Adam", _mlp, ce, _adam, (64, 512) if big else (2, 13)),
        Case("Transformer encoder, Adam", _encoder, ce, _adam, (16, 64) if big else (2, 13)),
        Case("Transformer encoder, inference", _encoder, None, None,
             (16, 64) if big else (2, 13), {"train": False}),
    )
