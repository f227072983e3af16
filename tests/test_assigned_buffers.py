"""Buffers a forward assigns (fxmem.trace.engine.modstate.BufferAssigned): a table cached on the
first call (timm ConViT's ``rel_indices``) or a buffer replaced on every call. A training loop's
step after the first starts from the buffers the step before left, as ``fxmem.measure``'s
does after its warm-up; the tracer traces such a step after an unrecorded one. Each model is
traced at B = 4 and checked to the byte against a real eager CPU step at other batch sizes,
for each kind of step."""

import pytest
import torch
from torch import nn

import fxmem

KW = {"loss": lambda o: o.float().sum(), "optimizer": torch.optim.Adam}
BATCHES = (2, 3, 5)  # the trace is at B = 4


class CachedTable(nn.Module):
    """A relative-position table made on the first call at a sequence length (a (1, 1, 3)
    placeholder until then), as ConViT's gated positional attention does."""

    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("table", torch.zeros(1, 1, 3), persistent=False)

    def forward(self, x):
        n = x.shape[1]
        if self.table.shape[0] != n:
            t = torch.zeros(n, n, 3)
            t[:, :, 0] = torch.arange(n).view(1, -1) - torch.arange(n).view(-1, 1)
            self.table = t
        return self.lin(x) + self.table[:, :, 0].sum(1)[:, None]


class ReplacedEachCall(nn.Module):
    """A buffer replaced by a new tensor on every call: the previous step's is live at the
    start of the step and freed when this one replaces it."""

    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("stat", torch.zeros(1))

    def forward(self, x):
        y = self.lin(x)
        self.stat = y.detach().mean(0)
        return y


class RegisteredLate(nn.Module):
    """A buffer registered by the first forward (``register_buffer`` in ``forward``)."""

    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        if not hasattr(self, "scale"):
            self.register_buffer("scale", torch.ones(x.shape[1], 1))
        return self.lin(x) * self.scale


STEPS = {
    "adam": KW,
    "set_to_none=False": {**KW, "set_to_none": False},
    "grad_accum=2": {**KW, "grad_accum": 2},
    "inference": {"train": False},
}


@pytest.mark.parametrize("block", [CachedTable, ReplacedEachCall, RegisteredLate])
@pytest.mark.parametrize("step", STEPS)
def test_a_step_starts_from_the_buffers_the_last_one_left(block, step):
    model = nn.Sequential(block(), nn.GELU(), block())
    x = torch.randn(4, 8, 16)
    r = fxmem.analyze(model, x, device="cpu", **STEPS[step])
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(model, x, B=b, **STEPS[step]).peak_bytes, b


def test_the_users_buffer_is_left_as_it_was():
    model = nn.Sequential(CachedTable(), CachedTable())
    before = [(m.table, m.table.clone()) for m in model]
    fxmem.analyze(model, torch.randn(4, 8, 16), device="cpu", **KW)
    for m, (t, v) in zip(model, before):
        assert m.table is t and torch.equal(m.table, v)


def test_the_cached_table_is_a_buffer_the_step_starts_with():
    """Traced after a warm-up step, the table is not made by the recorded step: it is one of
    the buffers, live from the start, and no op of the step makes it."""
    model = nn.Sequential(CachedTable(), CachedTable())
    r = fxmem.analyze(model, torch.randn(4, 8, 16), device="cpu", **KW)
    tables = [s for s in r.trace.storages if s.name.endswith(".table")]
    assert len(tables) == 2
    assert all(s.category == "buffer" and s.created_by < 0 for s in tables)
    assert all(s.size(1) == 8 * 8 * 3 * 4 for s in tables)


def test_a_forward_that_catches_the_signal_is_traced_after_a_warm_up_too():
    """A model whose forward swallows exceptions still gets the warm-up step (the signal is
    recorded before it is raised)."""

    class Careful(CachedTable):
        def forward(self, x):
            try:
                return super().forward(x)
            except Exception:  # noqa: BLE001 - what some models do
                return self.lin(x)

    model = nn.Sequential(Careful(), Careful())
    x = torch.randn(4, 8, 16)
    r = fxmem.analyze(model, x, device="cpu", **KW)
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(model, x, B=b, **KW).peak_bytes, b
