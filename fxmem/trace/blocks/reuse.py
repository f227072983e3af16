"""Repeated blocks: trace two of them, reuse their pattern for the rest.

A transformer is a stack of identical blocks, and tracing each one on fake tensors costs the
same. When a ``ModuleList`` or ``Sequential`` holds a run of three or more blocks that are
the same (:func:`find_runs`: same classes, parameter and buffer shapes, dtypes and
attributes, no hooks; an int attribute may differ by the block's position, as a layer
index does; a ``functools.partial`` of each block's own is compared by its function and
arguments; blocks with parameters need not be neighbours: two kinds of layer that take
turns, as Gemma 2's, are two runs), the tracer runs the first two blocks for real and
every later one as a *stand-in*: one ``autograd.Function`` that makes outputs (and, in
backward, gradients) of the right shapes. After the step, :func:`splice` replaces each
stand-in's ops with a copy of the second block's ops, storages and saved tensors, renamed
to the stand-in's inputs, outputs, parameters and gradients, so the trace reads as if
every block had run.

What is reused is checked while tracing: each block is called once, in order, with inputs
of the second block's shapes; the first two blocks produce the same ops and sizes, and
free what outlives them at the same moment; a stand-in's output feeds only the block after
it. Anything else raises :class:`NoReuse` and the step is traced again block by block
(``trace(..., reuse_blocks=False)`` does that from the start).

Under a checkpoint plan the stand-ins are installed over the plan's forwards, on the runs
:func:`by_plan` cuts where the plan treats blocks differently: a traced block runs under its
checkpoint, its re-run in backward inside its backward window, and a stand-in's copy has
both.

>>> import torch
>>> m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
>>> [r.paths for r in find_runs(m)]
[('0', '1', '2', '3', '4')]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..kernels.grad_sums import may_sum_in_place
from ..plans.checkpointing import user_path
from ..plans.regions import modules_of

MIN_RUN = 3  # two traced blocks, then at least one stand-in


class NoReuse(Exception):
    """The blocks of a run did not behave alike: trace them one by one."""


@dataclass(frozen=True)
class Run:
    """Sibling blocks that are the same module: raw paths (``model.named_modules`` names),
    in the order of their container, and the raw path of the sibling after each (None for
    the container's last): a run's blocks need not be neighbours (Gemma 2's layers
    alternate sliding-window and full attention, two runs taking turns)."""

    paths: tuple
    modules: tuple = field(repr=False, compare=False)
    nexts: tuple = field(default=(), repr=False, compare=False)

    def __post_init__(self):  # made without: each block's next is the next of its run
        if not self.nexts:
            object.__setattr__(self, "nexts", (*self.paths[1:], None))


# -- finding runs ------------------------------------------------------------------------
def _plain(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, torch.dtype, torch.device, type))


def _attr_same(a, b, offset: int) -> bool:
    if a is b:
        return True
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return a == b or b - a == offset  # a layer index
    if _plain(a) and _plain(b):
        return type(a) is type(b) and a == b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and \
            all(_attr_same(x, y, offset) for x, y in zip(a, b))
    if type(a) is functools.partial and type(b) is functools.partial:
        # each block's own (Hugging Face's GELUTanh: partial(gelu, approximate="tanh"))
        return a.func is b.func and _attr_same(a.args, b.args, 0) and \
            a.keywords.keys() == b.keywords.keys() and \
            all(_attr_same(v, b.keywords[k], 0) for k, v in a.keywords.items())
    return False


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _same(a: torch.nn.Module, b: torch.nn.Module, offset: int, hooks=None) -> bool:
    """Do blocks ``a`` and ``b`` (``offset`` positions apart) run the same way? ``hooks``:
    whether two of their modules' hooks are alike (``None``: blocks with hooks are not)."""
    mods_a, mods_b = list(a.named_modules()), list(b.named_modules())
    if len(mods_a) != len(mods_b):
        return False
    for (na, x), (nb, y) in zip(mods_a, mods_b):
        if na != nb or type(x) is not type(y) or x.training != y.training:
            return False
        if hooks is not None:
            if not hooks(x, y):
                return False
        elif any(getattr(x, h, None) or getattr(y, h, None) for h in _HOOKS):
            return False
        for d in ("_parameters", "_buffers"):
            ta, tb = getattr(x, d), getattr(y, d)
            if ta.keys() != tb.keys():
                return False
            for k, t in ta.items():
                u = tb[k]
                if (t is None) != (u is None):
                    return False
                if t is not None and (t is u or t.shape != u.shape or t.dtype != u.dtype
                                      or t.requires_grad != u.requires_grad):
                    return False
        va = {k: v for k, v in vars(x).items() if not k.startswith("_")}
        vb = {k: v for k, v in vars(y).items() if not k.startswith("_")}
        if va.keys() != vb.keys() or "forward" in vars(x) or "forward" in vars(y):
            return False
        if not all(_attr_same(va[k], vb[k], offset) for k in va):
            return False
    return True


def find_runs(model: torch.nn.Module, hooks=None) -> list:
    """Runs of at least :data:`MIN_RUN` identical blocks in the model's ``ModuleList`` and
    ``Sequential`` containers (outermost first; blocks inside a run's blocks are skipped).
    The blocks of a run may take turns with others' (layers that alternate between two
    kinds: two runs) when each has parameters; blocks without (an activation, a pooling)
    make runs only of neighbours. ``hooks``: as for :func:`_same`.

    >>> m = torch.nn.Sequential(*[torch.nn.Linear(4, 4 + k % 2) if k % 2 else
    ...                           torch.nn.Linear(5, 4) for k in range(8)])
    >>> [r.paths for r in find_runs(m)]
    [('0', '2', '4', '6'), ('1', '3', '5', '7')]
    """
    runs, inside = [], []
    for name, mod in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        kids = list(mod.named_children())
        found = []
        for members in _alike(kids, hooks):
            found += [piece for piece in _pieces(members, kids) if len(piece) >= MIN_RUN]

        def path(j):  # child j's raw path (None past the last)
            return None if j >= len(kids) else f"{name}.{kids[j][0]}" if name else kids[j][0]
        for piece in sorted(found):
            paths = tuple(path(j) for j in piece)
            nexts = tuple(path(j + 1) for j in piece)
            runs.append(Run(paths, tuple(kids[j][1] for j in piece), nexts))
            inside.extend(paths)
    return runs


def _alike(kids: list, hooks) -> list:
    """``kids`` (a container's named children) in classes of blocks that are the same, by
    their positions: each compared with the first block of the classes of its class and
    number of modules (a container of many different blocks compares few pairs)."""
    classes: list = []
    by_kind: dict = {}
    for j, (_, m) in enumerate(kids):
        kind = by_kind.setdefault((type(m), sum(1 for _ in m.modules())), [])
        for members in kind:
            i = members[0]
            if _same(kids[i][1], m, j - i, hooks):
                members.append(j)
                break
        else:
            kind.append([j])
            classes.append(kind[-1])
    return classes


def _pieces(members: list, kids: list) -> list:
    """A class of blocks as runs: whole when its blocks have parameters (copying a block
    saves its trace), else cut where they are not neighbours."""
    if all(next(kids[j][1].parameters(), None) is not None for j in members):
        return [members]
    out = [[members[0]]]
    for a, b in zip(members, members[1:]):
        if b == a + 1:
            out[-1].append(b)
        else:
            out.append([b])
    return out


def by_plan(runs: list, plan) -> list:
    """``runs`` cut where checkpoint ``plan`` treats their blocks differently: the blocks of
    a run must carry the same regions, read from inside each (every block checkpointed
    whole, or each one's MLP with the same op calls saved, or none), so that a copy of the
    second block's ops, its re-run in backward included, is each later block's. The blocks
    of a run the plan treats alike are one run wherever they are in it (as two kinds of
    layer taking turns are two runs: :func:`find_runs`): a plan checkpointing a Llama's
    first 12 blocks whole, the next 19 saving an op output each and the last whole traces
    four blocks for real, not five. A block that a larger region holds (a group of blocks,
    a module around the run) is in no run; fewer than :data:`MIN_RUN` blocks treated alike
    are traced block by block.

    >>> m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(7)])
    >>> [r.paths for r in by_plan(find_runs(m), ["0", "1", "2"])]
    [('0', '1', '2'), ('3', '4', '5', '6')]
    >>> [r.paths for r in by_plan(find_runs(m), ["0", "1", "5", "6"])]
    [('0', '1', '5', '6'), ('2', '3', '4')]
    """
    out = []
    for run in runs:
        alike: dict = {}  # the blocks' regions -> those blocks, in the run's order
        for b in zip(run.paths, run.modules, run.nexts):
            alike.setdefault(_regions_inside(user_path(b[0]), plan), []).append(b)
        out.extend(Run(*(tuple(x) for x in zip(*piece))) for key, piece in alike.items()
                   if key is not None and len(piece) >= MIN_RUN)
    return out


def traced_for_real(runs: list, kept: list) -> int:
    """How many blocks of ``runs`` (:func:`find_runs`) a step traces for real when ``kept``
    (:func:`by_plan`'s pieces of them) are reused: each piece's first two, and every block
    in no piece.

    >>> m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(7)])
    >>> runs = find_runs(m)
    >>> traced_for_real(runs, by_plan(runs, [])), traced_for_real(runs, by_plan(runs, ["3"]))
    (2, 3)
    >>> traced_for_real(runs, by_plan(runs, ["2", "3"]))  # 0, 1, then 2 and 3 on their own
    4
    """
    return sum(len(r.paths) for r in runs) - sum(len(r.paths) - 2 for r in kept)


def _regions_inside(block: str, plan):
    """The plan's regions inside ``block`` (a user path), by their paths from it and their
    saved op calls; None when a region holds the block or reaches out of it."""
    got = []
    for e in plan:
        mods = modules_of(e)
        rel = [m[len(block):] for m in mods if m == block or m.startswith(block + ".")]
        if len(rel) != len(mods) and (rel or any(block.startswith(m + ".") for m in mods)):
            return None
        if rel:
            got.append((tuple(rel), getattr(e, "save", ())))
    return tuple(sorted(got))


# -- recording block calls ---------------------------------------------------------------
def _expr(v):
    return v.node.expr if isinstance(v, torch.SymInt) else v


def _strides(t: torch.Tensor) -> tuple:
    return tuple(_expr(d) for d in t.stride())


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(_expr(d) for d in t.shape), tuple(_expr(d) for d in t.stride()), t.dtype,
            t.requires_grad)


_TENSOR = object()  # a tensor's place among a block's output leaves (None is a value)


def grad_meta(t: torch.Tensor) -> tuple:
    """What a stand-in makes ``t``'s gradient from: its local tensor's shape, strides, dtype
    and device, and for a DTensor (a parameter under TP) its mesh, placements, shape and
    strides (not the tensor: a stand-in holds no input alive)."""
    if isinstance(t, DTensor):
        loc = t._local_tensor
        return (loc.shape, loc.stride(), loc.dtype, loc.device,
                (t.device_mesh, t.placements, t.shape, t.stride()))
    return t.shape, t.stride(), t.dtype, t.device, None


def grad_of(meta: tuple) -> torch.Tensor:
    """A new gradient of :func:`grad_meta`'s ``meta``: a DTensor of the same placements
    for a DTensor's."""
    from ..parallel.strategy import dtensor_of

    shape, stride, dtype, device, dist = meta
    g = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    return g if dist is None else dtensor_of(g, *dist)


@dataclass
class _Call:
    """One block's forward call and its backward: op windows ``[start, end)`` and the
    storage ids of its roles (``("x", i)`` input leaf, ``("o", i)`` output leaf,
    ``("gy", i)`` gradient of output i, ``("gx", i)`` gradient it gave input i,
    ``("p", name)`` parameter or buffer, ``("g", name)`` a parameter's ``.grad``)."""

    k: int
    path: str  # user path
    standin: bool
    fwd: list = field(default_factory=lambda: [None, None])
    bwd: list = field(default_factory=lambda: [None, None])
    roles: dict = field(default_factory=dict)
    spec: object = None  # pytree spec of (args, kwargs)
    consts: tuple = ()  # non-tensor leaves of (args, kwargs)
    in_meta: tuple = ()
    out_spec: object = None
    out_leaves: tuple = ()  # non-tensor output leaves (tensors: _TENSOR)
    out_meta: tuple = ()  # (shape, stride, dtype, requires_grad, device) per tensor output
    final_gx: dict = field(default_factory=dict)  # input i -> sid of its whole gradient
    grad_strides: dict = field(default_factory=dict)  # ("gy"|"gx", i) -> the gradient's strides
    # ("gy", i) -> whether the gradient, were it summed first, could be summed into in place
    # (fxmem.trace.kernels.grad_sums.may_sum_in_place: a stand-in's may be a view its pattern's is
    # not)
    grad_summable: dict = field(default_factory=dict)
    out_meta_raw: tuple = ()  # the same with SymInts, to make a stand-in's outputs
    grad_inputs: list = field(default_factory=list)  # a stand-in's inputs that need a gradient
    pre: int = 0  # the first op of the block's call (its pre-hooks' ops come first)
    rec: object = field(default=None, repr=False)
    reuse: object = field(default=None, repr=False)
    tensors: list = field(default_factory=list, repr=False)  # during the call only
    pattern: object = field(default=None, repr=False)  # a stand-in's pattern block
    after: str | None = None  # the user path of the sibling after it (Run.nexts)
    # a copy whose windows are the block's spans, its FSDP2 hooks' ops included
    # (fxmem.trace.blocks.sharded.ShardedReuse.splice_runs), and for the pattern of such a
    # run, the block after the run's last copy in the step, as spans too
    spans: bool = False
    next_unit: object = None


class _StandIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, pattern, n_in, *tensors):
        ctx.call, ctx.n_in = call, n_in
        ctx.metas = [grad_meta(t) for t in tensors]
        ctx.set_materialize_grads(False)
        outs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=dev)
                     for shape, stride, dtype, _, dev in pattern.out_meta_raw)
        ctx.mark_non_differentiable(*(o for o, m in zip(outs, pattern.out_meta_raw)
                                      if not m[3]))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        call, rec = ctx.call, ctx.call.rec
        call.bwd[0] = rec.op_count
        call.reuse.backward_began(call)
        for i, g in enumerate(grads):
            if g is not None:
                call.roles[("gy", i)] = rec.register(g)[0]
                call.grad_strides[("gy", i)] = _strides(g)
                call.grad_summable[("gy", i)] = may_sum_in_place(g)
        out = [grad_of(m) for m in ctx.metas]
        for i, g in enumerate(out[:ctx.n_in]):
            call.roles[("gx", call.grad_inputs[i])] = rec.register(g)[0]
        call.bwd[1] = rec.op_count
        return (None, None, None, *out)


class Reuse:
    """Installs the stand-ins of ``runs`` on the model (undone by :meth:`remove`) and
    records each block call for :func:`splice`."""

    def __init__(self, rec, runs, fparams: dict, fbufs: dict):
        self.rec, self.runs = rec, runs
        self.fparams, self.fbufs = fparams, fbufs
        self.calls: dict = {r.paths: [] for r in runs}
        self._after = {p: n for r in runs for p, n in zip(r.paths, r.nexts)}
        self.skip: dict = {}  # run -> 1 when its first block is fed the model's input
        self.real: dict = {}  # run -> its blocks traced for real, when not the first two
        self._saved: list = []

    def install(self) -> None:
        for run in self.runs:
            for k, (path, mod) in enumerate(zip(run.paths, run.modules)):
                had = "forward" in vars(mod)
                self._saved.append((mod, had, vars(mod).get("forward")))
                mod.forward = self._block(run, k, path, mod.forward)

    def _block(self, run, k, path, orig):
        traced, standin = self._traced(run, path, orig), self._standin(run, path)

        def forward(*args, **kwargs):
            if k == 0 and self._fed_input(path, args, kwargs):
                # the model's input, no gradient: the first block's backward differs from
                # the others' (no input gradient); the run starts at the second block
                self.skip[run.paths] = 1
                if self.real.get(run.paths, 2) > 2:  # (its interior blocks are by position)
                    raise NoReuse(f"{user_path(path)} is fed the model's input")
                return orig(*args, **kwargs)
            i = k - self.skip.get(run.paths, 0)
            if i < 0:
                raise NoReuse(f"{user_path(path)} is called more than once")
            return (traced if i < self.real.get(run.paths, 2) else standin)(i, *args, **kwargs)
        return forward

    def _fed_input(self, path, args, kwargs) -> bool:
        if self.rec.phase != "forward" or not torch.is_grad_enabled():
            return False
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        return not any(t.requires_grad for t in tensors) and \
            any(p.requires_grad for _, p in self.params(path))

    def remove(self) -> None:
        for mod, had, fwd in reversed(self._saved):
            if had:
                mod.forward = fwd
            else:
                vars(mod).pop("forward", None)
        self._saved.clear()

    # ---------------------------------------------------------------------------------
    def _begin(self, run, k, path, args, kwargs, standin) -> _Call:
        rec = self.rec
        calls = self.calls[run.paths]
        if rec.phase != "forward" or not rec.recording or len(calls) != k:
            raise NoReuse(f"{user_path(path)} is not called once, in order, in the forward")
        after = self._after.get(path)
        c = _Call(k, user_path(path), standin, rec=rec, reuse=self,
                  after=None if after is None else user_path(after))
        c.pre = rec.call_starts[-1] if rec.call_starts else rec.op_count
        leaves, c.spec = tree_flatten((args, kwargs))
        # non-tensor arguments by value, or by identity (holding them would keep, e.g., a
        # KV cache alive)
        c.consts = tuple(None if isinstance(v, torch.Tensor) else v if _plain(v)
                         else ("id", type(v), id(v)) for v in leaves)
        c.in_meta = tuple(_meta(v) for v in leaves if isinstance(v, torch.Tensor))
        c.tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        for i, t in enumerate(c.tensors):
            c.roles[("x", i)] = rec.register(t)[0]
        for name, p in self.params(path):
            c.roles[("p", name)] = rec.register(p)[0]
        for name, b in self.buffers(path):
            c.roles[("p", "buf:" + name)] = rec.register(b)[0]
        c.fwd[0] = rec.op_count
        calls.append(c)
        return c

    @staticmethod
    def _own(path, named: dict):
        pre = path + "."
        return [(n[len(pre):], t) for n, t in named.items() if n.startswith(pre)]

    def params(self, path) -> list:
        """The parameters block ``path``'s ops read, by name inside the block."""
        return self._own(path, self.fparams)

    def buffers(self, path) -> list:
        """The buffers block ``path``'s ops read, by name inside the block."""
        return self._own(path, self.fbufs)

    def backward_began(self, c: _Call) -> None:
        """Hook: block call ``c``'s backward begins (its first output gradient)."""

    def hook_outputs(self, c: _Call, outs) -> None:
        """Marks where a traced block's backward begins: a hook on each output."""
        for i, t in enumerate(outs):
            if t.requires_grad:
                t.register_hook(self._out_hook(c, i))

    def _end(self, c: _Call, out):
        rec = self.rec
        c.fwd[1] = rec.op_count
        leaves, c.out_spec = tree_flatten(out)
        if not all(isinstance(v, torch.Tensor) or _plain(v) for v in leaves):
            raise NoReuse(f"{c.path} returns an object other than tensors and constants")
        c.out_leaves = tuple(_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves)
        outs = [v for v in leaves if isinstance(v, torch.Tensor)]
        if not outs:
            raise NoReuse(f"{c.path} returns no tensor")
        if any(isinstance(t, DTensor) for t in outs):  # (a stand-in makes plain outputs)
            raise NoReuse(f"{c.path} returns a DTensor")
        c.out_meta = tuple(_meta(t) for t in outs)
        c.out_meta_raw = tuple((t.shape, t.stride(), t.dtype, t.requires_grad, t.device)
                               for t in outs)
        for i, t in enumerate(outs):
            c.roles[("o", i)] = rec.register(t)[0]
        if len(set(c.roles.values())) != len(c.roles):
            raise NoReuse(f"{c.path}: an output shares storage with an input or parameter")
        return outs

    def _traced(self, run, path, orig):
        def forward(k, *args, **kwargs):
            c = self._begin(run, k, path, args, kwargs, False)
            out = orig(*args, **kwargs)
            outs = self._end(c, out)
            self.hook_outputs(c, outs)
            for i, t in enumerate(c.tensors):
                if t.requires_grad:
                    t.register_hook(self._in_hook(c, i))
            c.tensors = []
            return out
        return forward

    def _out_hook(self, c, i):
        def hook(grad):
            rec = self.rec
            if c.bwd[0] is None:
                self.backward_began(c)
            c.roles[("gy", i)] = rec.register(grad)[0]
            c.grad_strides[("gy", i)] = _strides(grad)
            c.bwd[0] = rec.op_count if c.bwd[0] is None else min(c.bwd[0], rec.op_count)
        return hook

    def _in_hook(self, c, i):
        def hook(grad):
            rec = self.rec
            c.grad_strides[("gx", i)] = _strides(grad)
            if c.standin:
                c.final_gx[i] = rec.register(grad)[0]
                return
            c.roles[("gx", i)] = rec.register(grad)[0]
            c.bwd[1] = rec.op_count if c.bwd[1] is None else min(c.bwd[1], rec.op_count)
        return hook

    def _standin(self, run, path):
        def forward(k, *args, **kwargs):
            c = self._begin(run, k, path, args, kwargs, True)
            calls = self.calls[run.paths]
            p = calls[1]
            if c.spec != p.spec or c.consts != p.consts or c.in_meta != p.in_meta:
                raise NoReuse(f"{c.path} is called with other arguments than "
                              f"{p.path}")
            grad_in = [i for i, t in enumerate(c.tensors) if t.requires_grad]
            params = [t for _, t in self.params(path) if t.requires_grad]
            c.grad_inputs = grad_in
            outs = _StandIn.apply(c, p, len(grad_in),
                                  *(c.tensors[i] for i in grad_in), *params)
            for i in grad_in:
                c.tensors[i].register_hook(self._in_hook(c, i))
            c.tensors = []
            leaves = list(p.out_leaves)
            it = iter(outs)
            leaves = [next(it) if v is _TENSOR else v for v in leaves]
            out = tree_unflatten(leaves, p.out_spec)
            self._end(c, out)
            return out
        return forward

    def splice_runs(self) -> list:
        """Each run's calls as :func:`splice` takes them: the first block, the pattern, then
        the stand-ins (raises :class:`NoReuse` where a block of a run was not called)."""
        out = []
        for run in self.runs:
            calls = self.calls[run.paths]
            if len(calls) != len(run.paths) - self.skip.get(run.paths, 0):
                raise NoReuse(f"{calls[-1].path if calls else run.paths[0]}: not every block "
                              "of the run was called")
            out.append(calls)
        return out

    def finish(self) -> None:
        """After the step: each block's parameters' ``.grad`` storages."""
        rec = self.rec
        for run in self.runs:
            paths = run.paths[self.skip.get(run.paths, 0):]
            for path, c in zip(paths, self.calls[run.paths]):
                for name, p in self._own(path, self.fparams):
                    if p.grad is not None:
                        c.roles[("g", name)] = rec.register(p.grad)[0]


# -- splicing ----------------------------------------------------------------------------
