"""What each PyTorch release needs while fxmem traces on fake tensors. fxmem declares torch
2.13 and later (``pyproject.toml``); CI runs 2.13 (the CPU build) and 2.15 (the CUDA build)
whole and 2.14's CUDA build on the real-model zoo, and a release outside :data:`TESTED`
says so once at import. The shims for 2.11 below are kept for installs that bypass the
declared range; no test runs them any more.

On torch < 2.13, :func:`tracing_shims` is entered around every trace:

- ``aten::matmul``'s C++ composite mishandles symbolic sizes in 2.11: an N-D input times a 2-D
  weight (a bias-free ``Linear`` on a 3-D input) calls ``numel()`` on the fake tensor and fails,
  and a batched 4-D matmul guards the batch and sequence symbols to their example values. While
  tracing, PyTorch's own Python decomposition (``torch._decomp.decompositions.matmul``) is its
  ``CompositeImplicitAutograd`` kernel: the same aten ops 2.13's C++ runs, and no such guards.
- ``aten::_transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer``'s fused inference
  path) has no meta kernel in 2.11: 2.13's (``empty_like(src)``) is registered.

From 2.13 on it changes nothing.

What else differs between releases, where fxmem follows each (the tests name the release):

- 2.15: ``FSDPParamGroup`` keeps no ``mp_policy`` (:func:`fsdp_group_policy`).
- 2.15: a Python call of ``torch.ops.aten.size.default`` on a fake tensor is answered before
  any dispatch mode sees it, so a step that reads B that way is refused (or its formula
  fitted, :mod:`fxmem.trace.engine.lift`) naming the next op of the same forward, not the read.
- 2.15: ``linalg_matrix_sqrth`` has autocast kernels (fp32: :mod:`fxmem.trace.kernels.amp`);
  ``_thnn_fused_gru_cell`` and its backward have meta kernels of PyTorch's own, which
  :mod:`fxmem.trace.kernels.cuda.rnn` replaces while tracing as on older releases.
- 2.15: every cuBLAS and cuBLASLt call takes its workspace through the caching allocator and
  frees it when it returns (2.14 keeps one per thread): :mod:`fxmem.trace.kernels.cuda.blas`, seen
  on 2.15's binary on the fake GPU.
- 2.14: ``group_norm`` no longer makes a CUDA input contiguous before ``native_group_norm``
  (:mod:`fxmem.trace.kernels.cuda.kernels`; seen on 2.14.1's and 2.15's binaries).

On every release, :func:`plain_backward_first` runs before the first trace: on a CUDA build
(2.14.1+cu130 and 2.15.0+cu132 checked; not the CPU build), the autograd engine started by a
backward under ``FakeTensorMode`` starts its device threads and registers a fork handler
(``torch/csrc/autograd/engine.cpp``, ``start_device_threads`` and
``track_bad_autograd_forks``), after which every process forked from this one fails its
first backward ("Unable to handle autograd's threading in combination with fork-based
multiprocessing"): ``fxmem.measure(..., parallel=)`` forks its ranks. The engine starts its
threads once per process, at its first backward; when that is a plain CPU one it starts
none, and forks stay usable.

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
# The releases fxmem's whole fast tier passes on (CI runs 2.13 and 2.15; 2.14's CUDA build runs
# the real-model zoo), and the oldest pyproject.toml admits.
TESTED = ((2, 13), (2, 14), (2, 15))


def untested_release(version: str | None = None) -> str | None:
    """The one-line warning for a torch release fxmem has not been tested on (``version``:
    default the running one), or None for a tested one.

    >>> untested_release("2.15.0+cu132") is None, untested_release("2.16.0")[:46]
    (True, 'fxmem has not been tested with torch 2.16.0 (t')
    """
    version = version or torch.__version__
    release = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    if release in TESTED:
        return None
    tested = ", ".join(".".join(map(str, r)) for r in TESTED)
    return (f"fxmem has not been tested with torch {version} (tested: {tested}): its "
            "predictions may be off")


def _transformer_encoder_layer_fwd_meta(src, *args, **kwargs):
    """torch/_meta_registrations.py (2.13) ``meta__transformer_encoder_layer_fwd``."""
    return src.clone() if src.numel() == 0 else torch.empty_like(src)


def fsdp_group_policy(state, group, param_of):
    """The ``MixedPrecisionPolicy`` that ``fully_shard`` was given for FSDP2 group ``group``
    of ``state`` (None: a state with no parameters), to wrap a copy the same way;
    ``param_of(fsdp_param)``: the copy's parameter for one of the group's.

    torch <= 2.14 keeps it on the group (``FSDPParamGroup.mp_policy``). 2.15 keeps none
    there: ``FSDPParamGroup.__init__`` gives each ``FSDPParam`` the policy resolved for its
    parameter (``mp_policy._resolve_for_param(param)``: ``param_dtype_override_fn``, new in
    2.15, ``_fsdp_api.py``) and the state keeps the policy without the function
    (``FSDPState.init``: ``replace(mp_policy, param_dtype_override_fn=None)``). The per-
    parameter dtypes are then given back as an override function over the copy's
    parameters."""
    if group is None:
        return state._mp_policy
    kept = getattr(group, "mp_policy", None)
    if kept is not None:
        return kept
    from dataclasses import replace

    base = state._mp_policy
    dtypes = {id(param_of(fp)): fp.mp_policy.param_dtype for fp in group.fsdp_params}
    if all(d == base.param_dtype for d in dtypes.values()):
        return base
    return replace(base, param_dtype_override_fn=lambda p: dtypes.get(id(p)))


_ENGINE_PRIMED = False


def plain_backward_first() -> None:
    """Run one plain CPU backward (a 1-element tensor, no fake tensor) unless fxmem has
    already: the autograd engine's first backward in the process decides whether it starts
    device threads (see the module docstring). Under a dispatch mode or with grad disabled
    it waits for a later call."""
    global _ENGINE_PRIMED
    if _ENGINE_PRIMED or not torch.is_grad_enabled() or \
            torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        return
    torch.ones(1, requires_grad=True).sum().backward()
    _ENGINE_PRIMED = True


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
