"""The seed CNN's step in fp32 and under CUDA AMP (float16, GradScaler), as formulas in B
(docs/seed-example.md, "Mixed precision").

Run: ``python examples/seed_amp.py``
"""

import torch
import torch.nn.functional as F

import fxmem
from seed_convnet import seed_step


def main():
    model, x, y = seed_step()
    kw = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cuda")
    fp32 = fxmem.analyze(model, x, y, **kw)
    amp = fxmem.analyze(model, x, y, **kw, amp=torch.float16)  # CUDA rules + GradScaler
    for name, r in (("fp32", fp32), ("amp fp16", amp)):
        print(f"{name}: {r.peak}")
        print(f"  at B=64: {r.peak_bytes(64):,} bytes; largest B for 16 GiB: "
              f"{r.max_batch_size(16 * 2**30):,}")
    print(f"ratio at B=64: {amp.peak_bytes(64) / fp32.peak_bytes(64):.3f}")


if __name__ == "__main__":
    main()
