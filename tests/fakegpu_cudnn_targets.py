"""Steps that run through cuDNN on the fake GPU (tests/test_fake_gpu_cudnn.py): each function
returns ``(model, inputs, targets, loss_fn, optimizer_factory)`` for
``fxmem.validate.fakegpu.measure_step`` and, built the same way, for ``fxmem.analyze``.

Models without ``nn.Linear`` keep cuBLAS out of the step (from torch 2.15 every cuBLAS call
takes a transient workspace of its own); ``head="linear"`` puts it back."""

import torch
from torch import nn


def adamw(params):
    return torch.optim.AdamW(params)


class _ChannelsLast(nn.Module):
    def forward(self, x):
        return x.contiguous(memory_format=torch.channels_last)


class _Autocast(nn.Module):
    """``inner(x)`` under ``torch.autocast(x.device.type, bfloat16)``."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.inner(x).float()


def cnn(B=8, head="conv", channels_last=False, bf16_autocast=False, conv_bias=True, seed=0):
    """Conv2d + BatchNorm2d + ReLU + MaxPool2d, twice, global average pooling and a
    classifier: a 1x1 convolution (``head="conv"``) or ``nn.Linear`` (``head="linear"``).
    Input 3x32x32, 10 classes, cross-entropy, AdamW. ``conv_bias=False``: the convolutions
    have no bias (as usual before a batch norm)."""
    torch.manual_seed(seed)
    layers = [nn.Conv2d(3, 16, 3, padding=1, bias=conv_bias), nn.BatchNorm2d(16), nn.ReLU(),
              nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1, bias=conv_bias),
              nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)]
    if head == "conv":
        layers += [nn.Conv2d(32, 10, 1, bias=conv_bias), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    else:
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)]
    model = nn.Sequential(*layers)
    if channels_last:
        model = nn.Sequential(_ChannelsLast(), *layers).to(memory_format=torch.channels_last)
    if bf16_autocast:
        model = _Autocast(model)
    return (model, torch.randn(B, 3, 32, 32), torch.randint(0, 10, (B,)),
            nn.functional.cross_entropy, adamw)


class _RNNModel(nn.Module):
    """A two-layer cuDNN LSTM or GRU (batch_first), the output's last hidden size summed
    into a squared-error loss: no matmul outside cuDNN."""

    def __init__(self, cell, input_size=32, hidden=64, bidirectional=False):
        super().__init__()
        cls = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = cls(input_size, hidden, num_layers=2, batch_first=True,
                       bidirectional=bidirectional)

    def forward(self, x):
        return self.rnn(x)[0]


def _mse(out, y):
    return (out - y).pow(2).mean()


def rnn(B=8, cell="lstm", T=16, bidirectional=False, seed=0):
    """``_RNNModel`` on a (B, T, 32) batch against a (B, T, hidden x directions) target,
    AdamW."""
    torch.manual_seed(seed)
    model = _RNNModel(cell, bidirectional=bidirectional)
    out = 64 * (2 if bidirectional else 1)
    return model, torch.randn(B, T, 32), torch.randn(B, T, out), _mse, adamw


def conv_transpose(B=8, loss="mse", seed=0):
    """Conv2d, ConvTranspose2d (stride 2) and a BatchNorm2d: an upsampling block, on a
    (B, 3, 16, 16) batch. ``loss="mse"``: against a (B, 4, 32, 32) target; ``"sum"``: the
    output's sum, whose gradient reaches the batch norm as an expanded (stride 0) tensor."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.ConvTranspose2d(8, 4, 2, stride=2), nn.BatchNorm2d(4))
    if loss == "sum":
        return model, torch.randn(B, 3, 16, 16), None, _sum, adamw
    return model, torch.randn(B, 3, 16, 16), torch.randn(B, 4, 32, 32), _mse, adamw


def _sum(out):
    return out.float().sum()


def probe_cudnn():
    """What the child's PyTorch says of cuDNN on the fake GPU, what one convolution
    allocates beyond its output (the workspace the stub reports), and cuDNN attention's
    route (forward and backward run)."""
    x = torch.randn(4, 8, 12, 12, device="cuda", requires_grad=True)
    conv = nn.Conv2d(8, 8, 3).cuda()
    bn = nn.BatchNorm2d(8).cuda()
    lstm = nn.LSTM(16, 32, 2).cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    a0 = torch.cuda.memory_allocated()
    y = conv(x)
    extra = torch.cuda.max_memory_allocated() - a0 - y.untyped_storage().nbytes()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        attn = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    attn.sum().backward()
    return {
        "sdpa_grad_fn": type(attn.grad_fn).__name__,
        "available": torch.backends.cudnn.is_available(),
        "version": torch.backends.cudnn.version(),
        "conv_grad_fn": type(y.grad_fn).__name__,
        "bn_grad_fn": type(bn(x).grad_fn).__name__,
        "lstm_grad_fn": type(lstm(torch.randn(5, 3, 16, device="cuda"))[0].grad_fn).__name__,
        "lstm_flat_storages": len({w.untyped_storage().data_ptr() for w in lstm._flat_weights}),
        "conv_forward_extra_bytes": extra,
    }


def probe_events(target="rnn", kwargs=None):
    """Debug probe: the measured step of ``target`` as ``_child`` runs it, with the caching
    allocator's history: ``[(action, bytes, top frame)]`` after the peaks were reset."""
    import gc

    model, x, y, loss_fn, opt_factory = globals()[target](**(kwargs or {}))
    model = model.cuda()
    x, y = x.cuda(), (y.cuda() if y is not None else None)
    opt = opt_factory(list(model.parameters()))

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y) if y is not None else loss_fn(out)
        del out
        loss.backward()
        opt.step()

    step()
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    step()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = []
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_completed"):
            fr = [f"{f['name']}@{f['filename'].rsplit('/', 1)[-1]}:{f['line']}"
                  for f in e.get("frames", [])][:3]
            ev.append((e["action"], e["size"], fr))
    return {"max_allocated": torch.cuda.max_memory_allocated(), "events": ev}
