"""Batch size and sequence length as symbols: GPT-2 small (transformers' default GPT2Config),
one training step with Adam, ``device="cuda"``, analysed once with L symbolic.

    python benchmarks/dims.py [--points 500]

Reports the analysis time, the formula's size, and the time to evaluate the peak at a new
(B, L) (random B in [2, 64], L in [2, 1024]; checked against the report re-derived at that L
for the first few).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from zoo import gpt2  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--points", type=int, default=500)
    a = p.parse_args()
    import fxmem

    with torch.device("meta"):
        model = gpt2()
    ids = torch.empty(8, 512, dtype=torch.int64, device="meta")
    t = time.perf_counter()
    r = fxmem.analyze(model, (ids, ids), optimizer=torch.optim.Adam,
                      dims={"L": [(0, 1), (1, 1)]})
    analysis = time.perf_counter() - t
    t = time.perf_counter()
    r.peak_bytes(8, L=512)
    first = time.perf_counter() - t
    random.seed(0)
    pts = [(random.randint(2, 64), random.randint(2, 1024)) for _ in range(a.points)]
    t = time.perf_counter()
    vals = [r.peak_bytes(b, L=n) for b, n in pts]
    per = (time.perf_counter() - t) / len(pts)
    checked = all(v == r.at(L=n).peak_bytes(b) for (b, n), v in list(zip(pts, vals))[:5])
    t = time.perf_counter()
    terms = len(r.peak.args)
    formula = time.perf_counter() - t
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}")
    print("GPT-2 small, Adam, device=cuda, traced at B=8, L=512 with L symbolic")
    print(f"analysis: {analysis:.2f} s; first (B, L) point: {first * 1e3:.0f} ms")
    print(f"a new (B, L): {per * 1e3:.3f} ms on average over {len(pts)} points; "
          f"equal to the re-derived report on 5 of them: {checked}")
    print(f"peak formula in B and L: {terms} terms (of {len(r.named._candidates[1])} candidate "
          f"ops), built in {formula:.2f} s")
    print(f"peak = {r.peak}")


if __name__ == "__main__":
    main()
