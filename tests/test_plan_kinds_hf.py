"""Plans of every kind on Hugging Face GPT-2 and Llama (random weights from configs): the
plan derived from one trace == fxmem.measure of the model after apply_checkpoints, at two
batch sizes, and recompute FLOPs (PyTorch's formulas) == FlopCounterMode's difference."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxmem
from fxmem import Region

transformers = pytest.importorskip("transformers")


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64,
                                  vocab_size=256, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).train()


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=256, max_position_embeddings=64, use_cache=False,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).train()


def loss(o):
    return o.logits.float().square().mean()


MODELS = {"gpt2": (gpt2, "transformer.h"), "llama": (llama, "model.layers")}


def _plans(report, stack):
    from fxmem.checkpoint.options import policies

    p = [f"{stack}.{i}" for i in range(3)]
    pol = policies(report, p[1], 8)
    return {
        "module": [p[1]],
        "group": [Region((p[0], p[1], p[2]))],
        "pointwise": [Region((p[1],), pol["pointwise"])],
        "torchtitan": [Region((q,), policies(report, q, 8)["torchtitan"]) for q in p]
        if "torchtitan" in pol else [p[0]],
        "knapsack + group": [Region((p[0],), pol["knapsack:1"]), Region((p[1], p[2]))],
    }


def _pytorch_recompute(report, b):  # as FlopCounterMode counts the re-run on this CPU
    from fxmem.checkpoint.options import counted_flops

    return counted_flops(report, b, recompute=True, twins=False)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_kind_exact_on_hugging_face(name):
    build, stack = MODELS[name]
    ids = torch.randint(0, 256, (2, 32))
    base = fxmem.analyze(build(), ids, loss=loss, device="cpu")
    with FlopCounterMode(display=False) as fc:
        loss(build()(torch.randint(0, 256, (5, 32)))).backward()
    none_flops = fc.get_total_flops()
    for kind, plan in _plans(base, stack).items():
        derived = base.with_plan(plan)
        for b in (3, 5):
            real = fxmem.measure(fxmem.apply_checkpoints(build(), plan), ids, loss=loss, B=b)
            assert derived.peak_bytes(b) == real.peak_bytes, (name, kind, b)
        m = fxmem.apply_checkpoints(build(), plan)
        with FlopCounterMode(display=False) as fc:
            loss(m(torch.randint(0, 256, (5, 32)))).backward()
        assert fc.get_total_flops() - none_flops == _pytorch_recompute(derived, 5), (name, kind)


def test_each_frontier_point_answers_its_own_peak_on_llama():
    """On this Llama (8 layers) the chain model puts several frontier plans 256 to 1,280
    bytes above their exact peaks, the smallest included: plan_for at a point's exact peak
    still finds a plan no worse (from the exact frontier)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=8,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=500,
                                   max_position_embeddings=64, use_cache=False,
                                   attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 500, (2, 32))
    r = fxmem.analyze(model, ids, loss=loss, optimizer=torch.optim.AdamW, device="cpu")
    front = r.frontier(B=8)
    planner = r._chooser()

    def counted(plan):
        return planner.exact_numbers(plan, 8)[2]

    assert len(front) >= 5
    for p in front:
        got = r.plan_for(p.peak_bytes, 8)  # no more FLOPs by PyTorch's formulas (the
        # planner's objective; pointwise ops' one FLOP per element only breaks ties)
        assert got.peak_bytes <= p.peak_bytes
        assert counted(got.plan) <= counted(p.plan)
        assert got.peak_bytes == r.with_plan(got.plan).peak_bytes(8)


def test_checkpointed_blocks_keep_no_cache_as_under_transformers_own_checkpointing():
    # GPT-2 with use_cache=True (its default) writes a key/value cache in every block's
    # forward. transformers' gradient checkpointing calls a checkpointed block without it
    # (its re-run would write it again), and so do fxmem's plans, traced and applied
    # (fxmem.trace.plans.checkpointing.uncached): a selective plan re-runs (it failed with
    # PyTorch's "... not found in storage" when the cache was written twice), and the plan
    # plan_for confirms by tracing peaks as measured.
    from fxmem.validate.zoo import CausalLM

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    assert model.config.use_cache
    ids = torch.randint(0, 100, (4, 32))
    kw = dict(optimizer=torch.optim.SGD, device="cpu")
    r = fxmem.analyze(CausalLM(model), (ids, ids), **kw)
    budget = r.peak_bytes(2) - 20_000
    derived = r.plan_for(budget, 2, confirm=False)
    assert any(reg.save for reg in derived.plan.regions)
    fxmem.measure(fxmem.apply_checkpoints(CausalLM(_copy(model)), derived.plan), (ids, ids),
                  **kw, B=2)
    chosen = r.plan_for(budget, 2)
    measured = fxmem.measure(fxmem.apply_checkpoints(CausalLM(_copy(model)), chosen.plan),
                             (ids, ids), **kw, B=2).peak_bytes
    assert chosen.peak_bytes == chosen.report.peak_bytes(2) == measured <= budget
    traced = fxmem.analyze(CausalLM(_copy(model)), (ids, ids), checkpoint=derived.plan,
                           retrace=True, **kw)
    assert traced.peak_bytes(2) == fxmem.measure(
        fxmem.apply_checkpoints(CausalLM(_copy(model)), derived.plan), (ids, ids), **kw,
        B=2).peak_bytes
    most = r.max_batch_size(budget, max_recompute=0.5)
    assert most.peak_bytes == most.report.peak_bytes(most.B) <= budget


def test_llama_with_its_cache_runs_selective_and_group_plans():
    # Llama passes its cache by keyword: a selective plan's re-run sliced the key it had
    # written twice ("aten.slice.Tensor invocation index 4 ... not found in storage")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=256, max_position_embeddings=64,
                                   attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).train()
    assert model.config.use_cache
    ids = torch.randint(0, 256, (2, 32))
    sdpa = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    for plan in ([Region(("model.layers.1",), ((sdpa, 0), ("aten.mm.default", 0)))],
                 [Region(("model.layers.0", "model.layers.1"), ((sdpa, 1),))]):
        traced = fxmem.analyze(_copy(model), ids, loss=loss, device="cpu", checkpoint=plan,
                               retrace=True)
        real = fxmem.measure(fxmem.apply_checkpoints(_copy(model), plan), ids, loss=loss, B=3)
        assert traced.peak_bytes(3) == real.peak_bytes, plan


def test_a_model_checkpointed_by_apply_checkpoints_is_traced_without_its_cache():
    # The user's model after fxmem.apply_checkpoints (whole Llama layers, use_cache on):
    # its checkpoint_wrappers call the layers without the cache, and the trace did not
    # (283d3c7 to this test: 558,268 bytes traced, 521,212 measured at B=3)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = fxmem.apply_checkpoints(transformers.LlamaForCausalLM(cfg),
                                    ["model.layers.0", "model.layers.1"])
    assert model.config.use_cache
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=loss, optimizer=torch.optim.AdamW, device="cpu")
    traced = fxmem.analyze(model, ids, **kw)
    assert traced.peak_bytes(3) == fxmem.measure(model, ids, B=3, **kw).peak_bytes


def test_a_plan_over_layers_with_a_cache_is_traced():
    # analyze(model, checkpoint=plan) derived the plan from the step without it, which
    # keeps the cache every layer writes (under autocast, copies of its keys and values
    # too): the layers checkpointed run without it. Llama, use_cache on, bf16 autocast,
    # both layers: 556,668 bytes derived at B=5 where the step apply_checkpoints makes
    # measures 555,644 (621,436 and 618,364 at B=7). Such a plan is now traced.
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    assert model.config.use_cache
    plan = ["model.layers.0", "model.layers.1"]
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu", amp=torch.bfloat16)
    r = fxmem.analyze(_copy(model), ids, ids, checkpoint=plan, **kw)
    real = fxmem.apply_checkpoints(_copy(model), plan)
    assert [r.peak_bytes(b) for b in (3, 5, 7)] == [
        fxmem.measure(real, ids, ids, B=b, **kw).peak_bytes for b in (3, 5, 7)]


def _lm_loss(out, y):
    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def _copy(model):
    import copy

    return copy.deepcopy(model)


def _cached_llama(family="llama"):
    torch.manual_seed(0)
    small = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))


def test_apply_checkpoints_keeps_no_cache_as_transformers_own_checkpointing():
    # A checkpointed layer is called without the cache (uncached); the cache was taken out
    # inside the checkpoint, which kept it among the layer's arguments for the re-run, so
    # the other layers' keys and values stayed until the layer's backward. transformers'
    # layer takes it out before its checkpoint (GradientCheckpointingLayer, here on layer 0
    # alone and with the model's own switch off, which would turn the cache off everywhere):
    # fxmem's plan now measures as that, phase by phase (before: the backward's peak 737,376
    # bytes at B=3 against 725,088).
    model = _cached_llama()
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu", amp=torch.bfloat16)
    own = _copy(model)
    own.gradient_checkpointing_enable({"use_reentrant": False})
    for m in own.modules():
        if hasattr(m, "gradient_checkpointing"):
            m.gradient_checkpointing = m is own.model.layers[0]
    ours = fxmem.apply_checkpoints(_copy(model), ["model.layers.0"])
    for b in (3, 5):
        assert fxmem.measure(ours, ids, ids, B=b, **kw).phase_peak_bytes == \
            fxmem.measure(own, ids, ids, B=b, **kw).phase_peak_bytes


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_plans_over_layers_with_a_cache_derived_as_measured(family):
    # The step with the cache (use_cache on, bf16 autocast: the cache's keys fp32, so its
    # values too) and plans over its layers, which run without it: derived from that one
    # trace (fxmem.checkpoint.uncached) == the step apply_checkpoints makes, measured.
    from fxmem.checkpoint.options import policies

    model = _cached_llama(family)
    assert model.config.use_cache
    ids = torch.randint(0, 128, (2, 16))
    kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu", amp=torch.bfloat16)
    r = fxmem.analyze(_copy(model), ids, ids, **kw)
    pol = policies(r, "model.layers.1", 4)
    plans = {"one": ["model.layers.1"], "all": [f"model.layers.{i}" for i in range(3)],
             "group": [Region(("model.layers.0", "model.layers.1"))],
             "pointwise": [Region(("model.layers.1",), pol["pointwise"])],
             "knapsack": [Region(("model.layers.2",), pol["knapsack:1"]), "model.layers.0"]}
    for kind, plan in plans.items():
        derived = r.with_plan(plan)
        real = fxmem.apply_checkpoints(_copy(model), plan)
        for b in (3, 5):
            assert derived.peak_bytes(b) == \
                fxmem.measure(real, ids, ids, B=b, **kw).peak_bytes, (kind, b)


def test_plans_over_layers_with_a_cache_derived_as_traced_on_cuda():
    # The same on CUDA's kernels (cuDNN attention, the allocator's replay) and under FSDP2
    # with and without its own mixed precision: each derived plan's per-rank peak, its
    # replay's allocated and reserved, equal the plan traced.
    model = _cached_llama()
    ids = torch.randint(0, 128, (2, 64))
    for parallel in (None, fxmem.FSDP(2),
                     fxmem.FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)):
        kw = dict(loss=_lm_loss, optimizer=torch.optim.AdamW, amp=torch.bfloat16,
                  parallel=parallel)
        r = fxmem.analyze(_copy(model), ids, ids, **kw)
        # a group is one segment on one GPU (FSDP2's hooks run between its layers)
        for plan in (["model.layers.1"], ["model.layers.0", "model.layers.2"]) if parallel \
                else (["model.layers.1"], [Region(("model.layers.0", "model.layers.1"))]):
            derived = r.with_plan(plan)
            traced = fxmem.analyze(_copy(model), ids, ids, checkpoint=plan, retrace=True, **kw)
            for b in (2, 6):
                d, t = (x.groups[0].report if parallel else x for x in (derived, traced))
                assert d.peak_bytes(b) == t.peak_bytes(b), (parallel, plan, b)
                md, mt = d.cuda_memory(b), t.cuda_memory(b)
                assert (md.max_allocated, md.max_reserved) == \
                    (mt.max_allocated, mt.max_reserved), (parallel, plan, b)
