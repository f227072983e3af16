"""Repeated blocks copied under DDP and ZeRO-1 (fxmem.trace.blocks.replicated), TP and FSDP2
over TP (fxmem.trace.blocks.sharded): a rank's trace with blocks copied reads exactly as the
same rank's trace block by block, DDP's buckets (rebuilt in the order a real block's
gradients come in, straddling blocks, and with the gradients as their views), TP's
sharded gradients and a checkpoint plan's re-runs included. (A file of its own beside
test_reuse_parallel.py: each file runs on one worker.)"""

import pytest
import torch

from fxmem.trace.parallel import TP
from fxmem.trace.parallel.fsdp import DDP, FSDP
from fxmem.trace.parallel.tp import Parallel
from fxmem.trace.plans.regions import Region
from test_fsdp import _lm_loss
from test_reuse import _flops
from test_reuse_parallel import _both, _full, _lm

transformers = pytest.importorskip("transformers")


# Four blocks: two traced, two copied (CI time: each case traces twice; DDP over 2 ranks
# of GPT-2 is ZeRO-1's case without the sharded optimizer)
LAYERS = 4
COPIED = (2, 3)

REPLICATED = [
    ("llama", DDP(2), {}),
    # buckets of 10 KB: they hold parameters of two blocks, other ones in each block
    ("llama", DDP(4, bucket_cap_mb=0.01), {}),
    ("gpt2", DDP(4, bucket_cap_mb=0.01), {}),
    ("llama", DDP(2, static_graph=True), {}),
    ("gpt2", DDP(2, zero1=True), {}),
    ("llama", DDP(3), dict(device="cuda", amp=torch.bfloat16)),
    # the gradients views of the buckets: no storage of their own
    ("llama", DDP(2, gradient_as_bucket_view=True), {}),
    ("gpt2", DDP(4, bucket_cap_mb=0.01, gradient_as_bucket_view=True), {}),
    ("llama", DDP(2, bucket_cap_mb=0.01, gradient_as_bucket_view=True),
     dict(device="cuda", amp=torch.bfloat16)),
]


def _named(t):
    """Each op's storages by name: which of DDP's buckets (``<DDP reducer>[i]``) it reads
    and writes, which :func:`test_reuse_parallel._full` sees only by their creator op."""
    return [(o.op, o.module, sorted(t.storages[s].name for s in {*o.in_sids, *o.written_sids}))
            for o in t.ops]


@pytest.mark.parametrize("kind,parallel,step", REPLICATED,
                         ids=[f"{k}-{p.name}-{s}" for k, p, s in REPLICATED])
def test_copied_blocks_under_ddp_equal_a_block_by_block_trace(kind, parallel, step):
    # the Reducer's copies into its buckets copied with each block, into the stand-in's
    # own buckets; the buckets rebuilt in the order a real block's gradients come in
    model, stack = _lm(kind, layers=LAYERS)
    ids = torch.randint(0, 128, (2, 16))
    step = {**dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu"), **step}
    a, b = _both(model, ids, ids, parallel, 0, **step)
    assert a.reused == tuple(f"{stack}.{i}" for i in COPIED)
    assert _full(a) == _full(b)
    assert _named(a) == _named(b)
    assert _flops(a) == _flops(b)


def test_checkpointed_blocks_under_ddp_are_copied_exactly():
    model, stack = _lm("llama", layers=LAYERS)
    ids = torch.randint(0, 128, (2, 16))
    plan = [Region((f"{stack}.{i}",), save=(("aten.mm.default", 1),)) for i in range(LAYERS)]
    a, b = _both(model, ids, ids, DDP(2, bucket_cap_mb=0.01), 1, loss=_lm_loss,
                 optimizer=torch.optim.AdamW, device="cpu", checkpoint=plan)
    assert a.reused == tuple(f"{stack}.{i}" for i in COPIED)
    assert _full(a) == _full(b)


@pytest.mark.parametrize("views", [False, True], ids=["grads", "bucket-views"])
def test_gradients_in_another_order_than_the_warm_up_s_trace_every_block(monkeypatch, views):
    # the stand-ins hand the Reducer their gradients in the order autograd gave for the
    # warm-up's third block; the pattern block's own order is checked after the step
    from fxmem.trace.blocks import replicated

    monkeypatch.setattr(replicated, "_ready_order",
                        lambda block, args, kwargs, params: [n for n, _ in params])
    model, stack = _lm("llama", layers=3)  # the fewest blocks that copy one
    ids = torch.randint(0, 128, (2, 16))
    a, b = _both(model, ids, ids, DDP(2, gradient_as_bucket_view=views), 0, loss=_lm_loss,
                 optimizer=torch.optim.AdamW, device="cpu")
    assert a.reused == ()
    assert _full(a) == _full(b)


# TP alone on CPU, FSDP2 over TP on CUDA under bf16 autocast (its TP the same plan)
SPLIT = [
    (TP(2), 1, {}),
    (Parallel(fsdp=FSDP(2), tp=TP(2)), 0, dict(device="cuda", amp=torch.bfloat16)),
]


@pytest.mark.parametrize("parallel,rank,step", SPLIT,
                         ids=[f"{p.name}-{r}-{s.get('device', 'cpu')}" for p, r, s in SPLIT])
def test_copied_blocks_under_tp_equal_a_block_by_block_trace(parallel, rank, step):
    # the model's own plan: each block's projections sharded (DTensor parameters, their
    # gradients DTensors of the same placements), TP's input and output hooks on each
    model, stack = _lm("llama", layers=LAYERS)
    ids = torch.randint(0, 128, (2, 16))
    step = {**dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu"), **step}
    a, b = _both(model, ids, ids, parallel, rank, **step)
    assert a.reused == tuple(f"{stack}.{i}" for i in COPIED)
    assert _full(a) == _full(b)
    assert _flops(a) == _flops(b)
