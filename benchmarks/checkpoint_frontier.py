"""Activation checkpointing frontier (issue 23): every peer's plan, applied for real.

    python benchmarks/checkpoint_frontier.py [--models gpt_stack,gpt2,llama] [--batch gpt2=4]
                                             [--no-compile] [--validate] [--plot PNG]

Three models, random weights from their constructors (nothing is downloaded), one CPU
training step each (forward, loss, backward, optimizer step), float32:

- ``gpt_stack``: :class:`zoo.GPTStack`, 12 pre-LN blocks, d=256, 4 heads, L=128, vocab 512,
  cross-entropy, Adam; B=8;
- ``gpt2``: Hugging Face GPT-2 small (``GPT2Config()`` defaults, 124M parameters),
  ``use_cache=False``, L=128, loss from the labels, AdamW; B=4;
- ``llama``: a small Hugging Face Llama (hidden 256, 8 layers, 4 heads, intermediate 688,
  vocab 8000, SDPA attention, ``use_cache=False``), L=128, loss from the labels, AdamW; B=8.

Each peer's plan is applied to a fresh copy of the model with PyTorch's own tools:

- ``none``;
- ``every block``: each block wrapped in ``checkpoint_wrapper`` (``NO_REENTRANT``);
- ``Chen sqrt(n)``: the n blocks regrouped into ceil(sqrt(n)) runs of ceil(n / ceil(sqrt(n)))
  consecutive blocks, each run a :class:`zoo.Group` module (same call signature as one block)
  wrapped in one ``checkpoint_wrapper``;
- ``torchtitan SAC``: torchtitan's default op-level selective checkpointing policy
  (:func:`torchtitan_policy`), per block;
- ``pointwise SAC``: per block, recompute only ops tagged ``torch.Tag.pointwise``, save the
  output of every other op (:func:`pointwise_policy`);
- ``compile budget=b``: ``torch.compile`` (inductor) of model + loss with
  ``torch._functorch.config.activation_memory_budget = b`` for b in 0.3, 0.5, 0.7 (and 1.0,
  the default, as the compiled reference).

Measured, for each: ``peak_bytes``, the most bytes live during one steady-state step;
``flops``, the step's FLOPs by PyTorch's formulas (``torch.utils.flop_counter``), recompute
included; ``seconds``, the wall time of one steady-state step (2 shared cores: indicative).

- Eager peers: the peak is ``fxmem.measure`` (live storage bytes, ground truth); the FLOPs
  are ``FlopCounterMode`` over one whole steady-state step, optimizer step included (Adam's
  ops are pointwise: PyTorch counts no FLOPs for them).
- Compiled peers: ``fxmem.measure``'s tracker is a TorchDispatchMode and does not see
  inductor's buffers, so the peak comes from the profiler's allocator events
  (:func:`profiler_peak`: ``torch.profiler.profile(profile_memory=True)``, the running sum of
  the CPU allocator's allocations and frees during the step, plus the bytes live before it).
  The FLOPs are counted on the forward and backward graphs the partitioner hands to inductor
  (:func:`graph_flops`, the same formulas as ``FlopCounterMode``, applied to each node's
  fake-tensor metadata; the backward graph holds the recomputed forward ops).
  ``--validate`` checks both methods: the profiler peak of the eager ``none`` and ``every
  block`` steps against ``fxmem.measure``, and the graph FLOPs at budget 1.0 against
  ``FlopCounterMode`` on the eager step; it also prints, per budget, what the partitioner
  saves for the backward (so that a budget that changes nothing shows).

Attention is counted as on a GPU, on every side: PyTorch registers no FLOP formula for the
CPU's ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), so on CPU
``FlopCounterMode`` counts attention as 0 while on CUDA it counts the flash kernels. Here the
CPU kernels are counted by their CUDA twins' formulas (:data:`GPU_COUNTED`, the twins of
``fxmem.checkpoint.flops.ALIASES``), in ``FlopCounterMode`` (``custom_mapping``) and in
:func:`graph_flops` alike, and fxmem's side counts them too: a plan that recomputes attention
pays for it, as it does on a GPU.

fxmem (:func:`fxmem_side`): the model traced once at an example batch of 2 (``device="cpu"``,
as the peers run), its frontier at B, and for each peer's measured peak as the budget the
cheapest plan (``report.plan_for``), applied with ``fxmem.apply_checkpoints`` and measured
as the peers are: it wins when its measured peak and FLOPs are both no higher. ``--plot``
draws peak against step FLOPs (docs/img/checkpoint_frontier.png).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils._pytree import tree_leaves, tree_map_only
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode, flop_registry

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import fxmem  # noqa: E402
from fxmem.checkpoint.flops import ALIASES  # noqa: E402
from fxmem.checkpoint.options import counted_flops  # noqa: E402
from zoo import GPTStack, Group, gpt2, llama, token_loss  # noqa: E402

MIB = 2**20
BUDGETS = (0.3, 0.5, 0.7)


def _raw(formula):  # a registry formula (already shape-wrapped), given as is
    def counted(*args, **kwargs):
        return formula(*args, **kwargs)
    counted._get_raw = True
    return counted


# the CPU flash-attention kernels counted by their CUDA twins' formulas, as on a GPU
GPU_COUNTED = {cpu: _raw(flop_registry[cuda]) for cpu, cuda in ALIASES.items()}


# models -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bundle:
    """A model to benchmark: ``build()`` a fresh model (same seeded weights each time),
    ``batch(B)`` its ``(inputs, targets)``, the loss (``None``: the output's ``.loss``),
    the optimizer factory, ``blocks``: the dotted path of its ``nn.ModuleList`` /
    ``nn.Sequential`` of blocks, and the default batch size."""

    name: str
    title: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], tuple]
    loss: Callable | None
    optimizer: Callable
    blocks: str
    B: int


def _seeded(fn):
    @functools.wraps(fn)
    def build():
        torch.manual_seed(0)
        return fn()
    return build


def _gpt2():
    """GPT-2 small whose HF model names its loss: ``GPT2LMHeadModel``'s class name names none,
    so its forward, given labels, logs transformers' ``loss_type=None`` warning through
    ``logging.Logger`` before using the causal-LM loss, a graph break under ``torch.compile``.
    Named, the loss is the same one, and the forward holds no logging call."""
    lm = gpt2(use_cache=False)
    lm.model.loss_type = "ForCausalLM"
    return lm


def _ids(vocab, seq, labels_as_target):
    def batch(B):
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (B, seq), generator=g)
        if labels_as_target:  # Hugging Face: model(ids, labels), two tensors as measure has
            return (ids, ids.clone()), ()
        return (ids,), (torch.randint(0, vocab, (B, seq), generator=g),)
    return batch


# hidden 256 and vocab 8000 rather than 512 and 32000: at hidden 512, vocab 32000, B=4 the
# step of every checkpointing plan peaks in AdamW's step (measured: 1,060,260,400 bytes there,
# 930,234,932 in the backward, with every block checkpointed), where no activation is left,
# so that all the plans measure the same peak (1011.1 MiB; none: 1021.3)
LLAMA = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=8000, max_position_embeddings=512)


def models() -> dict:
    """name -> :class:`Bundle`.

    >>> sorted(models())
    ['gpt2', 'gpt_stack', 'llama']
    """
    return {
        "gpt_stack": Bundle(
            "gpt_stack", "GPT-style stack (12 blocks, d=256, 4 heads, L=128, vocab 512, Adam)",
            _seeded(GPTStack), _ids(512, 128, False), token_loss,
            lambda p: torch.optim.Adam(p, lr=1e-3), "blocks", 8),
        "gpt2": Bundle(
            "gpt2", "Hugging Face GPT-2 small (GPT2Config(), L=128, AdamW)",
            _seeded(_gpt2), _ids(50257, 128, True), None,
            lambda p: torch.optim.AdamW(p, lr=1e-4), "model.transformer.h", 4),
        "llama": Bundle(
            "llama", "Hugging Face Llama (hidden 256, 8 layers, 4 heads, intermediate 688, "
            "vocab 8000, SDPA, L=128, AdamW)",
            _seeded(lambda: llama(**LLAMA)), _ids(8000, 128, True), None,
            lambda p: torch.optim.AdamW(p, lr=1e-4), "model.model.layers", 8),
    }


# plans, applied with PyTorch's own tools ----------------------------------------------
def wrap_blocks(model: nn.Module, path: str, wrap: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """Each block of the container at ``path`` replaced by ``wrap(block)``, in place."""
    container = model.get_submodule(path)
    for i, block in enumerate(list(container)):
        container[i] = wrap(block)
    return model


def chen_groups(model: nn.Module, path: str) -> nn.Module:
    """Chen et al.'s sqrt(n) plan: the n blocks at ``path`` regrouped into ceil(sqrt(n))
    runs of ceil(n / ceil(sqrt(n))) consecutive blocks (the last may be shorter), each run a
    :class:`Group` in one non-reentrant ``checkpoint_wrapper``; the container keeps its type."""
    parent, _, name = path.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    blocks = list(owner.get_submodule(name))
    n = len(blocks)
    k = math.ceil(n / math.ceil(math.sqrt(n)))
    groups = [checkpoint_wrapper(Group(blocks[i:i + k]), checkpoint_impl=CheckpointImpl.NO_REENTRANT)
              for i in range(0, n, k)]
    container = owner.get_submodule(name)
    setattr(owner, name, nn.Sequential(*groups) if isinstance(container, nn.Sequential)
            else nn.ModuleList(groups))
    return model


def every_block(block: nn.Module) -> nn.Module:
    return checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


# torchtitan's default SAC policy, reimplemented from
# https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/torchtitan/distributed/activation_checkpoint.py
# (last changed in c5d93d1098fe5f6f9b4fe6870b4e3d590ffa9cdf, "Refactor activation checkpointing
# into a policy class hierarchy"): _get_default_save_ops() and SelectiveAC._wrap_block().
# Saved: the partitioner's compute-intensive ops (aten mm, addmm, bmm, convolution,
# convolution_backward, _scaled_mm, the CUDA SDPA/flash/efficient attention kernels,
# upsample_bilinear2d), the SDPA cudnn/math/overrideable kernels, aten.max.default (amax for
# low precision), aten.linear, topk, flex attention, inductor_compiled_code, and the
# reduce_scatter/all_to_all collectives; every second aten.mm / aten.linear of a checkpointed
# call is recomputed (counted separately in the forward and in the recompute); all else is
# recomputed. Left out as inapplicable here: the CUDA->CPU _to_copy rule and the
# force-recompute of the MoE router's mm shapes (no "moe.router.gate" in these models),
# optional ops of packages not installed (deepep, hybridep, torch_attn).
# Added: on CPU PyTorch's SDPA runs aten._scaled_dot_product_flash_attention_for_cpu, which
# torchtitan's list (GPU-minded) does not name; it stands in here as torchtitan's attention
# entry (saved), as _scaled_dot_product_flash_attention is on CUDA.
def torchtitan_save_ops() -> set:
    from torch._functorch.partitioners import get_default_op_list

    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    aten = torch.ops.aten
    ops |= {aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_attention_math.default,
            aten._scaled_dot_product_fused_attention_overrideable.default,
            aten.max.default, torch._higher_order_ops.flex_attention, aten.linear.default,
            aten.topk.default, torch.ops._c10d_functional.reduce_scatter_tensor.default,
            torch.ops._c10d_functional.all_to_all_single.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default}  # the CPU attention entry
    if hasattr(torch._higher_order_ops, "inductor_compiled_code"):
        ops.add(torch._higher_order_ops.inductor_compiled_code)
    return ops


TORCHTITAN_MM_OPS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)


def torchtitan_policy(save_ops: set | None = None, mm_ops=TORCHTITAN_MM_OPS):
    """A fresh instance of torchtitan's stateful policy (one per checkpointed call, as
    torchtitan's ``context_fn`` makes one): save ``save_ops``' outputs except every second
    of ``mm_ops`` (``aten.mm``, ``aten.linear``), recompute everything else."""
    save_ops = torchtitan_save_ops() if save_ops is None else save_ops
    meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func in mm_ops:
            meta[key] += 1
        if func in save_ops:
            if func in mm_ops and meta[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def torchtitan_sac(block: nn.Module, mm_ops=TORCHTITAN_MM_OPS) -> nn.Module:
    """``block`` wrapped as torchtitan's ``SelectiveAC`` wraps a transformer block (its
    default config: RNG state preserved, default determinism check, ``early_stop=False``)."""
    save_ops = torchtitan_save_ops()
    return checkpoint_wrapper(
        block, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
        context_fn=lambda: create_selective_checkpoint_contexts(
            torchtitan_policy(save_ops, mm_ops)),
        preserve_rng_state=True, determinism_check="default", early_stop=False, debug=False)


_ALIASES_OR_EMPTY = {torch.ops.aten._unsafe_view.default, torch.ops.aten.empty_like.default,
                     torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


def pointwise_policy(ctx, func, *args, **kwargs):
    """Recompute the ops tagged ``torch.Tag.pointwise``; save every other op's output,
    except the ops that compute nothing, recomputed too: views and ``_unsafe_view`` (a
    saved view keeps alive the tensor it views: saving the flattening view of the GELU's
    output before the MLP's second matmul would keep the GELU's output itself, see
    :func:`pointwise_policy_views_saved`), in-place ops (their output is their input, so
    saving it is saving the input; dropout's ``bernoulli_``, whose recompute draws the same
    numbers since checkpointing restores the RNG state) and ``empty``/``empty_like`` (which
    dropout's mask fills in place: a saved one would be mutated, which SAC refuses)."""
    if (torch.Tag.pointwise in func.tags or torch.Tag.inplace in func.tags
            or getattr(func, "is_view", False) or func in _ALIASES_OR_EMPTY):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def pointwise_policy_views_saved(ctx, func, *args, **kwargs):
    """The literal policy: recompute only the ops tagged ``torch.Tag.pointwise``, save
    every other op's output, views included."""
    if torch.Tag.pointwise in func.tags:
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def sac(policy) -> Callable[[nn.Module], nn.Module]:
    """A block wrapped in ``checkpoint_wrapper`` with a stateless SAC ``policy``."""
    def wrap(block):
        return checkpoint_wrapper(
            block, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
            context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
    return wrap


EAGER_PLANS = {
    "none": lambda m, path: m,
    "every block": lambda m, path: wrap_blocks(m, path, every_block),
    "Chen sqrt(n)": chen_groups,
    "torchtitan SAC": lambda m, path: wrap_blocks(m, path, torchtitan_sac),
    "pointwise SAC": lambda m, path: wrap_blocks(m, path, sac(pointwise_policy)),
}
# two variants run on the GPT stack only, to show what they change (not peers as such): the
# literal pointwise policy (fails on GPT-2, whose dropout mutates a saved empty_like), and
# torchtitan's policy with aten.addmm counted among its "every other mm" (nn.Linear with a
# bias on a 3-d input runs aten.addmm on CPU, which torchtitan saves but never counts)
DIAGNOSTIC_PLANS = {
    "pointwise SAC, views saved (diagnostic)": lambda m, path: wrap_blocks(
        m, path, sac(pointwise_policy_views_saved)),
    "torchtitan SAC, addmm counted as mm (diagnostic)": lambda m, path: wrap_blocks(
        m, path, functools.partial(torchtitan_sac, mm_ops=(*TORCHTITAN_MM_OPS,
                                                           torch.ops.aten.addmm.default))),
}
PLANS = {**EAGER_PLANS, **DIAGNOSTIC_PLANS}


# measuring ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Peer:
    """One plan's measured step: peak bytes, FLOPs (recompute included), wall seconds."""

    name: str
    peak_bytes: int
    flops: int
    seconds: float


def _loss_of(bundle, out, targets):
    return bundle.loss(out, *targets) if bundle.loss is not None else out.loss


def train_step(bundle: Bundle, forward, opt, inputs, targets) -> None:
    """One training step as fxmem.measure runs it: zero_grad(set_to_none), forward, loss,
    backward, optimizer step; nothing kept."""
    opt.zero_grad(set_to_none=True)
    loss = _loss_of(bundle, forward(*inputs), targets)
    loss.backward()
    del loss
    opt.step()


def measured_peak(bundle: Bundle, model: nn.Module, B: int) -> int:
    inputs, targets = bundle.batch(B)
    return fxmem.measure(model, inputs, targets, loss=bundle.loss, optimizer=bundle.optimizer,
                         B=B).peak_bytes


def flops_and_seconds(bundle: Bundle, model: nn.Module, B: int) -> tuple[int, float]:
    """On a copy of ``model``: the wall time of a first step (which also creates the
    optimizer state: zeros, cheap), then FlopCounterMode over a second, steady-state one."""
    model = copy.deepcopy(model)
    inputs, targets = bundle.batch(B)
    opt = bundle.optimizer(list(model.parameters()))
    t0 = time.perf_counter()
    train_step(bundle, model, opt, inputs, targets)
    seconds = time.perf_counter() - t0
    with FlopCounterMode(display=False, custom_mapping=GPU_COUNTED) as counter:
        train_step(bundle, model, opt, inputs, targets)
    return counter.get_total_flops(), seconds


def eager_peer(bundle: Bundle, plan: str, B: int) -> Peer:
    model = PLANS[plan](bundle.build(), bundle.blocks)
    peak = measured_peak(bundle, model, B)
    flops, seconds = flops_and_seconds(bundle, model, B)
    return Peer(plan, peak, flops, seconds)


def _live_before(model, opt, inputs, targets) -> int:
    """Bytes of the distinct storages live before a step: parameters, buffers, gradients,
    optimizer state, the batch."""
    seen = {}
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for t in [*model.parameters(), *model.buffers(), *grads, *inputs, *targets,
              *(x for x in tree_leaves(opt.state) if isinstance(x, torch.Tensor))]:
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    return sum(seen.values())


def profiler_peak(run: Callable[[], None], before: int) -> int:
    """Peak bytes of ``run()`` from the CPU allocator's events: ``before`` (what is live as
    it starts) plus the highest running sum of the sizes allocated and freed during it, in
    the order the profiler recorded them (``torch.profiler``, ``profile_memory=True``). A
    free of a block allocated before the profile is not reported: call it with nothing
    from before freed during ``run`` (gradients already None)."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [(e.start_ns(), i, e.nbytes()) for i, e in
              enumerate(prof.profiler.kineto_results.events())
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    live = peak = 0
    for _, _, n in sorted(events):
        live += n
        peak = max(peak, live)
    return before + peak


def eager_profiler_peak(bundle: Bundle, plan: str, B: int) -> int:
    """The profiler's peak of an eager step with ``plan`` (to validate the method against
    ``fxmem.measure``), after a warm-up step, gradients set to None first as measure does."""
    model = PLANS[plan](bundle.build(), bundle.blocks)
    inputs, targets = bundle.batch(B)
    opt = bundle.optimizer(list(model.parameters()))
    train_step(bundle, model, opt, inputs, targets)
    opt.zero_grad(set_to_none=True)
    gc.collect()
    return profiler_peak(lambda: train_step(bundle, model, opt, inputs, targets),
                         _live_before(model, opt, inputs, targets))


def graph_flops(gm: torch.fx.GraphModule) -> int:
    """FLOPs of an aten graph by ``torch.utils.flop_counter``'s formulas (those
    ``FlopCounterMode`` applies), from each node's fake-tensor metadata."""
    total = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        packet = node.target.overloadpacket
        formula = flop_registry.get(ALIASES.get(packet, packet))
        if formula is None:
            continue
        args, kwargs = tree_map_only(torch.fx.Node, lambda a: a.meta["val"], (node.args, node.kwargs))
        total += formula(*args, **kwargs, out_val=node.meta["val"])
    return total


def saved_bytes(fw: torch.fx.GraphModule) -> tuple[int, int]:
    """(count, bytes) of the forward graph's outputs that are not its inputs: what the
    partitioner saves for the backward (plus the loss itself)."""
    inputs = {n for n in fw.graph.nodes if n.op == "placeholder"}
    out = next(n for n in fw.graph.nodes if n.op == "output")
    saved = [n for n in tree_leaves(out.args[0])
             if isinstance(n, torch.fx.Node) and n not in inputs
             and isinstance(n.meta.get("val"), torch.Tensor)]
    return len(saved), sum(n.meta["val"].untyped_storage().nbytes() for n in saved)


class WithLoss(nn.Module):
    """Model and loss as one module (compiled as one graph): ``forward(inputs, targets)``
    returns the loss."""

    def __init__(self, model, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, inputs, targets):
        out = self.model(*inputs)
        return self.loss(out, *targets) if self.loss is not None else out.loss


@contextlib.contextmanager
def memory_budget(budget: float):
    """``activation_memory_budget`` set, compile caches off (so each budget partitions
    afresh), dynamo reset on entry and exit; every flag restored on exit."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    try:
        with functorch_config.patch(activation_memory_budget=budget, enable_autograd_cache=False), \
                inductor_config.patch(fx_graph_cache=False):
            yield
    finally:
        torch._dynamo.reset()


@dataclass(frozen=True)
class Compiled:
    """A compiled step at one budget: the measured :class:`Peer` and the partition's
    graphs' figures (forward / backward FLOPs, what the forward saves)."""

    peer: Peer
    forward_flops: int
    backward_flops: int
    saved_tensors: int
    saved_bytes: int
    graphs: int


def compiled_peer(bundle: Bundle, budget: float, B: int) -> Compiled:
    """``torch.compile`` (inductor) of model + loss under ``activation_memory_budget``:
    two steps (compile, optimizer state), then the profiler's peak of the third, the wall
    time of a fourth; FLOPs and saved tensors from the graphs the partitioner gave inductor."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    graphs = []  # (graph module, is_backward)

    def inner(gm, example_inputs, **kwargs):
        graphs.append((gm, bool(kwargs.get("is_backward", False))))
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    model = bundle.build()
    inputs, targets = bundle.batch(B)
    opt = bundle.optimizer(list(model.parameters()))
    with memory_budget(budget):
        step = torch.compile(WithLoss(model, bundle.loss), backend=backend)

        def run():
            opt.zero_grad(set_to_none=True)
            loss = step(inputs, targets)
            loss.backward()
            del loss
            opt.step()

        run()
        run()
        opt.zero_grad(set_to_none=True)
        gc.collect()
        n_graphs = len(graphs)
        peak = profiler_peak(run, _live_before(model, opt, inputs, targets))
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
        if len(graphs) != n_graphs:
            raise RuntimeError(f"{bundle.name}: recompiled during the measured steps")
    fw = sum(graph_flops(g) for g, bw in graphs if not bw)
    bw = sum(graph_flops(g) for g, bw in graphs if bw)
    saved = [saved_bytes(g) for g, is_bw in graphs if not is_bw]
    return Compiled(Peer(f"compile budget={budget}", peak, fw + bw, seconds), fw, bw,
                    sum(s[0] for s in saved), sum(s[1] for s in saved), len(graphs))


def peers(model_name: str, B: int | None = None, compile: bool = True) -> list[Peer]:
    """Every peer's plan applied to a fresh copy of ``models()[model_name]`` and measured
    at batch size ``B`` (default: the bundle's): the eager plans, then ``torch.compile``
    at each of :data:`BUDGETS` (unless ``compile=False``)."""
    bundle = models()[model_name]
    B = bundle.B if B is None else B
    out = [eager_peer(bundle, plan, B) for plan in EAGER_PLANS]
    if compile:
        out += [compiled_peer(bundle, b, B).peer for b in BUDGETS]
    return out


# fxmem's planner ------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """fxmem's plan with one peer's measured peak as the budget (``plan`` None: no plan
    fits), its predicted peak, and the step with it applied (``apply_checkpoints``) measured
    as the peers are."""

    peer: Peer
    plan: object
    predicted_peak: int | None
    measured: Peer | None
    plan_seconds: float

    @property
    def wins(self) -> bool:
        """No higher measured peak and no more FLOPs than the peer."""
        return self.measured is not None and self.measured.peak_bytes <= self.peer.peak_bytes \
            and self.measured.flops <= self.peer.flops


@dataclass(frozen=True)
class Planned:
    """fxmem on one model: the trace's and the planner's times, the frontier at B
    (predicted peak, FLOPs of the step by PyTorch's formulas, plan) and the answers."""

    trace_seconds: float
    frontier_seconds: float
    frontier: tuple
    answers: tuple


def fxmem_side(bundle: Bundle, B: int, rows: list[Peer]) -> Planned:
    """Trace once (an example batch of 2, ``device="cpu"`` as the peers run), the frontier at
    ``B``, then for every peer but ``none`` the cheapest plan within its measured peak,
    applied and measured."""
    inputs, targets = bundle.batch(2)
    t0 = time.perf_counter()
    report = fxmem.analyze(bundle.build(), inputs, targets, loss=bundle.loss,
                           optimizer=bundle.optimizer, device="cpu")
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    front = report.frontier(B)
    t_front = time.perf_counter() - t0
    step = _counted(report, B)
    points = tuple((p.peak_bytes, step + _counted(report.with_plan(p.plan), B, True), p.plan)
                   for p in front)
    answers = []
    for peer in rows:
        if peer.name == "none":
            continue
        t0 = time.perf_counter()
        try:
            choice = report.plan_for(peer.peak_bytes, B)
        except fxmem.InfeasibleBudgetError:
            answers.append(Answer(peer, None, None, None, time.perf_counter() - t0))
            continue
        took = time.perf_counter() - t0
        model = fxmem.apply_checkpoints(bundle.build(), choice.plan)
        peak = measured_peak(bundle, model, B)
        flops, seconds = flops_and_seconds(bundle, model, B)
        answers.append(Answer(peer, choice.plan, choice.peak_bytes,
                              Peer(f"fxmem at {peer.name}", peak, flops, seconds), took))
    return Planned(t_trace, t_front, points, tuple(answers))


def _counted(report, b: int, recompute: bool = False) -> int:
    """FLOPs of the step (``recompute``: of its re-run ops only) by PyTorch's formulas,
    attention by its CUDA twin's (what FlopCounterMode counts here with GPU_COUNTED)."""
    return counted_flops(report, b, recompute=recompute)


def answers_table(planned: Planned) -> str:
    lines = ["| budget: the peer's peak | fxmem plan | predicted MiB | measured MiB | "
             "GFLOPs (peer's) | no higher peak, no more FLOPs |", "|---|---|---|---|---|---|"]
    for a in planned.answers:
        if a.measured is None:
            lines.append(f"| {a.peer.name}: {a.peer.peak_bytes / MIB:.1f} MiB | no plan fits | "
                         f"| | ({a.peer.flops / 1e9:.1f}) | no |")
            continue
        plan = str(a.plan)
        plan = plan if len(plan) <= 90 else plan[:87] + "..."
        lines.append(f"| {a.peer.name}: {a.peer.peak_bytes / MIB:.1f} MiB | {plan} | "
                     f"{a.predicted_peak / MIB:.1f} | {a.measured.peak_bytes / MIB:.1f} | "
                     f"{a.measured.flops / 1e9:.1f} ({a.peer.flops / 1e9:.1f}) | "
                     f"{'yes' if a.wins else 'no'} |")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Peak against step FLOPs, one panel per model: the peers (measured), fxmem's frontier
    (predicted) and fxmem's answers (measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.6), squeeze=False)
    for ax, (name, (bundle, B, rows, planned)) in zip(axes[0], results.items()):
        fx = sorted(planned.frontier, key=lambda p: p[1])
        ax.step([f / 1e9 for _, f, _ in fx], [p / MIB for p, _, _ in fx], where="post",
                color="tab:blue", label="fxmem frontier (predicted)")
        for p in rows:
            ax.scatter(p.flops / 1e9, p.peak_bytes / MIB, marker="s" if "compile" in p.name
                       else "o", color="tab:orange" if "compile" in p.name else "tab:red",
                       zorder=3)
            ax.annotate(p.name, (p.flops / 1e9, p.peak_bytes / MIB), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
        got = [a.measured for a in planned.answers if a.measured is not None]
        ax.scatter([m.flops / 1e9 for m in got], [m.peak_bytes / MIB for m in got],
                   marker="x", color="tab:blue", zorder=4, label="fxmem's plans (measured)")
        ax.set_title(f"{name}, B={B}", fontsize=10)
        ax.set_xlabel("step GFLOPs (PyTorch's formulas, recompute included)")
        ax.set_ylabel("peak MiB")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# report -------------------------------------------------------------------------------
def table(rows: list[Peer]) -> str:
    lines = ["| peer | measured peak MiB | step GFLOPs | step s |", "|---|---|---|---|"]
    lines += [f"| {p.name} | {p.peak_bytes / MIB:.1f} | {p.flops / 1e9:.1f} | {p.seconds:.2f} |"
              for p in rows]
    return "\n".join(lines)


def validate(bundle: Bundle, B: int, eager: list[Peer], compiled: dict) -> None:
    print(f"\nValidation ({bundle.name}, B={B}):\n")
    print("| eager step | fxmem.measure peak bytes | profiler peak bytes | difference |")
    print("|---|---|---|---|")
    for p in eager:
        if p.name in ("none", "every block"):
            prof = eager_profiler_peak(bundle, p.name, B)
            print(f"| {p.name} | {p.peak_bytes:,} | {prof:,} | {prof - p.peak_bytes:+,} |")
    none = next(p for p in eager if p.name == "none")
    print(f"\nFLOPs: FlopCounterMode on the eager step (none) {none.flops:,}; graph FLOPs of the "
          f"compiled step at budget 1.0 (no recompute of matmuls) "
          f"{compiled[1.0].peer.flops:,}.\n")
    print("| budget | graphs | forward GFLOPs | backward GFLOPs (recompute incl.) | "
          "saved for backward | saved MiB | measured peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for b, c in sorted(compiled.items()):
        print(f"| {b} | {c.graphs} | {c.forward_flops / 1e9:.2f} | {c.backward_flops / 1e9:.2f} | "
              f"{c.saved_tensors} | {c.saved_bytes / MIB:.1f} | {c.peer.peak_bytes / MIB:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt_stack,gpt2,llama")
    ap.add_argument("--batch", action="append", default=[], help="NAME=B, e.g. gpt2=2")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--plot", default=None, metavar="PNG",
                    help="write the peak-against-FLOPs plot here")
    ap.add_argument("--validate", action="store_true",
                    help="check the compiled-step methods (profiler peak, graph FLOPs)")
    args = ap.parse_args()
    batch = {k: int(v) for k, v in (s.split("=") for s in args.batch)}
    print(f"Checkpoint frontier: torch {torch.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()} ({platform.processor() or 'cpu'}), {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads")
    bundles = models()
    results = {}
    for name in args.models.split(","):
        bundle = bundles[name]
        B = batch.get(name, bundle.B)
        t0 = time.perf_counter()
        rows = [eager_peer(bundle, plan, B) for plan in EAGER_PLANS]
        compiled = {}
        if not args.no_compile:
            for b in (*BUDGETS, *((1.0,) if args.validate else ())):
                compiled[b] = compiled_peer(bundle, b, B)
            rows += [compiled[b].peer for b in BUDGETS]
        if name == "gpt_stack":
            rows += [eager_peer(bundle, plan, B) for plan in DIAGNOSTIC_PLANS]
        planned = fxmem_side(bundle, B, rows)
        results[name] = (bundle, B, rows, planned)
        print(f"\n### {bundle.title}, B={B}\n")
        print(table(rows))
        print(f"\nfxmem: traced in {planned.trace_seconds:.1f} s, frontier of "
              f"{len(planned.frontier)} plans in {planned.frontier_seconds:.1f} s, each budget's "
              f"plan in {max(a.plan_seconds for a in planned.answers):.1f} s at most\n")
        print(answers_table(planned))
        print(f"\n({time.perf_counter() - t0:.0f} s)")
        if args.validate and compiled:
            validate(bundle, B, rows[:len(EAGER_PLANS)], compiled)
    if args.plot:
        plot(results, args.plot)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
