"""``report.parts["activations"]`` follows the checkpoint plan (issue 41 item 6): it is the
most bytes held for backward at once (the activations autograd saves, the checkpoints a
plan keeps, the outputs a selective plan keeps, a recomputed region's saved tensors while
its backward runs), the same whether the plan is derived from one trace
(``analyze(checkpoint=...)``, ``Report.with_plan``) or traced with PyTorch's own
``checkpoint_wrapper`` applied, and counted by hand below."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem import B
from fxmem.memory.liveness import held_for_backward

STEP = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu")
D = 64  # a block's input and output: D floats a sample (256*B bytes); its ReLU's: 4*D
BLOCKS = [f"layers.{i}" for i in range(4)]
WHOLE = BLOCKS
# selective: each block keeps its second matmul's output (fc2's addmm, 256*B bytes)
SELECTIVE = [fxmem.Region((p,), save=(("aten.addmm.default", 1),)) for p in BLOCKS]


class Block(nn.Module):
    def __init__(self, d=D):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, d=D, n=4):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _batch():
    torch.manual_seed(0)
    return torch.randn(4, D), torch.randint(0, 10, (4,))


def _reports(plan):
    """The step under ``plan``: derived (checkpoint=, with_plan) and traced (wrapped)."""
    x, y = _batch()
    base = fxmem.analyze(Stack(), x, y, **STEP)
    return {"checkpoint=": fxmem.analyze(Stack(), x, y, checkpoint=plan, **STEP),
            "with_plan": base.with_plan(plan),
            "traced": fxmem.analyze(fxmem.apply_checkpoints(Stack(), plan), x, y, **STEP)}


def _most_held(report, b):
    """The most bytes held for backward at once at batch size b, op by op."""
    lv = report.liveness
    held = held_for_backward(lv.graph)
    return max(sum(lv.sizes[s](b) for s in lv.live_sids(i) if s in held)
               for i in range(len(lv.graph.ops)))


def test_no_plan_activations_are_what_the_forward_saves():
    """Blocks 1-3's inputs (block 0's is the batch), each block's ReLU output, the head's
    input, log_softmax's output and nll_loss's total weight: all live as backward begins."""
    x, y = _batch()
    r = fxmem.analyze(Stack(), x, y, **STEP)
    assert r.parts["activations"] == 3 * 256 * B + 4 * 1024 * B + 256 * B + 40 * B + 4
    assert int(r.parts["activations"].subs(B, 8)) == _most_held(r, 8)


@pytest.mark.parametrize("plan, by_hand", [
    # the three checkpoints, and block 3's recomputed ReLU output while its backward runs
    (WHOLE, 3 * 256 * B + 1024 * B),
    # ... and the four fc2 outputs kept (block 3's handed back to its re-run)
    (SELECTIVE, 3 * 256 * B + 4 * 256 * B + 1024 * B),
], ids=["whole_blocks", "selective"])
def test_a_plan_s_activations_follow_it(plan, by_hand):
    x, y = _batch()
    none = fxmem.analyze(Stack(), x, y, **STEP)
    for how, r in _reports(plan).items():
        acts = r.parts["activations"]
        assert acts == by_hand, how
        for b in (2, 8, 64):
            assert int(acts.subs(B, b)) == _most_held(r, b), (how, b)
            assert int(acts.subs(B, b)) < int(none.parts["activations"].subs(B, b))
        # the other parts are the step's, whatever the plan
        assert {k: v for k, v in r.parts.items() if k != "activations"} == \
            {k: v for k, v in none.parts.items() if k != "activations"}


def test_whole_blocks_and_selective_differ_as_their_peaks_do():
    """Was: 1064*B + 4 for both traced plans (the outputs selective checkpointing keeps
    were not counted), while their peaks differ."""
    whole, sel = _reports(WHOLE)["traced"], _reports(SELECTIVE)["traced"]
    assert whole.peak_bytes(64) < sel.peak_bytes(64)
    assert whole.parts["activations"].subs(B, 64) < sel.parts["activations"].subs(B, 64)


def _forward_storages(report):
    """(category, bytes) of each storage the forward makes, sorted."""
    lv = report.liveness
    return sorted((s.category, str(s.size.expr)) for s in lv.graph.storages
                  if s.created_by >= 0 and lv.graph.ops[s.created_by].phase == "forward")


def test_the_traced_plan_labels_what_the_derived_one_does():
    """A checkpoint's inputs and the outputs a selective plan keeps are activations (saved
    for backward) in both. Was: activations traced, temporaries derived (the inputs);
    temporaries in both (the kept outputs)."""
    # blocks 1-3's inputs, the head's; under the selective plan the four fc2 outputs too
    for plan, kept in ((WHOLE, 3 + 1), (SELECTIVE, 3 + 1 + 4)):
        reports = _reports(plan)
        derived, traced = reports["with_plan"], reports["traced"]
        assert derived.peak == traced.peak
        assert _forward_storages(derived) == _forward_storages(traced)
        assert _forward_storages(traced).count(("activation", str(256 * B))) == kept


def test_micro_batches_do_not_add_up():
    """With gradient accumulation each micro-batch's activations are freed by its backward
    before the next forward: the most held at once is one micro-batch's."""
    x, y = _batch()
    one = fxmem.analyze(Stack(), x, y, **STEP)
    two = fxmem.analyze(Stack(), x, y, grad_accum=2, **STEP)
    assert two.parts["activations"] == one.parts["activations"]


def test_a_users_own_selective_policy_counts_too():
    """``checkpoint_wrapper(context_fn=...)`` with PyTorch's
    ``create_selective_checkpoint_contexts`` and the user's op list (both matmuls kept):
    the same as the Region keeping them, derived or traced, counted by hand: the three
    checkpoints, each block's two matmul outputs, block 3's recomputed ReLU output."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    m = Stack()
    policy = functools.partial(create_selective_checkpoint_contexts,
                               [torch.ops.aten.addmm.default])
    for i, layer in enumerate(m.layers):
        m.layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                         context_fn=policy)
    both = [fxmem.Region((p,), save=(("aten.addmm.default", 0), ("aten.addmm.default", 1)))
            for p in BLOCKS]
    x, y = _batch()
    users = fxmem.analyze(m, x, y, **STEP)
    assert users.parts["activations"] == 3 * 256 * B + 4 * (1024 + 256) * B + 1024 * B
    for r in _reports(both).values():
        assert r.parts["activations"] == users.parts["activations"]
        assert r.peak == users.peak


def test_a_plan_s_parts_are_made_when_first_read():
    """A planner's walk derives dozens of plans' steps and replays them, or asks their peak:
    their parts (formulas over every storage) are made only when read, then kept."""
    x, y = _batch()
    r = fxmem.analyze(Stack(), x, y, **STEP).with_plan(WHOLE)
    r.peak_bytes(8)
    assert r.parts._made is None
    assert r.parts["activations"] == 3 * 256 * B + 1024 * B
    assert r.parts._made is not None and dict(r.parts) == r.parts._made
