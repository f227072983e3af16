"""What older PyTorch releases need while fxmem traces on fake tensors (fxmem supports torch
2.11 and later; CI runs 2.13).

On torch < 2.13, :func:`tracing_shims` is entered around every trace:

- ``aten::matmul``'s C++ composite mishandles symbolic sizes in 2.11: an N-D input times a 2-D
  weight (a bias-free ``Linear`` on a 3-D input) calls ``numel()`` on the fake tensor and fails,
  and a batched 4-D matmul guards the batch and sequence symbols to their example values. While
  tracing, PyTorch's own Python decomposition (``torch._decomp.decompositions.matmul``) is its
  ``CompositeImplicitAutograd`` kernel: the same aten ops 2.13's C++ runs, and no such guards.
- ``aten::_transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer``'s fused inference
  path) has no meta kernel in 2.11: 2.13's (``empty_like(src)``) is registered.

From 2.13 on it changes nothing.

>>> import torch
>>> with tracing_shims():
...     pass
>>> torch._C._dispatch_has_kernel_for_dispatch_key("aten::matmul", "CompositeImplicitAutograd")
True
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch

TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _transformer_encoder_layer_fwd_meta(src, *args, **kwargs):
    """torch/_meta_registrations.py (2.13) ``meta__transformer_encoder_layer_fwd``."""
    return src.clone() if src.numel() == 0 else torch.empty_like(src)


def _shims() -> dict:
    """dispatch key -> {aten op name: kernel} for this release."""
    if TORCH >= (2, 13):
        return {}
    from torch._decomp.decompositions import matmul

    out = {"CompositeImplicitAutograd": {"matmul": matmul}}
    if not torch._C._dispatch_has_kernel_for_dispatch_key(
            "aten::_transformer_encoder_layer_fwd", "Meta"):
        out["Meta"] = {"_transformer_encoder_layer_fwd": _transformer_encoder_layer_fwd_meta}
    return out


@contextlib.contextmanager
def tracing_shims() -> Iterator[None]:
    """Register this release's shims while the block runs (process-wide, as tracing is);
    remove them on exit."""
    shims = _shims()
    if not shims:
        yield
        return
    lib = torch.library.Library("aten", "IMPL")
    try:
        register(lib, shims)
        yield
    finally:
        lib._destroy()


def register(lib, kernels: dict) -> None:
    """Register ``kernels`` (dispatch key -> {aten op name: kernel}) in ``lib``, replacing
    what is there: ``allow_override`` because torch 2.11's default is False (2.13's True),
    and these replace kernels PyTorch registers itself (C++ ones, or a Python meta kernel)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        for key, table in kernels.items():
            for name, kernel in table.items():
                lib.impl(name, kernel, key, allow_override=True)
