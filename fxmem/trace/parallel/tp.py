"""Tensor parallelism, and FSDP2 over tensor parallelism on a 2-D mesh: the step as one rank
runs it, the model wrapped by PyTorch's own ``parallelize_module`` with the user's plan.

:class:`TP` applies a plan of ``torch.distributed.tensor.parallel`` styles
(``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``, ...) on a 1-D mesh of
``world_size`` ranks: the planned modules' parameters become ``DTensor`` shards and their
inputs and outputs are redistributed as the styles say (an all-reduce after a rowwise
layer, an all-gather before a sequence-parallel one, ...). :class:`Parallel` puts FSDP2
over the data-parallel dim of a ``(dp, tp)`` mesh named ``("dp", "tp")`` and the plan over
the other, as torchtitan does (``parallelize_module`` on ``mesh["tp"]`` first, then
``fully_shard`` on ``mesh["dp"]``); rank ``r`` is ``(r // tp, r % tp)`` on the mesh.

The trace runs DTensor's own Python on fake tensors (:func:`fxmem.trace.parallel.fsdp.sharded`):
the recorder declines each ``DTensor`` op and records the ops DTensor runs on its local
tensors, the functional collectives' buffers included. Ranks differ only where their
local shards do (``torch.chunk``'s split of a dim that the ranks do not divide evenly):
:meth:`TP.rank_groups` groups the ranks whose local parameters have the same shapes
(DTensor's arithmetic on one wrapped meta copy, checked by wrapping more). (A plan whose
activations split unevenly while every parameter splits evenly would make ranks alike here
that are not; the styles shard activations the way they shard the parameters next to them,
so none seen so far does.)

A local tensor handed to a style that expects a shard (``RowwiseParallel``'s input after a
``ColwiseParallel`` with ``use_local_output=True``) is taken as an even shard by
``DTensor.from_local``: a dim the ranks do not divide evenly fails there in PyTorch itself,
in the trace as in a real run; keep the DTensor (``use_local_output=False``) instead.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Iterator

import torch

from ...errors import InputError
from ..ledger.tracking import plain
from .fsdp import FSDP, Strategy, fake_world, meta_copy


def _styles():
    from torch.distributed.tensor.parallel import ParallelStyle

    return ParallelStyle


@dataclass(frozen=True)
class TP(Strategy):
    """Tensor parallelism over ``world_size`` ranks with ``plan``, a dict of module path
    (``fnmatch`` wildcards per level allowed, e.g. ``"layers.*.mlp.up_proj"``) to a
    ``torch.distributed.tensor.parallel`` style, as ``parallelize_module`` takes it; ``None``:
    a Hugging Face model's own plan (:func:`hf_plan`). Every rank sees the whole batch: B is
    the batch each rank's step runs on (the same on all).

    >>> from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    >>> TP(4, {"0": ColwiseParallel(), "2": RowwiseParallel()}).name
    'TP over 4 ranks'
    >>> TP(2).name
    "TP over 2 ranks (the model's Hugging Face plan)"
    """

    world_size: int
    plan: dict | None = None

    def __post_init__(self):
        self.check_world_size("TP")
        style = _styles()
        if self.plan is not None and (not isinstance(self.plan, dict) or not self.plan or not all(
                isinstance(k, str) and isinstance(v, style) for k, v in self.plan.items())):
            raise InputError("TP: plan is a dict of module path to a parallel style such as "
                             f"ColwiseParallel() (or None: a Hugging Face model's own plan), "
                             f"got {self.plan!r}")

    def __hash__(self):  # the plan is a dict
        return hash((self.world_size, tuple(self.plan or ())))

    def plan_for(self, model: torch.nn.Module) -> dict:
        """The plan applied to ``model``: ``plan``, or the model's own (:func:`hf_plan`),
        seen through checkpoint wrappers (:func:`through_wrappers`)."""
        return through_wrappers(model, dict(self.plan) if self.plan is not None
                                else hf_plan(model))

    @property
    def name(self) -> str:
        """A short description, e.g. ``TP over 4 ranks``."""
        own = " (the model's Hugging Face plan)" if self.plan is None else ""
        return f"TP over {self.world_size} ranks{own}"

    def check_plan(self, model: torch.nn.Module) -> None:
        """Every path of the plan names a submodule of ``model`` (as ``parallelize_module``
        matches it, level by level with ``fnmatch``); one ``InputError`` if not."""
        for path in self.plan_for(model):
            if path and not _matches(model, path.split(".")):
                raise InputError(f"TP: the model has no submodule {path!r} (plan key)")

    def apply(self, model: torch.nn.Module, mesh) -> None:
        """``parallelize_module`` ``model`` in place on ``mesh`` (1-D) with the plan."""
        from torch.distributed.tensor.parallel import parallelize_module

        self.check_plan(model)
        parallelize_module(model, mesh, self.plan_for(model))

    def rank_groups(self, model: torch.nn.Module) -> tuple:
        """The ranks, grouped by the shapes of their local parameters (:func:`_groups`: a
        meta copy wrapped as rank 0, the others' shards by DTensor's arithmetic, checked
        on each group's first and last rank), first rank first."""
        return _groups(self, model)

    def runs_compiled_parts(self) -> bool:
        """Blocks compiled on their own (``torch.compile(block)`` put back, or
        ``block.compile()``) whose linears the plan splits: dynamo traces the block on its
        DTensors, and the rank's trace lowers it as on one GPU (over a CUDA mesh), checked on
        the fake GPU's ranks; under FSDP2 x TP, :meth:`Parallel.runs_compiled_parts`."""
        return type(self) is TP

    def runs_planned_parts(self) -> bool:
        """A checkpoint plan over blocks ``torch.compile(block)`` put back, each lowered as
        ``torch.compile(checkpoint_wrapper(block))``, dynamo capturing the checkpoint on the
        rank's DTensors (torchtitan's recipe: checkpoint, compile, then split); checked on
        the fake GPU's ranks."""
        return type(self) is TP

    def materialize(self, model: torch.nn.Module, mode, device: str = "cpu") -> None:
        """Fakes of ``mode`` for ``model``'s meta parameters and buffers, each local shard
        keeping its storage's size: ``distribute_tensor`` scatters a dim-0 shard into a
        buffer the size of the largest chunk and narrows it to the rank's rows
        (``placement_types.py``, ``Shard._shard_tensor``: ``output =
        torch.empty_like(first)``, then ``_maybe_unpad_tensor_with_sizes``), so a rank with
        fewer rows holds the padded buffer (``to_empty`` would make it the rows' size)."""
        materialize_shards(model, mode, device)


@dataclass(frozen=True)
class Parallel(Strategy):
    """FSDP2 (``fsdp``, an :class:`fxmem.FSDP` whose ``world_size`` is the data-parallel
    degree dp) over tensor parallelism (``tp``, a :class:`TP` of degree tp) on a 2-D mesh
    ``(dp, tp)`` of ``dp * tp`` ranks. B is each data-parallel rank's micro-batch (the tp
    ranks of one dp rank share it).

    >>> from torch.distributed.tensor.parallel import ColwiseParallel
    >>> p = Parallel(fsdp=FSDP(2), tp=TP(4, {"0": ColwiseParallel()}))
    >>> p.world_size, p.mesh_shape, p.name
    (8, (2, 4), 'FSDP2 over 2 ranks x TP over 4 ranks (8 ranks)')
    """

    fsdp: FSDP
    tp: TP

    @property
    def mesh_dim_names(self) -> tuple:
        """``("dp", "tp")``; with HSDP, ``("replicate", "shard", "tp")``."""
        return ("replicate", "shard", "tp") if self.fsdp.replicate > 1 else ("dp", "tp")

    def __post_init__(self):
        if not isinstance(self.fsdp, FSDP):
            raise InputError(f"Parallel: fsdp is fxmem.FSDP(dp, ...), got {self.fsdp!r}")
        if not isinstance(self.tp, TP):
            raise InputError(f"Parallel: tp is fxmem.TP(tp, plan), got {self.tp!r}")

    @property
    def world_size(self) -> int:
        """All the ranks: dp * tp."""
        return self.fsdp.world_size * self.tp.world_size

    @property
    def mesh_shape(self) -> tuple:
        return (*self.fsdp.mesh_shape, self.tp.world_size)

    @property
    def offload(self) -> bool:
        return self.fsdp.offload

    @property
    def name(self) -> str:
        return f"{self.fsdp.name} x {self.tp.name} ({self.world_size} ranks)"

    def apply(self, model: torch.nn.Module, mesh) -> None:
        """The plan on ``mesh["tp"]``, then ``fully_shard`` on ``mesh["dp"]``."""
        self.tp.apply(model, mesh["tp"])
        self.fsdp.apply(model, mesh[self.mesh_dim_names[:-1]] if self.fsdp.replicate > 1
                        else mesh["dp"])

    def rank_groups(self, model: torch.nn.Module) -> tuple:
        """The ranks, grouped by the shapes of their local parameter shards (as
        :meth:`TP.rank_groups`), first rank first."""
        self.tp.check_plan(model)
        return _groups(self, model)

    def materialize(self, model: torch.nn.Module, mode, device: str = "cpu") -> None:
        """As :meth:`fxmem.FSDP.materialize`: under CPU offload the shards on the host
        whatever the mesh's device (FSDP2 refuses them elsewhere: a compiled step's mesh is
        CUDA)."""
        self.fsdp.materialize(model, mode, device)

    def runs_compiled_parts(self) -> bool:
        """Blocks compiled on their own (``torch.compile(block)`` put back, or
        ``block.compile()``) whose linears the plan splits on ``mesh["tp"]``, then sharded by
        FSDP2 on ``mesh["dp"]``: the rank's shards CUDA fakes on a CUDA mesh (host fakes
        under CPU offload), dynamo traces each block on its DTensors and the trace lowers it
        as on one GPU, FSDP2's hooks running eagerly around it (as under :class:`TP` and
        :class:`fxmem.FSDP` alone). Checked on the fake GPU's 4 ranks: a 2 x 2 mesh, with
        CPU offload too, and HSDP x TP of 2 replicas of 1 shard."""
        return type(self) is Parallel and type(self.fsdp) is FSDP

    def runs_planned_parts(self) -> bool:
        """A checkpoint plan over blocks ``torch.compile(block)`` put back, each lowered as
        ``torch.compile(checkpoint_wrapper(block))`` on the rank's DTensors, FSDP2's hooks
        eager around it (torchtitan's recipe: checkpoint, compile, split, then shard);
        checked on the fake GPU's 4 ranks, HSDP x TP and CPU offload over TP too."""
        return self.runs_compiled_parts()


def materialize_shards(model: torch.nn.Module, mode, device: str = "cpu") -> None:
    """Fakes of ``mode`` on ``device`` for ``model``'s meta parameters and buffers, a
    ``DTensor``'s local shard keeping its storage's size (:meth:`TP.materialize`)."""
    from torch.distributed.tensor import DTensor

    def fresh(t):
        local = plain(t)
        base = torch.empty(local.untyped_storage().nbytes() // local.element_size(),
                           dtype=local.dtype, device=device)
        new = base.as_strided(local.shape, local.stride(), local.storage_offset())
        if local is t:
            return new
        return DTensor.from_local(new, t.device_mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride())

    with mode:
        model._apply(fresh)


WRAPPED = "_checkpoint_wrapped_module"  # checkpoint_wrapper's child (checkpoint_wrapper.py)


def through_wrappers(model: torch.nn.Module, plan: dict) -> dict:
    """``plan`` for ``model`` whose blocks may be under ``checkpoint_wrapper``: each key
    matched against the module paths with the wrappers' ``_checkpoint_wrapped_module``
    left out, and a module inside a wrapper named by its full path (``parallelize_module``
    matches a path level by level, so ``layers.*.q`` would miss ``layers.0``'s ``q`` under
    a wrapper, skipping it with a warning). A model without wrappers keeps ``plan``.

    >>> from torch.distributed.tensor.parallel import ColwiseParallel
    >>> import fxmem
    >>> m = fxmem.apply_checkpoints(torch.nn.Sequential(torch.nn.Sequential(
    ...     torch.nn.Linear(2, 2))), ["0"])
    >>> list(through_wrappers(m, {"*.0": ColwiseParallel()}))
    ['0._checkpoint_wrapped_module.0']
    """
    names = [n for n, _ in model.named_modules() if n]
    if not any(WRAPPED in n.split(".") for n in names):
        return plan
    out = {}
    for key, style in plan.items():
        tokens = key.split(".")
        found = [n for n in names if n.split(".")[-1] != WRAPPED and _fits(n, tokens)]
        for n in found or [key]:  # (a key that names nothing: TP.check_plan says so)
            out[n] = style
    return out


def _fits(path: str, tokens: list) -> bool:
    seen = [t for t in path.split(".") if t != WRAPPED]
    return len(seen) == len(tokens) and all(fnmatch(a, b) for a, b in zip(seen, tokens))


def _matches(module: torch.nn.Module, tokens: list) -> bool:
    kids = [m for n, m in module.named_children() if fnmatch(n, tokens[0])]
    return bool(kids) and (len(tokens) == 1 or any(_matches(k, tokens[1:]) for k in kids))


def _groups(parallel: Strategy, model: torch.nn.Module) -> tuple:
    """Ranks whose wrapped copies hold local parameters of the same shapes and storage
    sizes (so the same memory), first rank first.

    One meta copy is wrapped (as rank 0); each rank's local shapes come from that copy's
    parameters by DTensor's and FSDP2's arithmetic (:func:`_local_shapes`), and ranks are
    grouped by them. The first and the last rank of each group are then wrapped for real:
    when either's shapes differ from what the arithmetic said, or its shapes and storage
    sizes from the other's, every rank is wrapped (:func:`_wrapped_groups`). Llama-3.1-8B
    over FSDP2 (8) x TP (8): two copies wrapped, not 64 (0.2 to 0.4 s each)."""
    world = parallel.world_size
    first = _wrapped_key(parallel, model, 0)
    keys = _local_shapes(first[1], parallel)
    groups: dict = {}
    for r in range(world):
        groups.setdefault(keys[r], []).append(r)
    known = {0: first[0]}
    for key, ranks in groups.items():
        for r in dict.fromkeys((ranks[0], ranks[-1])):
            real = known.get(r) or _wrapped_key(parallel, model, r)[0]
            known[r] = real
            if tuple(s for s, _ in real) != tuple(s for s, _ in key) \
                    or real != known[ranks[0]]:
                return _wrapped_groups(parallel, model)
    return tuple(tuple(g) for g in groups.values())


def _wrapped_key(parallel: Strategy, model: torch.nn.Module, rank: int) -> tuple:
    """The shape and storage bytes of each local parameter of a meta copy of ``model``
    wrapped as ``rank``, and each parameter's (global shape, mesh shape, placements) for
    :func:`_local_shapes` (None for a plain tensor)."""
    from torch.distributed.tensor import DTensor

    with fake_world(parallel.world_size, rank, parallel.mesh_shape,
                    parallel.mesh_dim_names) as mesh:
        copied = meta_copy(model)
        parallel.apply(copied, mesh)
        params = list(copied.parameters())
        key = tuple((tuple(plain(p).shape), plain(p).untyped_storage().nbytes())
                    for p in params)
        layout = tuple((tuple(p.shape), tuple(p.device_mesh.shape), tuple(p.placements))
                       if isinstance(p, DTensor) else (tuple(p.shape), None, None)
                       for p in params)
    return key, layout


def _local_shapes(layout: tuple, parallel: Strategy) -> list:
    """For each rank, each parameter's local shape and that of the first shard of its
    data-parallel group, whose size FSDP2 pads every shard's storage to
    (``FSDPParam._init_sharded_param``): ``(shape, first's shape)`` per parameter. The TP
    shard by DTensor's arithmetic over the TP dim (``torch.distributed.tensor._utils``);
    FSDP2's rows of it by :meth:`fxmem.FSDP.shard_rows` (``torch.chunk`` of the rank's TP
    shard: DTensor's ``_StridedShard`` arithmetic on the 2-D mesh differs from it where the
    rows split unevenly)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    fsdp = parallel.fsdp if isinstance(parallel, Parallel) else None
    tp = parallel.tp.world_size if fsdp else parallel.world_size
    whole = len(parallel.mesh_shape)  # a parameter the plan does not split: FSDP2's mesh

    def tp_local(shape, mesh, placements, j):
        if mesh is None or len(mesh) < whole:
            return shape
        return tuple(_compute_local_shape_and_global_offset(
            shape, (tp,), [j], placements[-1:], skip_offset=True)[0])

    def shards(shape, d):
        if fsdp is None:
            return shape, shape
        rows, rest = (shape[0], shape[1:]) if shape else (1, ())
        return (fsdp.shard_rows(rows, d), *rest), (fsdp.shard_rows(rows, 0), *rest)

    layouts = dict.fromkeys(layout)
    keys = []
    for r in range(parallel.world_size):
        d, j = divmod(r, tp)
        shapes = {lay: shards(tp_local(*lay, j), d) for lay in layouts}
        keys.append(tuple(shapes[lay] for lay in layout))
    return keys


def _wrapped_groups(parallel: Strategy, model: torch.nn.Module) -> tuple:
    """:func:`_groups` by wrapping a meta copy as every rank."""
    groups: dict = {}
    for r in range(parallel.world_size):
        groups.setdefault(_wrapped_key(parallel, model, r)[0], []).append(r)
    return tuple(tuple(g) for g in groups.values())


@contextlib.contextmanager
def metadata_unrecorded(tracker) -> Iterator[None]:
    """While the block runs, DTensor's sharding propagation runs its op on global-shaped
    fake tensors unrecorded by ``tracker``: eager DTensor does that under a
    ``FakeTensorMode`` of its own, on no device, to learn the output's global shape and
    strides (``torch/distributed/tensor/_sharding_prop.py``,
    ``_propagate_tensor_meta_non_cached``), and caches the answer; in a trace the mode it
    finds is the trace's, whose ops the recorder would count as allocations."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    base = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, op_schema):
        was, tracker.recording = tracker.recording, False
        try:
            return base(self, op_schema)
        finally:
            tracker.recording = was

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = base


def _hf_styles() -> dict:
    """Hugging Face's tensor-parallel style names, as PyTorch's styles. Transformers
    registers each name as its own ``ColwiseParallel``/``RowwiseParallel``/``EmbeddingParallel``
    with these layouts (``transformers/distributed/tensor_parallel.py``, the
    ``ALL_PARALLEL_STYLES.register`` calls): the same weight shards and the same
    redistributions of the input and output as PyTorch's styles below."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        # weight Shard(0); input Replicate; output this rank's Shard(-1), local
        "colwise": lambda: ColwiseParallel(),
        # weight Shard(-1), bias Replicate; input Shard(-1); output all-reduced, local
        "rowwise": lambda: RowwiseParallel(),
        # colwise whose output is all-gathered (a language model's head: the logits whole)
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        # rowwise on a replicated input (each rank takes its slice of it)
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        # vocabulary-parallel embedding: weight Shard(0), ids replicated, lookups summed
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        # hidden-dim-parallel embedding: weight Shard(1), the slices gathered
        "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(),
        "replicate": None,  # every rank keeps the whole parameter: nothing to apply
        # the same, its gradient summed over the ranks in place once accumulated (a per-head
        # norm between a colwise and a rowwise layer: Qwen3's q_norm and k_norm): the sum
        # allocates nothing
        "replicated_with_grad_allreduce": None,
    }


def hf_plan(model: torch.nn.Module) -> dict:
    """A Hugging Face model's own tensor-parallel plan (``model.tp_plan``: its class's
    ``_tp_plan`` and its config's ``base_model_tp_plan``, as ``from_pretrained(...,
    tp_plan="auto")`` applies them), each style as PyTorch's equivalent
    (:func:`_hf_styles`). A model without one, or a style PyTorch's styles cannot
    express (packed, expert-parallel, ...), is an :class:`fxmem.InputError`.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> with torch.device("meta"):
    ...     m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1))
    >>> plan = hf_plan(m)
    >>> type(plan["model.layers.*.self_attn.o_proj"]).__name__, len(plan)
    ('RowwiseParallel', 9)
    """
    # the model's, or that of the outermost module with one (a wrapper's Hugging Face model)
    hf = [(n, m) for n, m in model.named_modules() if isinstance(getattr(m, "tp_plan", None),
                                                                   dict)]
    prefix, own = next(((f"{n}." if n else "", m.tp_plan) for n, m in hf if m.tp_plan),
                       ("", None))
    cls = type(hf[0][1] if hf else model).__name__
    if own is None:
        why = ("Hugging Face gives it none" if hf else
               "only Hugging Face models carry one, and not every one does")
        raise InputError(f"TP: {cls} has no tensor-parallel plan of its own ({why}): pass "
                         f"fxmem.TP(world_size, plan) with yours")
    styles = _hf_styles()
    out = {}
    for path, name in own.items():
        if name not in styles:
            raise InputError(f"TP: {cls}'s plan shards {path} with Hugging Face's "
                             f"{name!r}, which fxmem cannot express with PyTorch's styles: "
                             f"pass fxmem.TP(world_size, plan) with your own")
        if styles[name] is not None:
            out[prefix + path] = styles[name]()
    return out
