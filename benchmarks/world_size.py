"""How long a per-rank analysis takes as the world size grows (docs/benchmarks.md): GPT-2
small's config (12 layers, on the meta device) under FSDP2, W = 2 to 1024. The ranks are
grouped by the shapes of their shards, and one trace serves a group, so the time follows the
number of groups (one to three), not W.

    python benchmarks/world_size.py
"""

import platform
import time

import torch
import torch.nn.functional as F

import fxmem


def main():
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    ids = torch.zeros(2, 128, dtype=torch.int64, device="meta")

    def loss(out, y):
        return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())

    print(f"<!-- python benchmarks/world_size.py; torch {torch.__version__}, "
          f"{platform.machine()}, {torch.get_num_threads()} threads -->")
    print("| W | rank groups | traces | analysis | peak per rank at B=8 |")
    print("|---:|---|---:|---:|---:|", flush=True)
    for w in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        t0 = time.perf_counter()
        r = fxmem.analyze(model, ids, ids, loss=loss, optimizer=torch.optim.AdamW,
                          device="cuda", parallel=fxmem.FSDP(w))
        seconds = time.perf_counter() - t0
        groups = ", ".join(g.label for g in r.groups)
        print(f"| {w} | {groups} | {len(r.groups)} | {seconds:.1f} s | "
              f"{r.peak_bytes(8) / 2**20:,.1f} MiB |", flush=True)


if __name__ == "__main__":
    main()
