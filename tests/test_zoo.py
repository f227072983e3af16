"""Predicted peak vs a real eager CPU step (fxmem.measure), for every zoo model, at batch
sizes other than the traced one (the examples have B=4). The measured gap is 0 bytes for
all of them; the assertion is exact equality."""

import pytest
import torch

import fxmem
from zoo import OPTIMIZERS, ZOO

BATCHES = (2, 3, 13)  # the trace uses B=4


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_training_step_matches_measure(name, opt):
    model, x, y, loss = ZOO[name]()
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=OPTIMIZERS[opt], device="cpu")
    for b in BATCHES:
        measured = fxmem.measure(model, x, y, loss=loss, optimizer=OPTIMIZERS[opt], B=b)
        assert report.peak_bytes(b) == measured.peak_bytes, (name, opt, b)
        assert int(report.peak.subs(fxmem.B, b)) == measured.peak_bytes


@pytest.mark.parametrize("name", sorted(ZOO))
def test_inference_step_matches_measure(name):
    model, x, _, _ = ZOO[name]()
    report = fxmem.analyze(model, x, train=False, device="cpu")
    # only oneDNN's LSTM scratchpad, which no PyTorch storage holds (fxmem.trace.kernels.cpu_rnn)
    assert [what.split(",")[0] for _, _, what in report.unmodelled] == (
        ["oneDNN RNN scratchpad"] if name == "lstm" else [])
    for b in BATCHES:
        assert report.peak_bytes(b) == fxmem.measure(model, x, train=False, B=b).peak_bytes


def test_lstm_onednn_workspace_is_modelled_and_its_scratchpad_reported():
    """The LSTM runs oneDNN (its training workspace is a formula: 4096*ceiling(...) terms, and
    the training step above is exact); oneDNN's scratchpad, outside PyTorch's storages, is
    named in the report."""
    model, x, y, loss = ZOO["lstm"]()
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    assert "aten.mkldnn_rnn_layer.default" in {o.op for o in report.trace.ops}
    assert "ceiling" in str(report.peak)
    assert [(op, mod) for op, mod, _ in report.unmodelled] == [("aten.mkldnn_rnn_layer.default",
                                                                "lstm")]
    assert "not modelled: oneDNN RNN scratchpad" in str(report)


@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_implementation_is_traced_as_run(foreach):
    model, x, y, loss = ZOO["mlp"]()
    opt = lambda p: torch.optim.Adam(p, foreach=foreach)  # noqa: E731
    report = fxmem.analyze(model, x, y, loss=loss, optimizer=opt, device="cpu")
    ops = {o.op for o in report.trace.ops if o.phase == "optimizer"}
    assert any(op.startswith("aten._foreach_") for op in ops) == foreach
    for b in BATCHES:
        assert report.peak_bytes(b) == fxmem.measure(model, x, y, loss=loss, optimizer=opt,
                                                     B=b).peak_bytes


def test_cuda_target_uses_foreach_and_block_rounding():
    model, x, y, loss = ZOO["mlp"]()
    cpu = fxmem.analyze(model, x, y, loss=loss, optimizer=torch.optim.Adam, device="cpu")
    cuda = fxmem.analyze(model, x, y, loss=loss, optimizer=torch.optim.Adam, device="cuda")
    assert not any(o.op.startswith("aten._foreach_") for o in cpu.trace.ops)
    assert any(o.op.startswith("aten._foreach_") for o in cuda.trace.ops)
    # every storage is a multiple of 512 bytes on CUDA, and the step counters live on the host
    for s, size in zip(cuda.liveness.graph.storages, cuda.liveness.sizes):
        for b in (1, 7, 64):
            assert size(b) % 512 == 0 and size(b) >= s.size(b) * (not s.name.endswith(".step"))
    assert cuda.peak_bytes(13) >= cpu.peak_bytes(13)


def test_backward_ops_belong_to_the_module_whose_forward_made_their_node():
    from fxmem.trace import trace

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    t = trace(model, (torch.randn(4, 8),), (torch.randint(0, 4, (4,)),),
              loss=torch.nn.functional.cross_entropy, optimizer=torch.optim.SGD, device="cpu")
    back = [o for o in t.ops if o.phase == "backward"]
    by_node = {}
    for o in back:
        by_node.setdefault(o.autograd_node, set()).add(o.module)
    assert by_node["NllLossBackward0"] == by_node["LogSoftmaxBackward0"] == {"<loss>"}
    assert by_node["AddmmBackward0"] == {"0", "2"}
    assert by_node["ReluBackward0"] == {"1"}
    assert by_node["torch::autograd::AccumulateGrad"] == {"0", "2"}  # the parameter's module
    grads = {s.name: s.module for s in t.storages if s.category == "grad"}
    assert grads == {"0.weight": "0", "0.bias": "0", "2.weight": "2", "2.bias": "2"}
