"""Where a prediction and a real CUDA step part ways (fxmem.validate.divergence): the comparison logic,
on snapshots shaped like ``torch.cuda.memory._snapshot()``'s (no GPU here)."""

import pytest
import torch

import fxmem
from fxmem.validate import harness as V
from fxmem.validate.divergence import (Allocation, first_divergence, predicted_allocations,
                              snapshot_allocations)


def _report():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))
    return fxmem.analyze(m, torch.randn(2, 16), loss=lambda o: o.sum(),
                         optimizer=torch.optim.SGD)


def _snapshot(sizes, frame="train.py"):
    events = [{"action": "segment_alloc", "size": 2**21}]
    for i, n in enumerate(sizes):
        events.append({"action": "alloc", "addr": 4096 * i, "size": n, "stream": 0,
                       "frames": [{"filename": "/x/torch/nn/modules/linear.py", "line": 1,
                                   "name": "forward"},
                                  {"filename": frame, "line": 10 + i, "name": "step"}]})
        events.append({"action": "free_requested", "addr": 4096 * i, "size": n})
    return {"segments": [], "device_traces": [events]}


def test_predicted_allocations_follow_the_trace_at_b():
    r = _report()
    want = predicted_allocations(r, 5)
    t = r.liveness.graph.trace
    # each op's in the order its CUDA kernel makes them: the trace lists them so
    # (fxmem.trace.kernels.cuda.call_order; a dropout's mask before its output)
    pos = {sid: k for op in t.ops for k, sid in enumerate(op.new_sids)}
    made = [(s.created_by, s.size(5))
            for s in sorted(t.storages, key=lambda s: (s.created_by, pos.get(s.sid, -1)))
            if s.created_by >= 0 and s.size(5) > 0]
    assert [(a.op_index, a.nbytes) for a in want if not a.what] == made
    # and from 2.15 each matmul's workspace, right after its output (fxmem.trace.kernels.cuda.blas)
    from fxmem.trace.kernels.cuda import blas

    matmuls = [a.op_index for a in want if a.op in ("aten.addmm.default", "aten.mm.default")
               and not a.what]
    assert [a.op_index for a in want if a.what.endswith("workspace")] == \
        (matmuls if blas.PER_CALL else [])
    # the dropout mask is bool on CUDA: 5 x 32 bytes, made by native_dropout
    assert [a.nbytes for a in want if a.op == "aten.native_dropout.default"] == \
        [5 * 32, 5 * 32 * 4]  # Dropout.cu dropout_cuda: the mask first


class ShiftedLabels(torch.nn.Module):
    """transformers' ``labels[..., 1:].contiguous()``: a copy, except at B = 1 (one row is
    contiguous), so the trace in B holds for B >= 2."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        y = torch.nn.functional.pad(y, (0, 1), value=-100)[..., 1:].contiguous()
        return self.lin(x).sum() + y.sum()


def test_below_the_formulas_b_the_allocations_are_the_step_traced_at_b():
    x, y = torch.randn(2, 8), torch.zeros(2, 16, dtype=torch.long)
    r = fxmem.analyze(ShiftedLabels(), (x, y), optimizer=None, device="cuda")
    assert r.min_batch_size == 2
    ops = lambda b: [a.op for a in predicted_allocations(r, b)]  # noqa: E731
    assert "aten.clone.default" in ops(2)
    assert "aten.clone.default" not in ops(1)


def test_a_step_that_allocates_as_predicted_does_not_diverge():
    want = predicted_allocations(_report(), 3)
    got = snapshot_allocations(_snapshot([a.nbytes for a in want]))
    assert [n for n, _ in got] == [a.nbytes for a in want]
    assert got[0][1] == "train.py:10 in step"  # the innermost frame outside torch
    assert first_divergence(want, got) is None


def test_the_first_differing_allocation_is_named():
    want = predicted_allocations(_report(), 3)
    sizes = [a.nbytes for a in want]
    k = next(i for i, a in enumerate(want) if a.op == "aten.native_dropout.default")
    sizes[k + 1] = 4 * sizes[k + 1]  # e.g. a float mask where a bool one was predicted
    d = first_divergence(want, snapshot_allocations(_snapshot(sizes)))
    assert d.index == k + 1 and d.predicted == want[k + 1]
    assert d.measured_bytes == 4 * want[k + 1].nbytes
    assert d.describe().startswith(f"allocation {k + 1}: predicted {want[k + 1].nbytes:,} B in "
                                   "aten.native_dropout.default")


def test_an_ops_allocations_may_come_in_another_order():
    want = [Allocation(100, 0, "a", "", "forward"), Allocation(8, 0, "a", "", "forward"),
            Allocation(50, 1, "b", "", "forward")]
    assert first_divergence(want, [(8, None), (100, None), (50, None)]) is None
    assert first_divergence(want, [(8, None), (50, None), (100, None)]).index == 0


@pytest.mark.parametrize("got,index,more", [([(100, "f"), (8, "f")], 2, "predicted"),
                                            ([(100, "f"), (8, "f"), (50, "f"), (1, "g")], 3,
                                             "measured")])
def test_one_list_ending_first_is_a_divergence(got, index, more):
    want = [Allocation(100, 0, "a", "", "forward"), Allocation(8, 0, "a", "", "forward"),
            Allocation(50, 1, "b", "m", "backward")]
    d = first_divergence(want, got)
    assert d.index == index
    if more == "predicted":
        assert d.measured_bytes is None and "measured nothing more" in d.describe()
    else:
        assert d.predicted is None and "predicted nothing more" in d.describe()


def test_a_missed_row_reports_where_it_parts_ways_in_the_table():
    row = V.Row("m", 4, 120, 100, 0.2, None, None, None, diverges="allocation 3: ...")
    v = V.Validation("cuda", "GPU", None, "2.13", "13.0", "full", (row,), ())
    assert "- m, B=4: allocation 3: ..." in V.to_markdown(v)


def test_record_history_needs_cuda():
    with pytest.raises(fxmem.InputError, match="device='cuda'"):
        fxmem.measure(torch.nn.Linear(2, 2), torch.randn(2, 2), loss=lambda o: o.sum(), B=2,
                      record_history=True)
