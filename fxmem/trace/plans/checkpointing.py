"""Activation-checkpoint plans: which module forwards are recomputed in backward.

A *plan* is a set of module paths (``"layer1.0"``, ``"model.transformer.h.3"``) whose forward
runs under ``torch.utils.checkpoint`` non-reentrantly (``use_reentrant=False``) with the RNG
state preserved, so dropout draws the same masks when the forward is recomputed.

- :func:`normalize_plan` checks a plan against a model (one clear error per bad path).
- :func:`apply_checkpoints` wraps the plan's modules in place with PyTorch's own
  ``checkpoint_wrapper``, for the user's real training.
- :func:`checkpointing` is what :func:`fxmem.analyze` uses while tracing: the same
  ``torch.utils.checkpoint`` call, installed on the module instances only for the trace and
  removed afterwards, so module paths and parameter names stay the user's.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
>>> fxmem.apply_checkpoints(m, ["0"])[0].__class__.__name__
'CheckpointWrapper'
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, noop_context_fn

from ...errors import InputError
from ..compiled import compiled_parts
from .regions import Plan, Region, modules_of, simple
from .selective import SaveCalls, context_fn, group_of, install_group, own_forward

WRAPPED = "._checkpoint_wrapped_module"  # the child name checkpoint_wrapper inserts


def user_path(path: str) -> str:
    """A module path without ``checkpoint_wrapper``'s inserted component."""
    return path.replace(WRAPPED, "").replace(WRAPPED[1:], "").strip(".")


def normalize_plan(model: torch.nn.Module, plan, parallel=None, compile=None) -> Plan:
    """The plan as a sorted :class:`fxmem.Plan`, checked against ``model`` (run under the
    strategy ``parallel``, if given; ``compile``: ``compile=``, which compiles the
    strategy's ``compile_blocks`` in place on each rank, checked as such parts).

    Raises :class:`fxmem.InputError` for a path that names no submodule, the root module, a
    path inside another path of the plan (nested checkpoints are not plans: checkpoint the
    outer module, or the inner ones), or a group whose modules are not siblings; and for
    what is not modelled of parts compiled on their own (:func:`check_parts_plan`).
    """
    if plan is None:
        return Plan()
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    plan = check_plan({user_path(m) for m in _named_modules(model)}, plan)
    blocks = parallel.compile_blocks(model) if compile and parallel is not None else ()
    check_parts_plan(model, plan, parallel, blocks)
    return plan


def check_parts_plan(model: torch.nn.Module, plan: Plan, parallel=None,
                     in_place: tuple = ()) -> None:
    """A plan with parts compiled on their own (:func:`fxmem.trace.compiled.compiled_parts`):
    each entry over them a whole part, ``torch.compile(block)`` put in the model or a block
    compiled in place (traced lowered as ``torch.compile(checkpoint_wrapper(block))``, or
    ``checkpoint_wrapper(block)`` compiled in place: :func:`checkpointed_call`), the others
    outside every part; else an :class:`fxmem.InputError` in one line. A block compiled in
    place is planned on one GPU and under a strategy ``parallel`` whose
    ``runs_planned_parts`` is True, as a part put back is. ``in_place``: paths of blocks
    a rank compiles in place (``compile=`` under ``parallel``), checked as such parts."""
    from torch._dynamo.eval_frame import OptimizedModule

    by_path = {user_path(p): m for p, m in compiled_parts(model)} if plan else {}
    by_path.update({p: None for p in in_place} if plan else {})  # (None: compiled in place)
    for e in plan if by_path else ():
        for p in modules_of(e):
            if p in by_path and parallel is not None and \
                    not isinstance(by_path[p], OptimizedModule) and \
                    not getattr(parallel, "runs_planned_parts", lambda: False)():
                raise InputError(f"checkpoint plan: module {p} is compiled in place "
                                 f"(block.compile()) under {parallel.name}: plans over it "
                                 "are not modelled yet (on one GPU, under FSDP2, HSDP, "
                                 "DDP, TP and FSDP2 x TP they are)")
            if p in by_path and not isinstance(e, str):
                raise InputError(f"checkpoint plan: {e} is selective or a group over module "
                                 f"{p}, compiled on its own: a plan checkpoints such a part "
                                 "whole, as torch.compile(checkpoint_wrapper(block)) does")
            part = next((q for q in by_path if p.startswith(q + ".") or q == ""), None)
            if part is not None:
                raise InputError(f"checkpoint plan: module {p} is inside module "
                                 f"{part or '(the model)'}, compiled on its own: a plan "
                                 "checkpoints such a part whole, not modules inside it")
            held = next((q for q in by_path if q.startswith(p + ".")), None)
            if held is not None:
                raise InputError(f"checkpoint plan: module {p} holds module {held}, compiled "
                                 "on its own: an eager checkpoint around compiled code is not "
                                 "modelled; checkpoint the parts themselves")


def check_plan(paths, plan) -> Plan:
    """``plan`` as a sorted :class:`fxmem.Plan`, checked against the module paths ``paths``
    (see :func:`normalize_plan`)."""
    if plan is None:
        return Plan()
    plan = Plan.of(plan)
    for e in plan:
        for p in modules_of(e):
            if p not in paths:
                raise InputError(f"checkpoint plan: the model has no submodule {p!r}"
                                 f"{_paths_hint(p, paths)}")
        mods = modules_of(e)
        if len({m.rpartition(".")[0] for m in mods}) > 1:
            raise InputError(f"checkpoint group {e}: {', '.join(mods)} are not siblings "
                             "(one segment is consecutive modules of one parent)")
    every = plan.modules
    if len(set(every)) != len(every):
        twice = sorted(m for m in set(every) if every.count(m) > 1)
        raise InputError(f"checkpoint plan: {twice[0]!r} is in two of its regions")
    for a in every:
        for b in every:
            if b != a and b.startswith(a + "."):
                raise InputError(f"checkpoint plan: {b!r} is inside {a!r}; nested checkpoints "
                                 "are not a plan (keep one of them)")
    return plan


def _paths_hint(p: str, paths) -> str:
    """Which module paths the user may have meant: the closest names, else the top level.

    >>> _paths_hint("conv3", {"", "conv1", "conv2", "fc"})
    " (did you mean 'conv2', 'conv1'? the model's top-level modules: conv1, conv2, fc)"
    """
    import difflib

    known = sorted(q for q in paths if q)
    near = sorted(q for q in known if q.startswith(p) or p.startswith(q))[:3] or \
        difflib.get_close_matches(p, known, n=2, cutoff=0.6)
    top = [q for q in known if "." not in q]
    listed = ", ".join(top[:12]) + (f" and {len(top) - 12} more" if len(top) > 12 else "")
    parts = [f"did you mean {', '.join(map(repr, near))}?"] if near else []
    parts += [f"the model's top-level modules: {listed}"] if top else []
    return f" ({' '.join(parts)})" if parts else ""


def _named_modules(model):
    return {n: m for n, m in model.named_modules() if n}


def _submodule(model, path):
    for n, m in model.named_modules():
        if n and user_path(n) == path:
            return n, m
    raise InputError(f"checkpoint plan: the model has no submodule {path!r}")


def apply_checkpoints(model: torch.nn.Module, plan) -> torch.nn.Module:
    """Checkpoint ``plan`` (module paths, :class:`fxmem.Region` s, a :class:`fxmem.Plan` or
    :func:`fxmem.load_plan`'s result) in ``model``, in place, and return ``model``.

    A module path, or a region of one module, is wrapped with PyTorch's ``checkpoint_wrapper``
    (non-reentrant, RNG state preserved; a region's ``save`` calls through
    ``create_selective_checkpoint_contexts``). A group of modules becomes one checkpoint
    through :func:`fxmem.trace.plans.selective.install_group` (module paths do not change).
    Already wrapped modules are left as they are. Gradients are the same as without the plan.
    A part compiled on its own, ``torch.compile(block)``, becomes
    ``torch.compile(checkpoint_wrapper(block))`` (the part's own options), the step
    :func:`fxmem.analyze` traces for the plan.
    """
    plan = normalize_plan(model, plan)  # an entry over a part: the whole part, compiled
    parts = {id(m) for _, m in compiled_parts(model)} if plan else set()
    for e in plan:
        mods = [_submodule(model, p) for p in modules_of(e)]
        if any(isinstance(m, CheckpointWrapper) or group_of(m) is not None for _, m in mods):
            continue
        save = getattr(e, "save", ())
        if len(mods) > 1:
            by_path = dict(zip(modules_of(e), (m for _, m in mods)))
            install_group([m for _, m in mods], modules_of(e), save,
                          outer=lambda p, f: uncached(by_path[p], f))
            continue
        name, mod = mods[0]
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, checkpointed_part(mod) if id(mod) in parts else
                _wrapped(mod, save))
    return model


def checkpointed_part(part) -> torch.nn.Module:
    """A part compiled on its own, ``torch.compile(block)``, as
    ``torch.compile(checkpoint_wrapper(block))``: the block in the wrapper
    :func:`apply_checkpoints` puts, compiled by the part's own dynamo context (backend and
    options). A block compiled in place (``block.compile()``) as torchtitan's recipe makes
    it: ``checkpoint_wrapper(block)``, compiled in place by the block's context, the block's
    own compile moved to the wrapper. What :func:`apply_checkpoints` puts in the model for
    such an entry of a plan (the trace lowers the same: :func:`checkpointed_call`)."""
    from torch._dynamo.eval_frame import OptimizedModule

    from ..compiled import in_place_context

    if isinstance(part, OptimizedModule):
        return part.dynamo_ctx(_wrapped(part._orig_mod, ()))
    context, wrapper = in_place_context(part), _wrapped(part, ())
    if context is None:  # (a _compiled_call_impl set by other code than Module.compile)
        raise InputError("checkpoint plan: a module is compiled in place, not by "
                         "module.compile(): plans over it are not modelled")
    object.__setattr__(part, "_compiled_call_impl", None)
    wrapper._compiled_call_impl = context(wrapper._call_impl)
    return wrapper


def checkpointed_call(part, hooked: bool = False):
    """What the trace lowers for a plan's entry that is a part compiled on its own
    (:func:`fxmem.trace.compiled.parts.parts_lowered`): ``torch.compile(block)``, as
    :func:`checkpointed_part`; a block compiled in place, its compiled call as the recipe
    runs it (:class:`_CheckpointedInPlace`), the model left as it is."""
    from torch._dynamo.eval_frame import OptimizedModule

    return checkpointed_part(part) if isinstance(part, OptimizedModule) else \
        _CheckpointedInPlace(part, hooked)


class _CheckpointedInPlace:
    """The call of a block compiled in place (``block.compile()``) as torchtitan's recipe
    runs it: ``checkpoint_wrapper(block)``, then ``.compile()`` on the wrapper by the
    block's own dynamo context (backend and options). While it runs, the block is called
    by the wrapper's checkpoint as the recipe's block is: its own compile off (its
    ``_compiled_call_impl`` None), set back after (the checkpoint's re-run is in the
    compiled backward graph).

    ``hooked``: a rank's block, whose strategy's hooks (FSDP2's) are on the block, which
    the trace calls uncompiled (:func:`fxmem.trace.compiled.parts.parts_lowered`): the
    block's forward checkpointed (non-reentrant) inside the block's own compile, as the
    recipe's compiled wrapper runs its forward between the hooks dynamo runs eagerly."""

    def __init__(self, block, hooked: bool = False):
        from ..compiled import in_place_context

        self.block, self.wrapper = block, _wrapped(block, ())
        context = in_place_context(block)
        if not hooked:
            self.call = context(self.wrapper._call_impl)
            return
        forward = block.forward  # (its class's: FSDP2's hooks run eagerly around it)

        def checkpointed(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        self.call = context(checkpointed)

    def __call__(self, *args, **kwargs):
        own = self.block.__dict__.get("_compiled_call_impl")
        object.__setattr__(self.block, "_compiled_call_impl", None)
        try:
            return self.call(*args, **kwargs)
        finally:
            object.__setattr__(self.block, "_compiled_call_impl", own)


def _wrapped(mod: torch.nn.Module, save) -> torch.nn.Module:
    """``mod`` in PyTorch's non-reentrant ``checkpoint_wrapper`` saving the ``save`` calls
    (without its cache when it writes one: :func:`_checkpoint_uncached`). No ``context_fn``
    when it saves none: dynamo refuses one inside a compile ("checkpoint not implemented
    for ... context_fn", 2.15), and without it checkpoint's own is the same."""
    how = {"checkpoint_fn": _checkpoint_uncached, "use_reentrant": False} \
        if _writes_cache(mod) else {}
    if save:
        how["context_fn"] = context_fn(save)
    return checkpoint_wrapper(mod, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **how)


@contextlib.contextmanager
def checkpointing(model: torch.nn.Module, plan, region=None, held=None, whole=False):
    """Run the plan's forwards under ``torch.utils.checkpoint`` until the block exits.

    Installs an instance attribute ``forward`` on each module of the plan (and on modules
    the user already wrapped with ``checkpoint_wrapper`` or grouped with
    :func:`apply_checkpoints`), restored on exit. ``region(path, fn)``, if given, wraps each
    function that checkpoint runs (and re-runs in backward), so a tracer can tell
    recomputation apart; ``held(tensor)``, if given, is called with each op output that
    selective checkpointing keeps for backward (whatever the policy: the plan's, or the
    user's own in a ``checkpoint_wrapper``'s ``context_fn``), as its policy decides it.
    A ``checkpoint_wrapper`` within a part compiled on its own, or anywhere in a model
    compiled whole (``whole``), is left as it is: dynamo captures its checkpoint into the
    part's graphs (the partitioner re-runs its forward in the backward graph); so does a
    plan's entry that is such a part (lowered with the checkpoint:
    :func:`fxmem.trace.compiled.parts.parts_lowered`). Yields the plan in effect (a
    :class:`fxmem.Plan`).
    """
    plan = normalize_plan(model, plan)
    parts = [("", model)] if whole else compiled_parts(model)
    # an entry over a part compiled on its own: lowered with the checkpoint (compiled.parts)
    paths = {user_path(p) for p, _ in parts}
    lowered = [e for e in plan if isinstance(e, str) and e in paths]
    targets = [(e, [_submodule(model, p) for p in modules_of(e)]) for e in plan
               if e not in lowered]
    inside = {id(m) for _, part in parts for m in part.modules()}
    seen = set()
    for n, m in model.named_modules():  # what the user applied already, but within a part
        if id(m) in inside:  # compiled on its own: dynamo's (its graphs re-run what it drops)
            continue
        if isinstance(m, CheckpointWrapper):
            fn = m.checkpoint_fn.keywords.get("context_fn", noop_context_fn) \
                if isinstance(m.checkpoint_fn, functools.partial) else noop_context_fn
            save = tuple(fn.save) if isinstance(fn, SaveCalls) else ()
            targets.append((Region((user_path(n),), save), [(n, m)], fn))
        elif (g := group_of(m)) is not None and id(g) not in seen:
            seen.add(id(g))
            mods = [_submodule(model, p) for p in g.paths]
            targets.append((Region(g.paths, tuple(getattr(g.context_fn, "save", ()))),
                            mods, g.context_fn))
    installed = []  # (module, its own forward attribute or None)
    try:
        for t in targets:
            e, mods = t[0], t[1]
            fn = t[2] if len(t) > 2 else context_fn(getattr(e, "save", ()))
            fn = fn if held is None else _watched(fn, held)
            for _, m in mods:
                installed.append((m, m.__dict__.get("forward")))
            if len(mods) > 1:
                by_path = {user_path(n): m for n, m in mods}

                install_group([m for _, m in mods], list(by_path), ctx_fn=fn,
                              wrap=region, outer=lambda p, f, by=by_path: uncached(by[p], f))
                continue
            name, mod = mods[0]
            # the module inside a checkpoint_wrapper is called, its own hooks run inside
            # the checkpoint (and again in its re-run), as CheckpointWrapper.forward does;
            # without its cache when apply_checkpoints wrapped it (its checkpoint_fn)
            layer = mod
            if isinstance(mod, CheckpointWrapper):
                inner = mod._checkpoint_wrapped_module
                if getattr(mod.checkpoint_fn, "func", None) is _checkpoint_uncached:
                    layer = inner
            else:
                inner = own_forward(mod)
            run = region(user_path(name), inner) if region else inner
            mod.forward = uncached(layer, functools.partial(_checkpointed, run, fn))
        yield Plan.of([*(simple(t[0]) for t in targets), *lowered])
    finally:
        for mod, before in reversed(installed):
            if before is None:
                mod.__dict__.pop("forward", None)
            else:
                mod.forward = before


def wrapped_modules(model: torch.nn.Module) -> set:
    """Ids of the modules inside ``model``'s ``checkpoint_wrapper`` s (each is called by its
    wrapper)."""
    return {id(m._checkpoint_wrapped_module) for m in model.modules()
            if isinstance(m, CheckpointWrapper)}


# the cache's names across transformers releases (5.24 calls it `cache`)
_CACHE_ARGS = ("cache", "past_key_values", "past_key_value", "layer_past", "cache_params")


def uncached(module, forward):
    """``forward`` (a call of ``module``'s forward: its checkpoint) called without the
    key/value cache when ``module`` is a Hugging Face layer that writes it (a
    ``GradientCheckpointingLayer`` without ``_can_checkpoint_with_cache``), as transformers
    calls its checkpointed layers under ``gradient_checkpointing_enable()``:
    ``use_cache=False`` and no cache object, taken out before the checkpoint keeps the
    arguments for its re-run (the cache, holding every layer's keys and values, is then not
    kept until the layer's backward). Else the recomputation in backward would write the
    cache a second time (a key and value twice as long, and selective checkpointing's count
    of op calls no longer matching the forward's). ``forward`` itself for any other module,
    or when it is without the cache already."""
    if not _writes_cache(module) or isinstance(forward, _WithoutCache):
        return forward
    return _WithoutCache(forward, module)


def drops_a_cache(model: torch.nn.Module, plan) -> bool:
    """Whether ``plan`` (normalized) checkpoints a Hugging Face layer that writes its
    key/value cache: checkpointed, it runs without it (:func:`uncached`), so the step under
    the plan is not the step without it with the plan's forwards re-run (the cache's
    keys and values, and under autocast their copies, are not made at all)."""
    return not set(cache_layers(model)).isdisjoint(getattr(plan, "modules", ()))


def cache_layers(model: torch.nn.Module) -> tuple:
    """The paths of ``model``'s Hugging Face layers that write their key/value cache when
    given one, and run without it checkpointed (:func:`uncached`)."""
    return tuple(user_path(n) for n, m in model.named_modules() if n and _writes_cache(m))


def _writes_cache(module) -> bool:
    """Whether ``module`` is a Hugging Face layer that writes its key/value cache."""
    return any(c.__name__ == "GradientCheckpointingLayer" for c in type(module).__mro__) \
        and not getattr(module, "_can_checkpoint_with_cache", False)


class _WithoutCache:
    """A call of ``module``'s forward made without the key/value cache (:func:`uncached`);
    an object, not a closure, so that ``copy.deepcopy`` of the model copies what it
    calls."""

    def __init__(self, forward, module):
        self.forward, self.module = forward, module

    def __call__(self, *args, **kwargs):
        f = self.forward
        try:  # the cache may come as a positional argument (GPT-2's blocks take it second)
            sig = inspect.signature(type(self.module).forward)
            bound = sig.bind(self.module, *args, **kwargs)
        except (TypeError, ValueError):
            _drop_cache(kwargs)
            return f(*args, **kwargs)
        changed = _drop_cache(bound.arguments)
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                changed |= _drop_cache(bound.arguments.get(p.name, {}))
        # unchanged: called as given (not rebound, so arguments keep their places)
        return f(*bound.args[1:], **bound.kwargs) if changed else f(*args, **kwargs)


def _drop_cache(arguments: dict) -> bool:
    """``arguments`` without the cache, in place; whether there was one."""
    changed = bool(arguments.get("use_cache"))
    if changed:
        arguments["use_cache"] = False
    for k in _CACHE_ARGS:
        if arguments.get(k) is not None:
            arguments[k], changed = None, True
    return changed


def _checkpoint_uncached(module, *args, use_reentrant=False, context_fn=noop_context_fn,
                         **kwargs):
    """``torch.utils.checkpoint.checkpoint`` of a Hugging Face layer, without its cache
    (:func:`uncached`): ``checkpoint_wrapper``'s ``checkpoint_fn`` (given checkpoint's own
    options with the layer's arguments)."""
    run = functools.partial(checkpoint, module, use_reentrant=use_reentrant,
                            context_fn=context_fn)
    return uncached(module, run)(*args, **kwargs)


def _checkpointed(fn, ctx_fn, *args, **kwargs):
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True,
                      context_fn=ctx_fn, **kwargs)


def _watched(ctx_fn, held):
    """``ctx_fn`` whose selective checkpointing policy (if it makes one) also calls
    ``held`` with the outputs it keeps (``MUST_SAVE``, ``PREFER_SAVE``, or ``True``) in the
    forward: what ``torch.utils.checkpoint``'s ``_CachingTorchDispatchMode`` then caches
    for backward (it passes the policy ``ctx.op_output``)."""
    if ctx_fn is noop_context_fn:
        return ctx_fn

    def fn():
        fwd, rec = ctx_fn()
        policy = getattr(fwd, "policy_fn", None)
        if callable(policy):
            def watched(ctx, func, *args, **kwargs):
                decision = policy(ctx, func, *args, **kwargs)
                if not ctx.is_recompute and (decision is True or decision in (
                        CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)):
                    for t in tree_leaves(getattr(ctx, "op_output", None)):
                        if isinstance(t, torch.Tensor):
                            held(t)
                return decision
            fwd.policy_fn = watched
        return fwd, rec
    return fn
