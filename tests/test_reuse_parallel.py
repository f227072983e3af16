"""Repeated blocks copied under FSDP2 (fxmem.trace.blocks.sharded; DDP and TP:
test_reuse_ddp_tp.py): a rank's trace with blocks copied reads exactly as the same rank's
trace block by block, FSDP2's all-gathers, reduce-scatters, side streams, reshards and
checkpoint plans' re-runs included; blocks that do not behave alike, and
the strategies whose blocks are not copied, are traced block by block."""

from collections import Counter
from dataclasses import fields, replace

import pytest
import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel

from fxmem.trace import trace
from fxmem.trace.ledger.records import TensorDesc
from fxmem.trace.parallel import TP
from fxmem.trace.parallel.fsdp import DDP, FSDP
from fxmem.trace.plans.regions import Region
from test_fsdp import _lm_loss
from test_reuse import DIFFERING, _Stack, _flops, _shape, differing

transformers = pytest.importorskip("transformers")


def _full(t):
    """:func:`test_reuse._shape` with each storage's stream, unref time and FSDP2 buffer
    kind too, each module call's pre-hooks' ops and arguments (where a checkpoint of it
    starts), and the storages made before the step each op reads."""
    def n(v):
        return -1 if v is None else v
    calls = sorted((c.path, c.first_op, c.hook_ops, c.last_op,
                    tuple(t.storages[s].created_by for s in c.arg_sids)) for c in t.calls)
    # the storages made before the step each op reads, by name (a rank's shards: FSDP2's
    # all-gathers read the block's own)
    named = [tuple(sorted(t.storages[s].name for s in o.in_sids if t.storages[s].created_by < 0))
             for o in t.ops]
    return _shape(t), sorted((s.created_by, s.stream, n(s.unref_after), s.resized_away,
                              s.data_bound, repr(s.fsdp_buffer)) for s in t.storages), calls, \
        named


def _both(model, inputs, targets, parallel, rank, **kw):
    a = trace(model, inputs, targets, parallel=parallel, rank=rank, **kw)
    b = trace(model, inputs, targets, parallel=parallel, rank=rank, reuse_blocks=False, **kw)
    assert b.reused == ()
    return a, b


def _lm(kind, layers=4):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=layers, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(cfg), "model.layers"
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=layers, n_head=4,
                                  n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg), "transformer.h"


CASES = [
    ("llama", FSDP(4), (0, 3), {}),
    ("gpt2", FSDP(2), (1,), {}),
    ("llama", FSDP(4, reshard_after_forward=False), (0,), {}),
    ("gpt2", FSDP(4, reshard_after_forward=2), (2,), {}),
    ("llama", FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32), (1,), {}),
    ("llama", FSDP(3), (0, 2), dict(device="cuda", amp=torch.bfloat16)),
    ("gpt2", FSDP(8), (7,), dict(device="cuda")),
    ("gpt2", FSDP(4, replicate=2), (1,), {}),
    ("llama", FSDP(2, offload=True), (0,), {}),
]


def _copied(parallel) -> tuple:
    """The blocks of a 5-block run copied under ``parallel``: from the third, or (FSDP2's
    defaults: the interior blocks copied with their hooks, the third traced) from the
    fourth."""
    from fxmem.trace.engine.tracer import _hookless

    return (3, 4) if _hookless(parallel) else (2, 3, 4)


@pytest.mark.parametrize("kind,parallel,ranks,step", CASES,
                         ids=[f"{k}-{p.name}-{s}" for k, p, _, s in CASES])
def test_copied_blocks_under_fsdp_equal_a_block_by_block_trace(kind, parallel, ranks, step):
    model, stack = _lm(kind, layers=5)
    ids = torch.randint(0, 128, (2, 16))
    step = {**dict(loss=_lm_loss, optimizer=torch.optim.AdamW, device="cpu"), **step}
    for rank in ranks:  # ranks with padded (uneven) shards among them
        a, b = _both(model, ids, ids, parallel, rank, **step)
        assert a.reused == tuple(f"{stack}.{i}" for i in _copied(parallel)), a.reused
        assert _full(a) == _full(b)
        assert _flops(a) == _flops(b)


def _every_field(t) -> dict:
    """Every field of trace ``t``, each storage named by the op that made it (and which of its
    new storages it is) or, made before the step, by its name, category, size and occurrence:
    two traces of one step, however their storages are numbered, compare equal. (The
    unmodelled allocations as a set: a copy's are listed after the recorded blocks'.)"""
    key, seen = {}, Counter()
    for o in t.ops:
        for k, s in enumerate(o.new_sids):
            key.setdefault(s, (o.index, k))
    for s in t.storages:
        if s.sid not in key:
            made = (s.name, s.category, str(s.size.expr))
            key[s.sid], seen[made] = (*made, seen[made]), seen[made] + 1

    def named(sids):
        return tuple(key[s] for s in sids)
    out = {f.name: getattr(t, f.name) for f in fields(t)
           if f.name not in ("graph_source", "reused", "unmodelled")}
    out["unmodelled"] = sorted(t.unmodelled)
    out["ops"] = [replace(o, out_sids=named(o.out_sids), new_sids=named(o.new_sids),
                          in_sids=named(o.in_sids), written_sids=named(o.written_sids))
                  for o in t.ops]
    out["storages"] = sorted(repr(replace(s, sid=0)) + repr(key[s.sid]) for s in t.storages)
    out["packs"] = sorted(repr(replace(p, sid=0)) + repr(key[p.sid]) for p in t.packs)
    out["calls"] = sorted(repr(replace(c, arg_sids=named(c.arg_sids))) for c in t.calls)
    return out


def _graph_reads(t) -> list:
    """Each op's node in the trace's graph (what named dims read), with the ops that made
    the storages its inputs are on."""
    out = []
    for node in t.graph.nodes:
        if "index" not in node.meta:
            continue
        made = []
        for a in node.all_input_nodes:
            v = a.meta.get("val")
            made += [t.storages[x.sid].created_by for x in (v if isinstance(v, tuple) else (v,))
                     if isinstance(x, TensorDesc) and x.sid >= 0]
        out.append((node.meta["index"], tuple(sorted(made))))
    return sorted(out)


@pytest.mark.parametrize("layers,parallel,rank,step,copied", [
    (8, FSDP(4), 1, dict(device="cuda", amp=torch.bfloat16), range(3, 8)),
    (7, FSDP(3), 2, dict(device="cpu", checkpoint="whole"), range(3, 7)),
    # the plan splits the blocks in two runs, 0-4 with 6 and 5 alone: the first run's blocks
    # are not neighbours (FSDP2 passes its storages to block 5), so their hooks run
    (7, FSDP(5), 0, dict(device="cpu", checkpoint="apart"), (2, 3, 4, 6)),
], ids=["cuda-bf16", "cpu-checkpointed", "cpu-run-apart"])
def test_interior_blocks_copied_with_their_hooks_equal_a_block_by_block_trace(
        layers, parallel, rank, step, copied):
    # the interior blocks (the 4th to the one before last) run without FSDP2's hooks: each
    # is a copy of the third block's hooks' ops and its own, the all-gathers, prefetches and
    # reduce-scatter states passed between copies relinked, on FSDP2's streams (cuda)
    model, stack = _lm("llama", layers=layers)
    ids = torch.randint(0, 128, (2, 16))
    if step.get("checkpoint") == "whole":
        step = {**step, "checkpoint": [f"{stack}.{i}" for i in range(layers)]}
    elif step.get("checkpoint") == "apart":
        step = {**step, "checkpoint": [f"{stack}.{i}" for i in (0, 1, 2, 3, 4, 6)] + [
            Region((f"{stack}.5",), save=(("aten.mm.default", 1),))]}
    a, b = _both(model, ids, ids, parallel, rank, loss=_lm_loss, optimizer=torch.optim.AdamW,
                 **step)
    assert a.reused == tuple(f"{stack}.{i}" for i in copied)
    assert _full(a) == _full(b)
    assert _every_field(a) == _every_field(b)
    assert _flops(a) == _flops(b)
    assert _graph_reads(a) == _graph_reads(b)


@pytest.mark.parametrize("kind", DIFFERING)
def test_blocks_that_differ_under_fsdp_fall_back_and_stay_exact(kind):
    model, copied = differing(kind)
    x = torch.randn(4, 16)
    a, b = _both(model, (x,), (), FSDP(2), 1, loss=None, optimizer=torch.optim.SGD,
                 device="cpu")
    # (a first block fed the model's input: the run's interior blocks copied with their
    # hooks fail, and it is copied with every block's hooks run, from its third block)
    assert a.reused == (copied[1:] if kind == "plain" and _copied(FSDP(2)) == (3, 4)
                        else copied)
    assert _full(a) == _full(b)


@pytest.mark.parametrize("parallel,copied", [
    (FSDP(2), True), (FSDP(4, reshard_after_forward=2), True),
    (FSDP(2, reshard_after_forward=False), False)])
def test_inference_under_fsdp(parallel, copied):
    # reshard_after_forward=False: the warm-up step leaves the blocks gathered, and a
    # block's parameters are first seen by its own ops: every block is traced
    x = torch.randn(4, 16)
    a, b = _both(_Stack(), (x,), (), parallel, 1, loss=None, train=False, device="cpu")
    assert a.reused == (("blocks.2", "blocks.3", "blocks.4") if copied else ())
    assert _full(a) == _full(b)


PLANNED = [("llama", FSDP(4), 3, "whole"), ("llama", FSDP(3), 0, "selective"),
           ("gpt2", FSDP(2), 1, "inner"), ("llama", FSDP(2), 1, "ends"),
           ("llama", FSDP(3), 2, "apart")]


@pytest.mark.parametrize("kind,parallel,rank,name", PLANNED,
                         ids=[f"{k}-{p.name}-{n}" for k, p, _, n in PLANNED])
def test_checkpointed_blocks_under_fsdp_are_copied_exactly(kind, parallel, rank, name):
    # FSDP2's all-gather before a block's backward, then the block's re-run: copied too
    model, stack = _lm(kind, layers=5)
    ids = torch.randint(0, 128, (2, 16))
    plan = {"whole": [f"{stack}.{i}" for i in range(5)],
            "selective": [Region((f"{stack}.{i}",), save=(("aten.mm.default", 1),))
                          for i in range(5)],
            "inner": [f"{stack}.{i}.mlp" for i in range(5)],
            # blocks treated alike are one run wherever they are (the others not checkpointed)
            "ends": [f"{stack}.{i}" for i in (0, 1, 4)],
            "apart": [f"{stack}.{i}" for i in (0, 2, 4)]}[name]
    a, b = _both(model, ids, ids, parallel, rank, loss=_lm_loss, optimizer=torch.optim.AdamW,
                 device="cpu", checkpoint=plan)
    assert a.reused == tuple(f"{stack}.{i}" for i in ((4,) if name in ("ends", "apart")
                                                      else _copied(parallel))), a.reused
    assert _full(a) == _full(b)
    assert _flops(a) == _flops(b)


def test_other_strategies_trace_every_block():
    model = _Stack()
    x = torch.randn(4, 16)
    step = dict(loss=None, optimizer=torch.optim.SGD, device="cpu")
    assert trace(model, x, parallel=FSDP(2), **step).reused  # the same model is copied
    assert trace(model, x, parallel=DDP(2), **step).reused
    assert trace(model, x, parallel=DDP(2, gradient_as_bucket_view=True), **step).reused
    tp = TP(2, {f"blocks.{i}.fc": ColwiseParallel(output_layouts=Replicate())
                for i in range(5)})
    assert trace(model, x, parallel=tp, **step).reused
    # blocks whose outputs are DTensors (a stand-in makes plain tensors)
    tp = TP(2, {f"layers.{i}": ColwiseParallel(output_layouts=Replicate(),
                                               use_local_output=False) for i in range(5)})
    assert trace(_DTensorsOut(), x, parallel=tp, **step).reused == ()


class _DTensorsOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(5))

    def forward(self, x):
        for m in self.layers:
            x = m(x).tanh()
        return x.to_local().square().mean()


def test_tracing_under_fsdp_leaves_the_model_as_it_was():
    model = _Stack()
    trace(model, torch.randn(4, 16), parallel=FSDP(2), loss=None, device="cpu")
    assert all("forward" not in vars(m) for m in model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
