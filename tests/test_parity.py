"""Conditions on the remainder of B (``Eq(Mod(B, 2), 0)``): code that asks whether B
divides evenly meets one at every trace (DTensor's view rule asks it of every dim it might
keep sharded). The tracer traces a B of the other remainder and drops the condition only
when that step is the same op by op (:func:`fxmem.trace.engine.lift.parity_checked`); a step that
really differs keeps it, and its formula is only claimed where the condition holds."""

import pytest
import sympy
import torch
from torch import nn

import fxmem
from fxmem.formula.symbols import B

ADAM = {"loss": lambda o: o.float().sum(), "optimizer": torch.optim.Adam, "device": "cpu"}


class Asks(nn.Module):
    """Asks whether B is even; ``differs``: an even B runs one op more (a clone), else the
    two answers run the same ops."""

    def __init__(self, differs):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.differs = differs

    def forward(self, x):
        y = self.lin(x)
        if x.shape[0] % 2 == 0:
            return y.clone() * 2 if self.differs else y * 2
        return y * 2


def _remainders(report):
    return [g for g in report.valid_when if "Mod" in str(g)]


@pytest.mark.parametrize("example", [2, 3])
def test_the_same_step_drops_the_condition(example):
    m = Asks(differs=False)
    r = fxmem.analyze(m, torch.randn(example, 8), **ADAM)
    assert _remainders(r) == []
    for b in (4, 5):
        assert r.peak_bytes(b) == fxmem.measure(m, torch.randn(example, 8), B=b,
                                                **ADAM).peak_bytes


@pytest.mark.parametrize("example,kept", [(2, sympy.Eq), (3, sympy.Ne)])
def test_a_different_step_keeps_it(example, kept):
    m = Asks(differs=True)
    r = fxmem.analyze(m, torch.randn(example, 8), **ADAM)
    (g,) = _remainders(r)
    assert isinstance(g, kept) and g.free_symbols == {B}
    # the formula holds where the condition does: the even B's step holds the clone
    b = 6 if kept is sympy.Eq else 7
    assert r.peak_bytes(b) == fxmem.measure(m, torch.randn(example, 8), B=b,
                                            **ADAM).peak_bytes
