"""Report.cuda_memory: the step replayed through the caching allocator model, with the cuBLAS
workspaces (kept per thread up to torch 2.14; taken and freed by each call from 2.15: both
checked on PyTorch's own build in tests/test_fake_gpu_blas.py). Checked here against the formula where the allocator adds nothing
but its 512-byte rounding (every block in the small pool), and for what it adds otherwise;
against a GPU by fxmem.validate."""

import torch
from torch import nn

import fxmem
from fxmem.device.allocator import cublas_workspace_bytes
from fxmem.device.caching_allocator import AllocatorConfig
from fxmem.trace.kernels.cuda import blas
from zoo import ZOO

MiB = 2**20


def _report(name="mlp", **kw):
    model, x, y, loss = ZOO[name]()
    return fxmem.analyze(model, x, y, loss=loss, optimizer=torch.optim.Adam, **kw)


def test_small_blocks_only_add_the_workspaces():
    r = _report()  # every storage under 1 MiB at these B: small pool, 512-byte blocks
    ws, lt = cublas_workspace_bytes((9, 0)), blas.lt_workspace_bytes()
    for b in (2, 13, 100):
        d = r.cuda_memory(b)
        if blas.PER_CALL:  # Linear's addmm runs cuBLASLt, backward's mm cuBLAS
            assert d.workspaces == (("cuBLAS workspace per call (freed after it)", ws),
                                    ("cuBLASLt workspace per call (freed after it)", lt))
            # each matmul holds its workspace on top of what is live after its output is
            # made: computed from the timeline, independently of the replay
            size = {"cublas": ws, "cublaslt": lt}
            at_matmuls = [t.live_bytes + size[r.trace.ops[t.index].blas]
                          for t in r.timeline(b) if r.trace.ops[t.index].blas]
            # 3 Linear: addmm each, and in backward an mm for each weight and for the
            # inputs of the last two (the batch needs no gradient)
            assert len(at_matmuls) == 3 + 3 + 2
            assert d.max_allocated == max(r.peak_bytes(b), *at_matmuls)
        else:
            assert [n for _, n in d.workspaces] == [ws, ws]  # forward thread, autograd's
            assert d.max_allocated == r.peak_bytes(b) + 2 * ws
        assert d.max_reserved >= d.max_allocated
        assert max(d.phase_max_allocated.values()) == d.max_allocated


def test_workspace_sizes_follow_the_gpu_and_the_environment(monkeypatch):
    r = _report()
    a100 = r.cuda_memory(8, compute_capability=(8, 0))
    assert a100.workspaces[0][1] == 8 * MiB + 128 * 1024
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")
    assert r.cuda_memory(8).workspaces[0][1] == 8 * MiB
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "0")
    none = r.cuda_memory(8, cublas_workspace=0)
    assert none.workspaces == () and none.max_allocated == r.peak_bytes(8)


def test_a_replay_runs_once_per_question(monkeypatch):
    """A report asked the same replay again (its headline, its ways out and its batch-size
    answers ask it several times) gets the first one's answer; another B, capacity,
    GPU or workspace size is another replay."""
    from fxmem.device import allocator

    r, made = _report(), []
    real = allocator._Replay.__init__
    monkeypatch.setattr(allocator._Replay, "__init__",
                        lambda self, *a, **k: made.append(a[1]) or real(self, *a, **k))
    first, run = r.cuda_memory(8), r.runs_on_device(8, 2**30)
    assert r.cuda_memory(8) is first and r.runs_on_device(8, 2**30) is run
    assert made == [8, 8]
    r.cuda_memory(9), r.runs_on_device(8, 2**29), r.cuda_memory(8, compute_capability=(8, 0))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")
    assert r.cuda_memory(8) != first and len(made) == 6


def test_a_step_s_call_orders_are_read_once_for_all_its_replays(monkeypatch):
    """Each op's call order (its allocations, temporaries and workspaces in the order its
    kernel makes them) is the same at every B and budget: read once per step, not once per
    op of each replay's two steps (a search replays one step dozens of times), and only
    for an op that makes two storages or more or calls cuDNN (one storage's order is
    itself)."""
    from fxmem.device import allocator

    r, calls = _report(), []
    real = allocator.call_order.steps
    monkeypatch.setattr(allocator.call_order, "steps",
                        lambda *a: calls.append(1) or real(*a))
    first = r.cuda_memory(8)
    n = len(calls)
    ops, made = r.trace.ops, {}
    for s in r.trace.storages:
        made[s.created_by] = made.get(s.created_by, 0) + 1
    assert n == sum(1 for o in ops if made.get(o.index, 0) >= 2
                    or o.op in allocator.CUDNN_CONV_OPS) < len(ops)
    r.cuda_memory(9), r.runs_on_device(8, 2**29), r.runs_on_device(13, 2**30)
    assert len(calls) == n and r.cuda_memory(8) is first


def test_inference_and_matmul_free_models():
    model, x, _, _ = ZOO["mlp"]()
    inf = fxmem.analyze(model, x, train=False).cuda_memory(8)
    assert [w for w, _ in inf.workspaces] == (
        ["cuBLASLt workspace per call (freed after it)"] if blas.PER_CALL
        else ["cuBLAS workspace (main thread)"])
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    r = fxmem.analyze(conv, torch.randn(2, 3, 16, 16), loss=lambda o: o.sum(),
                      optimizer=torch.optim.SGD)
    assert r.cuda_memory(8).workspaces == ()  # convolutions use cuDNN, not cuBLAS


def test_large_blocks_and_segments():
    # 1.5 MiB activations get 20 MiB segments: reserved well above allocated, and
    # allocated never below the formula's block sum
    model = nn.Sequential(nn.Linear(1024, 3 * 1024), nn.ReLU(), nn.Linear(3 * 1024, 10))
    r = fxmem.analyze(model, torch.randn(4, 1024), torch.randint(0, 10, (4,)),
                      loss=nn.functional.cross_entropy, optimizer=torch.optim.Adam)
    d = r.cuda_memory(128, cublas_workspace=0)
    assert d.max_allocated >= r.peak_bytes(128)
    assert d.max_reserved % (2 * MiB) == 0 and d.max_reserved > d.max_allocated
    exp = r.cuda_memory(128, AllocatorConfig(expandable_segments=True), cublas_workspace=0)
    assert exp.max_allocated >= r.peak_bytes(128)
    assert exp.baseline_allocated == d.baseline_allocated


def test_baseline_is_the_persistent_state():
    r = _report()
    d = r.cuda_memory(8, cublas_workspace=0)
    persistent = sum(-(-int(s.size(8)) // 512) * 512 for s in r.trace.storages
                     if s.created_by < 0 and not s.name.endswith(".step"))
    assert d.baseline_allocated == persistent


def test_largest_batch_by_max_memory_allocated():
    r = _report("seed_cnn")
    budget = 300 * MiB
    b = r.cuda_max_batch_size(budget)
    assert r.cuda_memory(b).max_allocated <= budget < r.cuda_memory(b + 1).max_allocated
    assert b < r.max_batch_size(budget, by="live")  # the workspaces take room the formula leaves out
    import pytest

    with pytest.raises(fxmem.InfeasibleBudgetError, match="smallest max_memory_allocated"):
        r.cuda_max_batch_size(MiB)


def _bias_grad_blocks(r, t, b):
    """The 512-byte blocks of the bias gradients (1-d outputs) ``convolution_backward`` makes
    after both its cuDNN calls (none for other ops)."""
    if t.op != "aten.convolution_backward.default":
        return 0
    op = r.trace.ops[t.index]
    sizes = [r.trace.storages[sid].size(b) for sid in op.new_sids
             if sid in op.out_sids and len(r.trace.storages[sid].shape) == 1]
    return sum(-(-n // 512) * 512 for n in sizes)


def test_cudnn_workspace_is_held_during_each_convolution(monkeypatch):
    # each convolution (forward, and each half of its backward) holds the workspace on top of
    # what is live after the op, but for a backward's bias gradient, made after both calls;
    # computed here from the timeline, independently of the replay
    from fxmem.device.allocator import CUDNN_CONV_OPS

    r = _report("seed_cnn")
    for b in (2, 13):
        monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "0")  # its Linear's (2.15)
        assert r.cuda_memory(b, cublas_workspace=0).max_allocated == r.peak_bytes(b)
        for w in (512, 3 * MiB, 2**30):
            d = r.cuda_memory(b, cublas_workspace=0, cudnn_workspace=w)
            at_convs = [t.live_bytes + w - _bias_grad_blocks(r, t, b)
                        for t in r.timeline(b) if t.op in CUDNN_CONV_OPS]
            assert len(at_convs) == 4  # conv1, conv2, and their backward
            assert d.max_allocated == max(r.peak_bytes(b), *at_convs)
            assert d.workspaces == (("cuDNN workspace per convolution call (freed after it)", w),)
    # a model without convolutions is unchanged, and lists no cuDNN workspace
    mlp = _report()
    assert mlp.cuda_memory(8, cudnn_workspace=2**30) == mlp.cuda_memory(8)
