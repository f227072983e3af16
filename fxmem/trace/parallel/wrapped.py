"""A model the user wrapped already (FSDP2's ``fully_shard``, tensor parallelism's
``parallelize_module``, both on a 2-D mesh, or ``DistributedDataParallel``), over a fake
process group of their own, analysed as it is: :func:`as_wrapped` reads what wraps it,
:class:`AsWrapped` is the strategy of the report, and :meth:`AsWrapped.copy` makes the copy
a trace runs, the user's model, parameters and process group left as they are.

How the copy is made (chosen by experiment, torch 2.13):

- FSDP2 refuses to be copied: ``fully_shard`` gives each module's class a ``__deepcopy__``
  that raises ("FSDP does not support deepcopy"), and its state holds process groups and
  streams. So the copy is made the other way round: an unwrapped copy of the model on the
  meta device (each module of its own class again, FSDP2's hooks and state left out, each
  parameter shaped as before ``fully_shard``: the whole tensor, or the tensor-parallel
  ``DTensor`` it sharded), then ``fully_shard`` applied to it again, state by state,
  innermost first, with what each of the user's FSDP2 states records: the modules of the
  group, the user's own mesh (so the copy's shards are the user's rank's),
  ``reshard_after_forward`` (``None``, the default, kept as such), the ``mp_policy``, the
  parameters left out, each parameter's shard placement, then the settings
  ``FSDPModule``'s setters change afterwards (prefetching, ``reshard_after_backward``,
  ``unshard_in_backward``, ...). The copy's groups are then compared with the user's
  (the parameters, their placements and shard shapes, the post-forward mesh): a wrapping
  not reproduced is an :class:`fxmem.InputError`, never a wrong answer. Re-applying
  PyTorch's own call reproduces more of the wrapping than reading it into
  :class:`fxmem.FSDP` would (which has one ``reshard_after_forward`` and one policy for
  all blocks, where torchtitan, for one, does not reshard its last block).
- Tensor parallelism's hooks (``parallelize_module``'s) are plain module hooks and stay on
  the copy; its ``DTensor`` parameters are copied onto the meta device with their
  placements, their global shapes and their local storages' sizes (a dim-0 shard keeps
  the padded storage of the largest chunk).
- ``DistributedDataParallel`` has no state to reproduce but its options: they are read
  back (bucket caps, ``gradient_as_bucket_view``, ``static_graph``, buffer sync) and the
  user's module, copied, is wrapped again with them inside the trace, over fxmem's own
  echo group (:mod:`fxmem.trace.parallel.ddp`), whatever group the user's DDP has.

Which ranks: the process group is the user's. fxmem neither destroys it nor makes
groups beside it, and a copy wrapped over the user's own mesh holds the shards of the
user's rank. So an FSDP2 or tensor-parallel model is reported for the user's rank only
(``report.groups`` has one group); the other ranks are other processes (analyse the
unwrapped model with ``parallel=`` to see every rank). Under DDP every rank holds the
same replica: every rank is reported, all alike.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from dataclasses import dataclass
from typing import Iterator

import torch

from ...errors import InputError
from ..kernels.compat import fsdp_group_policy
from .ddp import DDP, Kept, RealInts, _EchoGroup
from .fsdp import empty_tied, meta_copy
from .strategy import Strategy
from .tp import materialize_shards

WHAT_TO_DO = ("pass the unwrapped model with parallel=fxmem.FSDP(...), fxmem.DDP(...), "
              "fxmem.TP(...) or fxmem.Parallel(...)")
# what FSDPModule's setters change on a param group after fully_shard (plain values)
GROUP_SETTINGS = ("reduce_grads", "all_reduce_grads", "reshard_after_backward",
                  "reduce_scatter_max_input_buffers", "gradient_divide_factor",
                  "reduce_scatter_unused_params", "force_sum_reduction_for_comms",
                  "unshard_async_op", "unshard_in_backward")
_FSDP_ATTRS = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
          "_load_state_dict_post_hooks")
_HOOK_FLAGS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs")


@dataclass(frozen=True)
class AsWrapped(Strategy):
    """The wrapping found on a model (:func:`as_wrapped`), as the strategy of its report:
    ``name`` says what was found, ``world_size`` the ranks of the user's process group,
    ``rank`` the user's; ``ddp``: for a DDP model, its options read back (its module is
    wrapped again in the trace), else None (the model's own wrapping re-applied to a
    copy).

    >>> s = AsWrapped("FSDP2 over 4 ranks, as wrapped (rank 3 of 4)", 4, 3)
    >>> s.rank_groups(torch.nn.Linear(2, 2)), s.warmup_steps
    (((3,),), 1)
    """

    name: str
    world_size: int
    rank: int
    ddp: DDP | None = None
    kwargs: tuple = ()  # DDP's constructor options read back, as (name, value) pairs

    @property
    def warmup_steps(self) -> int:
        return self.ddp.warmup_steps if self.ddp is not None else 1

    def rank_groups(self, model: torch.nn.Module) -> tuple:
        """The user's rank alone; under DDP every rank (each a replica)."""
        if self.ddp is not None:
            return self.ddp.rank_groups(model)
        return ((self.rank,),)

    @contextlib.contextmanager
    def copy(self, model: torch.nn.Module, rank: int, mode) -> Iterator:
        """The copy of ``model`` (as :func:`as_wrapped` returned it) a trace runs as rank
        ``rank``, its storages fakes of ``mode``, and the :class:`fxmem.trace.parallel.ddp.Kept`
        that saw DDP's construction (None for the others); usable while the block runs."""
        if self.ddp is not None:
            copied = meta_copy(model)
            with mode:
                empty_tied(copied)
            kept = Kept()
            kept.know([*copied.parameters(), *copied.buffers()])
            kept.real = RealInts()
            from torch.nn.parallel import DistributedDataParallel

            with mode, kept.real, kept:
                wrapped = DistributedDataParallel(
                    copied, device_ids=None, process_group=_EchoGroup(rank, self.world_size),
                    init_sync=False, **dict(self.kwargs))
            yield wrapped, kept
            return
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _check_group()
        _clear_sharding_prop_cache()  # (as for fxmem's own fake group: parallel.fake_world)
        try:
            copied, fsdp = _rewrapped(model)
            if fsdp:  # FSDP2's _apply pads the shards again (FSDPParam.reset_sharded_param)
                with mode:
                    copied.to_empty(device="cpu")
            else:
                materialize_shards(copied, mode)
            yield copied, None
        finally:
            _clear_sharding_prop_cache()


def as_wrapped(model) -> tuple:
    """``(model, strategy)`` for a model wrapped already: for DDP its ``.module`` and the
    options read back; for FSDP2 and tensor parallelism the model itself; ``(model,
    None)`` for a model not wrapped. One :class:`fxmem.InputError` for a wrapping fxmem
    does not analyse as it is (FSDP1, ``DataParallel``, DeepSpeed, HSDP, CPU offload, a
    real process group, ...).

    >>> m = torch.nn.Linear(2, 2)
    >>> as_wrapped(m) == (m, None)
    True
    >>> as_wrapped(torch.nn.DataParallel(m))
    Traceback (most recent call last):
    ...
    fxmem.errors.InputError: torch.nn.DataParallel is not analysed as it is: pass the ...
    """
    if not isinstance(model, torch.nn.Module) or not torch.distributed.is_available():
        return model, None
    kind = type(model).__module__.split(".")[0]
    if kind == "deepspeed":
        raise InputError(f"a DeepSpeed engine ({type(model).__name__}) is not analysed as "
                         f"it is: {WHAT_TO_DO} (ZeRO-3 is FSDP, ZeRO-1 fxmem.DDP(zero1=True))")
    from torch.nn.parallel import DistributedDataParallel

    # FSDP's and DTensor's classes if their modules are imported (a model wrapped by them
    # has them imported): none is imported here for a model that is not
    fsdp_mod = sys.modules.get("torch.distributed.fsdp")
    tensor_mod = sys.modules.get("torch.distributed.tensor")
    FSDPModule = getattr(fsdp_mod, "FSDPModule", ())  # noqa: N806 - classes
    FSDP1 = getattr(fsdp_mod, "FullyShardedDataParallel", ())  # noqa: N806
    DTensor = getattr(tensor_mod, "DTensor", ())  # noqa: N806
    for name, m in model.named_modules():
        where = f" at {name!r}" if name else ""
        if isinstance(m, FSDP1):
            raise InputError(f"FSDP1 (FullyShardedDataParallel{where}) is not analysed as "
                             f"it is: {WHAT_TO_DO} (FSDP2, fully_shard)")
        if isinstance(m, torch.nn.DataParallel):
            raise InputError(f"torch.nn.DataParallel{where} is not analysed as it is: "
                             f"{WHAT_TO_DO}")
        if isinstance(m, DistributedDataParallel) and m is not model:
            raise InputError(f"a DistributedDataParallel inside the model{where} is not "
                             f"analysed as it is: wrap the model itself, or {WHAT_TO_DO}")
    if isinstance(model, DistributedDataParallel):
        return model.module, _ddp(model)
    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
    tp = [p for p in model.parameters() if isinstance(p, DTensor)]
    if not fsdp and not tp:
        return model, None
    _check_group()
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    parts = []
    if fsdp:
        states = _states(model)
        sizes = {g.mesh_info.shard_mesh_size for st, _ in states for g in _groups(st)}
        parts.append(f"FSDP2 over {max(sizes, default=1)} ranks")
        tp = [fp._unsharded_dtensor_spec for st, _ in states for g in _groups(st)
              for fp in g.fsdp_params if fp.is_dtensor]
        tp = [s.mesh for s in tp]
    else:
        tp = [p.device_mesh for p in tp]
    if tp:
        parts.append(f"TP over {max(m.size() for m in tp)} ranks")
    name = " x ".join(parts) + f", as wrapped (rank {rank} of {world})"
    return model, AsWrapped(name, world, rank)


def wrapping(model) -> str | None:
    """What wraps ``model`` (:attr:`AsWrapped.name`; ``"wrapped"`` for a wrapping not
    analysed as it is), or None for a model not wrapped."""
    try:
        _, found = as_wrapped(model)
    except InputError:
        return "wrapped"
    return found.name if found is not None else None


def refuse_wrapped(model, parallel=None, who: str = "analyze") -> None:
    """One :class:`fxmem.InputError` for a model wrapped already given ``parallel=``
    (``who``: ``analyze``), or given to ``who`` (``measure``, ``whatif``), which takes the
    unwrapped model and a spec."""
    what = wrapping(model)
    if what is None:
        return
    if parallel is not None:
        given = getattr(parallel, "name", parallel)
        raise InputError(f"parallel={given} was given for a model wrapped already ({what}): "
                         "analyse it without parallel= (as it is), or pass the unwrapped "
                         "model")
    raise InputError(f"{who} takes the unwrapped model and parallel=fxmem.FSDP(...), "
                     f"fxmem.DDP(...), ... (this one is wrapped already: {what}); "
                     "fxmem.analyze takes it as it is")


def _check_group() -> None:
    """The process group a wrapped model's copy runs over is fake (collectives do nothing),
    or one :class:`fxmem.InputError`: a real group's collectives would wait for the other
    ranks, or read fake tensors' data."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise InputError("the model is wrapped over a process group that is destroyed: "
                         f"analyse it before destroy_process_group, or {WHAT_TO_DO}")
    backend = dist.get_backend()
    if backend != "fake":
        raise InputError(f"the model is wrapped over a real {backend!r} process group of "
                         f"{dist.get_world_size()} ranks, whose collectives a trace cannot "
                         "run: wrap it over init_process_group('fake', store=FakeStore(), "
                         f"...), or {WHAT_TO_DO}")


def _ddp(ddp) -> AsWrapped:
    """A DistributedDataParallel's options read back (one InputError for those fxmem does
    not model: ``find_unused_parameters``, mixed precision, communication hooks)."""
    if ddp.find_unused_parameters:
        raise InputError("DDP with find_unused_parameters=True is not modelled: wrap without "
                         "it, or analyse the unwrapped model with parallel=fxmem.DDP(...)")
    if ddp.mixed_precision is not None or getattr(ddp, "_comm_hooks", None):
        raise InputError("DDP with mixed precision or a communication hook is not modelled: "
                         "analyse the unwrapped model with parallel=fxmem.DDP(...)")
    config = ddp._bucket_config
    mib = 1024 * 1024
    kwargs = {"bucket_cap_mb": None if ddp.bucket_bytes_cap_default else
              config.bucket_bytes_cap / mib,
              "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
              "static_graph": ddp.static_graph,
              "forward_sync_buffers": ddp.forward_sync_buffers}
    if config.per_bucket_bytes_caps:
        kwargs["bucket_cap_mb_list"] = [c / mib for c in config.per_bucket_bytes_caps]
    if getattr(ddp, "batched_grad_copy", False):
        kwargs["batched_grad_copy"] = True
    group = ddp.process_group
    cap = config.bucket_bytes_cap / mib
    for digits in range(1, 17):  # the shortest that gives the cap: 0.005, not 0.0049991...
        short = float(f"{cap:.{digits}g}")
        if int(short * mib) == config.bucket_bytes_cap:
            cap = short
            break
    spec = DDP(group.size(), bucket_cap_mb=cap,
               gradient_as_bucket_view=ddp.gradient_as_bucket_view,
               static_graph=ddp.static_graph)
    return AsWrapped(f"{spec.name}, as wrapped", group.size(), group.rank(), ddp=spec,
                     kwargs=tuple(kwargs.items()))


def _groups(state) -> list:
    return list(state._fsdp_param_groups)


def _states(model) -> list:
    """Each FSDP2 state of ``model`` and the paths of its modules, innermost first (the
    order ``fully_shard`` is called in: each group takes the parameters no group under it
    took)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    order, paths = [], {id(m): n for n, m in model.named_modules()}

    def post(mod):
        for kid in mod.children():
            post(kid)
        order.append(mod)

    post(model)
    out: dict = {}
    for m in order:
        if isinstance(m, FSDPModule):
            st = fully_shard.state(m)
            if st is None:  # e.g. torch.distributed._composable's replicate()
                raise InputError(f"{type(m).__name__} at {paths[id(m)]!r} is not "
                                 f"fully_shard's: not analysed as it is; {WHAT_TO_DO}")
            if id(st) not in out:
                out[id(st)] = (st, [paths[id(x)] for x in st._modules])
    for st, where in out.values():
        _check_state(st, where[0])
    return list(out.values())


def _check_state(st, where: str) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy

    groups = _groups(st)
    if len(groups) > 1:
        raise InputError(f"FSDP2 at {where!r} shards its parameters over several meshes "
                         f"(shard_placement_fn): not analysed as it is; {WHAT_TO_DO}")
    for g in groups:
        if isinstance(g.offload_policy, CPUOffloadPolicy):
            raise InputError(f"FSDP2 with CPUOffloadPolicy (at {where!r}) is not modelled "
                             "yet: analyse it without offload")
        if g.mesh_info.replicate_mesh_dim is not None or g.mesh_info.is_spmd_mesh:
            raise InputError(f"FSDP2 at {where!r} is HSDP or on an SPMD mesh (dp_mesh_dims): "
                             f"not analysed as it is; {WHAT_TO_DO}")
        post = g.post_forward_mesh_info
        if post is not None and post.shard_mesh_size != g.mesh_info.shard_mesh_size:
            raise InputError(f"FSDP2 at {where!r} reshards after forward to "
                             f"{post.shard_mesh_size} ranks (an int reshard_after_forward): "
                             "its mesh would be made again beside yours; pass the unwrapped "
                             "model with parallel=fxmem.FSDP(..., reshard_after_forward=n)")
        if type(g._all_gather_comm).__name__ != "DefaultAllGather" or \
                type(g._reduce_scatter_comm).__name__ != "DefaultReduceScatter" or \
                g._all_reduce_hook is not None:
            raise InputError(f"FSDP2 at {where!r} has a custom all-gather, reduce-scatter or "
                             f"all-reduce hook: not analysed as it is; {WHAT_TO_DO}")


def _is_fsdp(hook) -> bool:
    """Is this module hook one of FSDP2's (its state's methods, its parameters' lambdas)?"""
    for attr in ("hook", "func", "__func__"):  # _WrappedHook, partial, bound method
        hook = getattr(hook, attr, hook)
    return getattr(hook, "__module__", "").startswith("torch.distributed.fsdp")


def _meta_param(t, fp):
    """A meta parameter shaped as ``t`` was before ``fully_shard`` (``fp``, its FSDPParam,
    or None): the whole tensor, or the tensor-parallel DTensor; a DTensor of no FSDP2 group
    keeps its local storage's size."""
    from torch.distributed.tensor import DTensor

    if fp is not None:
        local = torch.empty(fp._orig_size, dtype=t.dtype, device="meta")
        spec = fp._unsharded_dtensor_spec if fp.is_dtensor else None
        new = local if spec is None else DTensor.from_local(
            local, spec.mesh, spec.placements, run_check=False, shape=spec.shape,
            stride=spec.stride)
    elif isinstance(t, DTensor):
        lt = t._local_tensor
        base = torch.empty(lt.untyped_storage().nbytes() // lt.element_size(), dtype=lt.dtype,
                           device="meta")
        new = DTensor.from_local(base.as_strided(lt.shape, lt.stride(), lt.storage_offset()),
                                 t.device_mesh, t.placements, run_check=False, shape=t.shape,
                                 stride=t.stride())
    else:
        new = t.detach().to("meta")
    return torch.nn.Parameter(new, requires_grad=t.requires_grad) \
        if isinstance(t, torch.nn.Parameter) else new


def _rewrapped(model) -> tuple:
    """The copy: ``model`` unwrapped on the meta device, its FSDP2 states applied again
    (:func:`_states`); and whether it has any (else it is tensor parallel only)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    states = _states(model)
    managed = {}  # (module id, name) -> FSDPParam
    for st, _ in states:
        for g in _groups(st):
            for fp in g.fsdp_params:
                info = fp._module_info
                managed[(id(info.module), info.param_name)] = fp
                for m, n in zip(info.shared_modules, info.shared_param_names):
                    managed[(id(m), n)] = fp
    memo: dict = {}
    mods = list(model.named_modules(remove_duplicate=False))
    for _, m in mods:
        for n, p in m._parameters.items():
            if p is not None and id(p) not in memo:
                memo[id(p)] = _meta_param(p, managed.get((id(m), n)))
        for b in m._buffers.values():
            if b is not None and id(b) not in memo:
                memo[id(b)] = _meta_param(b, None)
        if id(m) not in memo:
            cls = type(m)
            if isinstance(m, FSDPModule):
                cls = next(b for b in cls.__bases__ if not issubclass(b, FSDPModule))
            memo[id(m)] = cls.__new__(cls)
    done = set()
    for _, m in mods:
        if id(m) in done:
            continue
        done.add(id(m))
        state, dropped = {}, set()
        for k, v in vars(m).items():
            if k in _FSDP_ATTRS or k.startswith("__composable_api_state_key"):
                continue
            if k in _HOOKS:  # FSDP2's hooks left out; fully_shard registers its own
                fsdp = {i for i, h in v.items() if _is_fsdp(h)}
                dropped |= fsdp
                v = type(v)((i, h) for i, h in v.items() if i not in fsdp)
            state[k] = v
        for k in _HOOK_FLAGS:
            if k in state:
                state[k] = type(state[k])((i, f) for i, f in state[k].items()
                                          if i not in dropped)
        vars(memo[id(m)]).update(copy.deepcopy(state, memo))
    copied = memo[id(model)]
    if not states:
        return copied, False
    # fully_shard again, innermost first, as the user's states record it
    ignored = {memo[id(p)] for (mid, n), p in _slots(model) if (mid, n) not in managed}
    path_of_copy = dict(copied.named_modules())
    made = {}
    for st, paths in states:
        g = _groups(st)[0] if _groups(st) else None
        mesh = g.mesh_info.mesh if g is not None else _any_mesh(states)
        if st._auto_reshard_after_forward:
            reshard = None
        else:
            reshard = g is None or g.post_forward_mesh_info is not None
        def copy_of(fp):  # the copy's parameter for one of the group's
            return memo[id(getattr(fp._module_info.module, fp._module_info.param_name))]

        placement = {} if g is None else {id(copy_of(fp)): fp.fsdp_placement
                                          for fp in g.fsdp_params}
        targets = [path_of_copy[p] for p in paths]
        fully_shard(targets if len(targets) > 1 else targets[0], mesh=mesh,
                    reshard_after_forward=reshard,
                    shard_placement_fn=lambda p, _pl=placement: _pl.get(id(p)),
                    mp_policy=fsdp_group_policy(st, g, copy_of),
                    ignored_params=ignored or None)
        made[id(st)] = fully_shard.state(targets[0])
    by_state = {id(st): made[id(st)] for st, _ in states}
    for st, paths in states:
        new = made[id(st)]
        _same_groups(st, new, paths[0], model, copied)
        for g, h in zip(_groups(st), _groups(new)):
            for attr in GROUP_SETTINGS:
                if hasattr(g, attr):
                    setattr(h, attr, getattr(g, attr))
        new._states_to_forward_prefetch = [by_state[id(s)] for s in
                                           st._states_to_forward_prefetch]
        new._states_to_backward_prefetch = [by_state[id(s)] for s in
                                            st._states_to_backward_prefetch]
    return copied, True


def _slots(model):
    seen = set()
    for m in model.modules():
        for n, p in m._parameters.items():
            if p is not None and (id(m), n) not in seen:
                seen.add((id(m), n))
                yield (id(m), n), p


def _any_mesh(states):
    for st, _ in states:
        for g in _groups(st):
            return g.mesh_info.mesh
    raise InputError("FSDP2 states with no parameters at all: nothing to analyse as wrapped")


def _same_groups(user, new, where: str, model, copied) -> None:
    """The copy's FSDP2 groups hold the user's parameters with the same placements, shard
    shapes and post-forward mesh, or one InputError: the wrapping was not reproduced."""
    def keys(state, root):
        path = {id(m): n for n, m in root.named_modules()}
        return [[(path[id(fp._module_info.module)], fp._module_info.param_name,
                  fp.fsdp_placement, tuple(fp.sharded_size),
                  tuple(fp.padded_sharded_param_size), tuple(fp._orig_size),
                  fp.post_forward_mesh_info is None, fp.sharded_param.dtype)
                 for fp in g.fsdp_params] for g in _groups(state)]

    theirs, ours = keys(user, model), keys(new, copied)
    if theirs != ours:
        raise InputError(f"the FSDP2 wrapping at {where!r} could not be reproduced on a copy "
                         f"(its parameters or shards differ): {WHAT_TO_DO}")
