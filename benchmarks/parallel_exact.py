"""Every parallel strategy on one small Llama: each rank's predicted peak beside the peak of a
real run of the same step in W processes on this machine's CPU (gloo over loopback), at two
batch sizes other than the traced one (docs/distributed.md).

    python benchmarks/parallel_exact.py
"""

import platform
import time

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import fxmem

PLAN = {"model.layers.*.self_attn.q_proj": ColwiseParallel(),
        "model.layers.*.self_attn.k_proj": ColwiseParallel(),
        "model.layers.*.self_attn.v_proj": ColwiseParallel(),
        "model.layers.*.self_attn.o_proj": RowwiseParallel(),
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel()}

STRATEGIES = [
    fxmem.FSDP(2), fxmem.FSDP(4), fxmem.FSDP(4, reshard_after_forward=False),
    fxmem.FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    fxmem.DDP(2), fxmem.DDP(2, gradient_as_bucket_view=True), fxmem.DDP(2, zero1=True),
    fxmem.TP(2, PLAN), fxmem.Parallel(fsdp=fxmem.FSDP(2), tp=fxmem.TP(2, PLAN)),
]


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64))


def lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def main():
    model, ids = llama(), torch.randint(0, 128, (2, 16))
    step = dict(loss=lm_loss, optimizer=torch.optim.AdamW, device="cpu")
    print(f"<!-- python benchmarks/parallel_exact.py; torch {torch.__version__}, "
          f"{platform.machine()}, a 2-layer Llama (hidden 32, GQA 4/2 heads, vocab 128), "
          "AdamW, L=16 -->")
    print("| strategy | B | predicted per rank (bytes) | measured per rank (bytes) | equal |")
    print("|---|---:|---|---|---|", flush=True)
    for p in STRATEGIES:
        t0 = time.perf_counter()
        r = fxmem.analyze(model, ids, ids, parallel=p, **step)
        for b in (3, 5):
            got = [r.peak_bytes(b, rank=k) for k in range(p.world_size)]
            real = [m.peak_bytes for m in fxmem.measure(model, ids, ids, B=b, parallel=p,
                                                        **step)]
            fmt = ", ".join(f"{v:,}" for v in got)
            fmt_real = ", ".join(f"{v:,}" for v in real)
            print(f"| {p.name} | {b} | {fmt} | {fmt_real} | "
                  f"{'yes' if got == real else 'NO'} |", flush=True)
        print(f"<!-- {p.name}: {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
