"""FLOPs from the traced graph, symbolic in B, against PyTorch's FlopCounterMode on a real
eager step."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxmem
from fxmem.validate.measure import batch_of
from zoo import OPTIMIZERS, ZOO


@pytest.mark.parametrize("name", ["mlp", "seed_cnn", "resnet", "transformer_train_mode", "unet"])
def test_pytorch_formulas_match_flop_counter_mode(name):
    model, x, y, loss = ZOO[name]()
    report = fxmem.analyze(model, x, y, loss=loss, device="cpu")  # forward + backward
    for b in (3, 7):
        xs, ys = [batch_of(t, b, "cpu") for t in x], [batch_of(t, b, "cpu") for t in y]
        with FlopCounterMode(display=False) as counter:
            loss(model(*xs), *ys).backward()
        model.zero_grad(set_to_none=True)
        assert report.flop_count.from_pytorch.subs(fxmem.B, b) == counter.get_total_flops()


def test_linear_flops_are_exact_and_symbolic():
    r = fxmem.analyze(torch.nn.Linear(8, 2, bias=False), torch.randn(4, 8), train=False,
                      device="cpu")
    assert r.flop_count.total == 2 * 8 * 2 * fxmem.B
    assert r.flop_count.uncounted == ()


def test_ops_without_a_formula_are_listed_not_zero():
    model, x, y, loss = ZOO["transformer_train_mode"]()
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu")
    listed = dict(r.flop_count.uncounted)
    assert listed["aten.native_layer_norm.default"] == 4  # 2 layers x 2 norms
    assert "aten.view.default" not in listed  # views do no arithmetic


def test_recompute_flops_of_a_plan():
    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=OPTIMIZERS["adam"], device="cpu")
    base = fxmem.analyze(model, x, y, **kw)
    plan = fxmem.analyze(model, x, y, **kw, checkpoint=["layer1.0"])
    assert base.recompute_flops == 0
    fwd = plan.flop_count.by_phase["forward"]
    assert fwd == base.flop_count.by_phase["forward"]
    # recomputation re-runs part of layer1.0's forward, never more than all of it
    assert 0 < plan.recompute_flops.subs(fxmem.B, 5) < fwd.subs(fxmem.B, 5)
    assert plan.flop_count.total == base.flop_count.total + plan.recompute_flops
    # a conv-only segment recomputes nothing: conv saves its input (made outside) before its
    # kernel runs, so non-reentrant checkpoint's early stop ends the recomputation there
    model, x, y, loss = ZOO["seed_cnn"]()
    r = fxmem.analyze(model, x, y, loss=loss, device="cpu", checkpoint=["conv1", "conv2"])
    assert r.recompute_flops == 0


def test_copied_blocks_cost_what_their_pattern_costs():
    """A stack of identical blocks is traced as two and the others' ops copied
    (fxmem.trace.blocks): each op's FLOPs are read from the recorded graph, a copied op
    costing its pattern op's, op for op what the whole step's graph gives (in B, in B and
    L, on an FSDP2 rank), and in all what FlopCounterMode counts on a real step."""
    transformers = pytest.importorskip("transformers")
    from fxmem.checkpoint.flops import _graph_flops, op_flops
    from fxmem.memory.dims import nodes_and_values
    from fxmem.trace.blocks import Spliced

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=4, n_head=4,
                                  n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model, ids = transformers.GPT2LMHeadModel(cfg), torch.randint(0, 128, (2, 16))

    def loss(out):
        return out.logits.sum()

    step = dict(loss=loss, device="cpu")
    plain = fxmem.analyze(model, ids, **step)
    for r in (plain, fxmem.analyze(model, ids, dims={"L": [(0, 1)]}, **step).at(L=16),
              fxmem.analyze(model, ids, parallel=fxmem.FSDP(2), **step).groups[0].report):
        t = r.trace
        source = getattr(t.graph_source, "original", t).graph_source
        assert isinstance(source, Spliced) and len(t.reused) == 2
        assert op_flops(t) == _graph_flops(*nodes_and_values(t))
    for b in (3, 5):
        with FlopCounterMode(display=False) as counter:
            loss(model(batch_of(ids, b, "cpu"))).backward()
        model.zero_grad(set_to_none=True)
        assert plain.flop_count.from_pytorch.subs(fxmem.B, b) == counter.get_total_flops()
