"""Per-GPU memory of Llama-2 7B and 70B configs under FSDP2 on H100s (docs/distributed.md).

For each model, world size and activation-checkpointing choice, one analysis with the sequence
length L a symbol (``dims``), on the meta device (nothing the size of the model is allocated):
the rank's peak at B=2, L=4096, its model states beside DeepSpeed's ZeRO-3 estimate for the
same parameters, the largest micro-batch B per GPU at L=4096 (the caching allocator replayed,
H100-80GB less 512 MiB for the CUDA context), and the longest L at B=2 (live bytes).

    python benchmarks/distributed.py            # all rows, a Markdown table on stdout
    python benchmarks/distributed.py --only 7B  # rows whose name contains 7B
"""

import argparse
import platform
import time

import torch
import torch.nn.functional as F

import fxmem

GiB = 2**30


def llama(name):
    from transformers import LlamaConfig

    kw = dict(vocab_size=32000, max_position_embeddings=4096)
    if name == "Llama-2-7B":
        cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, **kw)
    else:
        cfg = LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, **kw)
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(cfg), cfg


def lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten())


def deepspeed_zero3_gib(model, world):
    """deepspeed/runtime/zero/stage3.py ``estimate_zero3_model_states_mem_needs`` without
    offload: 4 bytes x the largest module's own parameters + 18 bytes x parameters / GPUs."""
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return (4 * largest + 18 * total / world) / GiB


def row(name, world, ac):
    model, cfg = llama(name)
    ids = torch.zeros(1, 4096, dtype=torch.int64, device="meta")
    plan = [f"model.layers.{i}" for i in range(cfg.num_hidden_layers)] if ac else None
    t0 = time.perf_counter()
    r = fxmem.analyze(model, ids, ids, loss=lm_loss, optimizer=torch.optim.AdamW,
                      device="cuda", dims={"L": [(0, 1), (1, 1)]}, checkpoint=plan,
                      parallel=fxmem.FSDP(world, param_dtype=torch.bfloat16,
                                          reduce_dtype=torch.float32))
    seconds = time.perf_counter() - t0
    at = r.at(L=4096)
    worst = at.tightest(2)
    parts = worst.report.parts
    states = sum(int(parts[p]) for p in ("params", "grads", "optimizer_state")) / GiB
    try:
        most_b = int(at.max_batch_size(gpu="H100-80GB"))
    except fxmem.InfeasibleBudgetError:
        most_b = 0
    usable = 80 * 10**9 - 512 * 2**20
    try:
        most_l = r.max_length(usable, 2, limit=None)
    except fxmem.InfeasibleBudgetError:
        most_l = 0
    return dict(model=name, world=world, ac="every block" if ac else "none",
                peak=at.peak_bytes(2) / GiB, states=states,
                zero3=deepspeed_zero3_gib(model, world), most_b=most_b, most_l=most_l,
                seconds=seconds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    print(f"<!-- python benchmarks/distributed.py; torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads -->")
    print("| model | GPUs | checkpointing | peak per GPU at B=2, L=4096 | model states per GPU "
          "(fxmem) | DeepSpeed ZeRO-3 estimate | largest B at L=4096 on H100-80GB | longest L "
          "at B=2 | analysis |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|", flush=True)
    for name in ("Llama-2-7B", "Llama-2-70B"):
        for world in (8, 64):
            for ac in (False, True):
                if args.only not in f"{name} W={world} ac={ac}":
                    continue
                x = row(name, world, ac)
                b = f"{x['most_b']:,}" if x["most_b"] else "none fits"
                lo = f"{x['most_l']:,}" if x["most_l"] else "none fits"
                print(f"| {x['model']} | {x['world']} | {x['ac']} | {x['peak']:.2f} GiB | "
                      f"{x['states']:.2f} GiB | {x['zero3']:.2f} GiB | {b} | {lo} | "
                      f"{x['seconds']:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
