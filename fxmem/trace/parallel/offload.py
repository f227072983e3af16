"""FSDP2's CPU offload (``CPUOffloadPolicy``) on this CPU-only machine: the copies between
host and device that a GPU run makes, and which storages are host memory, not device memory.

With ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` (``torch/distributed/fsdp/
_fully_shard``), a GPU rank runs the step with its shards on the host:

- each parameter's padded shard (``FSDPParam._sharded_param_data``) is host memory
  (``_fsdp_param.py``, ``_init_sharded_param``: ``padded_sharded_param.cpu()``), and so
  are the optimizer state made from it and the optimizer step, which runs on the host;
- before each all-gather, the shard is copied to the device (``FSDPParam.all_gather_inputs``:
  ``sharded_param_data.to(self.device, non_blocking=True)``), a device tensor that lives
  until its bytes are copied into the all-gather buffer;
- after each reduce-scatter, the rank's gradient shard is copied to the host
  (``_fsdp_collectives.py``, ``foreach_reduce``: ``new_sharded_grad.to(torch.device("cpu"))``):
  the sharded gradient is host memory, and the device's reduce-scatter output is freed
  when ``foreach_reduce`` lets go of it.

On a CPU mesh both ``.to`` calls return their tensor itself. :func:`offloaded` makes them
copy, as on a GPU, while FSDP2's own code runs (in a trace and in a measured rank alike),
and names the host copies to ``tracker`` (``tracker.host``); :func:`host_storages` is the
rest of the rule: which storages of a step are on the host.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

HOST_CATEGORIES = ("param", "grad", "optimizer_state")  # a shard, its gradient, its state
HOST_PHASE = "optimizer"  # the optimizer step runs on the host, on host shards


def _device_given(args, kwargs) -> bool:
    """Does a ``Tensor.to`` call name a device (not only a dtype)?"""
    first = args[0] if args else kwargs.get("device")
    return isinstance(first, (torch.device, str, int)) and not isinstance(first, bool)


@contextlib.contextmanager
def _copying(to_host: bool, tracker) -> Iterator[None]:
    """While the block runs, a ``Tensor.to`` that names a device copies its tensor (the
    host-to-device or device-to-host copy of a GPU run); with ``to_host``, the copy's
    storage is named host memory to ``tracker``."""
    real = vars(torch.Tensor).get("to")
    base = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = base(self, *args, **kwargs)
        if out is self and _device_given(args, kwargs):
            out = self.clone()
            if to_host and tracker is not None:
                tracker.mark_host(out)
        return out

    torch.Tensor.to = to
    try:
        yield
    finally:
        if real is None:
            del torch.Tensor.to
        else:
            torch.Tensor.to = real


@contextlib.contextmanager
def offloaded(tracker) -> Iterator[None]:
    """While the block runs, FSDP2's CPU-offload copies are made as a GPU rank makes them
    (see the module docstring), the host copies named to ``tracker`` (None: to nothing,
    e.g. in a warm-up step); every patch is undone on exit."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    prop = _fsdp_param.FSDPParam.all_gather_inputs
    reduce = _fsdp_param_group.foreach_reduce

    def all_gather_inputs(self):
        with _copying(False, tracker) if self.offload_to_cpu else contextlib.nullcontext():
            return prop.fget(self)

    def foreach_reduce(*args, **kwargs):
        with _copying(True, tracker):
            return reduce(*args, **kwargs)

    _fsdp_param.FSDPParam.all_gather_inputs = property(all_gather_inputs)
    _fsdp_param_group.foreach_reduce = foreach_reduce
    try:
        yield
    finally:
        _fsdp_param.FSDPParam.all_gather_inputs = prop
        _fsdp_param_group.foreach_reduce = reduce


def host_storages(categories: dict, created_in: dict, marked) -> set:
    """The storages of an offloaded rank's step that are host memory: those of the named
    ``categories`` (sid -> category) :data:`HOST_CATEGORIES`, those made in the optimizer
    step (``created_in``: sid -> phase), and the ``marked`` host copies."""
    return ({sid for sid, c in categories.items() if c in HOST_CATEGORIES}
            | {sid for sid, ph in created_in.items() if ph == HOST_PHASE} | set(marked))
