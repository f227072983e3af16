"""The host side of ATen's CUDA reductions (``aten/src/ATen/native/cuda/Reduce.cuh``): how
TensorIterator lays a reduction out (reordered, coalesced dims; the 32-bit split) and
``setReduceConfig``'s block, grid and global-reduce staging, as exact expressions of the
symbolic sizes. :mod:`fxmem.trace.kernels.cuda.reductions` applies it per op.

>>> _cdiv(10, 4)
3
"""

from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true as _known

MAX_THREADS_PER_SM = 2048  # cudaDeviceProp.maxThreadsPerMultiProcessor: sm80, sm90, sm100
_INT32_MAX = 2**31 - 1


# --- symbolic helpers --------------------------------------------------------------------------

def _sym(*xs) -> bool:
    return any(isinstance(x, (torch.SymInt, torch.SymBool)) for x in xs)


def _decide(c):
    from .sizing import _decide as d
    return d(c)


def _ite(c, a, b):
    from .sizing import _ite as ite
    if isinstance(a, int) and isinstance(b, int) and a == b:
        return a
    return ite(c, a, b)


def _min(a, b):
    return torch.sym_min(a, b) if _sym(a, b) else min(a, b)


def _max(a, b):
    return torch.sym_max(a, b) if _sym(a, b) else max(a, b)


def _cdiv(a, b):
    return (a + b - 1) // b


def _at_hint(c) -> bool:
    """A layout choice (which dim moves fastest): decided when the ShapeEnv can, else at the
    size hints without recording a guard."""
    c = _decide(c)
    if isinstance(c, bool):
        return c
    with c.node.shape_env.suppress_guards():
        return bool(c)


def _last_pow2_below(n, cap: int):
    """``dim < cap ? last_pow2(dim) : cap`` (set_block_dimension); cap a power of two."""
    if not _sym(n):
        return cap if n >= cap else max(1, 1 << (int(n).bit_length() - 1))
    out, p = 1, 2
    while p <= cap:
        out = _ite(n >= p, p, out)
        p *= 2
    return out


def _pow2_cases(n, cap: int):
    """``[(condition, dim < cap ? last_pow2(dim) : cap)]`` over the values n may take
    (exclusive conditions; the impossible left out)."""
    if not _sym(n):
        return [(True, _last_pow2_below(n, cap))]
    out, p = [], 1
    while p <= cap:
        cond = n >= cap if p == cap else (_and(n >= p, n < 2 * p) if p > 1 else n < 2)
        c = _decide(cond)
        if c is True:
            return [(True, p)]
        if c is not False:
            out.append((cond, p))
        p *= 2
    return out


def _bool_cases(cond):
    c = _decide(cond)
    if isinstance(c, bool):
        return [(True, c)]
    return [(c, True), (torch.sym_not(c), False)]


def _vec_of(n):
    """The largest of 4, 2, 1 dividing n (get_output_vec_size's update_vec_size)."""
    if not _sym(n):
        return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1
    return _ite(n % 4 == 0, 4, _ite(n % 2 == 0, 2, 1))


# --- TensorIterator's reduce layout -------------------------------------------------------------

class _Iter:
    """shape, per-operand byte strides (outputs first, the input last), the input's byte
    offset from its storage (vector alignment), after reorder and coalesce."""

    def __init__(self, shape, strides, in_offset, noutputs):
        self.shape, self.strides = shape, strides
        self.in_offset, self.noutputs = in_offset, noutputs

    @property
    def ndim(self):
        return len(self.shape)

    def num_reduce_dims(self):
        return sum(1 for s in self.strides[0] if _known(s == 0))

    def num_output_elements(self):
        return math.prod([n for n, s in zip(self.shape, self.strides[0]) if not _known(s == 0)])

    def numel(self):
        return math.prod(self.shape)


def _out_strides(shape, reduced):
    """The contiguous output with stride 0 on the reduced dims (review_reduce_result)."""
    strides, acc = [0] * len(shape), 1
    for d in reversed(range(len(shape))):
        if d not in reduced:
            strides[d] = acc
            acc = acc * shape[d]
    return strides


def _iterator(x_shape, x_strides, x_offset, reduced, out_sizes, in_size) -> _Iter:
    shape = list(x_shape)
    outs = [[s * e for s in _out_strides(shape, reduced)] for e in out_sizes]
    ops = outs + [[s * in_size for s in x_strides]]
    n = len(shape)
    # reorder_dimensions: perm initialised n-1 .. 0, insertion sort with should_swap
    perm = list(reversed(range(n)))

    def should_swap(d0, d1):
        for k, st in enumerate(ops):
            s0, s1 = st[d0], st[d1]
            if k < len(outs):  # is_reduction_ && is_output: reduced dims to the front
                z0, z1 = _known(s0 == 0), _known(s1 == 0)
                if z0 != z1:
                    return 1 if z1 else -1
            if _known(s0 == 0) or _known(s1 == 0):
                continue
            if _at_hint(s0 < s1):
                return -1
            if _at_hint(s0 > s1):
                return 1
            if _at_hint(shape[d0] > shape[d1]):
                return 1
        return 0

    if n > 1:
        for i in range(1, n):
            d1 = i
            for d0 in range(i - 1, -1, -1):
                c = should_swap(perm[d0], perm[d1])
                if c > 0:
                    perm[d0], perm[d1] = perm[d1], perm[d0]
                    d1 = d0
                elif c < 0:
                    break
    shape = [shape[p] for p in perm]
    ops = [[st[p] for p in perm] for st in ops]
    # coalesce_dimensions
    if len(shape) > 1:
        def can(d0, d1):
            if _known(shape[d0] == 1) or _known(shape[d1] == 1):
                return True
            return all(_at_hint(shape[d0] * st[d0] == st[d1]) for st in ops)

        prev = 0
        for dim in range(1, len(shape)):
            if can(prev, dim):
                if _known(shape[prev] == 1):
                    for st in ops:
                        st[prev] = st[dim]
                shape[prev] = shape[prev] * shape[dim]
            else:
                prev += 1
                if prev != dim:
                    for st in ops:
                        st[prev] = st[dim]
                    shape[prev] = shape[dim]
        shape = shape[:prev + 1]
        ops = [st[:prev + 1] for st in ops]
    return _Iter(shape, ops, x_offset * in_size, len(outs))


def _can_use_32bit(it: _Iter):
    """TensorIteratorBase::can_use_32bit_indexing."""
    conds = [it.numel() <= _INT32_MAX]
    for st in it.strides:
        conds.append(1 + sum((n - 1) * s for n, s in zip(it.shape, st)) <= _INT32_MAX)
    decided = [_decide(c) for c in conds]
    if any(c is False for c in decided):
        return False
    return True if all(c is True for c in decided) else None  # None: not decidable


def _split_32bit(it: _Iter):
    """SplitUntil32Bit (concrete sizes): halve the dim of largest extent until each piece is
    32-bit indexable; yields the pieces in launch order."""
    stack = [it]
    while stack:
        cur = stack.pop()
        if _can_use_32bit(cur) is not False:
            yield cur
            continue
        best, dim = -1, -1
        for d in range(cur.ndim - 1, -1, -1):
            if cur.shape[d] == 0:
                continue
            for st in cur.strides:
                ext = (cur.shape[d] - 1) * abs(st[d])
                if ext > best:
                    best, dim = ext, d
        size = cur.shape[dim]
        half = size // 2
        first = _Iter(list(cur.shape), [list(s) for s in cur.strides], cur.in_offset,
                      cur.noutputs)
        first.shape[dim] = half
        cur.shape[dim] = size - half
        cur.in_offset += cur.strides[-1][dim] * half
        stack.append(cur)
        stack.append(first)  # the copy (first half) is split and launched first


# --- setReduceConfig -----------------------------------------------------------------------------

def _config_bytes(it: _Iter, arg_size, in_size, vt0, ivs, sms, max_threads=512):
    """(global_memory_size, semaphore_size) of setReduceConfig for ``it`` (0, 0 when the
    config does not reduce across blocks)."""
    if it.ndim == 0:
        return 0, 0
    num_outputs = it.num_output_elements()
    inputs_per_output = it.numel() // num_outputs
    nred = it.num_reduce_dims()
    st_in = it.strides[-1]
    fastest = nred == it.ndim or _at_hint(st_in[0] < st_in[nred])
    if fastest:
        dim0, dim1, fms = inputs_per_output, num_outputs, st_in[0]
    else:
        dim0, dim1, fms = num_outputs, inputs_per_output, st_in[nred]

    def rest(vec_in: bool):
        ovs, d0 = 1, dim0
        if _at_hint(fms == in_size) if _sym(fms) else fms == in_size:
            if vec_in:
                d0 = d0 // ivs
            elif not fastest:
                base = it.in_offset // in_size
                vecs = [_vec_of(base), _vec_of(it.shape[nred])]
                vecs += [_vec_of(s // in_size) for j, s in enumerate(st_in) if j != nred]
                ovs = vecs[0]
                for v in vecs[1:]:
                    ovs = _min(ovs, v)
                d0 = d0 // ovs
        mnt = max_threads // ovs if not _sym(ovs) else None
        if mnt is None:  # ovs symbolic: its three values, combined
            return tuple(_ite(ovs == 4, a, _ite(ovs == 2, b, c)) for a, b, c in zip(
                *[_finish(vec_in, v, d0_v, dim1, max_threads // v) for v, d0_v in
                  ((4, dim0 // 4), (2, dim0 // 2), (1, dim0))]))
        return _finish(vec_in, ovs, d0, dim1, mnt)

    def _finish(vec_in, ovs, d0, d1, mnt):
        # each power of two set_block_dimension may pick, and the split across warps, is a
        # case of its own (the conditions on the sizes exclusive): in each case the block is
        # known, and the staging a single-level formula; the cases are summed as ites
        g_tot, s_tot = 0, 0
        for c0, p0 in _pow2_cases(d0, mnt):
            for c1, p1 in _pow2_cases(d1, mnt):
                bw = min(p0, 32)
                bh = min(p1, mnt // bw)
                bw = min(p0, mnt // bh)
                step_in, step_out = (bw, 1) if fastest else (1, bw)
                vpt = _cdiv(inputs_per_output, step_in)
                for c2, split in _bool_cases(vpt >= min(bh * 16, 256)):
                    step_in2 = step_in * bh if split else step_in
                    step_out2 = step_out if split else step_out * bh
                    if not split:
                        continue  # input_mult[1] == 0: no global reduce
                    grid_x = _cdiv(num_outputs // ovs, step_out2)
                    target = sms * (MAX_THREADS_PER_SM // (bw * bh))
                    vpt2 = _cdiv(inputs_per_output, step_in2)
                    # std::clamp(c1, c3, c2) with c3 <= c2
                    ctas = _max(_cdiv(vpt2, 256), _min(_cdiv(target, grid_x), _cdiv(vpt2, 16)))
                    glob = _and(c0, c1, c2, vpt2 >= 256, grid_x <= target, ctas > 1)
                    size = arg_size * num_outputs * ctas * (1 if fastest else bw * ovs)
                    g_tot = g_tot + _ite(glob, size, 0)
                    s_tot = s_tot + _ite(glob, 4 * grid_x, 0)
        return g_tot, s_tot

    vec_in_c = (fastest and nred == 1 and (_at_hint(fms == in_size) if _sym(fms)
                                           else fms == in_size))
    if not vec_in_c:
        return rest(False)
    cond = _decide(dim0 >= 128)
    if isinstance(cond, bool):
        return rest(cond)
    a, b = rest(True), rest(False)
    return _ite(cond, a[0], b[0]), _ite(cond, a[1], b[1])


def _and(*cs):
    from .sizing import _and as a
    return a(*cs)
