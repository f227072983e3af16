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


def _pytorch_recompute(report, b):
    per_op = report._op_flops
    return sum(int(per_op[o.source][0].subs(fxmem.B, b)) for o in report.trace.ops
               if o.recompute and o.source in per_op and per_op[o.source][1])


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
