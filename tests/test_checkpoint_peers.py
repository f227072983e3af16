"""The peers of benchmarks/checkpoint_frontier.py (issue 23), applied for real to a small GPT
stack: every plan's measured peak and FlopCounterMode FLOPs obey what the plan promises, and
torchtitan's policy, as reimplemented, saves and recomputes what it says."""

import os
import sys

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from zoo import GPTBlock, GPTStack, token_loss

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import checkpoint_frontier as cf  # noqa: E402

B = 2
aten = torch.ops.aten


def small():
    return cf.Bundle("small", "small GPT stack", cf._seeded(lambda: GPTStack(
        vocab=64, d=32, seq=16, n_layers=4, heads=2)), cf._ids(64, 16, False), token_loss,
        lambda p: torch.optim.Adam(p, lr=1e-3), "blocks", B)


@pytest.fixture(scope="module")
def measured():
    bundle = small()
    return {plan: cf.eager_peer(bundle, plan, B) for plan in cf.PLANS}


def test_plans_trade_memory_for_recompute(measured):
    none = measured["none"]
    assert measured["every block"].peak_bytes < none.peak_bytes
    assert measured["Chen sqrt(n)"].peak_bytes < none.peak_bytes
    assert measured["every block"].flops > none.flops
    assert measured["Chen sqrt(n)"].flops > measured["every block"].flops  # longer segments
    # pointwise ops carry no FLOPs in PyTorch's formulas: recomputing only them costs none
    assert measured["pointwise SAC"].flops == none.flops
    assert measured["pointwise SAC"].peak_bytes < none.peak_bytes
    # saving the views too keeps alive the pointwise outputs they view (the GELU's)
    literal = measured["pointwise SAC, views saved (diagnostic)"]
    assert literal.flops == none.flops
    assert literal.peak_bytes > measured["pointwise SAC"].peak_bytes


def test_every_block_recomputes_each_block_up_to_its_last_needed_matmul(measured):
    """Non-reentrant checkpointing stops recomputing once the last saved tensor the backward
    needs is rebuilt (early_stop): per block qkv, the attention, proj and the first MLP
    matmul, not the second (the residual add after it saves nothing). 2*M*K*N per matmul,
    M = B*L tokens; the attention's two batched matmuls 4*B*L*L*d, counted as on a GPU
    (the CPU flash kernel by its CUDA twin's formula: cf.GPU_COUNTED)."""
    m, d = B * 16, 32
    per_block = 2 * m * d * (3 * d) + 2 * m * d * d + 2 * m * d * (4 * d) + 4 * B * 16 * 16 * d
    assert measured["every block"].flops - measured["none"].flops == 4 * per_block


def test_chen_groups_consecutive_blocks_and_keeps_the_values():
    bundle = small()
    model = cf.chen_groups(bundle.build(), "blocks")
    groups = list(model.blocks)
    assert isinstance(model.blocks, nn.Sequential) and len(groups) == 2  # ceil(sqrt(4))
    assert [len(g._checkpoint_wrapped_module.blocks) for g in groups] == [2, 2]
    (ids,), (y,) = bundle.batch(B)
    plain = bundle.build()
    loss, ref = token_loss(model(ids), y), token_loss(plain(ids), y)
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref)
    assert torch.allclose(model.tok.weight.grad, plain.tok.weight.grad)


def test_torchtitan_policy_decisions():
    """Saved: matmuls (addmm always: it is not counted as an mm), CPU flash attention;
    every second aten.mm recomputed, counted apart in the forward and in the recompute;
    pointwise ops, layer norms, softmax and views recomputed."""
    class Ctx:
        is_recompute = False

    policy, ctx = cf.torchtitan_policy(), Ctx()
    x = torch.zeros(2, 2)
    decisions = [policy(ctx, op, x, x) for op in (
        aten.mm.default, aten.addmm.default, aten.mm.default, aten.mm.default, aten.gelu.default,
        aten.native_layer_norm.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten.view.default, aten.bmm.default, aten.max.default, aten._softmax.default)]
    S, R = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert decisions == [S, S, R, S, R, R, S, R, S, S, R]
    ctx.is_recompute = True  # the recompute counts its own mms from 1
    assert [policy(ctx, aten.mm.default, x, x) for _ in range(3)] == [S, R, S]


def test_torchtitan_sac_recomputes_exactly_every_second_mm():
    """Applied for real: on three bias-free linears (aten.mm), the step costs the plain
    step's FLOPs plus the second linear's forward, nothing else (early_stop=False)."""
    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Sequential(
            nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 24, bias=False), nn.ReLU(),
            nn.Linear(24, 4, bias=False)))

    bundle = cf.Bundle("mm", "mm", net, lambda b: ((torch.randn(b, 8),), (torch.randn(b, 4),)),
                       nn.functional.mse_loss, lambda p: torch.optim.SGD(p, lr=0.1), "0", 5)
    plain, _ = cf.flops_and_seconds(bundle, net(), 5)
    sac, _ = cf.flops_and_seconds(bundle, cf.wrap_blocks(net(), "0", cf.torchtitan_sac), 5)
    # wrap_blocks wrapped each of the five layers on its own: make one block of all five
    one = net()
    one[0] = cf.torchtitan_sac(one[0])
    block, _ = cf.flops_and_seconds(bundle, one, 5)
    assert sac == plain  # one mm per checkpointed call: the first, saved
    assert block == plain + 2 * 5 * 16 * 24


def test_sac_on_a_gpt_block_saves_the_attention_for_cpu():
    """The torchtitan policy really keeps the CPU SDPA output: no attention kernel runs in
    the recompute (the recompute's kernels, seen by a dispatch mode, are listed)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    x = torch.randn(2, 16, 32, requires_grad=True)
    counts = {}
    for name, wrap in (("titan", cf.torchtitan_sac), ("full", cf.every_block)):
        block = wrap(GPTBlock(32, 2))
        out = block(x).sum()
        with Ops() as seen:
            out.backward()
        counts[name] = seen.ops.count(aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert counts == {"titan": 0, "full": 1}


def test_profiler_peak_agrees_with_measure_on_the_eager_step(measured):
    """The method used for the compiled step's peak, checked on the eager step: equal with
    no checkpointing; with it, the profiler also sees the CPU RNG states that
    checkpointing keeps (preserve_rng_state: torch.get_rng_state(), made outside the
    dispatcher, so fxmem.measure's storage tracker does not see them): a whole number of
    them, at most one per checkpointed block."""
    bundle = small()
    assert cf.eager_profiler_peak(bundle, "none", B) == measured["none"].peak_bytes
    rng = torch.get_rng_state().nbytes
    for plan in ("every block", "pointwise SAC"):
        extra = cf.eager_profiler_peak(bundle, plan, B) - measured[plan].peak_bytes
        assert extra % rng == 0 and 0 <= extra // rng <= 4, (plan, extra)


def test_pointwise_sac_recomputes_dropout_and_keeps_the_gradients():
    """Dropout on CPU is empty_like + bernoulli_ + div_ + mul: the pointwise policy
    recomputes all four (the literal policy would save the empty_like that bernoulli_ then
    fills, which SAC refuses); checkpointing restores the RNG state, so the gradients are
    the plain step's."""
    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4))

    x = torch.randn(3, 8)
    grads = []
    for wrap in (None, cf.sac(cf.pointwise_policy)):
        model = net()
        if wrap is not None:
            model = nn.Sequential(wrap(model))
        torch.manual_seed(1)
        model(x).square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    with pytest.raises(RuntimeError, match="mutated"):
        model = nn.Sequential(cf.sac(cf.pointwise_policy_views_saved)(net()))
        model(x).sum().backward()


def test_counting_addmm_as_mm_makes_torchtitan_recompute(measured):
    """torchtitan's every-other-mm rule counts aten.mm and aten.linear only; the GPT
    stack's biased linears run aten.addmm, so the faithful policy recomputes no matmul."""
    titan = measured["torchtitan SAC"]
    assert titan.flops == measured["none"].flops
    counted = measured["torchtitan SAC, addmm counted as mm (diagnostic)"]
    m, d = B * 16, 32
    # per block: the 2nd (proj) and 4th (the MLP's second) matmuls recomputed
    assert counted.flops - titan.flops == 4 * (2 * m * d * d + 2 * m * (4 * d) * d)
    assert counted.peak_bytes <= titan.peak_bytes  # equal at this size: the peak is elsewhere


def test_memory_budget_sets_the_partitioner_flag_and_restores_every_flag():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    before = (functorch_config.activation_memory_budget, functorch_config.enable_autograd_cache,
              inductor_config.fx_graph_cache)
    with cf.memory_budget(0.3):
        assert functorch_config.activation_memory_budget == 0.3
        assert not functorch_config.enable_autograd_cache and not inductor_config.fx_graph_cache
    assert (functorch_config.activation_memory_budget, functorch_config.enable_autograd_cache,
            inductor_config.fx_graph_cache) == before
