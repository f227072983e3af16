"""Checks a model makes on its data (``assert``, ``if ...: raise``, ``torch._assert``) are
assumed to pass (fxmem.trace.kernels.checks); any other branch on data is still refused."""

import pytest
import torch
from torch import nn

import fxmem
from fxmem.trace.kernels.checks import outcome_at_line


class Checked(nn.Module):
    """An embedding model that validates its ids the ways model code does (Hugging Face
    XLM: ``assert lengths.max().item() <= slen``)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, ids):
        assert ids.max().item() < 32, "id out of range"
        if (ids < 0).any():
            raise ValueError("negative id")
        if not (ids.sum() >= 0):
            raise ValueError("negative sum")
        torch._assert(ids.min() >= 0, "negative id")
        return self.out(self.emb(ids)).sum()


class Branches(Checked):
    """A condition on data whose outcome the syntax does not fix: refused."""

    def forward(self, ids):
        if ids.max() > 3 and ids.min() > 1:
            raise ValueError("ambiguous")
        return self.out(self.emb(ids)).sum()


def test_checks_on_data_pass_and_the_prediction_is_exact():
    m, ids = Checked(), torch.randint(0, 32, (4, 8))
    kw = dict(optimizer=torch.optim.Adam, device="cpu")
    r = fxmem.analyze(m, (ids,), **kw)
    for b in (3, 7):
        assert r.peak_bytes(b) == fxmem.measure(m, (ids,), **kw, B=b).peak_bytes
    notes = [what for op, _, what in r.unmodelled if op == "check"]
    assert [n.rsplit(": ", 1)[1] for n in notes] == [
        'assert ids.max().item() < 32, "id out of range"', "if (ids < 0).any():",
        "if not (ids.sum() >= 0):", 'torch._assert(ids.min() >= 0, "negative id")']
    assert all("assumed to pass" in n for n in notes)


def test_a_branch_whose_passing_outcome_is_ambiguous_is_refused():
    with pytest.raises(fxmem.DataDependentError, match="branches on a value") as e:
        fxmem.analyze(Branches(), (torch.randint(0, 32, (4, 8)),), device="cpu")
    assert "test_checks.py" in str(e.value)


@pytest.mark.parametrize("source, line, outcome", [
    ("assert n <= 16", 1, True),
    ("assert not n > 16", 1, False),
    ("assert a and not b", 1, None),  # a true, b false: which one is undecided?
    ("assert (a and\n        b)", 2, True),
    ("if n > 16:\n    raise ValueError", 1, False),
    ("if n > 16 or m > 2:\n    raise ValueError", 1, False),
    ("if n > 16 and m > 2:\n    raise ValueError", 1, None),
    ("if n > 16:\n    x = 1\n    raise ValueError", 1, None),  # not only a raise
    ("if n > 16:\n    raise ValueError\nelse:\n    x = 1", 1, None),
    ("y = n > 16", 1, None),
    ("if n > 16:\n    assert m < 2", 2, True),  # the innermost statement decides
])
def test_the_outcome_a_check_needs(source, line, outcome):
    assert outcome_at_line(source, line) is outcome
