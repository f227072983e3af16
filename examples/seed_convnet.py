"""The worked example fxmem starts from (docs/seed-example.md): a small CNN, batch 64,
input 64x3x32x32, fp32, Adam, cross-entropy over 10 classes.

Run: ``python examples/seed_convnet.py``
"""

import torch
from torch import nn

import fxmem
from fxmem.report.text import fmt_bytes


class SimpleConvNet(nn.Module):
    def __init__(self, c1: int = 64, c2: int = 128):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3)
        self.conv2 = nn.Conv2d(c1, c2, 3)
        self.fc = nn.Linear(c2 * 28 * 28, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = x.view(x.size(0), -1)
        return self.fc(x)


def seed_step():
    """Model and example batch of the seed article (model on meta: no weights allocated)."""
    with torch.device("meta"):
        model = SimpleConvNet()
    x = torch.empty(64, 3, 32, 32, device="meta")
    y = torch.empty(64, dtype=torch.int64, device="meta")
    return model, x, y


def main():
    model, x, y = seed_step()
    report = fxmem.analyze(model, x, y, loss=nn.functional.cross_entropy,
                           optimizer=torch.optim.Adam, device="cpu")
    print(f"peak(B) = {report.peak}   [bytes, valid when {', '.join(map(str, report.valid_when))}]")
    print()
    print(f"{'part':<16} {'formula (bytes)':<22} {'at B=64':>14}")
    for name, expr in report.parts.items():
        v = int(expr.subs(fxmem.B, 64))
        print(f"{name:<16} {str(expr):<22} {v:>14,}  ({fmt_bytes(v)})")
    print()
    bd = report.breakdown(B=64)
    print(f"peak at B=64: {bd.peak_bytes:,} bytes ({fmt_bytes(bd.peak_bytes)}), "
          f"after {bd.op} in {bd.phase} ({bd.module or '(root)'})")
    for r in report.regimes:
        print(f"  for B >= {r.B_from}: the peak is after {r.op} in {r.phase} "
              f"({r.module or '(root)'})")
    budget = 16 * 2**30
    print(f"largest B for a 16 GiB budget: {report.max_batch_size(budget):,}")


if __name__ == "__main__":
    main()
