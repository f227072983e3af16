"""CUDA streams in the allocator replay (issue 41 item 6): PyTorch's caching allocator keeps
each stream's blocks apart (a block is reused only by the stream it was allocated on, in
segments of that stream), so a step that allocates on a second stream reserves a segment of
its own there. The trace tags each storage with the stream ``torch.cpu.stream`` selected
(what FSDP2 selects its all-gather and reduce-scatter streams with on a CPU mesh) and the
replay allocates it from that stream's pools. The fake GPU checks FSDP2's figures
(``tests/test_fake_gpu_parallel.py``); these check the modelling on the CPU build."""

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.device.allocator import cuda_memory
from fxmem.trace.kernels.cuda import blas

MiB = 2**20
SMALL_SEGMENT = 2 * MiB


class SideStream(nn.Module):
    """Doubles its input on a stream of its own (device-agnostic code: ``torch.cpu.stream``
    is ``torch.cuda.stream`` on a GPU), then scales it by a weight on the default stream."""

    def __init__(self, d=256):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.side = torch.cpu.Stream()

    def forward(self, x):
        with torch.cpu.stream(self.side):
            y = x * 2
        return y * self.w


def _one_stream(liveness):
    """``liveness`` with every storage on the default stream: the replay without streams."""
    trace = liveness.graph.trace
    flat = dataclasses.replace(trace, storages=tuple(
        dataclasses.replace(s, stream=0) for s in trace.storages))
    return dataclasses.replace(liveness, graph=dataclasses.replace(liveness.graph, trace=flat))


def test_a_second_stream_gets_a_small_segment_of_its_own():
    before = torch.cpu.current_stream()
    r = fxmem.analyze(SideStream(), torch.randn(4, 256), train=False, device="cuda")
    assert torch.cpu.current_stream() is before
    trace = r.trace
    made = [(trace.ops[s.created_by].op, s.stream) for s in trace.storages if s.created_by >= 0]
    assert made == [("aten.mul.Tensor", 1), ("aten.mul.Tensor", 0)]
    assert all(s.stream == 0 for s in trace.storages if s.created_by < 0)
    # x, w and x * 2 * w in the default stream's 2 MiB segment; x * 2 in the side stream's
    # own: on one stream every block would fit in one segment
    assert r.cuda_memory(4).max_reserved == 2 * SMALL_SEGMENT
    assert cuda_memory(_one_stream(r.liveness), 4).max_reserved == SMALL_SEGMENT


def test_fsdp2_allocates_on_its_streams():
    """FSDP2 over 2 ranks, the fake GPU's case (``fakegpu_parallel_targets``: three blocks of
    Linear(64, 64) + ReLU and a head): each all-gather output on the all-gather copy-in
    stream, each reduce-scatter output (the sharded gradients are its views) on the
    reduce-scatter stream, as the real run's measured step allocates (8 and 4 blocks on
    2.14.1 and 2.15); each of the two streams reserves a 2 MiB small segment of its own."""
    from test_fsdp import Stack

    torch.manual_seed(0)
    model = Stack(d=64)
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))
    r = fxmem.analyze(model, (x,), (y,), parallel=fxmem.FSDP(2), device="cuda",
                      loss=F.cross_entropy, optimizer=torch.optim.Adam)
    for k in range(2):
        trace = r.rank(k).trace
        made = [(trace.ops[s.created_by].phase, s.stream, s.category, int(s.size.expr))
                for s in trace.storages if s.created_by >= 0 and s.stream]
        gathered = 4 * (64 * 64 + 64)  # a block's weight and bias, both ranks' shards
        head = 4 * (10 * 64 + 10)
        assert made == [("forward", 1, "temporary", n) for n in (head, *[gathered] * 3)] + [
            ("backward", *got) for got in [(1, "temporary", head), (1, "temporary", gathered),
                                           (1, "temporary", gathered), (2, "grad", gathered // 2),
                                           (1, "temporary", gathered), (2, "grad", gathered // 2),
                                           (2, "grad", head // 2), (2, "grad", gathered // 2)]]
        for B in (4, 16):
            got = r.rank(k).cuda_memory(B).max_reserved
            assert got == cuda_memory(_one_stream(r.rank(k).liveness), B).max_reserved \
                + 2 * SMALL_SEGMENT
            if not blas.PER_CALL:  # a 32 MiB cuBLAS workspace per thread (forward, backward)
                assert got == 2 * 32 * MiB + 3 * SMALL_SEGMENT == 73_400_320  # the fake GPU's


def test_gradients_kept_across_steps_stay_on_the_reduce_scatter_stream():
    """Under ``zero_grad(set_to_none=False)`` FSDP2's gradients were made by an earlier step,
    as views of its reduce-scatter output: made before the traced step, on the
    reduce-scatter stream (seen by the trace's warm-up step), and the replay keeps them in
    that stream's pools (on the fake GPU at width 1,024, 2.15: 123,731,968 B reserved seen
    and predicted; 136,314,880 predicted with them on the default stream)."""
    from test_fsdp import Stack

    torch.manual_seed(0)
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))
    r = fxmem.analyze(Stack(d=64), (x,), (y,), parallel=fxmem.FSDP(2), device="cuda",
                      loss=F.cross_entropy, optimizer=torch.optim.Adam, set_to_none=False)
    trace = r.rank(0).trace
    kept = [s.stream for s in trace.storages if s.created_by < 0 and s.category == "grad"]
    scattered = {s.stream for s in trace.storages
                 if s.created_by >= 0 and trace.ops[s.created_by].phase == "backward"
                 and s.stream and int(s.size.expr) in (4 * (64 * 64 + 64) // 2,
                                                       4 * (10 * 64 + 10) // 2)}
    assert len(kept) == 4 and len(scattered) == 1 and set(kept) == scattered
    assert all(s.stream == 0 for s in trace.storages
               if s.created_by < 0 and s.category != "grad")
