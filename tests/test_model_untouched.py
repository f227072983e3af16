"""``fxmem.analyze`` leaves the user's model exactly as it was: its parameters and buffers
(the same tensors, versions and values), every module's attributes and the items of its
dicts, lists and sets. A model is then copied and trained for real after the analysis."""

import copy

import torch
import torch.nn.functional as F

import fxmem

X, Y = torch.randn(4, 8), torch.randint(0, 3, (4,))
KW = {"loss": F.cross_entropy, "optimizer": torch.optim.Adam}


def _state(model):
    """What the trace could change, by identity where a value is an object."""
    mods = []
    for name, m in model.named_modules(remove_duplicate=False):
        attrs = dict(vars(m))
        items = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list)
                     else set(map(id, v)))
                 for k, v in attrs.items() if isinstance(v, (dict, list, set))}
        mods.append((name, m, attrs, items))
    tensors = [(n, t, type(t), t._version, t.detach().clone())
               for n, t in [*model.named_parameters(remove_duplicate=False),
                            *model.named_buffers(remove_duplicate=False)]]
    return mods, tensors


def _assert_unchanged(model, before):
    mods, tensors = _state(model)
    for (name, m, attrs, items), (_, m2, attrs2, items2) in zip(before[0], mods, strict=True):
        assert m is m2, name
        assert attrs.keys() == attrs2.keys(), name
        assert all(attrs[k] is attrs2[k] for k in attrs), name
        for k, v in items.items():
            w = items2[k]
            if isinstance(v, dict):
                assert v.keys() == w.keys() and all(v[i] is w[i] for i in v), f"{name}.{k}"
            elif isinstance(v, list):
                assert len(v) == len(w) and all(a is b for a, b in zip(v, w)), f"{name}.{k}"
            else:
                assert v == w, f"{name}.{k}"
    for (n, t, ty, ver, val), (_, t2, ty2, ver2, val2) in zip(before[1], tensors, strict=True):
        assert t is t2 and ty is ty2 and ver == ver2 and torch.equal(val, val2), n


def _real_step(model):
    """A copy of the model moved and trained for one real step (what fxmem.measure does)."""
    m = copy.deepcopy(model).to("cpu")
    opt = torch.optim.Adam(m.parameters())
    F.cross_entropy(m(X), Y).backward()
    opt.step()


class _Block(torch.nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.lin, self.shared = torch.nn.Linear(8, 8), shared

    def forward(self, x):
        return self.shared(torch.relu(self.lin(x)))


class _SharedSubmodule(torch.nn.Module):
    """One submodule reachable by several paths (timm CoaT: ``crpe1`` is also each serial
    block's ``factoratt_crpe.crpe``), with a buffer the step updates."""

    def __init__(self):
        super().__init__()
        self.pe = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
        self.blocks = torch.nn.Sequential(_Block(self.pe), _Block(self.pe), _Block(self.pe))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.blocks(self.pe(x)))


def test_a_submodule_shared_by_several_paths_keeps_its_real_parameters():
    """Named by every path, the shared slot's second swap saved the fake as its original, and
    the restore left fake parameters on the model: the copy's ``.to()`` then failed ("Couldn't
    swap Linear.weight"), or the heap was corrupted (timm CoaT)."""
    torch.manual_seed(0)
    m = _SharedSubmodule()
    before = _state(m)
    report = fxmem.analyze(m, X, Y, **KW, device="cpu")
    _assert_unchanged(m, before)
    _real_step(m)
    for b in (3, 6):  # the shared module's parameters counted once, as eager holds them
        assert report.peak_bytes(b) == fxmem.measure(m, X, Y, **KW, B=b).peak_bytes


class _Caching(torch.nn.Module):
    """A forward that caches a tensor in a dict it holds and registers a buffer on first use."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)
        self.tables = {}
        self.seen = []

    def forward(self, x):
        if "scale" not in self._buffers:
            self.register_buffer("scale", torch.ones(3))
        self.tables[x.shape[-1]] = self.lin.weight * 2  # a fake with autograd history
        self.seen.append(x.shape[0])
        return self.lin(x) * self.scale


def test_items_a_forward_puts_in_its_modules_dicts_and_lists_are_taken_back():
    m = _Caching()
    before = _state(m)
    fxmem.analyze(m, X, Y, **KW, device="cpu")
    _assert_unchanged(m, before)
    assert m.tables == {} and m.seen == [] and "scale" not in m._buffers
    _real_step(m)


def test_weights_tied_across_modules_stay_tied_and_real():
    """Two modules holding one Parameter: two slots, each swapped and restored."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.ReLU(),
                            torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 3))
    m[2].weight = m[0].weight
    before = _state(m)
    report = fxmem.analyze(m, X, Y, **KW, device="cpu")
    _assert_unchanged(m, before)
    assert m[0].weight is m[2].weight
    _real_step(m)
    assert report.peak_bytes(5) == fxmem.measure(m, X, Y, **KW, B=5).peak_bytes
