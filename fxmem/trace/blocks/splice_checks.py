"""Whether the blocks of a run behave alike, so that copying the pattern block's ops for
each stand-in gives the trace a block-by-block run would (:mod:`fxmem.trace.blocks.splice`).
Each check raises :class:`~fxmem.trace.blocks.reuse.NoReuse`; the step is then traced
again block by block."""

from __future__ import annotations

import sympy

from ..kernels.grad_sums import ACCUMULATE_GRAD
from .reuse import NoReuse


def windows(c) -> list:
    """The op ranges of call ``c``: its forward, and its backward when it has one."""
    w = [range(*c.fwd)]
    if c.bwd[0] is not None:
        w.append(range(*c.bwd))
    return w


def final_size(rec, v):
    """A storage size as the ShapeEnv finally knows it (guards may equate symbols)."""
    if isinstance(v, int):
        return v
    return sympy.expand(rec.shape_env.replace(v.node.expr))


def check_run(rec, calls: list, by_path: dict | None = None) -> None:
    """Raise :class:`NoReuse` unless the run's blocks (``calls``: the first, the pattern,
    then the stand-ins) behave alike: the same ops, sizes and lifetimes in the first two
    blocks, a stand-in's backward where a real block's would be, its outputs read by the
    next block only (the sibling after it, of this run or another: ``by_path``, every
    run's calls by path), and gradients laid out as the pattern's
    (:func:`check_gradients`)."""
    ops, n = rec.ops, len(rec.ops)
    first, pat = calls[0], calls[1]
    if first.bwd[0] is not None and first.bwd[1] is None and pat.bwd[1] is not None:
        # the first block's input needs no gradient (the model's input): its backward
        # is as long as the second's, which the comparison below checks
        first.bwd[1] = min(n, first.bwd[0] + len(range(*pat.bwd)))
    has_bwd = {c.bwd[0] is not None and c.bwd[1] is not None for c in calls}
    partly = {c.bwd[0] is not None or c.bwd[1] is not None for c in calls}
    if len(has_bwd) != 1 or partly != has_bwd:
        raise NoReuse(f"{pat.path}: the blocks' backward passes differ")
    for c in calls[2:]:  # a stand-in's backward: the AccumulateGrad steps right after it
        if c.bwd[0] is not None:
            j = c.bwd[1]
            while j < n and ops[j].autograd_node == ACCUMULATE_GRAD:
                j += 1
            c.bwd[1] = j
        if any(len(w) == 0 for w in windows(c)):
            raise NoReuse(f"{c.path}: its stand-in ran no op")
        for i, g in c.final_gx.items():
            if c.roles.get(("gx", i)) != g:
                raise NoReuse(f"{c.path}: its input's gradient comes from elsewhere too")
    st = rec.storages
    check_gradients(rec, calls)
    wf, wp = windows(first), windows(pat)
    for a, b in zip(wf, wp):
        if [ops[i].op for i in a] != [ops[i].op for i in b]:
            raise NoReuse(f"{first.path} and {pat.path} run different ops")
        na = [s for i in a for s in ops[i].new_sids]
        nb = [s for i in b for s in ops[i].new_sids]
        if [final_size(rec, st[s].nbytes) for s in na] != \
                [final_size(rec, st[s].nbytes) for s in nb]:
            raise NoReuse(f"{first.path} and {pat.path} allocate different sizes")
        inside_a = {i for w in wf for i in w}
        inside_b = {i for w in wp for i in w}
        role_a, role_b = set(first.roles.values()), set(pat.roles.values())
        for sa, sb in zip(na, nb):
            fa, fb = st[sa].freed_after, st[sb].freed_after
            if sb in role_b or sa in role_a:
                continue
            if (fb is None) != (fa is None):
                raise NoReuse(f"{pat.path}: a storage outlives one block, not the other")
            if fb is not None and fb not in inside_b and fa != fb and not pat.spans:
                # (spans: a storage passed to a neighbour, which the splice relinks)
                raise NoReuse(f"{pat.path}: a storage outlives its block "
                              "and is freed at another time than the first block's")
            if fb is not None and (fb in inside_b) != (fa in inside_a):
                raise NoReuse(f"{pat.path}: a storage outlives one block, not the other")
    used = {}
    for i, op in enumerate(ops):
        for s in op.in_sids:
            used.setdefault(s, []).append(i)
    by_path = by_path or {c.path: c for c in calls}
    for c in calls[2:-1]:  # (the last one's output leaves the run)
        nxt = by_path.get(c.after)
        if nxt is None:  # (not a block of a run: as the last)
            continue
        for key, s in c.roles.items():
            # (from the start of its call: FSDP2's pre-hook wraps its inputs first)
            if key[0] == "o" and any(i not in range(nxt.pre, nxt.fwd[1])
                                     and ops[i].phase == "forward"
                                     for i in used.get(s, ())):
                raise NoReuse(f"{c.path}: its output is read outside the next block")


def check_gradients(rec, calls: list) -> None:
    """A stand-in's gradients must be laid out as a real block's would be.

    A stand-in makes its input's gradient with the input's strides, which need not be
    those of the gradient the block's backward really computes: torchvision's ViT
    blocks output a transposed layout (``nn.MultiheadAttention(batch_first=True)``)
    and get a contiguous gradient. The block before it then runs its backward on a
    gradient laid out otherwise than for real (``reshape`` copies a non-contiguous
    one), the pattern block included, whose copies then carry the error; the pattern's
    own input gradient follows from it, so only the last stand-in's output gradient,
    which comes from outside the run, shows it. So every block's gradients must have
    the pattern's strides (an expanded gradient, as ``out.sum()``'s, is not a
    contiguous one either: ops such as ``view`` behave differently on it). And a
    stand-in's parameter gradients are tensors of their own, whereas a real block's
    may share one storage (the gradient of ``torch.cat`` of parameters, as BEiT's
    q/k/v bias, is split into views of one buffer three times their size): the
    pattern's must be one storage each, of the stand-in's size."""
    pat, st = calls[1], rec.storages
    for c in calls[2:]:
        for key, strides in pat.grad_strides.items():
            if c.grad_strides.get(key, strides) != strides:
                raise NoReuse(f"{c.path}: its gradient {key} is laid out other than "
                              f"{pat.path}'s")
    grads = {k: s for k, s in pat.roles.items() if k[0] == "g"}
    if len(set(grads.values())) != len(grads):
        raise NoReuse(f"{pat.path}: parameters' gradients share a storage")
    for c in calls[2:]:
        for key, s in grads.items():
            t = c.roles.get(key)
            if t is not None and final_size(rec, st[t].nbytes) != final_size(rec, st[s].nbytes):
                raise NoReuse(f"{c.path}: the gradient {key} has another size than "
                              f"{pat.path}'s")
