"""Steps the fake GPU runs (tests/test_fake_gpu.py): each function returns ``(model, inputs,
targets, loss_fn, optimizer_factory)`` for ``fxmem.validate.fakegpu`` and, built the same
way, what ``fxmem.analyze`` predicts."""

import torch
from torch import nn


def mlp(B=64, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    return (model, torch.randn(B, 1024), torch.randint(0, 10, (B,)),
            nn.functional.cross_entropy, adamw)


def adamw(params):
    return torch.optim.AdamW(params)


class GPT2WithLabels(nn.Module):
    """A two-layer GPT-2 (n_embd 256, 4 heads), called as ``model(ids, labels)``."""

    def __init__(self):
        super().__init__()
        import transformers

        self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=256, n_head=4, bos_token_id=0, eos_token_id=0))

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels)


def gpt2(B=4, L=128, seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, 50257, (B, L))
    return GPT2WithLabels(), (ids, ids), None, None, adamw
