"""Repeated blocks under FSDP2 and TP: trace two of them, copy their ops for the rest.

Under ``fully_shard`` each block has FSDP2's hooks: its forward pre-hook all-gathers the
block's parameters (setting the unsharded ones on the module) and wraps the block's inputs
in ``RegisterPostBackwardFunction`` (its backward reduce-scatters the block's gradients);
its forward hook reshards and puts a pre-backward hook on the outputs (all-gather again,
prefetch the previous block). None of that runs inside the block's ``forward``, which is what
:class:`fxmem.trace.blocks.reuse.Reuse` replaces by a stand-in: those ops stay recorded for real
(in every block, or as below in the blocks traced for real and the run's last), and only the
block's own ops, between them, are copied (:mod:`fxmem.trace.blocks.splice`). Under FSDP2's
defaults in training (``hookless``: resharded after forward, no CPU offload, no HSDP), a run of
five blocks or more, neighbours in the step, traces its first three for real, and the blocks
between the third and the last run without FSDP2's hooks at all (their forward hooks removed,
not gathered by FSDP2's initialisation): each is replaced by a copy of the third block's spans,
its hooks' ops and its own, the storages passed between neighbours (all-gather outputs freed by
the next copy-out, the backward prefetch, the reduce-scatter state freed by the next
post-backward) relinked (:func:`fxmem.trace.blocks.splice_links.relink`); such a stand-in makes
FSDP2's sharded gradients itself, laid out as the last block's. Where that fails
(:class:`NoReuse`), the step is traced again with every block's hooks run. So
:class:`ShardedReuse` differs from the one-GPU case in

- the runs it finds (:func:`find_sharded_runs`): blocks whose hooks are the same functions
  (FSDP2's own, bound to each block's state, and fxmem's), instead of blocks with none;
- the parameters a block reads: the module's own at the time (the unsharded parameters
  FSDP2 set, or in backward gathered again into new storages: roles ``("pb", name)``),
  not the sharded ones the model was registered with;
- where a traced block's backward begins: after FSDP2's pre-backward hook (its hook on the
  outputs is registered after FSDP2's post-forward has put its own there);
- the gradients of the unsharded parameters: taken when the block's input gradient is
  complete, before FSDP2's post-backward reduce-scatters and frees them;
- the unrecorded warm-up step that initialises the wrapping before the recorded one
  (:func:`fxmem.trace.parallel.fsdp.sharded`): it runs a run's first three blocks for real and
  the later ones as stand-ins of their outputs' and gradients' shapes only (FSDP2's hooks
  around them run, as in the recorded step), so that it too costs three blocks, not all.

TP's blocks are copied by this too (and FSDP2's over TP): their parameters are DTensors,
whose gradients a stand-in makes as DTensors of the same placements
(:func:`fxmem.trace.blocks.reuse.grad_of`), and TP's hooks are closures over each module's
style and mesh (:func:`_key`). DDP's blocks are copied by
:mod:`fxmem.trace.blocks.replicated`, which extends this;
:func:`fxmem.trace.blocks.installed.reuses_under` says which strategies are.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from ..kernels.grad_sums import ACCUMULATE_GRAD
from .reuse import NoReuse, Reuse, _StandIn, find_runs, grad_meta, grad_of

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _key(hook):
    """What a hook runs: a bound method's function and its object's class (each block's
    FSDP2 state is an object of its own); a closure's code and what it closes over (TP's
    hooks, ``distribute_module``'s lambdas over each module's style and mesh); or the
    function itself."""
    f = getattr(hook, "__func__", None)
    if f is not None:
        return f, type(hook.__self__)
    code, cells = getattr(hook, "__code__", None), getattr(hook, "__closure__", None)
    if code is not None and cells is not None:
        return code, tuple(_value(c.cell_contents) for c in cells)
    return hook


def _value(v):
    """A hook's closed-over value as its key compares it: a ``functools.partial`` by its
    function (a bound method's by its function and its object's class and attributes: a
    TP style) and arguments, anything else by identity."""
    if isinstance(v, functools.partial):
        f = v.func
        owner = getattr(f, "__self__", None)
        return ("partial", getattr(f, "__func__", f), type(owner),
                _attrs(owner), v.args, tuple(sorted(v.keywords.items())))
    return ("is", id(v))


def _attrs(owner) -> tuple:
    return tuple(sorted(vars(owner).items())) if hasattr(owner, "__dict__") else ()


def _hooks_alike(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    for h in _HOOKS:
        ha, hb = getattr(a, h, None) or {}, getattr(b, h, None) or {}
        if [_key(x) for x in ha.values()] != [_key(x) for x in hb.values()]:
            return False
    return True


def _in_a_bucket(grad: torch.Tensor, created_by: int) -> bool:
    """Is ``grad`` a view of a buffer made before the step (DDP's bucket, under
    ``gradient_as_bucket_view=True``)? Such a gradient has no storage of its own to
    rename: the splice maps the buckets step by step, as DDP writes into them
    (:meth:`fxmem.trace.blocks.splice.Numbering._outer`)."""
    return created_by < 0 and grad._is_view()


class _Warm(torch.autograd.Function):
    """A block in the warm-up step: outputs of ``metas`` and gradients of its inputs'."""

    @staticmethod
    def forward(ctx, metas, n_in, *tensors):
        ctx.metas = [grad_meta(t) for t in tensors]
        ctx.set_materialize_grads(False)
        outs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=device)
                     for shape, stride, dtype, _, device in metas)
        ctx.mark_non_differentiable(*(o for o, m in zip(outs, metas) if not m[3]))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *(grad_of(m) for m in ctx.metas))


def _call_key(args, kwargs) -> tuple:
    """What a warm-up stand-in must be called with as the third block was (its arguments'
    structure, their values but tensors', and the tensors' sizes), and those tensors."""
    leaves, spec = tree_flatten((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    return (spec, tuple(None if isinstance(v, torch.Tensor) else id(v) for v in leaves),
            tuple((t.shape, t.stride(), t.dtype, t.requires_grad) for t in tensors)), tensors


def find_sharded_runs(model: torch.nn.Module) -> list:
    """:func:`fxmem.trace.blocks.reuse.find_runs` for a model under ``fully_shard``: blocks whose
    hooks are alike."""
    return find_runs(model, _hooks_alike)


class ShardedReuse(Reuse):
    """:class:`fxmem.trace.blocks.reuse.Reuse` for blocks under FSDP2 (see the module docstring)."""

    def __init__(self, rec, runs, hookless: bool = False):
        super().__init__(rec, runs, {}, {})
        self.modules = {p: m for r in runs for p, m in zip(r.paths, r.modules)}
        self._pending: dict = {}  # path -> (call, outputs) until its forward hooks ran
        self._out_modules: dict = {}  # path -> its outputs' autograd nodes' modules, names
        self._node_names: dict = {}  # a stand-in's path -> its pattern's output node's name
        self._handles: list = []
        self._warm: dict = {}  # run -> its third block's call in the warm-up: key, outputs
        # ``hookless``: a run's blocks between its third and its last run without
        # FSDP2's hooks, copied whole from the third (its hooks and its ops) by the splice;
        # only where the run's blocks are neighbours (FSDP2 passes storages to the next
        # block that runs: a run split by a plan, whose blocks another run's separate, not)
        self.interior: dict = {}  # raw path -> its run
        for r in runs:
            if hookless and len(r.paths) >= 5 and r.nexts[:-1] == r.paths[1:]:
                self.real[r.paths] = 3
                self.interior.update((p, r) for p in r.paths[3:-1])

    @property
    def hookless(self) -> list:
        """The modules whose FSDP2 hooks the step does not run (not gathered either by
        :func:`fxmem.trace.parallel.fsdp.initialise`)."""
        return [self.modules[p] for p in self.interior]

    def _block(self, run, k, path, orig):
        recorded = super()._block(run, k, path, orig)

        def forward(*args, **kwargs):
            if self.rec.recording:
                return recorded(*args, **kwargs)
            return self._warming(run, k, orig, args, kwargs)
        return forward

    def _warming(self, run, k, orig, args, kwargs):
        """A block in the unrecorded warm-up step that initialises the wrapping: the first
        three of a run for real, a later one called as the third was by a stand-in that
        only makes outputs and gradients of the right shapes (FSDP2's hooks, around the
        forward, run in every block; the recorded step's blocks are traced as always)."""
        key, tensors = _call_key(args, kwargs)
        seen = self._warm.get(run.paths)
        if k < 3 or seen is None or seen[0] != key:
            out = orig(*args, **kwargs)
            if k == 2:
                outs, out_spec = tree_flatten(out)
                # (a DTensor out: every block runs, and the recorded step's raises NoReuse)
                if all(isinstance(v, torch.Tensor) and not isinstance(v, DTensor)
                       for v in outs):
                    self._warm[run.paths] = (key, out_spec, tuple(
                        (t.shape, t.stride(), t.dtype, t.requires_grad, t.device)
                        for t in outs))
            return out
        _, out_spec, metas = seen
        grad_in = [t for t in tensors if t.requires_grad]
        params = [p for _, p in self.params(run.paths[k]) if p.requires_grad]
        outs = _Warm.apply(metas, len(grad_in), *grad_in, *params)
        return tree_unflatten(list(outs), out_spec)

    def install(self) -> None:
        super().install()
        for mod in self.modules.values():  # after FSDP2's post-forward hook
            self._handles.append(mod.register_forward_hook(self._outputs_hooked))
        for mod in self.hookless:
            state = mod._get_fsdp_state()
            state._pre_forward_hook_handle.remove()
            state._post_forward_hook_handle.remove()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        super().remove()

    def _begin(self, run, k, path, args, kwargs, standin):
        # a stand-in's parameters are read by no op: the trace must know them already, as
        # FSDP2's all-gather made them (not so when a warm-up step left them gathered)
        if self.rec.recording and any(self.rec.sid(t) is None for _, t in
                                      [*self.params(path), *self.buffers(path)]):
            raise NoReuse(f"{path}: its parameters were gathered before the step")
        c = super()._begin(run, k, path, args, kwargs, standin)
        if path in self.interior or (self.real.get(run.paths) == 3 and k in (1, 2)):
            for name, shard, _ in self.sharded(path):  # read by FSDP2's all-gather
                c.roles[("sp", name)] = self.rec.register(shard)[0]
        return c

    def params(self, path) -> list:
        if path in self.interior:  # no op reads its parameters, nor makes their gradients
            return []
        return [(n, p) for n, p in self.modules[path].named_parameters()]

    def sharded(self, path) -> list:
        """The local shards of block ``path``'s parameters (FSDP2's, whichever the module
        holds now) and their gradients' (None where none), by name inside the block."""
        mod = self.modules[path]
        where = {id(m): n for n, m in mod.named_modules()}
        out = []
        for fp in mod._get_fsdp_state()._fsdp_param_group.fsdp_params:
            info, p = fp._module_info, fp.sharded_param
            pre = where.get(id(info.module))
            name = info.param_name if not pre else f"{pre}.{info.param_name}"
            g = p.grad
            out.append((name, p._local_tensor, None if g is None else
                        g._local_tensor if isinstance(g, DTensor) else g))
        return out

    def buffers(self, path) -> list:
        return [(n, b) for n, b in self.modules[path].named_buffers() if b is not None]

    def hook_outputs(self, c, outs) -> None:
        self._pending[c.path] = (c, outs)
        self._out_modules[c.path] = self._node_modules(outs)

    def _node_modules(self, outs) -> set:
        """The modules and names of the autograd nodes of the outputs: what FSDP2's
        pre-backward hook on them runs as (:meth:`Recorder.module`)."""
        fn = self.rec.fn_module
        return {(fn.get(t.grad_fn._sequence_nr()), t.grad_fn.name()) for t in outs
                if t.grad_fn is not None}

    def _standin(self, run, path):
        made = super()._standin(run, path)

        def forward(k, *args, **kwargs):
            out = made(k, *args, **kwargs)
            calls = self.calls[run.paths]
            c, pat = calls[-1], calls[1]
            mods = self._out_modules.get(pat.path, set())
            nodes = {t.grad_fn._sequence_nr() for t in tree_leaves(out)
                     if isinstance(t, torch.Tensor) and t.grad_fn is not None}
            if len(mods) > 1 or len(nodes) > 1:
                raise NoReuse(f"{pat.path}: its outputs' gradients start in several modules")
            for m, name in mods:
                self._node_names[c.path] = name
                if m is not None and (m == pat.path or m.startswith(pat.path + ".")):
                    m = c.path + m[len(pat.path):]
                for n in nodes:  # the stand-in's node runs FSDP2's hooks as the block would
                    self.rec.fn_module[n] = m
            return out
        return forward

    def _outputs_hooked(self, mod, args, out):
        from ..plans.checkpointing import user_path

        path = next(p for p, m in self.modules.items() if m is mod)
        got = self._pending.pop(user_path(path), None)
        if got is None:
            return None
        c, outs = got
        now = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if len(now) != len(outs) or any(a is not b for a, b in zip(now, outs)):
            raise NoReuse(f"{c.path}: a hook replaced the block's outputs")
        super().hook_outputs(c, outs)
        return None

    def backward_began(self, c) -> None:
        rec = self.rec
        raw = self._raw(c)
        if raw in self.interior:
            self._sharded_grads(c, raw)
            return
        for name, p in self.params(raw):
            c.roles[("pb", name)] = rec.register(p)[0]

    def _sharded_grads(self, c, raw: str) -> None:
        """An interior block's gradients as FSDP2's post-backward leaves them (views of one
        reduce-scatter output, on its stream), laid out as the last block's, whose
        post-backward ran before: the splice makes the copy's reduce-scatter output them."""
        from ..parallel.strategy import dtensor_of

        run = self.interior[raw]
        last = self.modules[run.paths[-1]]
        got = [(n, p.grad) for n, p in last.named_parameters()]
        if any(g is None or not isinstance(g, DTensor) for _, g in got):
            raise NoReuse(f"{c.path}: the last block's gradients are not FSDP2's shards")
        bases = {id(g._local_tensor.untyped_storage()) for _, g in got}
        if len(bases) != 1:
            raise NoReuse(f"{c.path}: the last block's gradients are not one buffer's views")
        first = got[0][1]._local_tensor
        base = first.untyped_storage()
        state = last._get_fsdp_state()
        handle, stream = state._device_handle, state._comm_ctx.reduce_scatter_stream
        with handle.stream(stream):
            flat = torch.empty(base.nbytes() // first.element_size(), dtype=first.dtype,
                               device=first.device)
        mine = dict(self.modules[raw].named_parameters())
        for n, g in got:
            loc = g._local_tensor
            view = flat.as_strided(loc.size(), loc.stride(), loc.storage_offset())
            mine[n].grad = dtensor_of(view, g.device_mesh, g.placements, g.shape, g.stride())
        c.roles[("rs",)] = self.rec.register(flat)[0]

    def _raw(self, c) -> str:
        run = next(r for r in self.runs if any(x is c for x in self.calls[r.paths]))
        return run.paths[c.k + self.skip.get(run.paths, 0)]

    def _in_hook(self, c, i):
        inner = super()._in_hook(c, i)

        def hook(grad):
            inner(grad)
            rec = self.rec
            for name, p in self.params(self._raw(c)):
                if p.requires_grad:
                    if p.grad is None:
                        raise NoReuse(f"{c.path}: a parameter's gradient comes after its "
                                      "input's")
                    sid = rec.register(p.grad)[0]
                    if not _in_a_bucket(p.grad, rec.storages[sid].created_by):
                        c.roles[("g", name)] = sid
        return hook

    def splice_runs(self) -> list:
        """A run whose interior blocks ran without FSDP2's hooks as two: its first two
        blocks and its last (the last's ops copied from the second's, as always), and the
        second and third blocks' spans (their hooks' ops and their own, as copies of the
        calls whose windows are the spans) then the interior blocks, each replaced by a copy
        of the third's spans (:func:`fxmem.trace.blocks.splice_links.relink`: the
        storages passed between neighbours)."""
        out = []
        for calls in super().splice_runs():
            if len(calls) < 5 or not any(c.standin and self._raw(c) in self.interior
                                         for c in calls):
                out.append(calls)
                continue
            u0, u1, u2, *inner, last = calls
            u2s = self._spanned(u2)
            u2s.next_unit = self._spanned(last)  # (its spans: hooks real, body a copy)
            out += [[u0, u1, last], [self._spanned(u1), u2s, *inner]]
        return out

    _SPAN_ROLES = ("x", "o", "gy", "gx", "sp", "rs")

    def _spanned(self, c):
        """A copy of call ``c`` (a block traced for real, hooks and all) whose windows are
        its spans: forward from its pre-hooks' first op to its own last (FSDP2's post-forward
        records none), backward from FSDP2's pre-backward ops (its module's, right before its
        own) to its post-backward's (RegisterPostBackwardFunction's, right after)."""
        ops = self.rec.ops
        b0, b1 = c.bwd
        if b0 is not None:
            while b0 > 0 and ops[b0 - 1].module == c.path and ops[b0 - 1].phase == "backward":
                b0 -= 1
            while b1 < len(ops) and ops[b1].autograd_node == ACCUMULATE_GRAD:
                b1 += 1  # (a stand-in's parameters' steps, after it)
            while b1 < len(ops) and ops[b1].module == c.path and \
                    ops[b1].autograd_node == "RegisterPostBackwardFunctionBackward":
                b1 += 1
        return replace(c, fwd=[c.pre, c.fwd[1]], bwd=[b0, b1], spans=True,
                       roles={k: v for k, v in c.roles.items() if k[0] in self._SPAN_ROLES})

    def finish(self) -> None:
        """After the step: the ops FSDP2's hooks on a stand-in's outputs ran (outside its
        window) read as run by its pattern's node. (The gradients were taken in backward:
        FSDP2 has freed them since.)"""
        for run in self.runs:  # the third block's reduce-scatter output: its gradients'
            calls = self.calls[run.paths]
            if self.real.get(run.paths) == 3 and len(calls) > 2:
                grads = {id(g.untyped_storage()): g for _, _, g in self.sharded(run.paths[2])
                         if g is not None}
                if len(grads) != 1:
                    raise NoReuse(f"{calls[2].path}: its gradients are not one buffer's views")
                calls[2].roles[("rs",)] = self.rec.register(next(iter(grads.values())))[0]
        rec, node = self.rec, _StandIn.__name__ + "Backward"
        standins = [c for calls in self.calls.values() for c in calls if c.standin]
        for j, op in enumerate(rec.ops):
            if op.autograd_node != node:
                continue
            for c in standins:
                if (c.path in self._node_names and c.bwd[0] is not None
                        and j not in range(*c.bwd)
                        and (op.module == c.path or op.module.startswith(c.path + "."))):
                    rec.ops[j] = replace(op, autograd_node=self._node_names[c.path])
