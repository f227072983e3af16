"""Ops of fake tensors whose sizes are plain ints, run by their own kernel on the fake
tensors as the meta tensors they are.

FakeTensorMode runs some ops through Python written for symbolic sizes: a view through its
``_view_meta`` (torch/_subclasses/fake_impls.py, then ``_reshape_view_helper`` in torch/_refs
and an ``as_strided`` dispatched again), and under PyTorch's Python dispatcher (which the
trace enters for symbolic sizes: :meth:`fxmem.trace.engine.eager_ops.EagerOps.fake_kernel`)
FSDP2's copies through the decompositions of the aten ops their Meta kernels call. Where
every tensor's sizes, strides and offset and every argument are plain ints, the op's own
kernel run on the fake tensors in FakeTensorMode's kernel invocation (as FakeTensorMode
itself runs a meta kernel) gives the same outputs sooner: a view's sizes, strides and offset
are computed by the same code on every device and it shares its input's storage, and
FSDP2's copies only write the tensors they are given (or return a view of one). An output
made so is wrapped as FakeTensorMode wraps a meta kernel's (``from_meta_and_device``).

Most such ops are FSDP2's: each block's all-gathered parameters viewed out of the
all-gather's output (about 640 views per step of Llama-3.1-8B), its copy-in and copy-out,
and the gradients' copy into the reduce-scatter's input.

>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode():
...     x = torch.empty(24)
...     y = meta_kernel(torch.ops.aten.view.default, (x, [4, 6]), {})
>>> y.shape, y.stride(), y.untyped_storage()._cdata == x.untyped_storage()._cdata
(torch.Size([4, 6]), (6, 1), True)

Where sizes are symbolic, three kinds of op are made as FakeTensorMode makes them, without
its checks on symbolic sizes (each 1 to 7 ms an op of a ``(B, L, 4096)`` tensor), where the
answer is plain: views of contiguous tensors (:func:`contiguous_view`), pointwise ops on
contiguous tensors or led by a first tensor whose strides order every dim (:func:`pointwise`)
and empty tensors (:func:`empty`). Anything else stays FakeTensorMode's.

>>> from torch._dynamo.source import ConstantSource
>>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
>>> env = ShapeEnv()
>>> b = env.create_symintnode(env.create_symbol(4, ConstantSource("B")), hint=4)
>>> with FakeTensorMode(shape_env=env):
...     x, w = torch.empty(b, 16, 64, dtype=torch.bfloat16), torch.empty(64)
...     v = contiguous_view(torch.ops.aten.view.default, (x, [b * 16, -1, 8]), {})
...     y = pointwise(torch.ops.aten.mul.Tensor, (x, w), {})
>>> v.shape[1:], v.stride(), v.untyped_storage()._cdata == x.untyped_storage()._cdata
(torch.Size([8, 8]), (64, 8, 1), True)
>>> y.shape[1:], y.stride(), y.dtype
(torch.Size([16, 64]), (1024, 64, 1), torch.float32)
"""

from __future__ import annotations

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten

# ops whose output is computed from the input's metadata and the arguments alone
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.as_strided.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.slice.Tensor, aten.select.int, aten.alias.default,
    aten.detach.default,
})
# FSDP2's copies (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), by name: the
# namespace exists once FSDP2 is imported
FSDP_COPIES = frozenset({"all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"})
NOT_RUN = object()  # what meta_kernel returns for an op it leaves to FakeTensorMode
# views whose fake outputs contiguous_view makes where the sizes are symbolic
CONTIGUOUS_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})


def meta_kernel(func, args: tuple, kwargs: dict):
    """``func`` (one of :data:`VIEW_OPS`, without keyword arguments, or of
    :data:`FSDP_COPIES`) on fake tensors of plain-int metadata, by its own kernel;
    :data:`NOT_RUN` where FakeTensorMode must run it (symbolic sizes or arguments, a tensor
    whose value the mode keeps, a tensor of another kind or mode, another op)."""
    if func in VIEW_OPS:
        if kwargs or not args:
            return NOT_RUN
    elif func.namespace != "fsdp" or func._opname not in FSDP_COPIES:
        return NOT_RUN
    mode = device = None
    for v in tree_leaves((args, kwargs)):
        if isinstance(v, torch.Tensor):
            if not _fake_of(v, mode) or v._has_symbolic_sizes_strides:
                return NOT_RUN
            mode, device = v.fake_mode, device or v.fake_device
        elif not (v is None or type(v) in (int, bool)):
            return NOT_RUN
    if mode is None:
        return NOT_RUN
    with in_kernel_invocation_manager(mode):
        out = func(*args, **kwargs)
    wrap = mode.fake_tensor_converter.from_meta_and_device
    return tree_map(lambda t: wrap(mode, t, device)
                    if isinstance(t, torch.Tensor) and type(t) is not FakeTensor else t, out)


def _fake_of(v, mode) -> bool:
    """Whether ``v`` is a fake tensor of ``mode`` (of any, where None) whose value the mode
    does not keep (no constant, no real tensor beside it): one the paths here may make the
    outputs of."""
    return type(v) is FakeTensor and v.constant is None and v.real_tensor is None and \
        (mode is None or v.fake_mode is mode)


def contiguous_view(func, args: tuple, kwargs: dict):
    """``aten.view`` (or ``_unsafe_view``) of a contiguous fake tensor whose sizes are
    symbolic, as the ``as_strided`` it is: the new sizes with contiguous strides over the same
    storage and offset. FakeTensorMode's ``_view_meta`` (torch/_subclasses/fake_impls.py)
    reaches the same ``as_strided`` through ``_reshape_view_helper`` (torch/_refs), whose
    checks on symbolic sizes cost about 2 ms a view (Llama's blocks view each activation
    several times: about 0.2 s of each trace), against 0.2 ms. Taken only where the answer is
    plain: the strides are exactly the contiguous ones of the sizes (as expressions), the new
    sizes hold as many elements (as expressions, one ``-1`` standing for a plain int or a run
    of the input's sizes), every size is an int or a SymInt; :data:`NOT_RUN` otherwise,
    FakeTensorMode's own view then. (The module's docstring has an example.)"""
    if func not in CONTIGUOUS_VIEWS or kwargs or len(args) != 2:
        return NOT_RUN
    a, shape = args
    if not _fake_of(a, None) or not a._has_symbolic_sizes_strides or \
            type(shape) not in (list, tuple) or \
            any(type(v) not in (int, torch.SymInt) for v in shape):
        return NOT_RUN
    sizes = a.size()
    if len(shape) == len(sizes) and all(_expr(v) == _expr(s) for v, s in zip(shape, sizes)):
        return a.as_strided(shape, a.stride())  # the same sizes: an alias, strides kept
    free = [i for i, v in enumerate(shape) if type(v) is int and v == -1]
    if len(free) > 1 or not sizes or not _contiguous(a):
        return NOT_RUN
    numel = 1  # the elements, as an expression
    for size in sizes:
        numel = numel * _expr(size)
    known = 1
    for v in shape:
        if not (type(v) is int and v == -1):
            known = known * _expr(v)
    shape = list(shape)
    if free:
        rest = _run_of(sizes, sympy.sympify(numel) / known)
        if rest is None:
            return NOT_RUN
        shape[free[0]] = rest
    elif sympy.sympify(known) != sympy.sympify(numel):
        return NOT_RUN
    strides = _contiguous_strides(shape)
    return NOT_RUN if strides is None else a.as_strided(shape, strides)


def _run_of(sizes, rest):
    """The size a view's ``-1`` stands for, ``rest`` (an expression): a positive int, or the
    product of a run of the input's ``sizes`` whose expression it is (a flattened run: B*L of
    (B, L, vocab)); None otherwise."""
    if rest.is_Integer:
        return int(rest) if rest > 0 else None
    for i in range(len(sizes)):
        product, expr = sizes[i], _expr(sizes[i])
        for j in range(i + 1, len(sizes) + 1):
            if sympy.sympify(expr) == rest:
                return product
            if j < len(sizes):
                product, expr = product * sizes[j], expr * _expr(sizes[j])
    return None


def _expr(v):
    """A size or stride as a sympy expression (an int as it is)."""
    return v.node.expr if type(v) is torch.SymInt else v


def pointwise(func, args: tuple, kwargs: dict):
    """A pointwise op (``torch.Tag.pointwise``, or ``aten._to_copy``) on contiguous fake
    tensors of symbolic sizes, its output made as FakeTensorMode's would be: the inputs'
    broadcast sizes, contiguous, the dtype the op's meta kernel gives for one-element tensors
    of the inputs' dtypes, on their device. FakeTensorMode reaches the same through Python
    references (torch/_refs, torch/_prims_common) or ``make_fast_binary_impl``
    (torch/_subclasses/fake_impls.py) whose checks on symbolic sizes cost 1 to 6 ms an op
    (about 0.45 s of each of Llama-3.1-8B's traces), against 0.3 ms. Taken only where the
    answer is plain: a functional op with one tensor out and no alias, every tensor a
    fake of one mode and device with at least one dimension, each size equal to the others
    at its place or 1 and positive, keyword arguments that keep the layout, and either
    every tensor's strides contiguous (as expressions; any strides where the op is asked
    for a contiguous output, as a copy made ``contiguous``) or the first tensor's layout
    the output's (:func:`_led_by`: a rotary embedding's ``q * cos`` on a transposed ``q``,
    8 to 10 ms an op before); :data:`NOT_RUN` otherwise (FakeTensorMode's own then). (The
    module's docstring has an example.)"""
    if not _functional_pointwise(func):
        return NOT_RUN
    for k, v in kwargs.items():
        if not _keeps_layout(k, v):
            return NOT_RUN
    mode = device = None
    tensors, symbolic = [], False
    for v in tree_leaves((args, kwargs)):
        if isinstance(v, torch.Tensor):
            if not _fake_of(v, mode) or v.dim() == 0 or \
                    mode is not None and v.fake_device != device:
                return NOT_RUN
            mode, device = v.fake_mode, v.fake_device
            symbolic = symbolic or v._has_symbolic_sizes_strides
            tensors.append(v)
    if not symbolic or kwargs.get("device") not in (None, device):
        return NOT_RUN
    sizes = _broadcast([t.size() for t in tensors])
    if sizes is None:
        return NOT_RUN
    if kwargs.get("memory_format") is torch.contiguous_format or \
            all(_contiguous(t) for t in tensors):
        strides = _contiguous_strides(sizes)
    else:  # the first tensor's layout, where it alone orders every pair of dims
        strides = _led_by(tensors, sizes, func in IN_ORDER)
    if strides is None:
        return NOT_RUN
    with in_kernel_invocation_manager(mode):
        try:
            probe = func(*tree_map(_one, args), **{
                k: torch.device("meta") if k == "device" and v is not None else _one(v)
                for k, v in kwargs.items()})
        except Exception:  # noqa: BLE001 - the op refuses them: FakeTensorMode's error
            return NOT_RUN
        out = torch.empty_strided(sizes, strides, dtype=probe.dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, out, device)


def empty(func, args: tuple, kwargs: dict):
    """``aten.empty`` or ``aten.empty_strided`` under FakeTensorMode, as its constructors' rule
    makes it (``constructors`` in torch/_subclasses/fake_impls.py: the op run on the meta
    device in the mode's kernel invocation, wrapped on the device asked, the CPU when none
    is), without the mode's dispatch around it (its arguments normalised, the op's rule
    looked up): 0.2 to 0.8 ms an op before, a few hundredths after. Taken for strided
    tensors in memory not pinned, in a contiguous format; :data:`NOT_RUN` otherwise.

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> with FakeTensorMode() as mode:
    ...     x = empty(torch.ops.aten.empty_strided.default, ([4, 6], [1, 4]),
    ...               {"dtype": torch.float16, "device": torch.device("cuda")})
    >>> type(x).__name__, x.shape, x.stride(), x.dtype, x.device, x.fake_mode is mode
    ('FakeTensor', torch.Size([4, 6]), (1, 4), torch.float16, device(type='cuda', index=0), True)
    """
    if func not in EMPTY or kwargs.get("layout") not in (None, torch.strided) or \
            kwargs.get("pin_memory") or \
            kwargs.get("memory_format") not in (None, torch.contiguous_format):
        return NOT_RUN
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None:
        return NOT_RUN
    device = kwargs.get("device")
    with in_kernel_invocation_manager(mode):
        out = func(*args, **{**kwargs, "device": torch.device("meta")})
    return FakeTensor(mode, out, torch.device("cpu") if device is None else device)


def foreach(func, args: tuple, kwargs: dict):
    """A pointwise ``_foreach_*`` op that makes new tensors (an optimizer's
    ``_foreach_sqrt`` of its second moments: AdamW's over Llama-3.1-8B's 291 parameters took
    31 to 33 ms, each tensor's op run in FakeTensorMode's dispatch) on contiguous fakes of
    plain-int sizes: each output as FakeTensorMode's meta kernel makes it, a contiguous
    tensor of its input's sizes, of the dtype the op gives one-element tensors of the
    inputs' dtypes, on its input's device. Taken only for an op with one list of tensors
    out and no alias, each input list as long as the first and of its sizes, every other
    argument a number; :data:`NOT_RUN` otherwise.

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> with FakeTensorMode() as mode:
    ...     xs = [torch.empty(4, 6, dtype=torch.bfloat16), torch.empty(3)]
    ...     ys = foreach(torch.ops.aten._foreach_sqrt.default, (xs,), {})
    >>> [(y.shape, y.dtype, y.fake_mode is mode) for y in ys]
    [(torch.Size([4, 6]), torch.bfloat16, True), (torch.Size([3]), torch.float32, True)]
    """
    if not _functional_foreach(func) or kwargs:
        return NOT_RUN
    lists = [a for a in args if isinstance(a, (list, tuple))]
    if not lists or any(not (a is None or type(a) in (int, float, bool) or
                             isinstance(a, (list, tuple))) for a in args):
        return NOT_RUN
    mode = None
    for xs in lists:
        if len(xs) != len(lists[0]):
            return NOT_RUN
        for v, x in zip(xs, lists[0]):
            if not _fake_of(v, mode) or v._has_symbolic_sizes_strides or \
                    v.shape != x.shape or not _contiguous(v):
                return NOT_RUN
            mode = v.fake_mode
    out, dtypes = [], {}
    with in_kernel_invocation_manager(mode):
        for i, first in enumerate(lists[0]):
            key = tuple(xs[i].dtype for xs in lists)
            if key not in dtypes:
                try:
                    probe = func(*[[_one(xs[i])] if isinstance(xs, (list, tuple)) else xs
                                   for xs in args])
                except Exception:  # noqa: BLE001 - the op refuses them: FakeTensorMode's
                    return NOT_RUN
                dtypes[key] = probe[0].dtype
            out.append(torch.empty(first.shape, dtype=dtypes[key], device="meta"))
    return [FakeTensor(mode, t, x.fake_device) for t, x in zip(out, lists[0])]


_FOREACH: dict = {}  # op -> whether foreach takes it


def _functional_foreach(func) -> bool:
    """Whether ``func`` is a ``_foreach_*`` op making one new list of tensors whose op on
    each tensor is pointwise: the same overload of the op without ``_foreach_`` (``List``:
    its ``Tensor`` one), so ``_foreach_sqrt.default`` (``aten.sqrt.default``) is, and
    neither ``_foreach_max.default`` nor ``_foreach_norm.Scalar`` (reductions) is."""
    got = _FOREACH.get(func)
    if got is None:
        name = func._opname
        overload = {"List": "Tensor"}.get(func._overloadname, func._overloadname)
        one = getattr(getattr(aten, name[len("_foreach_"):], None), overload, None) \
            if name.startswith("_foreach_") else None
        got = _FOREACH[func] = isinstance(one, torch._ops.OpOverload) and \
            torch.Tag.pointwise in one.tags and _one_new(func._schema, "List[Tensor]")
    return got


EMPTY = frozenset({aten.empty.memory_format, aten.empty_strided.default})
# binary ops whose references (torch/_refs) hand their operands to the prim in order (a type
# promotion's cast keeps a dense layout), as TensorIterator takes them
IN_ORDER = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor})
_FUNCTIONAL: dict = {}  # op -> whether pointwise takes it


def _functional_pointwise(func) -> bool:
    got = _FUNCTIONAL.get(func)
    if got is None:
        got = _FUNCTIONAL[func] = (torch.Tag.pointwise in func.tags
                                   or func is aten._to_copy.default) \
            and _one_new(func._schema, "Tensor")
    return got


def _one_new(schema, kind: str) -> bool:
    """Whether an op of ``schema`` writes none of its arguments and returns one new value
    of type ``kind`` (``"Tensor"``, ``"List[Tensor]"``), an alias of none."""
    return not schema.is_mutable and len(schema.returns) == 1 and \
        schema.returns[0].alias_info is None and str(schema.returns[0].type) == kind


def _keeps_layout(key: str, value) -> bool:
    """Whether a keyword argument of a pointwise op leaves a contiguous output contiguous
    (a device is checked apart: the inputs')."""
    if key == "memory_format":
        return value in (None, torch.preserve_format, torch.contiguous_format)
    if key == "layout":
        return value in (None, torch.strided)
    if key == "pin_memory":
        return not value
    return key == "device" or not isinstance(value, torch.Tensor)


def _one(v):
    """A tensor as a one-element meta tensor of its dtype and dimensions (what the op's
    dtype is computed from)."""
    if isinstance(v, torch.Tensor):
        return torch.empty((1,) * v.dim(), dtype=v.dtype, device="meta")
    return v


def _broadcast(shapes: list):
    """The sizes ``shapes`` broadcast to, where each place's sizes are 1 or one expression;
    None otherwise."""
    out = []
    for place in range(1, max(len(s) for s in shapes) + 1):
        got = None
        for s in shapes:
            if place <= len(s) and not (type(s[-place]) is int and s[-place] == 1):
                if got is None:
                    got = s[-place]
                elif _expr(got) != _expr(s[-place]):
                    return None
        out.append(1 if got is None else got)
    return out[::-1]


def _led_by(tensors, sizes, in_order: bool) -> list | None:
    """The output's strides of a pointwise op on ``tensors`` whose first has the output's
    ``sizes``, each at least 2, and strides none of which is 0 and each pair of which is
    ordered the same way for every value the ShapeEnv's ranges allow: the contiguous strides
    of ``sizes`` in the order of the first's (its own, where it is laid out densely).
    TensorIterator orders each pair of dims by the first operand whose strides there differ
    and neither is 0 (a broadcast dim's), and lays the output out densely in that order
    (``reorder_dimensions`` in aten/src/ATen/TensorIterator.cpp;
    ``compute_elementwise_output_logical_to_physical_perm`` in torch/_prims_common, which
    FakeTensorMode's references follow): such a first tensor orders every pair, and no
    guard is needed. ``in_order``: the op's reference keeps its operands in order
    (:data:`IN_ORDER`); else every other tensor's dims that are neither of size 1 nor of
    stride 0 must be ordered the same way, so that a decomposition putting another operand
    first gives the same. None otherwise (a size that may be 1 or 0, the first broadcast,
    strides whose order depends on the sizes' values, two tensors that disagree)."""
    first = tensors[0]
    n = len(sizes)
    if first.dim() != n or not all(_expr(a) == _expr(b) and _at_least_two(a)
                                   for a, b in zip(first.size(), sizes)):
        return None
    dense = _dense_order(first.size(), first.stride(), range(n))
    order = dense or _stride_order(first.stride(), range(n))
    if order is None:
        return None
    rank = {d: k for k, d in enumerate(order)}  # 0: the innermost dim
    for t in () if in_order else tensors[1:]:
        shift = n - t.dim()  # its dims, aligned to the output's from the right
        shape = [1] * shift + list(t.size())
        stride = [0] * shift + list(t.stride())
        mine = _stride_order(stride, [d for d in range(n) if not (
            type(shape[d]) is int and shape[d] == 1 or type(stride[d]) is int and stride[d] == 0)])
        if mine is None or any(rank[a] > rank[b] for a, b in zip(mine, mine[1:])):
            return None
    if dense is not None:
        return list(first.stride())
    out, step = [None] * n, 1
    for d in order:
        out[d] = step
        step = step * sizes[d]
    return out


def _dense_order(shape, strides, dims) -> list | None:
    """``dims`` innermost first where their strides are the contiguous ones of their sizes
    in some order (as expressions), else None."""
    left, step, out = set(dims), 1, []
    while left:
        inner = next((i for i in left if _expr(strides[i]) == step), None)
        if inner is None:
            return None
        left.discard(inner)
        out.append(inner)
        step = step * _expr(shape[inner])
    return out


def _stride_order(strides, dims) -> list | None:
    """``dims`` by their strides, smallest first, where no stride is 0 and every pair is
    ordered the same way for every value (:func:`_below`), else None."""
    out: list = []
    for d in dims:
        if type(strides[d]) is int and strides[d] == 0:
            return None
        k = len(out)
        while k:
            below = _below(strides[d], strides[out[k - 1]])
            if below is None:
                return None
            if not below:
                break
            k -= 1
        out.insert(k, d)
    return out


def _below(a, b) -> bool | None:
    """Whether stride ``a`` is below stride ``b`` (ints or SymInts) for every value their
    ShapeEnv's ranges allow: True, False (above), or None (equal, or it depends). A
    symbol's range only narrows, so an answer is kept on the ShapeEnv."""
    if type(a) is int and type(b) is int:
        return None if a == b else a < b
    env = (a if type(a) is not int else b).node.shape_env
    diff = sympy.sympify(_expr(b) - _expr(a))
    known = env.__dict__.setdefault("_fxmem_signs", {})
    if diff not in known:
        if diff.is_number:
            known[diff] = None if diff == 0 else bool(diff > 0)
        else:
            r = env.bound_sympy(diff)
            known[diff] = True if r.lower > 0 else False if r.upper < 0 else None
    return known[diff]


def _at_least_two(v) -> bool:
    """Whether size ``v`` (an int or a SymInt) is 2 or more wherever its ShapeEnv's ranges
    hold (a symbol's range only narrows, so an answer of True is kept on the ShapeEnv)."""
    if type(v) is int:
        return v >= 2
    env, expr = v.node.shape_env, v.node.expr
    known = env.__dict__.setdefault("_fxmem_at_least_two", set())
    if expr in known:
        return True
    if env.bound_sympy(expr).lower >= 2:
        known.add(expr)
        return True
    return False


def _contiguous_strides(sizes) -> list | None:
    """The contiguous strides of ``sizes`` as ``make_contiguous_strides_for`` (torch/_prims_common)
    gives them (each size taken as at least 1); None where a symbolic size may be below 1 (a
    data-dependent count: its ``Max(u0, 1)`` is left to FakeTensorMode)."""
    strides, step = [], 1
    for v in reversed(sizes):
        strides.append(step)
        if type(v) is int:
            step = step * max(v, 1)
        elif v.node.expr.is_positive:
            step = step * v
        else:
            return None
    return strides[::-1]


def _contiguous(t) -> bool:
    """Whether ``t``'s strides are the contiguous ones of its sizes, as expressions, by
    :func:`_contiguous_strides`' rule (a plain size taken as at least 1; a symbolic size
    whose stride would be ``Max(u0, 1)`` matches no product)."""
    step = 1
    for size, stride in zip(reversed(t.size()), reversed(t.stride())):
        if _expr(stride) != step:
            return False
        step = step * (max(size, 1) if type(size) is int else _expr(size))
    return True


def empty_fake(t: torch.Tensor, mode, device) -> FakeTensor:
    """``torch.empty_like(t, device=device)`` under ``mode`` for the meta tensor ``t``, by its
    meta kernel: FakeTensorMode would first make ``t`` a fake of its own (``from_real_tensor``:
    most of the 0.2 to 0.4 s that ``to_empty`` took over Llama-3.1-8B's shards on a rank).

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> mode = FakeTensorMode()
    >>> x = empty_fake(torch.empty(4, 6, device="meta").t(), mode, "cpu")
    >>> type(x).__name__, x.shape, x.stride(), x.device
    ('FakeTensor', torch.Size([6, 4]), (1, 6), device(type='cpu'))
    """
    with in_kernel_invocation_manager(mode):
        out = torch.empty_like(t)
    return mode.fake_tensor_converter.from_meta_and_device(mode, out, torch.device(device))
