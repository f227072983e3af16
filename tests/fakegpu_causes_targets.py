"""Small steps that each show one way the order or the sharing of PyTorch's CUDA allocations
differs from fxmem's trace (tests/test_fake_gpu_causes.py): the causes the allocator-layout
comparison of GPT-2, Llama and ViT found, and of the full-scale zoo (docs/validation.md, "The
fake GPU")."""

import torch
import torch.nn.functional as F
from torch import nn


class Dropout(nn.Module):
    """A Linear then dropout (0.1): the CUDA kernel's mask and output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 256)

    def forward(self, x):
        return F.dropout(self.lin(x), 0.1)


class TwoPaths(nn.Module):
    """``h * 2 + h.sin()`` for ``h = lin(x)``: autograd sums the two gradients of ``h``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 256)

    def forward(self, x):
        h = self.lin(x)
        return h * 2 + h.sin()


class PatchConv(nn.Module):
    """ViT's patch embedding: a strided Conv2d with a bias, its output flattened, transposed
    and put after a class token, so the convolution's incoming gradient is a strided slice
    (cuDNN's backward copies it)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 8, stride=8)
        self.token = nn.Parameter(torch.zeros(1, 1, 32))

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)
        return torch.cat([self.token.expand(y.shape[0], -1, -1), y], 1)


class EfficientGQA(nn.Module):
    """fp32 attention with two key/value heads for four query heads on the memory-efficient
    kernel, its output made contiguous: the kernel's incoming gradient is a strided view
    (copied first), its key and value gradients are made at the query's heads, and fp32's
    ``delta`` is a product, its sum and their transposed copy."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 4 * 64)
        self.kv = nn.Linear(64, 2 * 2 * 64)

    def forward(self, x):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 64).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, 2, 64).permute(2, 0, 3, 1, 4)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return out.contiguous()


class Residual(nn.Module):
    """``x + lin(x).sin()``: autograd sums the two gradients of ``x``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return x + self.lin(x).sin()


class Residuals(nn.Module):
    """Four identical :class:`Residual` blocks (fxmem traces two and copies the others):
    autograd sums each block input's two gradients in place."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(Residual() for _ in range(4)))

    def forward(self, x):
        return self.blocks(x)


class StridedLinear(nn.Module):
    """A Linear with a bias on a transposed (non-contiguous) 3-D input, as
    ``nn.MultiheadAttention``'s in-projection of a batch-first input: ``matmul``, then the
    bias added in place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 192)

    def forward(self, x):
        return self.lin(x.transpose(0, 1))


class ExpandedIds(nn.Module):
    """BERT's token types: a (1, L) buffer of ids expanded to the batch (strides 0), looked
    up in an embedding and added to the input."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2, 64)
        self.register_buffer("ids", torch.zeros(1, 16, dtype=torch.long))

    def forward(self, x):
        return x + self.emb(self.ids.expand(x.shape[0], -1))


def square_sum(out):
    return out.pow(2).sum()


STEPS = {"dropout": (Dropout, (64,)), "two_paths": (TwoPaths, (64,)),
         "patch_conv": (PatchConv, (3, 32, 32)), "efficient_gqa": (EfficientGQA, (128, 64)),
         "residuals": (Residuals, (64,)), "strided_linear": (StridedLinear, (16, 64)),
         "expanded_ids": (ExpandedIds, (16, 64))}


def build(name, B=4):
    """(model, input) of step ``name`` at batch size ``B``."""
    cls, sample = STEPS[name]
    torch.manual_seed(0)
    return cls(), torch.randn(B, *sample)


def measure_all(names: list) -> dict:
    """In the fake GPU's child: ``fxmem.measure(..., record_history=True)`` of each step at
    B=4, one after another (it starts each from a fresh allocator): {name: the measured
    allocations ``[bytes, frame]``, ``peak_bytes`` and ``peak_reserved_bytes``}."""
    import fxmem

    out = {}
    for name in names:
        model, x = build(name)
        m = fxmem.measure(model, x, loss=square_sum, B=4, device="cuda", record_history=True)
        out[name] = {"allocations": [list(a) for a in m.allocations],
                     "peak_bytes": m.peak_bytes, "peak_reserved_bytes": m.peak_reserved_bytes}
    return out
