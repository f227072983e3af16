"""Small steps that each show one way the order or the sharing of PyTorch's CUDA allocations
differs from fxmem's trace (tests/test_fake_gpu_causes.py): the causes the allocator-layout
comparison of GPT-2, Llama and ViT found (docs/validation.md, "The fake GPU")."""

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


def square_sum(out):
    return out.pow(2).sum()


STEPS = {"dropout": (Dropout, (64,)), "two_paths": (TwoPaths, (64,)),
         "patch_conv": (PatchConv, (3, 32, 32))}


def build(name, B=4):
    """(model, input) of step ``name`` at batch size ``B``."""
    cls, sample = STEPS[name]
    torch.manual_seed(0)
    return cls(), torch.randn(B, *sample)
