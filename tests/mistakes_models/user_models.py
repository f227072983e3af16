"""Small models for tests/test_mistakes.py: each one a user's mistake, or a model that cannot
be traced, and why. Run through the command line (``tests/mistakes_models/models.py:Name``)
and the API."""

import logging
import warnings

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(4, width)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))


class Two(nn.Module):
    """forward takes two tensors."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, y):
        return self.fc(x) + self.fc(y)


class Emb(nn.Module):
    """Token ids into an Embedding (float ids are a mistake)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, ids):
        return self.fc(self.emb(ids)).mean(1)


class Branchy(nn.Module):
    """A Python branch on a tensor's value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            h = h * 2
        return h


class MaskBranch(nn.Module):
    """A Python branch on how many values a mask selects."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        picked = h[h > 0]
        if picked.shape[0] > 3:
            return h * 2
        return h


class MaskOut(nn.Module):
    """Returns a tensor as long as a mask's True values (not a loss)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h[h > 0]


class Inner(nn.Module):
    def forward(self, x):
        if x.mean() > 0:
            return x
        return -x


class Nested(nn.Module):
    """The branch on a value is in a submodule (inner.1)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), Inner())

    def forward(self, x):
        return self.inner(x)


class FixedBatch(nn.Module):
    """The batch size written as a constant."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).view(8, 3)


class Raises(nn.Module):
    """A bug in the user's forward."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        raise ValueError("my own bug")


class NoParams(nn.Module):
    """Nothing to train."""

    def forward(self, x):
        return x * 2


class Noisy(nn.Module):
    """Warns and logs through torch's logger while it runs: none of it may reach the output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        warnings.warn("a warning from the model")
        logging.getLogger("torch._subclasses.fake_tensor").error("a torch log line")
        return self.fc(x)


class Interrupted(nn.Module):
    """The user presses Ctrl-C while the step is traced."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        raise KeyboardInterrupt


class Fails(nn.Module):
    """The constructor fails."""

    def __init__(self):
        super().__init__()
        raise RuntimeError("cannot build this one")


class NeedsArgs(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(4, n)

    def forward(self, x):
        return self.fc(x)


def not_a_module():
    return 3


CONSTANT = 3


class SizedByAValue(nn.Module):
    """A tensor sized by a value read from another one: no bound fxmem knows."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        n = h.argmax()
        return h.sum() + torch.ones(n.item() + 1).sum()


class SizedByACount(nn.Module):
    """repeat_interleave by counts the data sets: no bound either."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        reps = (h[:, 0] > 0).long() + 1
        return h.repeat_interleave(reps, dim=0).sum()


class Tokens(nn.Module):
    """Token ids (B, L) into an Embedding, then a Linear expecting 5 features (a mistake)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(5, 3)

    def forward(self, ids):
        return self.fc(self.emb(ids)).mean()


made = Net()  # a model the file makes: a target as it is
