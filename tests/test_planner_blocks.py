"""The planner's per-op indices (:mod:`fxmem.checkpoint.options`): which block owns an op
and how many blocks' windows hold it, against the definitions op by op."""

import random
from types import SimpleNamespace

import pytest

from fxmem.checkpoint.options import NotAChain, _covers, _owners


def _brute_covers(n, windows):
    out = []
    for t in range(n):
        inside = [k for k, (lo, hi) in enumerate(windows) if lo <= t < hi]
        if inside != list(range(len(inside))):
            raise NotAChain(f"the windows over op {t} are not a prefix of the blocks")
        out.append(len(inside))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_covers_are_the_windows_over_each_op(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 40)
    windows, lo, hi = [], rng.randint(0, 10), rng.randint(20, 45)
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.15:  # now and then a window that is not within the one before
            windows.append((rng.randint(-2, 45), rng.randint(-2, 48)))
        else:
            lo = rng.randint(lo, lo + 4)
            hi = rng.randint(min(hi, max(lo - 2, hi - 4)), hi)
            windows.append((lo, hi))
    try:
        want = _brute_covers(n, windows)
    except NotAChain as e:
        with pytest.raises(NotAChain, match=str(e)):
            _covers(n, windows)
        return
    assert _covers(n, windows) == want


def test_owners_are_the_blocks_an_op_is_in():
    blocks = ("m.layers.1", "m.layers.10", "m.layers.2", "m.head")
    mods = ["m", "m.layers.1", "m.layers.1.attn", "m.layers.10.mlp", "m.layers.100",
            "m.layers.2", "m.layers.2x", "m.head", "", "m.layers"]
    ops = [SimpleNamespace(index=i, module=m, phase=ph) for i, (m, ph) in enumerate(
        (m, ph) for m in mods for ph in ("forward", "backward", "optimizer"))]
    want = [-1] * len(ops)
    for k, p in enumerate(blocks):
        for o in ops:
            if o.phase in ("forward", "backward") and (o.module == p
                                                       or o.module.startswith(p + ".")):
                want[o.index] = k
    got = _owners(ops, blocks)
    assert got == want and set(got) == {-1, 0, 1, 2, 3}
