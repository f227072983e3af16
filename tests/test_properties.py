"""Property tests: random MLP/CNN shapes and batch sizes against the real step, and the
polynomial envelope against brute force."""

from fractions import Fraction as F

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fxmem
from fxmem.formula import poly as P

SETTINGS = dict(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(**SETTINGS)
@given(widths=st.lists(st.integers(1, 48), min_size=1, max_size=4),
       d_in=st.integers(1, 40), n_cls=st.integers(2, 9), inplace=st.booleans(),
       opt=st.sampled_from(["sgd", "adam", "none"]), batches=st.lists(st.integers(2, 40),
                                                                      min_size=2, max_size=3))
def test_random_mlp(widths, d_in, n_cls, inplace, opt, batches):
    layers, d = [], d_in
    for w in widths:
        layers += [nn.Linear(d, w), nn.ReLU(inplace=inplace)]
        d = w
    model = nn.Sequential(*layers, nn.Linear(d, n_cls))
    _check(model, torch.randn(5, d_in), torch.randint(0, n_cls, (5,)), opt, batches)


@settings(**SETTINGS)
@given(c1=st.integers(1, 8), c2=st.integers(1, 8), k=st.sampled_from([1, 3]),
       hw=st.integers(5, 12), pool=st.booleans(), bn=st.booleans(),
       opt=st.sampled_from(["sgd", "adam"]), batches=st.lists(st.integers(2, 12), min_size=2,
                                                              max_size=3))
def test_random_cnn(c1, c2, k, hw, pool, bn, opt, batches):
    model = nn.Sequential(
        nn.Conv2d(3, c1, k), nn.BatchNorm2d(c1) if bn else nn.Identity(), nn.ReLU(),
        nn.MaxPool2d(2) if pool else nn.Identity(), nn.Conv2d(c1, c2, 1), nn.ReLU(),
        nn.Flatten(), nn.LazyLinear(4) if False else nn.Identity())
    with torch.no_grad():
        d = model(torch.zeros(1, 3, hw, hw)).shape[1]
    model = nn.Sequential(model, nn.Linear(d, 4))
    _check(model, torch.randn(3, 3, hw, hw), torch.randint(0, 4, (3,)), opt, batches)


def _check(model, x, y, opt, batches):
    optim = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
             "adam": torch.optim.Adam, "none": None}[opt]
    loss = nn.functional.cross_entropy
    r = fxmem.analyze(model, x, y, loss=loss, optimizer=optim, device="cpu")
    for b in batches:
        assert r.peak_bytes(b) == fxmem.measure(model, x, y, loss=loss, optimizer=optim,
                                                B=b).peak_bytes


polys = st.lists(st.tuples(st.integers(-50, 200), st.integers(-20, 20), st.integers(-2, 2)),
                 min_size=1, max_size=8)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(polys)
def test_envelope_is_the_max_everywhere(cs):
    ps = [P.norm(c) for c in cs]
    pieces = P.upper_envelope(ps)
    assert pieces[0][0] == 1
    # sample points: integers, the breakpoints and points right after them
    xs = [F(x) for x in range(1, 60)] + [x for x, _ in pieces] + [x + F(1, 1000) for x, _ in
                                                                  pieces if isinstance(x, F)]
    for x in xs:
        if not isinstance(x, F):
            continue
        i = next(i for (x0, i) in reversed(pieces) if x0 <= x)
        assert P.evaluate(ps[i], x) == max(P.evaluate(p, x) for p in ps)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(polys, st.tuples(st.integers(-50, 200), st.integers(-20, 20)))
def test_le_on_agrees_with_sampling(cs, q):
    ps, q = [P.norm(c) for c in cs], P.norm(q)
    got = P.le_on(q, ps)
    sampled = all(P.evaluate(q, F(x, 4)) <= max(P.evaluate(p, F(x, 4)) for p in ps)
                  for x in range(4, 400))
    if got:
        assert sampled  # a proof can never be contradicted by a sample
    elif all(len(p) <= 2 for p in ps):
        # for lines, q exceeds the envelope on an interval that starts at 1, ends at a
        # crossing, or goes to infinity: one of those points shows it
        xs = {F(1), F(10**9)} | {x + d for x, _ in P.upper_envelope(ps) for d in (F(-1, 10**6),
                                                                                   F(1, 10**6))}
        xs |= set(P._real_roots_above(P.sub(q, P.ZERO), 0))
        assert any(x >= 1 and P.evaluate(q, x) > max(P.evaluate(p, x) for p in ps) for x in xs
                   ) or any(P.evaluate(q, F(x, 8)) > max(P.evaluate(p, F(x, 8)) for p in ps)
                            for x in range(8, 800))


def test_envelope_of_a_line_tangent_to_a_parabola_terminates():
    # 4x touches -x^2 + 8x - 4 at x = 2 (both 8, slope 4); the parabola bends below after it.
    # Unpadded derivative keys ranked the parabola first there, and the search never moved on.
    line, parabola = (F(0), F(4)), (F(-4), F(8), F(-1))
    assert P.upper_envelope([parabola, line], start=2) == [(F(2), 1)]
    assert P.le_on(parabola, [line], start=2)
    assert not P.le_on(line, [parabola], start=1)
