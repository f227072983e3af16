"""FSDP2 per rank (issue 18): each rank's predicted peak equals a real multi-process run of
the same step (gloo, on this machine's CPU, fxmem.measure(..., parallel=...)), to the
byte, at batch sizes other than the traced one; ranks with uneven shards included."""

import dataclasses
import functools
import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.trace.parallel.fsdp import FSDP, stack_blocks

BATCHES = (3, 17)  # the example batch is 4


class Stack(nn.Module):
    """Blocks of Linear + ReLU and a head; 30 and 10 rows shard unevenly over 4 ranks."""

    def __init__(self, d=30, n=3, out=10):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.ReLU())
                                     for _ in range(n)])
        self.head = nn.Linear(d, out)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


STEP = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu")


def _batch():
    torch.manual_seed(0)
    return torch.randn(4, 30), torch.randint(0, 10, (4,))


def _exact(model, inputs, targets, parallel, batches=BATCHES, **step):
    """analyze once; measure every rank at each B in real processes: the same bytes."""
    step = {**STEP, **step}
    report = fxmem.analyze(model, inputs, targets, parallel=parallel, **step)
    for b in batches:
        measured = fxmem.measure(model, inputs, targets, B=b, parallel=parallel, **step)
        assert len(measured) == parallel.world_size
        got = [report.peak_bytes(b, rank=k) for k in range(parallel.world_size)]
        assert got == [m.peak_bytes for m in measured], (b, got)
    return report


@pytest.mark.parametrize("parallel", [
    FSDP(2),
    FSDP(4),
    FSDP(4, reshard_after_forward=False),
    FSDP(4, reshard_after_forward=2),
    FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    FSDP(4, param_dtype=torch.bfloat16),
], ids=lambda p: p.name)
def test_stack_per_rank(parallel):
    r = _exact(Stack(), *_batch(), parallel)
    # 30 rows over 4 ranks: 8, 8, 8, 6; 10 rows: 3, 3, 3, 1. The last rank differs.
    groups = [g.ranks for g in r.groups]
    assert groups == ([(0, 1)] if parallel.world_size == 2 else [(0, 1, 2), (3,)])


@pytest.mark.parametrize("optimizer", [
    torch.optim.SGD, functools.partial(torch.optim.SGD, momentum=0.9), torch.optim.Adam,
    torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop, torch.optim.NAdam,
    torch.optim.RAdam, torch.optim.Adamax,
], ids=lambda o: getattr(o, "__name__", None) or f"{o.func.__name__}-{o.keywords}")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_optimizer_steps_on_local_shards(optimizer, device, monkeypatch):
    """An elementwise optimizer's step runs on the ranks' local shards, not through DTensor
    (fxmem.trace.parallel.local_step): every rank's bytes as the real DTensor step's over
    gloo; Adamax (not elementwise: its foreach step stacks tensors) runs through DTensor."""
    from fxmem.trace.parallel import local_step

    ran = []
    locals_ = local_step._locals
    monkeypatch.setattr(local_step, "_locals", lambda *a: ran.append(1) or locals_(*a))
    elementwise = getattr(optimizer, "func", optimizer) in local_step.ELEMENTWISE
    if device == "cpu":
        _exact(Stack(), *_batch(), FSDP(4), batches=(3,), optimizer=optimizer)
    else:  # CUDA's foreach step: the recorded ops those of the step through DTensor
        ops = {}
        for on in (True, False):
            if not on:
                monkeypatch.setattr(local_step, "ELEMENTWISE", ())
            r = fxmem.analyze(Stack(), *_batch(), parallel=FSDP(2), loss=F.cross_entropy,
                              optimizer=optimizer, device="cuda")
            t = r.rank(1).trace
            ops[on] = [(op.op, op.phase, [str(t.storages[s].size.expr) for s in op.new_sids])
                       for op in t.ops], r.peak_bytes(5, rank=1)
            assert any(o[1] == "optimizer" for o in ops[on][0])
        assert ops[True] == ops[False]
    assert bool(ran) == elementwise


@pytest.mark.parametrize("parallel,groups", [
    (FSDP(4, replicate=2), [(0, 1, 2, 3)]),       # 30 rows over 2 shards: 15 and 15
    (FSDP(4, replicate=2, reshard_after_forward=False), [(0, 1, 2, 3)]),
    (FSDP(6, replicate=2), [(0, 1, 3, 4), (2, 5)]),  # over 3 shards: 10, 10, 10; 4, 4, 2
], ids=lambda p: p.name if isinstance(p, FSDP) else "")
def test_hsdp_per_rank(parallel, groups):
    """HSDP: ``fully_shard`` on a (replicate, shard) mesh; each rank holds the shards of its
    shard group, gradients reduce-scattered there, then all-reduced across the replicas."""
    r = _exact(Stack(), *_batch(), parallel)
    assert [g.ranks for g in r.groups] == groups
    # a replica's ranks hold what FSDP over the shard group's ranks would
    alone = fxmem.analyze(Stack(), *_batch(), parallel=FSDP(parallel.shards), **STEP)
    assert r.parts(0)["params"] == alone.parts(0)["params"]


@pytest.mark.parametrize("parallel", [
    FSDP(2, offload=True),
    FSDP(4, offload=True),                                   # uneven shards
    FSDP(2, offload=True, param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
], ids=lambda p: p.name)
def test_cpu_offload_per_rank(parallel):
    """CPUOffloadPolicy: the shards, their gradients, the optimizer state and the optimizer
    step are host memory; the device holds each shard's copy until the all-gather copies it
    in, the gathered blocks, the reduce-scatter buffers and the activations. The measured
    ranks make the same host-device copies (fxmem.trace.parallel.offload) and leave the host out."""
    r = _exact(Stack(), *_batch(), parallel)
    for k in range(parallel.world_size):
        parts = r.parts(k)
        assert parts["params"] == parts["grads"] == parts["optimizer_state"] == 0
    # what the device no longer holds: more than the model states it gave up, less the
    # device copies of one block's shards
    kept = fxmem.analyze(Stack(), *_batch(), parallel=dataclasses.replace(parallel,
                                                                          offload=False), **STEP)
    states = sum(kept.parts(0)[p] for p in ("params", "grads", "optimizer_state"))
    assert 0 < kept.peak_bytes(64, rank=0) - r.peak_bytes(64, rank=0) <= states


def test_cpu_offload_copies_to_the_device():
    """Each offloaded shard is copied to the device before its all-gather (a GPU run's
    host-to-device copy); the CPU's ``.to`` would return the shard itself."""
    from fxmem.trace import trace

    def copies(offload):
        t = trace(Stack(), *_batch(), parallel=FSDP(2, offload=offload), **STEP)
        return [op for op in t.ops if op.op == "aten.clone.default" and op.phase == "forward"]

    assert copies(False) == []
    # one copy of each of the 8 parameters' shards before its block's forward all-gather
    assert len(copies(True)) == len(list(Stack().parameters())) == 8


def test_reshard_after_forward_false_keeps_the_gathered_blocks():
    """Without resharding, each block's gathered parameters stay until its backward: a
    higher peak, by what the blocks gather."""
    x, y = _batch()
    on = fxmem.analyze(Stack(), x, y, parallel=FSDP(2), **STEP)
    off = fxmem.analyze(Stack(), x, y, parallel=FSDP(2, reshard_after_forward=False), **STEP)
    assert off.peak_bytes(64) > on.peak_bytes(64)


def test_the_shards_are_the_parts():
    """Params, grads and optimizer state per rank are the shards, derived by hand: each
    parameter's rows chunked as torch.chunk does, the storage padded to the largest chunk
    (FSDPParam._init_sharded_param), Adam's moments on the unpadded shard."""
    m = Stack()
    x, y = _batch()
    p = FSDP(4)
    r = fxmem.analyze(m, x, y, parallel=p, **STEP)
    for rank in range(4):
        padded = sum(-(-t.shape[0] // 4) * t[0].numel() * 4 for t in m.parameters())
        held = sum(p.shard_rows(t.shape[0], rank) * t[0].numel() * 4 for t in m.parameters())
        parts = r.parts(rank)
        assert parts["params"] == padded
        n = len(list(m.parameters()))
        assert parts["optimizer_state"] == 2 * held + 4 * n  # exp_avg, exp_avg_sq, step


def _hf(kind):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(cfg)
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4,
                                  n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    return transformers.GPT2LMHeadModel(cfg)


def _lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


@pytest.mark.parametrize("kind,world", [("llama", 2), ("llama", 4), ("gpt2", 2)])
def test_language_models(kind, world):
    m = _hf(kind)
    ids = torch.randint(0, 128, (2, 16))
    r = _exact(m, ids, ids, FSDP(world), batches=(3, 5), loss=_lm_loss,
               optimizer=torch.optim.AdamW)
    assert FSDP(world).block_paths(m) == tuple(
        f"{'model.layers' if kind == 'llama' else 'transformer.h'}.{i}" for i in range(2))
    assert r.peak_bytes(5) == max(r.peak_bytes(5, rank=k) for k in range(world))


def test_cuda_step_on_shards():
    """device="cuda": CUDA's kernels and foreach optimizer run on the shards; each
    parameter shard is one caching-allocator block, 512-byte rounded."""
    m = Stack()
    r = fxmem.analyze(m, *_batch(), parallel=FSDP(4), loss=F.cross_entropy,
                      optimizer=torch.optim.Adam, device="cuda")
    blocks = sum(-(-(-(-t.shape[0] // 4) * t[0].numel() * 4) // 512) * 512
                 for t in m.parameters())
    assert r.parts(0)["params"] == blocks
    assert "aten._foreach_add_.Scalar" in {op.op for op in r.rank(0).trace.ops}
    assert r.max_batch_size(gpu="H100-80GB") > 1000


def _recorded(t) -> tuple:
    """A trace's ops and storages, everything but object identities."""
    ops = [(o.op, o.phase, o.module, o.out_sids, o.new_sids, o.in_sids, o.written_sids,
            o.autograd_node, o.blas, o.reduce) for o in t.ops]
    storages = [(str(s.size.expr), s.category, s.name, s.module, s.created_by, s.freed_after,
                 s.saved, s.unref_after, s.resized_away, s.stream) for s in t.storages]
    return ops, storages


@pytest.mark.parametrize("kind,parallel,device", [
    ("stack", FSDP(4), "cpu"),
    ("stack", FSDP(4), "cuda"),
    ("stack", FSDP(4, reshard_after_forward=False), "cpu"),
    ("stack", FSDP(4, reshard_after_forward=2), "cuda"),
    ("stack", FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32), "cuda"),
    ("stack", FSDP(4, replicate=2), "cpu"),
    ("llama", FSDP(4), "cuda"),
    ("llama", FSDP(2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32), "cuda"),
], ids=lambda v: getattr(v, "name", v))
def test_initialisation_stands_for_the_warm_up_step(parallel, device, kind):
    """A rank's step is traced after FSDP2's own initialisation (lazy init, each module
    gathered and freed: fxmem.trace.parallel.fsdp.initialise), not after a whole unrecorded
    step (``warm_up=True``): both record the same ops and storages, on every rank group,
    on the CPU's and CUDA's kernels."""
    from fxmem.trace.engine import trace

    if kind == "stack":
        model, (x, y), step = Stack(), _batch(), dict(loss=F.cross_entropy)
    else:
        model, step = _hf("llama"), dict(loss=_lm_loss)
        x = y = torch.randint(0, 128, (2, 16))
    step.update(optimizer=torch.optim.AdamW, device=device, parallel=parallel,
                reuse_blocks=False)
    for ranks in parallel.rank_groups(model):
        initialised = trace(model, x, y, rank=ranks[0], **step)
        stepped = trace(model, x, y, rank=ranks[0], warm_up=True, **step)
        assert _recorded(initialised) == _recorded(stepped), ranks


def test_nothing_changes_outside():
    """The user's model keeps its parameters and class; no process group is left; the
    storage method fxmem wraps while tracing is PyTorch's again."""
    m = Stack()
    before = [(id(p), type(p)) for p in m.parameters()]
    resize = torch.UntypedStorage.resize_
    fxmem.analyze(m, *_batch(), parallel=FSDP(2), **STEP)
    gc.collect()
    assert [(id(p), type(p)) for p in m.parameters()] == before
    assert type(m) is Stack and not dist.is_initialized()
    assert torch.UntypedStorage.resize_ is resize
    assert "resize_" not in vars(torch.UntypedStorage)
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("make,words", [
    (lambda: FSDP(0), "world_size"),
    (lambda: FSDP(2.0), "world_size"),
    (lambda: FSDP(4, reshard_after_forward=8), "reshard_after_forward"),
    (lambda: FSDP(2, param_dtype=torch.int64), "param_dtype"),
    (lambda: FSDP(2, param_dtype="fp13"), "param_dtype"),
    (lambda: FSDP(2, blocks=[3]), "blocks"),
])
def test_bad_strategies(make, words):
    with pytest.raises(fxmem.InputError, match=words):
        make()


def test_bad_uses():
    x, y = _batch()
    with pytest.raises(fxmem.InputError, match="no submodule 'layers.7'"):
        fxmem.analyze(Stack(), x, y, parallel=FSDP(2, blocks=["layers.7"]), **STEP)
    with pytest.raises(fxmem.InputError, match="parallel is fxmem.FSDP"):
        fxmem.analyze(Stack(), x, y, parallel=4, **STEP)
    with pytest.raises(fxmem.InputError, match="on the CPU"):
        fxmem.measure(Stack(), x, y, B=2, parallel=FSDP(2), **{**STEP, "device": "cuda"})
    r = fxmem.analyze(Stack(), x, y, parallel=FSDP(2), **STEP)
    with pytest.raises(fxmem.InputError, match="rank is an int from 0 to 1"):
        r.rank(2)


def test_stack_blocks():
    m = Stack()
    assert stack_blocks(m) == ("layers.0", "layers.1", "layers.2")
    assert FSDP(2, blocks=nn.Linear).block_paths(m) == (
        "layers.0.0", "layers.1.0", "layers.2.0", "head")
    assert FSDP(2, blocks="head").block_paths(m) == ("head",)


def test_the_measured_reduce_scatter_reduces():
    """The real run's reduce-scatter (in place, as NCCL allocates) gives gloo's answer: each
    rank the sum of every rank's chunk, averaged for AVG."""
    from fxmem.validate.distributed import measure_ranks

    def one(model, params):
        rank = dist.get_rank()
        inp = torch.arange(8, dtype=torch.float32) + 10 * rank
        out = torch.empty(4)
        dist.reduce_scatter_tensor(out, inp)
        avg = torch.empty(4)
        dist.reduce_scatter_tensor(avg, torch.arange(8, dtype=torch.float32) + 10 * rank,
                                   op=dist.ReduceOp.AVG)
        return out.tolist(), avg.tolist()

    got = measure_ranks(nn.Linear(2, 2), None, FSDP(2), 1, one)
    assert got[0] == ([10.0, 12.0, 14.0, 16.0], [5.0, 6.0, 7.0, 8.0])
    assert got[1] == ([18.0, 20.0, 22.0, 24.0], [9.0, 10.0, 11.0, 12.0])


def test_a_failing_rank_is_one_error():
    from fxmem.validate.distributed import measure_ranks

    def one(model, params):
        raise ValueError("boom")

    with pytest.raises(fxmem.FxmemError, match="failed on rank 0: ValueError: boom"):
        measure_ranks(nn.Linear(2, 2), None, FSDP(2), 1, one)


def test_command_line():
    """``fxmem analyze ... --fsdp 4``: the ranks with the least room, the per-rank table
    beside it (tests/test_rank_table.py), the same figures as the library's."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ["analyze", "tests/test_fsdp.py:Stack", "--input", "B,30", "--target",
            "B:int64:10", "--optimizer", "adam", "--device", "cpu", "--fsdp", "4",
            "--budget", "1GiB", "--batch", "16", "--format", "json"]
    r = subprocess.run([sys.executable, "-m", "fxmem", *args], cwd=root, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    setup = doc["setup"]
    report = fxmem.analyze(Stack(), *_batch(), parallel=FSDP(4), **STEP)
    assert setup["parallel"] == "FSDP2 over 4 ranks"
    assert setup["ranks shown"] == "0-2 (the least room)"
    assert [(r["label"], r["tightest"]) for r in doc["ranks"]] == [("0-2", True), ("3", False)]
    assert doc["max_batch_size"] == report.max_batch_size(2**30) == min(
        report.rank(k).max_batch_size(2**30) for k in range(4))
    assert doc["peak_bytes"] == report.peak_bytes(16, rank=0)


def test_min_world_size_is_a_boundary():
    """The fewest ranks whose every rank fits B: the answer fits, one fewer does not."""
    m = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    x = torch.randn(2, 256)
    step = dict(loss=lambda o: o.sum(), optimizer=torch.optim.Adam, device="cpu")
    budget = 2_500_000
    w = fxmem.min_world_size(m, x, parallel=FSDP(1), budget_bytes=budget, B=16, **step)
    assert w > 1
    assert fxmem.analyze(m, x, parallel=FSDP(w), **step).peak_bytes(16) <= budget
    assert fxmem.analyze(m, x, parallel=FSDP(w - 1), **step).peak_bytes(16) > budget
    with pytest.raises(fxmem.InfeasibleBudgetError, match="on 4 ranks"):
        fxmem.min_world_size(m, x, parallel=FSDP(1), budget_bytes=10_000, B=16,
                             max_world_size=4, **step)


def test_whatif_has_a_sharding_row():
    x, y = _batch()
    rows = fxmem.whatif(Stack(), x, y, B=16, budget_bytes=2**20, parallel=FSDP(4), **STEP)
    row = rows[-1]
    r = fxmem.analyze(Stack(), x, y, parallel=FSDP(4), **STEP)
    assert row.method == "sharding" and row.peak_bytes == r.peak_bytes(16)
    assert row.max_batch_size == r.max_batch_size(2**20)
    assert row.peak_bytes < rows[0].peak_bytes  # the unsharded step's


@pytest.mark.parametrize("options", [dict(grad_accum=2), dict(amp=torch.bfloat16)],
                         ids=["grad_accum", "amp"])
def test_composes_with_the_training_loop(options):
    """Gradient accumulation (FSDP2 reduce-scatters after each micro-batch and accumulates
    the sharded gradient) and CPU autocast: exact per rank."""
    _exact(Stack(), *_batch(), FSDP(4), **options)


def test_composes_with_checkpointing():
    """Blocks under checkpoint_wrapper, gathered again for the recomputed forward: the
    Llama's recomputed blocks hold their input until the recompute lets go of it."""
    _exact(fxmem.apply_checkpoints(Stack(), ["layers.0", "layers.1", "layers.2"]),
           *_batch(), FSDP(4))
    m = fxmem.apply_checkpoints(_hf("llama"), ["model.layers.0", "model.layers.1"])
    ids = torch.randint(0, 128, (2, 16))
    _exact(m, ids, ids, FSDP(2), batches=(3, 5), loss=_lm_loss, optimizer=torch.optim.AdamW)


def test_command_line_hsdp_and_offload():
    """``--fsdp 4 --replicate 2 --offload``: HSDP with CPU offload, the library's figures."""
    import json

    from click.testing import CliRunner

    from fxmem.cli.command import cli

    r = CliRunner().invoke(cli, [
        "analyze", "tests/test_fsdp.py:Stack", "--input", "B,30", "--target", "B:int64:10",
        "--optimizer", "adam", "--device", "cpu", "--fsdp", "4", "--replicate", "2",
        "--offload", "--batch", "16", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    parallel = FSDP(4, replicate=2, offload=True)
    report = fxmem.analyze(Stack(), *_batch(), parallel=parallel, **STEP)
    assert doc["setup"]["parallel"] == parallel.name
    assert doc["peak_bytes"] == report.peak_bytes(16)
