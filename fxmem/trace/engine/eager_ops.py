"""What each op does in eager PyTorch that its fake kernel does not: the rules of
:mod:`fxmem.trace.kernels` applied to each op of the traced step as it runs.

:class:`EagerOps` is the half of :class:`~fxmem.trace.engine.recorder.Recorder` that runs an
op (:meth:`EagerOps.run_op`, called by
:class:`~fxmem.trace.ledger.tracking.StorageTracker` for each aten op): the fake kernel
under PyTorch's Python dispatcher, what CUDA's kernel allocates instead, values the trace
knows, values read from tensors (unbacked symbols), the sizes eager kernels give their
outputs and workspaces. The other half records what ran (the graph, the ops, the module
each is in). It reads the recorder's state: ``shape_env``, ``kernels``, ``values``,
``oracle``, ``data``, ``phase``, ``unmodelled`` and ``failed``.
"""

from __future__ import annotations

import traceback

import sympy
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_leaves

from ...errors import TraceError
from ..kernels.datadep import DataSymbol, count_of, data_symbols, drawn_at_random
from ..kernels.meta_kernels import NOT_RUN, contiguous_view, empty, foreach, meta_kernel, pointwise
from ..kernels.rules import (
    DATA_DEPENDENT_OPS,
    EAGER_CPU_OUTPUT_LAYOUTS,
    GUARD_INT_BACKWARD_NODES,
    LAYOUT_ONLY_GUARD_OPS,
    OWN_META_OPS,
    PERIODIC_WINDOW_OPS,
    RETURNS_ITS_INPUT,
    SIZED_OUTPUTS,
    SPLIT_ALIASED_OUTPUTS,
    STATS_IN_WEIGHT_DTYPE_OPS,
    STORAGE_AT_LEAST_INPUT_OPS,
    UNREDUCED_STORAGE_LOSSES,
    UNSIZED_WORKSPACE_OPS,
    eager_cpu_layout,
    window_storage_nbytes,
)
from ..kernels.values import passed, written_args
from .messages import fails_in_eager, user_frame


def _cache_off_for(func, args):
    """The fake tensor mode whose dispatch cache view op ``func`` is made without (its cache
    on), else None. A view of a tensor of symbolic sizes found in the cache is rebuilt from
    the entry's size expressions, SymInt by SymInt: 1.5 ms an ``as_strided`` and 0.55 ms a
    ``detach``, dearer than making it (Llama-3.1-8B's plan over 5 GPUs, four blocks traced
    for real: 1.26 s of its 5.8 s trace in such rebuilds; 5.26 to 5.87 s a trace before,
    4.71 to 5.13 s with views made without the cache). Other ops keep the cache, which
    pays where an op repeats with the same sizes (GPT-2 small, every block traced: 4.0 to
    4.5 s a trace with it on, 4.9 to 5.3 s off, 3.2 to 3.3 s with views made without it).

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> with FakeTensorMode() as mode:
    ...     x = torch.empty(2, 3)
    >>> _cache_off_for(torch.ops.aten.t.default, (x,)) is mode
    True
    >>> _cache_off_for(torch.ops.aten.add.Tensor, (x, x)) is None
    True
    """
    if not args or not getattr(func, "is_view", False):
        return None
    mode = getattr(args[0], "fake_mode", None)
    return mode if mode is not None and mode.cache_enabled else None


class EagerOps:
    """Each op run as eager PyTorch runs it (a mixin of the recorder: see the module
    docstring for the state it reads)."""

    def metadata(self, func, args, kwargs):
        """A C++ kernel asked a tensor with symbolic sizes for its concrete metadata (see
        :data:`fxmem.trace.kernels.rules.METADATA_QUERIES`): the fake tensor mode answers, nothing
        is recorded. An answer that fixes B (or a named dim) to its example value is a
        :class:`SpecializationError` naming the op, raised here rather than at the next op."""
        n_repl = len(self.shape_env.replacements)
        out = func(*args, **kwargs)
        if len(self.shape_env.replacements) != n_repl:
            self.check_specialized(
                str(func), self.module(),
                hint=f"a C++ kernel asked a tensor whose sizes are symbolic for concrete ones "
                     f"({func}); fxmem has no symbolic stand-in for the op that asked "
                     "(fxmem.trace.kernels.symbolic)")
        return out

    def run_op(self, func, args, kwargs):
        try:
            if not self.recording and self._update_only(func, args, kwargs, plain=False):
                # the unrecorded step that makes the optimizer's state: no kernel, nor the
                # rules that follow one
                self.values.update(func, args, kwargs, None)
                return _written_result(func, args, kwargs)
            if self._unguarded is not None:
                args = self.unguarded_size(func, args)
            if func in DATA_DEPENDENT_OPS and self.phase != "optimizer":
                value = self.values.read(args[0])  # a value the model made, not data
                if value is not NotImplemented:
                    return value
                # a value read from a tensor: an unbacked symbol, traced through while only
                # computed with; a branch on it stops the trace (fxmem.trace.kernels.datadep)
                out = self.fake_kernel(func, args, kwargs)
                self.note_read(func, args[0], out)
                return out
            if func in DATA_DEPENDENT_OPS and self.phase == "optimizer":
                value = self.oracle(args[0])
                if value is not NotImplemented:
                    return value
                const = getattr(args[0], "constant", None)  # what the fake kernel returns
                if func is torch.ops.aten._local_scalar_dense.default and const is not None:
                    with no_dispatch():  # a real tensor: read, not made fake again
                        return const.item()  # e.g. Adam's step count, read per parameter
            if func in RETURNS_ITS_INPUT:
                return args[0]
            if func in LAYOUT_ONLY_GUARD_OPS:
                with self.shape_env.suppress_guards():
                    return self.fake_kernel(func, args, kwargs)
            out = _written_result(func, args, kwargs) if self._update_only(
                func, args, kwargs, plain=True) else self.fake_kernel(func, args, kwargs)
            if func is torch.ops.aten.new_zeros.default and self.phase == "backward":
                self.expect_size_read(args[1])
            rule = UNSIZED_WORKSPACE_OPS.get(func)
            if rule is not None and rule[0](args) and (func, self.module()) not in self.unmodelled:
                what = rule[1]
                self.unmodelled[(func, self.module())] = what(args) if callable(what) else what
            sized = SIZED_OUTPUTS.get(func) if self.kernels is None else None
            got = sized(args) if sized is not None else None
            self._sized = (out[got[0]], got[1]) if got is not None else ()
            # what CUDA's kernel allocates (fxmem.trace.kernels.cuda.kernels)
            if self.kernels is not None:
                out = self.kernels.outputs(func, args, kwargs, out)
                self._host = tuple(out[i] for i in self.kernels.host_outputs(func, args, kwargs))
                what = self.kernels.unmodelled(func, args, kwargs, out)
                if what is not None:
                    self.unmodelled.setdefault((func, self.module()), what)
            if func in EAGER_CPU_OUTPUT_LAYOUTS and self.kernels is None:
                out = eager_cpu_layout(func, args, out)  # CUDA's: fxmem.trace.kernels.cuda.kernels
            pair = SPLIT_ALIASED_OUTPUTS.get(func)
            if pair and out[pair[0]].untyped_storage() is out[pair[1]].untyped_storage():
                out = (*out[:pair[1]], torch.empty_like(out[pair[1]]), *out[pair[1] + 1:])
            self.values.update(func, args, kwargs, out)
            return out
        except TraceError:
            raise
        except Exception as e:
            if self.failed is None:
                self.failed = (str(func), self.module(), self.phase,
                               user_frame(traceback.extract_stack()), e,
                               fails_in_eager(func, args, kwargs, self.shape_env, e))
            raise

    def note_read(self, func, t: torch.Tensor, value) -> None:
        """``value`` was read from fake tensor ``t``: its unbacked symbol, with where it was
        read and whether ``t`` is computed from a random draw."""
        new = data_symbols(value) - self.data.keys()
        if new:
            node = self._node_of.get(t)
            read = DataSymbol("a value read from a tensor", str(func), self.module(),
                              self.phase, user_frame(traceback.extract_stack()),
                              random=drawn_at_random(node) if node is not None else None)
            self.data.update(dict.fromkeys(new, read))

    def note_counts(self, func, args, new_sids) -> None:
        """Storages of this op sized by a symbol the trace has not seen: a count of the
        values of a tensor (a mask's True values), bounded by its number of elements
        (:func:`fxmem.trace.kernels.datadep.count_of`), or unbounded when the op says nothing."""
        found = set()
        for sid in new_sids:
            found |= data_symbols(self.storages[sid].nbytes)
        for sym in found - self.data.keys():
            bound, what = count_of(func, args, sym) or (None, "values {func} counts")
            expr = bound.node.expr if isinstance(bound, torch.SymInt) else bound
            n = self._sub(expr) if isinstance(expr, sympy.Expr) else expr
            self.data[sym] = DataSymbol(
                "the number of " + what.format(n=n, func=func), str(func), self.module(),
                self.phase, user_frame(traceback.extract_stack()), expr)

    def expect_size_read(self, size) -> None:
        """A backward node of :data:`~fxmem.trace.kernels.rules.GUARD_INT_BACKWARD_NODES` made its
        gradient storage, ``new_zeros(size)``: its C++ reads that size as an int before its
        next op, so guards stay suppressed until then (:meth:`unguarded_size`)."""
        node = torch._C._current_autograd_node()
        if (node is None or node.name() not in GUARD_INT_BACKWARD_NODES or len(size) != 1
                or not isinstance(size[0], torch.SymInt)):
            return
        suppress = self.shape_env.suppress_guards()
        suppress.__enter__()
        self._unguarded = (size[0], suppress)

    def unguarded_size(self, func, args) -> tuple:
        """The op after :meth:`expect_size_read`: guards are on again; an ``arange(0, n)``
        whose ``n`` is the storage size read as an int gets that size, symbolic."""
        size, suppress = self._unguarded
        self._unguarded = None
        suppress.__exit__(None, None, None)
        if (func is torch.ops.aten.arange.start and len(args) == 2 and args[0] == 0
                and isinstance(args[1], int) and args[1] == size.node.hint):
            return (0, size)
        return args

    def _update_only(self, func, args, kwargs, plain: bool) -> bool:
        """Whether ``func`` is an optimizer's update in place (``_foreach_addcdiv_``,
        ``mul_``) whose fake kernel need not run: it makes no storage and changes no size,
        but for a value the fake mode keeps (a step count the next step reads). ``plain``:
        of tensors of plain-int sizes only (the recorded step: :meth:`run_op`). Such a
        kernel costs 0.2 ms a tensor: AdamW's over Llama-3.1-8B's 291 parameters took
        0.22 s of each trace."""
        if self.phase != "optimizer" or not writes_only(func):
            return False
        for t in tree_leaves(passed(written_args(func), args, kwargs)):
            if isinstance(t, torch.Tensor) and (getattr(t, "constant", None) is not None
                                                or plain and t._has_symbolic_sizes_strides):
                return False
        return True

    def fake_kernel(self, func, args, kwargs):
        """``func`` on the fake tensors, under PyTorch's Python dispatcher, as AOTAutograd
        (torch/_functorch/aot_autograd.py, whenever there is a ShapeEnv) and
        ``make_fx(tracing_mode="symbolic")`` (torch/fx/experimental/proxy_tensor.py) run fake
        kernels with symbolic sizes. Without
        it, FakeTensorMode (torch/_subclasses/fake_tensor.py ``_dispatch_impl``) reaches C++
        kernels that need concrete sizes: ``aten::constant_pad_nd``, whose Python meta
        torch/_meta_registrations.py ``activate_meta`` keeps off the C++ Meta key, calls
        ``sizes()`` and so pins B (``F.pad``, and ``F.unfold``/``F.fold``, whose Python
        decompositions ``im2col``/``col2im`` in torch/_decomp/decompositions.py pad); the
        C++ ``aten::expand`` that Python meta kernels call (``meta_baddbmm``, and
        ``elementwise_meta``'s broadcast for ``addcmul``/``addcdiv``) refuses symbolic sizes
        ("SymIntArrayRef expected to contain only concrete integers"). The Python dispatcher
        sends each op to its Python kernel (``OpOverload.py_kernels``) first. It is entered
        here only, below autograd and this mode: the model's own ops (composites included)
        still run their C++ kernels, in eager order.

        Views of plain-int metadata are made by their C++ kernel instead, which gives the
        same view sooner, and so are FSDP2's copies; views of contiguous tensors of symbolic
        sizes, pointwise ops on such tensors and empty tensors are made as FakeTensorMode
        makes them, without its checks on symbolic sizes, and so are a pointwise
        ``_foreach_`` op's new tensors (:mod:`fxmem.trace.kernels.meta_kernels`).

        The exception: ops whose Meta kernel fxmem replaces while tracing
        (:data:`fxmem.trace.kernels.rules.OWN_META_OPS`; for CUDA,
        :data:`fxmem.trace.kernels.cuda.rnn.META`). The Python dispatcher would prefer PyTorch's
        Python meta, which they replace, over a
        kernel registered with ``torch.library``.

        A view is made with the fake tensor mode's dispatch cache off
        (:func:`_cache_off_for`): the cache costs a view more than the view does."""
        mode = _cache_off_for(func, args)
        if mode is None:
            return self._fake_kernel(func, args, kwargs)
        mode.cache_enabled = False
        try:
            return self._fake_kernel(func, args, kwargs)
        finally:
            mode.cache_enabled = True

    def _fake_kernel(self, func, args, kwargs):
        if func in OWN_META_OPS or self.kernels is not None and func in self.kernels.meta_ops:
            return func(*args, **kwargs)
        out = meta_kernel(func, args, kwargs)  # plain-int metadata: the op's own kernel
        if out is NOT_RUN:  # a contiguous tensor of symbolic sizes viewed: as_strided
            out = contiguous_view(func, args, kwargs)
        if out is NOT_RUN:  # a pointwise op on contiguous tensors of symbolic sizes
            out = pointwise(func, args, kwargs)
        if out is NOT_RUN:  # an empty tensor: the mode's constructors' rule
            out = empty(func, args, kwargs)
        if out is NOT_RUN:  # a pointwise _foreach_ op's new tensors, of plain-int sizes
            out = foreach(func, args, kwargs)
        if out is not NOT_RUN:
            return out
        with enable_python_dispatcher():
            return func(*args, **kwargs)

    def workspaces(self, func, args, kwargs, out) -> list:
        if self.kernels is None:
            return []
        # an empty tensor stands for each (a storage of its own), its size given as is: a
        # symbolic size through torch.empty could meet the fake mode's dispatch cache
        return [(torch.empty(0, dtype=torch.uint8), what, nbytes)
                for what, nbytes in self.kernels.workspaces(func, args, kwargs, out)]

    def output_nbytes(self, func, args, kwargs, t):
        if self._host and any(t is h for h in self._host):
            return 0  # a host tensor: no device memory (fxmem.trace.kernels.cuda.kernels)
        if self._sized and t is self._sized[0]:
            return self._sized[1]  # fxmem.trace.kernels.rules.SIZED_OUTPUTS
        if func in STATS_IN_WEIGHT_DTYPE_OPS and self.kernels is None:  # CPU kernels only
            x, w = args[0], args[1]
            if w is not None and w.dtype != x.dtype and t.dim() == 1 and x.dim() > 1:
                return t.numel() * w.element_size()  # a per-channel statistic
            return None
        if func in PERIODIC_WINDOW_OPS:
            return window_storage_nbytes(func, args, kwargs, t)
        if func in STORAGE_AT_LEAST_INPUT_OPS:  # empty_like(input), then resize_
            return torch.sym_max(args[0].numel(), t.numel()) * t.element_size()
        pos = UNREDUCED_STORAGE_LOSSES.get(func)
        if pos is not None:
            reduction = args[pos] if len(args) > pos else kwargs.get("reduction", 1)
            if reduction != 0:
                return args[0].numel() * t.element_size()
        return None


def writes_only(func) -> bool:
    """Does ``func`` only write tensors it is given in place, their sizes and storages kept
    (``mul_``, ``_foreach_lerp_``; not ``resize_``, ``set_``, ``t_``, nor an ``out=``
    variant, which may resize its output), returning nothing or what it wrote?

    >>> writes_only(torch.ops.aten._foreach_mul_.Scalar), writes_only(torch.ops.aten.mul.out)
    (True, False)
    >>> writes_only(torch.ops.aten.resize_.default), writes_only(torch.ops.aten.t_.default)
    (False, False)
    """
    return _returned(func) is not None


def _returned(func) -> tuple | None:
    """Of a :func:`writes_only` op, the (position, name) of the written argument each of its
    returns is; None for any other op."""
    if func not in _RETURNED:
        schema, got = func._schema, None
        at = {frozenset(a.alias_info.before_set): (i, a.name)
              for i, a in enumerate(schema.arguments)
              if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only}
        if at and func._opname.endswith("_") and func._opname not in _KEEPS_NOT_STORAGE \
                and torch.Tag.inplace_view not in func.tags \
                and all(r.alias_info is not None and frozenset(r.alias_info.before_set) in at
                        for r in schema.returns):
            got = tuple(at[frozenset(r.alias_info.before_set)] for r in schema.returns)
        _RETURNED[func] = got
    return _RETURNED[func]


_RETURNED: dict = {}
# in place, yet they change a tensor's storage or its size: run as they are
_KEEPS_NOT_STORAGE = frozenset(("resize_", "resize_as_", "set_", "_resize_output_",
                                "resize_as_sparse_", "sparse_resize_",
                                "sparse_resize_and_clear_", "_coalesced_"))


def _written_result(func, args, kwargs):
    """What ``func`` (:func:`writes_only`) returns: nothing, or the arguments it wrote."""
    outs = [args[i] if i < len(args) else kwargs[name] for i, name in _returned(func)]
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)
