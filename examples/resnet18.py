"""A ResNet-18 for 32x32 images (CIFAR-style: 3x3 stem, no max-pool), written out with
BasicBlocks so no torchvision is needed; 10 classes, cross-entropy, Adam.

Analyse it from the command line:

    fxmem analyze examples/resnet18.py:ResNet18 --input B,3,32,32 --target B:int64:10 --optimizer adam --budget 8GiB

Its report is in ``docs/gallery/resnet18.md`` (``python examples/gallery.py``).
"""

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, and the identity (or a 1x1 projection)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 layout: a stem, four stages of two BasicBlocks (64, 128, 256, 512
    channels), global average pooling and a linear classifier."""

    def __init__(self, num_classes: int = 10, width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, c = [], width
        for i, c_out in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if i == 0 else 2
            blocks += [BasicBlock(c, c_out, stride), BasicBlock(c_out, c_out)]
            c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def example():
    """Model (on the meta device: no weights allocated), an example batch and its labels."""
    with torch.device("meta"):
        model = ResNet18()
    x = torch.empty(8, 3, 32, 32, device="meta")
    y = torch.empty(8, dtype=torch.int64, device="meta")
    return model, (x,), (y,)
