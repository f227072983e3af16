"""Steps the fake GPU runs (tests/test_fake_gpu.py): each function returns ``(model, inputs,
targets, loss_fn, optimizer_factory)`` for ``fxmem.validate.fakegpu`` and, built the same
way, what ``fxmem.analyze`` predicts."""

import copy

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


# --- one model per CUDA kernel rule (fxmem.trace.kernels.cuda.kernels.RULES), for test_fake_gpu.py
# ------

class _Op(nn.Module):
    """``fn(x * w)`` for a parameter ``w`` shaped like a sample (so the op is in autograd)."""

    def __init__(self, fn, sample_shape, *modules, dtype=torch.float32):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.ones(sample_shape, dtype=dtype))
        self.mods = nn.ModuleList(modules)

    def forward(self, x):
        return self.fn(self, x * self.w)


def _sum(out):
    return out.float().sum()


def _channels_last(t):
    return t.contiguous(memory_format=torch.channels_last)


F = nn.functional
RULES = {
    # name: (forward fn(self, x), sample shape, dtype, modules, makes the batch from B)
    "dropout": (lambda m, x: F.dropout(x, 0.1), (64, 96), torch.float32, ()),
    "softmax fp16 to fp32": (lambda m, x: torch.softmax(x, -1, dtype=torch.float32),
                             (64, 96), torch.float16, ()),
    "log_softmax fp32": (lambda m, x: torch.log_softmax(x, -1), (64, 96), torch.float32, ()),
    "softmax of a transpose": (lambda m, x: torch.softmax(x.transpose(1, 2), -1),
                               (64, 96), torch.float32, ()),
    "rms_norm": (lambda m, x: m.mods[0](x), (64, 96), torch.float32, (nn.RMSNorm(96),)),
    "rms_norm bf16": (lambda m, x: m.mods[0](x), (64, 96), torch.bfloat16,
                      (nn.RMSNorm(96, dtype=torch.bfloat16),)),
    "layer_norm fp16": (lambda m, x: m.mods[0](x), (64, 96), torch.float16,
                        (nn.LayerNorm(96, dtype=torch.float16),)),
    "layer_norm many rows": (lambda m, x: m.mods[0](x), (40000, 8), torch.float32,
                             (nn.LayerNorm(8),)),
    "rms_norm many rows": (lambda m, x: m.mods[0](x), (40000, 8), torch.float32,
                           (nn.RMSNorm(8),)),
    "batch_norm 2-d (native kernel)": (lambda m, x: m.mods[0](x), (96,), torch.float32,
                                       (nn.BatchNorm1d(96),)),
    "batch_norm bf16 (native kernel)": (lambda m, x: m.mods[0](x), (16, 12, 12),
                                        torch.bfloat16,
                                        (nn.BatchNorm2d(16, dtype=torch.bfloat16),)),
    "log_sigmoid": (lambda m, x: F.logsigmoid(x), (64, 96), torch.float32, ()),
    "cumsum of a bool mask": (lambda m, x: x + (x != 1).cumsum(-1), (64, 96), torch.float32, ()),
    "group_norm": (lambda m, x: m.mods[0](x), (16, 12, 12), torch.float32,
                   (nn.GroupNorm(4, 16),)),
    "group_norm channels_last": (lambda m, x: m.mods[0](_channels_last(x)), (16, 12, 12),
                                 torch.float32, (nn.GroupNorm(4, 16),)),
    "embedding_bag sum": (lambda m, x: m.mods[0]((x.sum(-1).long() % 1000).abs()),
                          (8, 4), torch.float32, (nn.EmbeddingBag(1000, 64, mode="sum"),)),
    "embedding_bag max": (lambda m, x: m.mods[0]((x.sum(-1).long() % 1000).abs()),
                          (8, 4), torch.float32, (nn.EmbeddingBag(1000, 64, mode="max"),)),
    "index_put accumulate": (lambda m, x: torch.zeros(
        512, x.shape[-1], device=x.device).index_put((torch.arange(x.shape[0], device=x.device)
                                                      % 512,), x[:, 0], accumulate=True),
        (4, 96), torch.float32, ()),
}


def rule(B=2, case="dropout", seed=0):
    """A training step (no optimizer) of one op under one of fxmem's CUDA kernel rules."""
    torch.manual_seed(seed)
    fn, shape, dtype, mods = RULES[case]
    # a copy: ``RULES`` keeps its modules, which moving a model to the device would move
    model = _Op(fn, shape, *copy.deepcopy(mods), dtype=dtype)
    return model, torch.randn(B, *shape).to(dtype), None, _sum, None
RULES.update({
    "batch_norm 2-d eval-mode grads": (lambda m, x: m.mods[0].eval()(x), (96,), torch.float32,
                                       (nn.BatchNorm1d(96),)),
    "batch_norm bf16 channels_last (native kernel)": (
        lambda m, x: m.mods[0](_channels_last(x)), (16, 12, 12), torch.bfloat16,
        (nn.BatchNorm2d(16, dtype=torch.bfloat16),)),
    "batch_norm 3-d {N, C, 1} (native kernel)": (lambda m, x: m.mods[0](x), (96, 1),
                                                 torch.bfloat16,
                                                 (nn.BatchNorm1d(96, dtype=torch.bfloat16),)),
})
RULES.update({
    "group_norm channels_last, no affine": (
        lambda m, x: m.mods[0](_channels_last(x)), (16, 12, 12), torch.float32,
        (nn.GroupNorm(4, 16, affine=False),)),
    "group_norm channels_last bf16": (
        lambda m, x: m.mods[0](_channels_last(x)), (16, 12, 12), torch.bfloat16,
        (nn.GroupNorm(4, 16, dtype=torch.bfloat16),)),
    "group_norm channels_last, a contiguous gradient": (
        lambda m, x: m.mods[0](_channels_last(x)).contiguous(), (16, 12, 12), torch.float32,
        (nn.GroupNorm(4, 16),)),
})


class _Embed(nn.Module):
    """An embedding looked up with ids made from the batch (so its backward is in the step)."""

    def __init__(self, vocab=50257, dim=64, dtype=torch.float32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, dtype=dtype)

    def forward(self, ids):
        return self.emb(ids)


def embedding(B=2, L=2048, dtype="float32", seed=0):
    """``embedding_dense_backward`` past 3,072 indices (B·L): the sort-based path."""
    torch.manual_seed(seed)
    model = _Embed(dtype=getattr(torch, dtype))
    return model, torch.randint(0, 50257, (B, L)), None, _sum, None


def wide_mlp(B=20000, seed=0):
    """docs/index.md's model: 160 MB activations at B = 20,000, large-pool segments whose reuse
    (and the cuBLAS workspaces' place among them) decides max_memory_reserved."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
    return (model, torch.randn(B, 512), torch.randint(0, 10, (B,)),
            nn.functional.cross_entropy, adam)


def adam(params):
    return torch.optim.Adam(params)


def measured_in_turn(batches=(64, 512)):
    """``fxmem.measure`` of the zoo's MLP shape (4096-16384-4096-10, Adam) at each B in turn,
    in this one process: ``[(max_allocated, max_reserved), ...]``."""
    import fxmem

    out = []
    for b in batches:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4096, 16384), nn.GELU(), nn.Linear(16384, 4096),
                              nn.GELU(), nn.Linear(4096, 10))
        m = fxmem.measure(model, torch.randn(4, 4096), torch.randint(0, 10, (4,)),
                          loss=nn.functional.cross_entropy, optimizer=adam, device="cuda",
                          B=b)
        out.append((m.peak_bytes, m.peak_reserved_bytes))
    return out


def adam(params):
    return torch.optim.Adam(params, lr=1e-4)


def reserved_when_measure_starts():
    """``fxmem.measure`` of :func:`mlp` twice in this one process: ``memory_reserved()`` when
    the second moves its model to the device (a fresh process: 0)."""
    import fxmem

    seen = []
    to = nn.Module.to

    def watched(self, *args, **kwargs):
        seen.append(torch.cuda.memory_reserved())
        return to(self, *args, **kwargs)

    for watch in (False, True):
        model, x, y, loss, opt = mlp(B=4)
        nn.Module.to = watched if watch else to
        try:
            fxmem.measure(model, x, y, loss=loss, optimizer=opt, device="cuda", B=64)
        finally:
            nn.Module.to = to
    return seen[0]
