"""Parallel steps for the fake GPU's ranks (tests/test_fake_gpu_parallel.py): each case is a
model, its example batch and a strategy; :func:`measure` runs in each rank's process
(:func:`fxmem.validate.fakegpu.ranks.call_ranks`), :func:`case` also in the test's, for the
prediction."""

import collections
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from fxmem import DDP, FSDP, TP, Parallel
from test_fsdp import Stack as _Stack

# test_fsdp's blocks of Linear + ReLU and a head, at width 64 (FSDP2 shards each block, then
# the root)
Stack = functools.partial(_Stack, d=64)


class MLP(nn.Module):
    """Up, ReLU, down; ``up`` column-wise and ``down`` row-wise under TP (every parameter a
    DTensor: CUDA's foreach Adam takes no mix of DTensors and plain tensors)."""

    def __init__(self, d=64, hidden=256):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


MLP_PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}


class CausalMath(nn.Module):
    """Causal attention whose CUDA kernel is the math one on every PyTorch (a head dim of 6,
    which no fused kernel takes: tests/test_ddp.py's ``_CausalMath``), which makes its
    causal mask, a bool tensor of L x L, from no tensor; then a head over the mean token."""

    def __init__(self, d=32):
        super().__init__()
        self.q = nn.Linear(d, 24)
        self.head = nn.Linear(24, 10)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 6).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return self.head(a.transpose(1, 2).reshape(b, n, 24).mean(1))

class Stemmed(nn.Module):
    """A stem, seven identical blocks of Linear + ReLU and a head: the first block is given
    the stem's output (which needs a gradient), so under FSDP2's defaults the blocks between
    the third and the last run without FSDP2's hooks, copies of the third's
    (fxmem.trace.blocks.sharded)."""

    def __init__(self, d=64, n=7, out=10):
        super().__init__()
        self.stem = nn.Linear(d, d)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.ReLU())
                                     for _ in range(n)])
        self.head = nn.Linear(d, out)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# at width 1,024 every gathered block, reduce-scatter input and output is a large-pool block
# (4,198,400 B gathered, 2,099,200 B each rank's gradients of a block): each FSDP2 stream
# reserves large segments of its own; "kept": gradients kept across steps
# (zero_grad(set_to_none=False)), views of the first step's reduce-scatter output
Wide = functools.partial(_Stack, d=1024)

AMP_SGD = {"amp": torch.bfloat16, "optimizer": torch.optim.SGD}
CASES = {  # name: (model, strategy, input width, step options)
    "fsdp": (Stack, lambda: FSDP(2), 64, {}),
    "fsdp-keep": (Stack, lambda: FSDP(2, reshard_after_forward=False), 64, {}),
    "fsdp-wide": (Wide, lambda: FSDP(2), 1024, {}),
    "fsdp-wide-kept": (Wide, lambda: FSDP(2), 1024, {"set_to_none": False}),
    "ddp": (Stack, lambda: DDP(2), 64, {}),
    # a 12 MiB bucket (3 blocks of 4 MiB and the head: the large pool), made when DDP is
    # constructed and again where it was when the buckets are rebuilt, before any cuBLAS
    # workspace's 32 MiB segment is cached
    "ddp-wide": (Wide, lambda: DDP(2), 1024, {}),
    "tp": (MLP, lambda: TP(2, MLP_PLAN), 64, {}),
    # six identical blocks: the rank's trace copies the last three (fxmem.trace.blocks:
    # under DDP its Reducer's copies into the buckets, under TP the DTensor gradients); with
    # buckets of 20 KB, buckets straddle the blocks
    "ddp-reused": (lambda: Stack(n=6), lambda: DDP(2), 64, {}),
    "ddp-reused-buckets": (lambda: Stack(n=6), lambda: DDP(2, bucket_cap_mb=0.02), 64, {}),
    # the gradients views of those buckets
    # the math attention's causal mask, made from no tensor, is the step's under DDP too
    # (not run for real as the Reducer's bookkeeping, its bytes uncounted): inputs of
    # 128 tokens of width 32, a mask of 16 KiB
    "ddp-causal-mask": (CausalMath, lambda: DDP(2), (2048, 32), {}),
    "ddp-reused-views": (lambda: Stack(n=6), lambda: DDP(
        2, bucket_cap_mb=0.02, gradient_as_bucket_view=True), 64, {}),
    "tp-reused": (lambda: _blocks_of(6), lambda: TP(2, BLOCKS_PLAN_OWN), 256, {}),
    "fsdp-interior": (Stemmed, lambda: FSDP(2), 64, {}),
    "fsdp-tp-reused": (lambda: _blocks_of(6), lambda: Parallel(
        fsdp=FSDP(2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    # autocast around FSDP2's step, every block checkpointed: autocast's weight cache holds a
    # bf16 copy of each gathered weight until the forward ends (fxmem.report.precision; the
    # prediction without the cache is 10,576,896 B under it at B=4 on 2.14.1), and with
    # FSDP2's own param_dtype autocast casts no weight
    "fsdp-amp": (lambda: _checkpointed(Wide(n=16)), lambda: FSDP(4), 1024, AMP_SGD),
    "fsdp-amp-param-dtype": (lambda: _checkpointed(Wide(n=16)), lambda: FSDP(
        4, param_dtype=torch.bfloat16, reduce_dtype=torch.float32), 1024, AMP_SGD),
    # as torchtitan did: each block torch.compile(block) put back in the model, then sharded
    "fsdp-compiled": (lambda: _blocks("each"), lambda: FSDP(2), 256, {}),
    # as torchtitan does now: each block compiled in place (block.compile()), then sharded
    "fsdp-compiled-in-place": (lambda: _blocks("in_place"), lambda: FSDP(2), 256, {}),
    # torchtitan's recipe: each block checkpoint_wrapper(block), then torch.compile of that
    # put back, then sharded (PyTorch alone: fxmem's plan over fsdp-compiled's blocks is
    # checked against it)
    "fsdp-compiled-checkpointed": (lambda: _blocks("checkpointed"), lambda: FSDP(2), 256, {}),
    # torchtitan's recipe now: each block checkpoint_wrapper(block) put back, then compiled
    # in place (.compile() on the wrapper), then sharded (fxmem's plan over
    # fsdp-compiled-in-place's blocks is checked against it)
    "fsdp-compiled-checkpointed-in-place": (lambda: _blocks("checkpointed_in_place"),
                                            lambda: FSDP(2), 256, {}),
    # HSDP: 2 replicas of 2 shards (fully_shard on a 2-D mesh over 4 ranks)
    "hsdp": (Stack, lambda: FSDP(4, replicate=2), 64, {}),
    "hsdp-compiled": (lambda: _blocks("each"), lambda: FSDP(4, replicate=2), 256, {}),
    "hsdp-compiled-checkpointed": (lambda: _blocks("checkpointed"), lambda: FSDP(4, replicate=2),
                                   256, {}),
    # FSDP2's CPU offload: the shards, their gradients and the optimizer state in pinned
    # host memory, the optimizer step on the host
    "fsdp-offload": (Stack, lambda: FSDP(2, offload=True), 64, {}),
    "fsdp-compiled-offload": (lambda: _blocks("each"), lambda: FSDP(2, offload=True), 256, {}),
    "fsdp-compiled-checkpointed-offload": (lambda: _blocks("checkpointed"),
                                           lambda: FSDP(2, offload=True), 256, {}),
    "fsdp-compiled-in-place-offload": (lambda: _blocks("in_place"),
                                       lambda: FSDP(2, offload=True), 256, {}),
    "fsdp-compiled-checkpointed-in-place-offload": (
        lambda: _blocks("checkpointed_in_place"), lambda: FSDP(2, offload=True), 256, {}),
    "hsdp-compiled-in-place": (lambda: _blocks("in_place"), lambda: FSDP(4, replicate=2),
                               256, {}),
    "hsdp-compiled-checkpointed-in-place": (lambda: _blocks("checkpointed_in_place"),
                                            lambda: FSDP(4, replicate=2), 256, {}),
    # compile= under a strategy: each block compiled in place in each rank's copy, then
    # sharded (fxmem.trace.compiled.Compile.blocks); measured, fsdp-compiled-in-place's
    # figures (PyTorch alone) and the step measured with compile= (fxmem.measure's ranks),
    # and under a partitioner budget, which saves less
    "fsdp-compile-option": (lambda: _blocks("eager"), lambda: FSDP(2), 256, {"compile": True}),
    "fsdp-compile-budget": (lambda: _blocks("eager"), lambda: FSDP(2), 256,
                            {"compile": {"activation_memory_budget": 0.3}}),
    "fsdp-compile-budget-0.7": (lambda: _blocks("eager"), lambda: FSDP(2), 256,
                                {"compile": {"activation_memory_budget": 0.7}}),
    "ddp-compile-option": (lambda: _blocks("eager"), lambda: DDP(2), 256, {"compile": True}),
    "fsdp-tp-compile-option": (lambda: _blocks("eager"), lambda: Parallel(
        fsdp=FSDP(2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {"compile": True}),
    # a block compiled on its own, then its linears split column- and row-wise (the
    # compiled graph runs on the local shards: DTensor's ops traced by dynamo)
    "tp-compiled": (lambda: _tp_block("each"), lambda: TP(2, TP_BLOCK), 256, {}),
    "tp-compiled-in-place": (lambda: _tp_block("in_place"), lambda: TP(2, TP_BLOCK_OWN), 256,
                             {}),
    # torchtitan's recipe under TP: the block checkpoint_wrapper(block), then torch.compile
    # of that put back, then its linears split (the plan seen through the wrapper)
    "tp-compiled-checkpointed-in-place": (lambda: _tp_block("checkpointed_in_place"),
                                          lambda: TP(2, TP_BLOCK_OWN), 256, {}),
    "tp-compiled-checkpointed": (lambda: _tp_block("checkpointed"), lambda: TP(2, TP_BLOCK),
                                 256, {}),
    # each block torch.compile(block) put back (or compiled in place), then the model wrapped
    # by DDP: DDP's forward makes dynamo split each block's graph at its buckets' bounds
    # (DDPOptimizer), in the trace as in the run; with ZeRO-1, and with the gradients views
    # of the buckets
    "ddp-compiled": (lambda: _blocks("each"), lambda: DDP(2), 256, {}),
    "ddp-compiled-in-place": (lambda: _blocks("in_place"), lambda: DDP(2), 256, {}),
    # torchtitan's recipe under DDP (and under HSDP above): checkpoint, compile, then wrap
    "ddp-compiled-checkpointed": (lambda: _blocks("checkpointed"), lambda: DDP(2), 256, {}),
    "ddp-compiled-checkpointed-in-place": (lambda: _blocks("checkpointed_in_place"),
                                           lambda: DDP(2), 256, {}),
    "ddp-compiled-in-place-zero1": (lambda: _blocks("in_place"), lambda: DDP(2, zero1=True),
                                    256, {}),
    "ddp-compiled-checkpointed-in-place-zero1": (lambda: _blocks("checkpointed_in_place"),
                                                 lambda: DDP(2, zero1=True), 256, {}),
    "ddp-compiled-in-place-views": (lambda: _blocks("in_place"),
                                    lambda: DDP(2, gradient_as_bucket_view=True), 256, {}),
    "ddp-compiled-checkpointed-in-place-views": (
        lambda: _blocks("checkpointed_in_place"),
        lambda: DDP(2, gradient_as_bucket_view=True), 256, {}),
    "ddp-compiled-zero1": (lambda: _blocks("each"), lambda: DDP(2, zero1=True), 256, {}),
    "ddp-compiled-checkpointed-zero1": (lambda: _blocks("checkpointed"),
                                        lambda: DDP(2, zero1=True), 256, {}),
    "ddp-compiled-checkpointed-views": (lambda: _blocks("checkpointed"),
                                        lambda: DDP(2, gradient_as_bucket_view=True), 256, {}),
    "ddp-compiled-views": (lambda: _blocks("each"),
                           lambda: DDP(2, gradient_as_bucket_view=True), 256, {}),
    # FSDP2 over TP on a (2, 2) mesh of 4 ranks: each block torch.compile(block) put back,
    # its linears split column- and row-wise on mesh["tp"], then every block and the root
    # sharded on mesh["dp"]; eagerly, the same model's blocks uncompiled; each block compiled
    # in place (block.compile())
    "fsdp-tp": (lambda: _blocks("eager"), lambda: Parallel(
        fsdp=FSDP(2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "fsdp-tp-compiled": (lambda: _blocks("each"), lambda: Parallel(
        fsdp=FSDP(2), tp=TP(2, BLOCKS_PLAN)), 256, {}),
    "fsdp-tp-compiled-in-place": (lambda: _blocks("in_place"), lambda: Parallel(
        fsdp=FSDP(2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    # torchtitan's recipe over FSDP2 x TP: each block checkpoint_wrapper(block), compiled,
    # put back, its linears split (the plan seen through the wrappers), then sharded
    "fsdp-tp-compiled-checkpointed": (lambda: _blocks("checkpointed"), lambda: Parallel(
        fsdp=FSDP(2), tp=TP(2, BLOCKS_PLAN)), 256, {}),
    "fsdp-tp-compiled-checkpointed-in-place": (lambda: _blocks("checkpointed_in_place"),
                                               lambda: Parallel(fsdp=FSDP(2), tp=TP(
                                                   2, BLOCKS_PLAN_OWN)), 256, {}),
    # HSDP x TP: 2 replicas of 1 shard over TP 2, a (replicate, shard, tp) mesh of 4 ranks;
    # FSDP2's CPU offload over TP (the shards on the host, made there: Parallel.materialize)
    "hsdp-tp": (lambda: _blocks("eager"), lambda: Parallel(
        fsdp=FSDP(2, replicate=2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "hsdp-tp-compiled": (lambda: _blocks("each"), lambda: Parallel(
        fsdp=FSDP(2, replicate=2), tp=TP(2, BLOCKS_PLAN)), 256, {}),
    # HSDP x TP with 2 shards per replica: a (2, 2, 2) mesh of 8 ranks, eager and compile=
    "hsdp2-tp": (lambda: _blocks("eager"), lambda: Parallel(
        fsdp=FSDP(4, replicate=2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "hsdp2-tp-compiled-in-place": (lambda: _blocks("in_place"), lambda: Parallel(
        fsdp=FSDP(4, replicate=2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "hsdp2-tp-compile-option": (lambda: _blocks("eager"), lambda: Parallel(
        fsdp=FSDP(4, replicate=2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {"compile": True}),
    "fsdp-tp-offload": (lambda: _blocks("eager"), lambda: Parallel(
        fsdp=FSDP(2, offload=True), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "fsdp-tp-compiled-offload": (lambda: _blocks("each"), lambda: Parallel(
        fsdp=FSDP(2, offload=True), tp=TP(2, BLOCKS_PLAN)), 256, {}),
    # torchtitan's recipe over HSDP x TP and over FSDP2's CPU offload x TP
    "hsdp-tp-compiled-checkpointed": (lambda: _blocks("checkpointed"), lambda: Parallel(
        fsdp=FSDP(2, replicate=2), tp=TP(2, BLOCKS_PLAN)), 256, {}),
    "fsdp-tp-compiled-checkpointed-offload": (lambda: _blocks("checkpointed"), lambda: Parallel(
        fsdp=FSDP(2, offload=True), tp=TP(2, BLOCKS_PLAN)), 256, {}),
    # the same two over blocks compiled in place, and the recipe compiling in place
    "hsdp-tp-compiled-in-place": (lambda: _blocks("in_place"), lambda: Parallel(
        fsdp=FSDP(2, replicate=2), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "hsdp-tp-compiled-checkpointed-in-place": (lambda: _blocks("checkpointed_in_place"),
                                               lambda: Parallel(fsdp=FSDP(2, replicate=2),
                                                                tp=TP(2, BLOCKS_PLAN_OWN)),
                                               256, {}),
    "fsdp-tp-compiled-in-place-offload": (lambda: _blocks("in_place"), lambda: Parallel(
        fsdp=FSDP(2, offload=True), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
    "fsdp-tp-compiled-checkpointed-in-place-offload": (
        lambda: _blocks("checkpointed_in_place"), lambda: Parallel(
            fsdp=FSDP(2, offload=True), tp=TP(2, BLOCKS_PLAN_OWN)), 256, {}),
}
# the block's linears split: through torch.compile(block)'s _orig_mod, or the block's own
# paths (compiled in place, or eager)
TP_BLOCK = {"0._orig_mod.a": ColwiseParallel(), "0._orig_mod.b": RowwiseParallel()}
TP_BLOCK_OWN = {"0.a": ColwiseParallel(), "0.b": RowwiseParallel()}
# fakegpu_compile_targets.Blocks' linears split (the head's output gathered: every parameter
# a DTensor on the 2-D mesh, as CUDA's foreach Adam needs), through each torch.compile(block)'s
# _orig_mod, or the blocks' own paths
_HEAD = {"head": ColwiseParallel(output_layouts=Replicate())}
BLOCKS_PLAN = {"layers.*._orig_mod.inner.a": ColwiseParallel(),
               "layers.*._orig_mod.inner.b": RowwiseParallel(), **_HEAD}
BLOCKS_PLAN_OWN = {"layers.*.inner.a": ColwiseParallel(), "layers.*.inner.b": RowwiseParallel(),
                   **_HEAD}


def _tp_block(how):
    """:class:`fakegpu_compile_targets.Pointwise` alone (every parameter split: CUDA's
    foreach Adam takes no mix of DTensors and plain tensors), ``torch.compile``d and put
    in a ``Sequential`` (``"each"``), compiled in place (``"in_place"``), or not;
    ``"checkpointed"``, ``torch.compile(checkpoint_wrapper(block))``;
    ``"checkpointed_in_place"``, ``checkpoint_wrapper(block)`` compiled in place."""
    from fakegpu_compile_targets import Pointwise

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    block = Pointwise()
    if how == "in_place":
        block.compile()
    if how in ("checkpointed", "checkpointed_in_place"):
        block = checkpoint_wrapper(block)
    if how == "checkpointed_in_place":  # then compiled in place (torchtitan's recipe now)
        block.compile()
    return nn.Sequential(torch.compile(block) if how in ("each", "checkpointed") else block)
# a compiled case's first step, B marked dynamic: its blocks compile at the example's batch
# size, as fxmem's trace lowers them, and that code runs at the measured B (measure_rank's
# compile_at_example)
COMPILED = {"fsdp-compiled", "fsdp-compiled-in-place", "hsdp-compiled",
            "hsdp2-tp-compiled-in-place",
            "fsdp-compiled-in-place-offload", "hsdp-compiled-in-place",
            "hsdp-tp-compiled-in-place", "fsdp-tp-compiled-in-place-offload",
            "ddp-compiled-in-place-zero1", "ddp-compiled-in-place-views",
            "fsdp-compiled-offload", "tp-compiled", "tp-compiled-in-place", "ddp-compiled",
            "ddp-compiled-in-place", "ddp-compiled-zero1", "ddp-compiled-views",
            "fsdp-tp-compiled", "fsdp-tp-compiled-in-place", "hsdp-tp-compiled",
            "fsdp-tp-compiled-offload", *(n for n in CASES if "-checkpointed" in n)}


def _checkpointed(model):
    import fxmem

    return fxmem.apply_checkpoints(model, [f"layers.{i}" for i in range(len(model.layers))])


def _blocks(how):
    from fakegpu_compile_targets import blocks

    return blocks(how)


def _blocks_of(n: int):
    """:class:`fakegpu_compile_targets.Blocks` of ``n`` blocks, uncompiled."""
    from fakegpu_compile_targets import Blocks

    return Blocks(n)


def case(name):
    """``(model, x, y, parallel, step options)`` of the case ``name``."""
    make, strategy, width, options = CASES[name]  # width: an int, or a sample's shape
    torch.manual_seed(0)
    model = make()
    x, y = torch.randn(4, *(width if isinstance(width, tuple) else (width,))), \
        torch.randint(0, 10, (4,))
    return model, x, y, strategy(), {"loss": F.cross_entropy, "optimizer": torch.optim.Adam,
                                     **options}


def measure_each(name, batches):
    """In a rank's process: :func:`measure` at each of ``batches`` in turn, the process set
    back between them as a fresh one starts (what the collectives kept let go of: the
    watchdog's wait, then a barrier; every tensor of the step collected, the cuBLAS
    workspaces let go, every cached segment returned): {str(B): the measurement}."""
    from fakegpu_batch import set_back
    from fxmem.validate.fakegpu.ranks import let_go_of_collectives

    out = {}
    for b in batches:
        out[str(b)] = measure(name, b)
        let_go_of_collectives()
        set_back()
    return out


def measure(name, B, record_history=False):  # noqa: N803
    """In a rank's process: the case's step measured at batch size ``B``."""
    from fxmem.validate.fakegpu.ranks import measure_rank

    model, x, y, parallel, step = case(name)
    return measure_rank(model, (x,), (y,), parallel=parallel, B=B,
                        record_history=record_history, compile_at_example=name in COMPILED, **step)


def predict(name, batches, checkpoint=None):
    """On the fake GPU (a compiled case lowers there): fxmem's per-rank prediction of the case
    at each of ``batches``, traced at the example batch with B a symbol, under the
    ``checkpoint`` plan: {str(B): [(max_allocated, max_reserved) per rank]}."""
    import fxmem

    model, x, y, parallel, step = case(name)
    report = fxmem.analyze(model, (x,), (y,), parallel=parallel, device="cuda", **step,
                           checkpoint=checkpoint)
    out = {str(b): [(d.max_allocated, d.max_reserved) for d in
                    (report.rank(k).cuda_memory(b) for k in range(parallel.world_size))]
           for b in batches}
    # FSDP2's ops each rank's trace recorded, by phase: its all-gathers, copies in and out
    # of their buffers, reduce-scatters (none may go unseen inside a compiled call)
    out["ops"] = [sorted(collections.Counter(
        f"{o.op} {o.phase}" for o in report.rank(k).trace.ops
        if o.op.startswith(("fsdp.", "c10d."))).items()) for k in range(parallel.world_size)]
    return out


def fewest_compiled(B):  # noqa: N803
    """On the fake GPU: the ``fsdp-compiled`` case's blocks compiled on their own, its step on
    one GPU at ``B`` within a budget of live bytes halfway between the largest rank's peaks
    on 2 and 3 GPUs (the allocator's reserve: more on any number of GPUs than on one, for
    these small blocks: FSDP2's streams keep pools of their own): the ways out fxmem gives,
    and whether the step fits on the number of GPUs it names and on one fewer, each
    analysed again (every rank traced, its blocks lowered as on one GPU)."""
    import fxmem

    model, x, y, _, step = case("fsdp-compiled")

    def analysed(w):
        return fxmem.analyze(model, (x,), (y,), device="cuda", **step,
                             **({"parallel": FSDP(w)} if w > 1 else {}))

    two, three = analysed(2).peak_bytes(B), analysed(3).peak_bytes(B)
    budget = (two + three) // 2
    f = analysed(1).fits(B, budget, by="live")
    fsdp = f.way("fsdp")
    fits = {} if fsdp is None else {
        w: bool(analysed(w).fits(B, budget, by="live", ways=False))
        for w in (fsdp.value, fsdp.value - 1)}
    return {"peaks": [two, three], "budget": budget, "fits": bool(f),
            "ways": [w.as_dict() for w in f.ways], "none": list(f.none),
            "checked": {str(w): v for w, v in fits.items()}}


def fail_on_rank_1():
    """In a rank's process: rank 1 crashes at once (no result line, exit code 3), the
    others wait (killed when it does)."""
    import os
    import sys
    import time

    if os.environ["RANK"] == "1":
        print("rank 1 crashes here", file=sys.stderr, flush=True)
        os._exit(3)
    time.sleep(120)


def cli_compile_option(B):  # noqa: N803
    """``fxmem analyze ... --compile --compile-budget 0.3 --fsdp 2 --format json`` on the
    blocks of ``fsdp-compile-budget`` at ``B``: its exit code, its setup's "compiled" row,
    its ``max_allocated`` (the ranks with the least room), and the API's for rank 0 of the
    same step (``compile=`` with ``parallel=FSDP(2)``)."""
    import json

    from click.testing import CliRunner

    import fakegpu_compile_targets
    import fxmem
    from fxmem.cli import cli

    r = CliRunner().invoke(cli, [
        "analyze", f"{fakegpu_compile_targets.__file__}:Blocks", "--input", "B,256",
        "--target", "B,10", "--loss", "mse", "--optimizer", "adam", "--compile",
        "--compile-budget", "0.3", "--fsdp", "2", "--batch", str(B), "--format", "json"])
    if r.exit_code != 0:
        return {"exit": r.exit_code, "output": r.output}
    report = json.loads(r.stdout)
    api = fxmem.analyze(_blocks("eager"), torch.zeros(B, 256), torch.zeros(B, 10),
                        loss=F.mse_loss, optimizer=torch.optim.Adam, device="cuda",
                        parallel=FSDP(2), compile={"activation_memory_budget": 0.3})
    short = CliRunner().invoke(cli, [  # within half its need: the ways out
        "analyze", f"{fakegpu_compile_targets.__file__}:Blocks", "--input", "B,256",
        "--target", "B,10", "--loss", "mse", "--optimizer", "adam", "--compile",
        "--compile-budget", "0.3", "--fsdp", "2", "--batch", str(B), "--format", "json",
        "--budget", str(report["cuda"]["max_reserved"] // 2)])
    return {"exit": 0, "compiled": report["setup"]["compiled"],
            "cli": report["cuda"]["max_allocated"],
            "api": api.rank(0).cuda_memory(B).max_allocated,
            "short": short.exit_code, "none": json.loads(short.stdout)["fit"]["none"]}


def cli_auto_compile(B, share):  # noqa: N803
    """``fxmem analyze ... --checkpoint auto --compile --fsdp 2 --format json`` on the step of
    the ``fsdp-compile-budget`` cases (the blocks uncompiled, cross-entropy, Adam) at ``B``
    within ``share`` of the bytes it reserves compiled under budget 1.0: the setup's
    "compiled" row, the frontier's compiled budgets, the report's
    ``max_allocated``/``max_reserved``, and each rank's by the API for the same choice
    (``compile=`` at the budget chosen, or the eager plan chosen, under ``FSDP(2)``)."""
    import json
    import os
    import tempfile

    from click.testing import CliRunner

    import fakegpu_compile_targets
    import fxmem
    from fxmem.cli import cli
    from fxmem.trace.plans import load_plan

    def api(**options):
        return fxmem.analyze(_blocks("eager"), torch.zeros(B, 256),
                             torch.zeros(B, dtype=torch.int64), loss=F.cross_entropy,
                             optimizer=torch.optim.Adam, device="cuda", parallel=FSDP(2),
                             **options)

    reference = api(compile=True)
    need = max(reference.rank(k).cuda_memory(B).max_reserved for k in (0, 1))
    budget = int(need * share)
    with tempfile.TemporaryDirectory() as where:
        saved = os.path.join(where, "plan.json")
        r = CliRunner().invoke(cli, [
            "analyze", f"{fakegpu_compile_targets.__file__}:Blocks", "--input", "B,256",
            "--target", "B:int64:10", "--loss", "cross_entropy", "--optimizer", "adam",
            "--compile", "--checkpoint", "auto", "--fsdp", "2", "--batch", str(B),
            "--format", "json",
            "--budget", str(budget), "--save-plan", saved])
        plan = load_plan(saved) if os.path.exists(saved) else None
    out = {"exit": r.exit_code, "budget": budget, "need": need}
    if r.exit_code not in (0, 4):
        return {**out, "output": r.output}
    report = json.loads(r.stdout)
    row = report["setup"]["compiled"]
    chosen = float(row.split("activation_memory_budget ")[1].split()[0]) \
        if "activation_memory_budget" in row else None
    same = api(compile={"activation_memory_budget": chosen}) if chosen is not None else \
        api(checkpoint=plan)
    return {**out, "compiled": row, "chosen": chosen, "plan": str(plan),
            "frontier": [p.get("compiled") for p in report["frontier"]],
            "cli": [report["cuda"]["max_allocated"], report["cuda"]["max_reserved"]],
            "api": [[same.rank(k).cuda_memory(B).max_allocated,
                     same.rank(k).cuda_memory(B).max_reserved] for k in (0, 1)]}
