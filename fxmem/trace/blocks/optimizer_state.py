"""The optimizer's state of copied blocks: made for the blocks traced for real, copied for
the stand-ins.

Before the recorded step, one unrecorded ``opt.step()`` makes the optimizer's state
(:class:`fxmem.trace.engine.tracer._Phases`), so the recorded one runs in steady state. Its
cost is per parameter: AdamW's over Llama-3.1-8B's 291 parameters took 0.34 to 0.36 s of
CPU in each one-GPU trace (0.41 to 0.45 s over 8 ranks), 0.10 s (0.13 s) since. With
blocks reused (:mod:`fxmem.trace.blocks.reuse`), a stand-in's parameters are its pattern
block's in shape, dtype and placement, and a torch.optim optimizer of :data:`COPIED` makes
each parameter's state from that parameter alone: so the unrecorded step runs with the
stand-ins' gradients put aside (an optimizer skips a parameter without one) and each
stand-in parameter's state is then a new tensor like its pattern parameter's, entry by
entry (a step count keeps its value). The recorded step steps every parameter, as before;
tests/test_reuse.py checks that the trace is the one a block-by-block trace records, for
each of these optimizers, for-loop, foreach and fused.

>>> import torch
>>> m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
>>> params = dict(m.named_parameters())
>>> pairs = counterparts(params, "1", ["2", "3"])
>>> pairs["3.weight"]
'1.weight'
"""

from __future__ import annotations

import contextlib

import torch

# torch.optim's optimizers whose state for a parameter is made from that parameter alone,
# its first step's entries the same for parameters alike (checked: tests/test_reuse.py)
COPIED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
          torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax, torch.optim.Adadelta,
          torch.optim.Rprop, torch.optim.Adafactor, torch.optim.ASGD, torch.optim.Adagrad)


def counterparts(params: dict, pattern: str, standins) -> dict:
    """Each parameter of blocks ``standins`` (raw module paths) by name -> the name of the
    same parameter in block ``pattern``, of ``params`` (names -> parameters)."""
    out = {}
    for path in standins:
        pre = path + "."
        for name in params:
            if name.startswith(pre):
                twin = pattern + "." + name[len(pre):]
                if twin not in params:
                    return {}
                out[name] = twin
    return out


def standin_pairs(reuse, params: dict) -> dict:
    """The stand-ins' parameters -> their pattern block's (:func:`counterparts`), over every
    run ``reuse`` copies (a :class:`fxmem.trace.blocks.reuse.Reuse` after the backward)."""
    out = {}
    for run in reuse.runs:
        calls = reuse.calls.get(run.paths, [])
        paths = run.paths[reuse.skip.get(run.paths, 0):]
        if len(calls) < 3 or len(calls) != len(paths):
            continue
        out.update(counterparts(params, paths[1],
                                [p for p, c in zip(paths, calls) if c.standin]))
    return out


def copies_state(opt, local) -> bool:
    """Whether the state of ``opt`` (``local``: the optimizer that holds it) is copied for
    the stand-ins: a torch.optim optimizer of :data:`COPIED`, not wrapped (ZeRO)."""
    return local is opt and type(opt) in COPIED


@contextlib.contextmanager
def without_grads(params: list):
    """``params``' gradients put aside while the block runs (the optimizer skips them)."""
    kept = [(p, p.grad) for p in params if p.grad is not None]
    for p, _ in kept:
        p.grad = None
    try:
        yield
    finally:
        for p, g in kept:
            p.grad = g


def copy_state(state: dict, params: dict, pairs: dict) -> None:
    """Each stand-in parameter's state (``state``: the optimizer's, by parameter) made as
    its pattern parameter's: a new tensor like each of its tensors (:func:`fresh`), the rest
    as it is."""
    from torch.distributed.tensor import DTensor

    from ..parallel.strategy import dtensor_of

    def like(v):
        if isinstance(v, DTensor):  # (its own placements: not through DTensor's dispatch)
            return dtensor_of(fresh(v._local_tensor), v.device_mesh, v.placements, v.shape,
                              v.stride())
        return fresh(v) if isinstance(v, torch.Tensor) else v

    for name, twin in pairs.items():
        p, q = params[name], params[twin]
        if q in state:
            state[p] = {k: like(v) for k, v in state[q].items()}


def fresh(v: torch.Tensor) -> torch.Tensor:
    """A new fake tensor of ``v``'s sizes, strides, dtype and device, and value where the
    fake mode knows it (a step count's ``constant``), made by its meta kernel (70 us, where
    ``v.clone()`` through the trace's modes took about 1 ms under cProfile); ``v.clone()``
    for anything else (a view into a larger storage, symbolic sizes, a tensor not fake).

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> with FakeTensorMode():
    ...     step = torch.tensor(3.0)
    >>> new = fresh(step)
    >>> new is step, new.constant
    (False, tensor(3.))
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    from ..kernels.meta_kernels import empty_fake

    converter = getattr(getattr(v, "fake_mode", None), "fake_tensor_converter", None)
    if type(v) is not FakeTensor or v._has_symbolic_sizes_strides or v.storage_offset() or \
            v.untyped_storage().nbytes() != v.numel() * v.element_size() or \
            not hasattr(converter, "set_tensor_memo"):
        return v.clone()
    out = empty_fake(v, v.fake_mode, v.device)
    if v.constant is not None:
        with no_dispatch():  # a real tensor (the modes active would make a fake one)
            out.constant = v.constant.clone()
        # as the fake mode's own constants: an op on it in place gives back this tensor
        # (the fake mode finds it by its constant), not a new one
        converter.set_tensor_memo(out.constant, out)
    return out


__all__ = ["COPIED", "counterparts", "standin_pairs", "copies_state", "without_grads",
           "copy_state", "fresh"]
