"""The recorder's FX nodes (fxmem.trace.engine.recorder._call_node): made without their
arguments, which are set on them after, so that FX's walk of a call's arguments for raw
SymInts (none here) is not made; the step's graph the same as ``graph.call_function``'s."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.trace.engine import recorder


def _analyze():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))
    # CUDA AdamW: foreach ops, whose outputs are lists (getitem nodes), some with kwargs
    return fxmem.analyze(model, torch.randn(4, 16), torch.randint(0, 10, (4,)),
                         loss=F.cross_entropy, optimizer=torch.optim.AdamW, device="cuda")


def _graph(report):
    return [(n.name, n.op, str(n.target), repr(n.args), repr(n.kwargs),
             [u.name for u in n.users]) for n in report.trace.graph.nodes]


def test_call_nodes_are_made_without_their_arguments(monkeypatch):
    given = []  # for each call_function node: were its arguments given to create_node?
    create = torch.fx.Graph.create_node

    def spy(self, op, target, args=None, kwargs=None, *rest, **kw):
        if op == "call_function":
            given.append(bool(args or kwargs))
        return create(self, op, target, args, kwargs, *rest, **kw)
    monkeypatch.setattr(torch.fx.Graph, "create_node", spy)
    _analyze()
    assert given and not any(given)


def test_the_graph_is_the_one_call_function_makes(monkeypatch):
    fast = _graph(_analyze())
    monkeypatch.setattr(recorder, "_call_node", lambda g, f, args, kwargs=None:
                        g.call_function(f, args, dict(kwargs or {})))
    slow = _graph(_analyze())
    assert fast == slow
    assert any(kw != "{}" for *_, kw, _ in fast)  # kwargs set after too
    assert any(t == "<built-in function getitem>" for _, _, t, *_ in fast)
