"""The seed article's six ways to save memory, for its CNN (docs/seed-example.md):
each as a peak formula in B, the peak at B=64, and the largest batch within 16 GiB.

Run: ``python examples/seed_whatifs.py``
"""

import torch
from torch import nn

import fxmem
from fxmem.report.whatif import render_markdown
from seed_convnet import SimpleConvNet, seed_step


def main():
    model, x, y = seed_step()
    with torch.device("meta"):
        smaller = SimpleConvNet(c1=32, c2=64)  # the article's "smaller model": halved channels
    rows = fxmem.whatif(model, x, y, loss=nn.functional.cross_entropy,
                        optimizer=torch.optim.Adam, B=64, budget_bytes=16 * 2**30,
                        device="cpu", smaller_model=smaller, amp=torch.bfloat16, grad_accum=4,
                        checkpoint=["conv1", "conv2"])
    print(render_markdown(rows))


if __name__ == "__main__":
    main()
