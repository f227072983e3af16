"""A rank's optimizer step over its parameters' local shards, not through DTensor.

Under FSDP2 every parameter, its gradient and its optimizer state are DTensors with the same
placements, and an elementwise optimizer's ops (Adam's ``_foreach_lerp_``, ``_foreach_mul_``,
...) dispatch through DTensor to the same op on each local shard: nothing is redistributed,
so nothing is allocated but what the local op allocates. DTensor's sharding propagation of
those ops is what costs: under a ``FakeTensorMode`` it is not cached
(``torch.distributed.tensor._sharding_prop``, ``_are_we_tracing``), and the foreach ops
over an 8B model's 291 shards took 5.2 to 5.8 s of a 23 s rank trace (py-spy). So a step whose
parameters, gradients and state are DTensors of the same placements, of an optimizer whose
ops are elementwise (:data:`ELEMENTWISE`), runs on the local tensors: the local shards stand
in for the parameters, their gradients' local shards for the gradients, and the state the
step makes is wrapped back into DTensors of each parameter's placements afterwards. Any
other step (a gradient or a state of other placements, a mix of DTensors and tensors,
another optimizer) runs through DTensor as before. ``tests/test_fsdp.py`` checks the ranks'
bytes against the same steps run for real over gloo.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .strategy import dtensor_like

# torch.optim's optimizers whose step is elementwise over each parameter and its state
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad,
               torch.optim.RMSprop, torch.optim.NAdam, torch.optim.RAdam)


def on_local_shards(opt) -> None:
    """Make ``opt.step`` run over its DTensor parameters' local shards whenever it can (see
    the module docstring), in place; nothing changes for any other optimizer."""
    from torch.distributed.tensor import DTensor

    params = [p for g in opt.param_groups for p in g["params"]]
    if type(opt) not in ELEMENTWISE or not params or \
            not all(isinstance(p, DTensor) for p in params):
        return
    through_dtensor = opt.step

    @functools.wraps(through_dtensor)
    def step(*args, **kwargs):
        if not _alike(opt, params):
            return through_dtensor(*args, **kwargs)
        with _locals(opt, params):
            return through_dtensor(*args, **kwargs)

    opt.step = step


def _alike(opt, params) -> bool:
    """Are every parameter's gradient and state tensors DTensors of its own placements?"""
    from torch.distributed.tensor import DTensor

    def same(t, p):
        return isinstance(t, DTensor) and t.placements == p.placements and \
            t.device_mesh == p.device_mesh and t.shape == p.shape

    for p in params:
        if p.grad is not None and not same(p.grad, p):
            return False
        for v in opt.state.get(p, {}).values():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and not same(v, p):
                return False
    return True


@contextlib.contextmanager
def _locals(opt, params):
    """The step's parameters, gradients and state their local tensors while the block runs;
    the DTensors back after it, the state it made wrapped as its parameter is."""
    local = {p: p._local_tensor for p in params}
    kept = {p: opt.state.pop(p) for p in params if p in opt.state}
    groups = [g["params"] for g in opt.param_groups]
    try:
        for p, t in local.items():
            t.grad = None if p.grad is None else p.grad._local_tensor
        for p, state in kept.items():
            opt.state[local[p]] = {k: getattr(v, "_local_tensor", v) for k, v in state.items()}
        for g in opt.param_groups:
            g["params"] = [local[p] for p in g["params"]]
        yield
    finally:
        for g, ps in zip(opt.param_groups, groups):
            g["params"] = ps
        for p, t in local.items():
            t.grad = None
            state = opt.state.pop(t, None)
            if state is not None:
                before = kept.get(p, {})
                opt.state[p] = {k: _wrapped(v, before.get(k), p) for k, v in state.items()}


def _wrapped(v, before, p):
    """State ``v`` of parameter ``p`` as the DTensor step keeps it: the DTensor it was
    before the step, a new one of ``p``'s placements for a tensor of ``p``'s local shape
    (``exp_avg``), or as it is (a 0-dim step count, a number)."""
    from torch.distributed.tensor import DTensor

    if isinstance(before, DTensor) and before._local_tensor is v:
        return before
    if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == p._local_tensor.shape:
        return dtensor_like(v, p)  # (not moved: CPU-offloaded state stays on the host)
    return v
