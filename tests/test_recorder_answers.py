"""Ops the recorder answers itself (fxmem.trace.kernels.rules.DEVICE_QUERY and
PROFILER_MARKERS): the fake tensor mode below it sees none of them, and the step traced is
the one traced when they were passed on to it."""

import collections

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import fxmem
from fxmem.trace.engine import recorder
from fxmem.trace.kernels.rules import DEVICE_QUERY, PROFILER_MARKERS


class Marked(nn.Module):
    """Two blocks, each forward inside a profiler marker (as FSDP2's hooks open them)."""

    def __init__(self, d=32):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.GELU())
                                     for _ in range(2)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            with torch.profiler.record_function(f"block {k}"):
                x = layer(x)
        return self.head(x)


# AdamW's foreach grouping asks each tensor's device on CUDA; FSDP2's hooks open markers of
# their own
CASES = {"cuda-adamw": dict(device="cuda"), "fsdp": dict(device="cpu", parallel=fxmem.FSDP(2))}


def _analyze(case):
    torch.manual_seed(0)
    return fxmem.analyze(Marked(), torch.randn(4, 32), torch.randint(0, 10, (4,)),
                         loss=F.cross_entropy, optimizer=torch.optim.AdamW, **CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_mode_sees_no_device_query_nor_marker(case, monkeypatch):
    # asked of the recorder; passed to the fake tensor mode while the recorder answers one
    asked, passed = collections.Counter(), collections.Counter()
    within: list = []  # the op the recorder is answering
    answer, dispatch = recorder.Recorder.__torch_dispatch__, FakeTensorMode.__torch_dispatch__

    def recorder_spy(self, func, types, args=(), kwargs=None):
        if func is not DEVICE_QUERY and func not in PROFILER_MARKERS:
            return answer(self, func, types, args, kwargs)
        asked[func] += 1
        within.append(func)
        try:
            return answer(self, func, types, args, kwargs)
        finally:
            within.pop()

    def mode_spy(self, func, types, args=(), kwargs=None):
        if within and func is within[-1]:
            passed[func] += 1
        return dispatch(self, func, types, args, kwargs)
    monkeypatch.setattr(recorder.Recorder, "__torch_dispatch__", recorder_spy)
    monkeypatch.setattr(FakeTensorMode, "__torch_dispatch__", mode_spy)
    _analyze(case)
    assert asked[DEVICE_QUERY] > 0 and any(asked[m] for m in PROFILER_MARKERS), asked
    assert not passed, passed


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_is_the_one_traced_when_they_are_passed_on(case, monkeypatch):
    fast = _analyze(case)
    monkeypatch.setattr(recorder, "DEVICE_QUERY", None)
    monkeypatch.setattr(recorder, "PROFILER_MARKERS", frozenset())
    slow = _analyze(case)
    reports = [(r, r.groups[0].report) if hasattr(r, "groups") else (r, r)
               for r in (fast, slow)]
    (a, ta), (b, tb) = reports
    assert [(o.op, o.new_sids, o.in_sids) for o in ta.trace.ops] == \
        [(o.op, o.new_sids, o.in_sids) for o in tb.trace.ops]
    assert [a.peak_bytes(n) for n in (4, 64)] == [b.peak_bytes(n) for n in (4, 64)]
