"""Normalization outputs laid out as the eager CPU kernels lay them out
(:data:`fxmem.trace.kernels.rules.EAGER_CPU_OUTPUT_LAYOUTS`).

The fake kernels of ``native_layer_norm_backward``, ``native_batch_norm(_backward)`` and
``native_group_norm(_backward)`` give output 0 another tensor's strides (dY's, the input's,
or contiguous for a channels_last X), where eager CPU allocates it dense in a format of its
own. The bytes are the same; what differs is a later op: a ``reshape`` of the gradient or
of the output copies on one side only. Hugging Face Swin and timm's PVT-v2 (a LayerNorm
whose output is pooled through a transpose, its gradient reaching each block's Linear)
were over-predicted by one activation per block. Each model here is traced at B = 4 and
compared to the byte with a real eager CPU step at B = 2 and 5; each op against its eager
kernel's strides.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import fxmem
from fxmem.trace.kernels import rules

aten = torch.ops.aten
KW = {"loss": lambda o: o.float().sum(), "optimizer": torch.optim.Adam}


class Tokens(nn.Module):
    """Tokens (B, L, C) through a residual MLP (whose gradient the residual keeps alive), a
    norm seen through ``to_norm``/``from_norm``, then pooled over L through a transpose
    (``tail="pool"``: Swin's and PVT's head) or a Linear first (``tail="linear"``), or a
    residual Linear (``tail="residual"``)."""

    def __init__(self, norm, to_norm=None, from_norm=None, tail="pool"):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.fc1, self.act, self.fc2 = nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)
        self.norm, self.tail = norm, tail
        self.to_norm, self.from_norm = to_norm or (lambda y: y), from_norm or (lambda y: y)
        self.out = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.proj(x)
        y = x + self.fc2(self.act(self.fc1(x)))
        y = self.from_norm(self.norm(self.to_norm(y)))
        if self.tail == "linear":
            y = self.out(y)
        elif self.tail == "residual":  # the norm's output kept alive beside the Linear's input
            y = y + self.out(y)
        return self.head(y.transpose(1, 2).mean(-1))


def _t(y):
    return y.transpose(1, 2)


def _tc(y):
    return y.transpose(1, 2).contiguous()


def _nhwc(y):  # (B, 10, 16) tokens as a channels_last (B, 16, 2, 5) image
    return y.reshape(y.shape[0], 2, 5, 16).permute(0, 3, 1, 2)


def _tokens(y):
    return y.permute(0, 2, 3, 1).reshape(y.shape[0], 10, 16)


MODELS = {
    # dX of the LayerNorm gets the pooled gradient's transposed strides on fake tensors
    "layer_norm_then_pool": lambda: Tokens(nn.LayerNorm(16)),
    # batch norm's output (forward) and dX (backward) over transposed tokens
    "batch_norm_of_transposed_tokens": lambda: Tokens(nn.BatchNorm1d(16), _t, _t, "linear"),
    "batch_norm_gradient_transposed": lambda: Tokens(nn.BatchNorm1d(16), _tc, _t, "linear"),
    "group_norm_gradient_transposed": lambda: Tokens(nn.GroupNorm(4, 16), _tc, _t, "linear"),
    # a channels_last input: group norm's fake output is contiguous, eager's channels_last
    "group_norm_channels_last": lambda: Tokens(nn.GroupNorm(4, 16), _nhwc, _tokens),
    "batch_norm_channels_last": lambda: Tokens(nn.BatchNorm2d(16), _nhwc, _tokens),
}


@pytest.mark.parametrize("name", MODELS)
def test_norm_layouts_exact_on_cpu(name):
    torch.manual_seed(0)
    model, x = MODELS[name](), torch.randn(4, 10, 16)
    r = fxmem.analyze(model, x, device="cpu", **KW)
    for b in (2, 5):
        assert r.peak_bytes(b) == fxmem.measure(model, x, B=b, **KW).peak_bytes, (b, r.peak)


# --- each op against its eager CPU kernel -----------------------------------------------------

def _ln(x, dy_t):
    y = F.layer_norm(x, (x.shape[-1],), torch.ones(x.shape[-1], requires_grad=True),
                     torch.zeros(x.shape[-1], requires_grad=True))
    return y.transpose(1, 2).mean(-1).pow(2).sum() if dy_t else y.pow(2).sum()


def _bn(x, dy_t):
    y = F.batch_norm(x, torch.zeros(x.shape[1]), torch.ones(x.shape[1]),
                     torch.ones(x.shape[1], requires_grad=True),
                     torch.zeros(x.shape[1], requires_grad=True), training=True)
    return y.transpose(1, 2).mean(-1).pow(2).sum() if dy_t else y.pow(2).sum()


def _gn(x, dy_t):
    y = F.group_norm(x, 2, torch.ones(x.shape[1], requires_grad=True),
                     torch.zeros(x.shape[1], requires_grad=True))
    return y.transpose(1, 2).mean(1).pow(2).sum() if dy_t else y.pow(2).sum()


LAYOUTS = {  # an input x of (2, 6, 8) or (2, 6, 2, 4), laid out
    "contiguous": lambda: torch.randn(2, 6, 8),
    "transposed": lambda: torch.randn(2, 8, 6).transpose(1, 2),
    "channels_last": lambda: torch.randn(2, 6, 2, 4).contiguous(
        memory_format=torch.channels_last),
    "image": lambda: torch.randn(2, 6, 2, 4),
}


class _Calls(TorchDispatchMode):
    """Every aten op call, its arguments, and its eager outputs' strides."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "aten":
            self.calls.append((func, args, kwargs or {}, _strides(out)))
        return out


def _strides(out) -> list:
    """Each tensor output's strides, those of dims of size 1 left out (they never matter)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [tuple(st for n, st in zip(t.shape, t.stride()) if n != 1)
            if isinstance(t, torch.Tensor) else None for t in outs]


def _fake(fake, x):
    return fake.from_tensor(x) if isinstance(x, torch.Tensor) else x


def _replay(program, layout, dy_transposed, with_rules=True):
    """``(op, eager strides, fake strides)`` of each op call in ``program``'s step, the fake
    kernel run on fake copies of the call's arguments (and fxmem's layout rule applied)."""
    x = LAYOUTS[layout]().requires_grad_()
    with _Calls() as seen:
        program(x, dy_transposed).backward()
    fake, rows = FakeTensorMode(), []
    for func, args, kwargs, eager in seen.calls:
        args = tree_map(lambda a: _fake(fake, a), args)
        kwargs = tree_map(lambda a: _fake(fake, a), kwargs)
        # as fxmem.trace.engine.recorder.Recorder.fake_kernel
        with fake, enable_python_dispatcher():
            out = func(*args, **kwargs)
            if with_rules and func in rules.EAGER_CPU_OUTPUT_LAYOUTS:
                out = rules.eager_cpu_layout(func, args, out)
        rows.append((func, eager, _strides(out)))
    return rows


PROGRAMS = {"layer": _ln, "batch": _bn, "group": _gn}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dy_transposed", [False, True], ids=["dy", "dy_transposed"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_fake_kernels_give_the_eager_kernels_strides(program, dy_transposed, layout):
    rows = _replay(PROGRAMS[program], layout, dy_transposed)
    assert any(func in rules.EAGER_CPU_OUTPUT_LAYOUTS for func, _, _ in rows)
    for func, eager, got in rows:
        assert got == eager, func


def test_the_rules_are_what_differs():
    """Without the rules, the calls laid out otherwise than eager are calls of the rules'
    ops (which of them depends on the release: group norm's since torch 2.14)."""
    differs = set()
    for program in PROGRAMS.values():
        for layout in LAYOUTS:
            for dy_transposed in (False, True):
                rows = _replay(program, layout, dy_transposed, with_rules=False)
                differs |= {func for func, eager, got in rows if got != eager}
    assert aten.native_layer_norm_backward.default in differs  # Swin's and PVT's
    assert differs <= set(rules.EAGER_CPU_OUTPUT_LAYOUTS)
