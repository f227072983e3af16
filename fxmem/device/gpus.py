"""The cards fxmem knows by name: how much device memory the caching allocator can get on each.

A card's ``total_bytes`` is what PyTorch reports as its total capacity
(``torch.cuda.get_device_properties(i).total_memory``, the "GPU 0 has a total capacity of
79.11 GiB" of an out-of-memory message), which is less than the marketing size: the driver
keeps some, and ECC takes its share. Each figure names where it was read. The messages give
GiB to two decimals, so a figure taken from one is good to about 5 MiB either way; give
``--budget`` (the usable bytes) when you know your card's exact figure.

What the allocator can use is that capacity minus the **CUDA context** (the driver's state and
the kernels it loads, outside PyTorch's allocator and in neither ``memory_allocated()`` nor
``memory_reserved()``). With CUDA >= 11.7 PyTorch loads kernels lazily
(``CUDA_MODULE_LOADING=LAZY``, set by torch since 1.13), and published figures for the
context are 274 MiB (pytorch/pytorch PR 86509: ``total - free`` after one small tensor,
287,047,680 B), "around 400MB" (pytorch/pytorch issue 109888, ptrblck) and 426 MiB on an RTX
6000 Ada with torch 2.10 + CUDA 13.0 (unslothai/unsloth-zoo PR 1053, ``nvidia-smi`` after
``mem_get_info``). Kernels loaded later in the job add to it. fxmem's default,
:data:`DEFAULT_CONTEXT_BYTES` = 512 MiB, is above every published figure; it is an
estimate, not a measurement of your job: measure yours as ``total - free -
memory_reserved()`` from ``torch.cuda.mem_get_info()`` after a step and pass it as
``context_bytes`` (CLI ``--cuda-context``).

>>> g = gpu("h100")
>>> g.name, g.compute_capability, round(g.total_bytes / 2**30, 2)
('H100-80GB', (9, 0), 79.11)
>>> g.usable_bytes() == g.total_bytes - DEFAULT_CONTEXT_BYTES
True
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ..errors import InputError

MiB, GiB = 2**20, 2**30
DEFAULT_CONTEXT_BYTES = 512 * MiB


def _gib(x: str) -> int:
    """Bytes of a two-decimal GiB figure from an OOM message, to the MiB."""
    return round(float(x) * 1024) * MiB


@dataclass(frozen=True)
class GPU:
    """One card: ``total_bytes`` (what torch reports as its total capacity, bytes),
    ``compute_capability`` (which kernels and workspaces fxmem follows for it) and
    ``source`` (where the capacity was read)."""

    name: str
    total_bytes: int
    compute_capability: tuple
    source: str
    aliases: tuple = ()

    def usable_bytes(self, context_bytes: int | None = None) -> int:
        """Bytes the caching allocator can get: the capacity minus the CUDA context
        (``context_bytes``; default :data:`DEFAULT_CONTEXT_BYTES`)."""
        ctx = DEFAULT_CONTEXT_BYTES if context_bytes is None else context_bytes
        if isinstance(ctx, bool) or not isinstance(ctx, int) or not 0 <= ctx < self.total_bytes:
            raise InputError(f"the CUDA context must be 0 to {self.total_bytes:,} bytes on "
                             f"{self.name}, got {context_bytes!r}")
        return self.total_bytes - ctx


_OOM = "an out-of-memory message's total capacity, "
GPUS = {g.name: g for g in (
    GPU("H100-80GB", _gib("79.11"), (9, 0), _OOM + "vllm-project/vllm issue 27508",
        ("h100", "h100-sxm", "h100-80g")),
    GPU("A100-80GB", _gib("79.25"), (8, 0), _OOM + "levihsu/OOTDiffusion issue 235",
        ("a100-80g",)),
    GPU("A100-40GB", 42_298_834_944, (8, 0),
        "deviceQuery on an A100-SXM4-40GB, bottlerocket-os/bottlerocket PR 3873",
        ("a100", "a100-40g")),
    GPU("L40S", _gib("44.53"), (8, 9), _OOM + "Wan-Video/Wan2.1 issue 205", ("l40s-48gb",)),
    GPU("A10", _gib("21.99"), (8, 6), _OOM + "zai-org/CogVLM issue 236", ("a10-24gb",)),
    GPU("RTX4090", _gib("23.64"), (8, 9),
        _OOM + "3DTopia/Phidias-Diffusion issue 8 (others report 23.65 and 23.68 GiB: "
        "the smallest is taken)", ("4090", "rtx-4090", "rtx4090-24gb")),
    GPU("RTX3090", _gib("23.70"), (8, 6), _OOM + "GaoLii/DSP issue 10",
        ("3090", "rtx-3090", "rtx3090-24gb")),
    GPU("T4", _gib("14.75"), (7, 5), _OOM + "hpcaitech/Open-Sora issue 697", ("t4-16gb",)),
    GPU("V100-32GB", _gib("31.74"), (7, 0), _OOM + "haotian-liu/LLaVA issue 812",
        ("v100", "v100-32g")),
)}


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def gpu(name) -> GPU:
    """The card named ``name`` (case and ``-``/``_``/space do not matter: ``H100-80GB``,
    ``h100``, ``rtx4090``), or a :class:`GPU` given as is. An unknown name is an
    :class:`fxmem.InputError` naming the closest known card.

    >>> gpu("RTX 4090").name
    'RTX4090'
    """
    if isinstance(name, GPU):
        return name
    if not isinstance(name, str):
        raise InputError(f"a GPU is named by a string such as 'H100-80GB', got {name!r}")
    key = _key(name)
    for g in GPUS.values():
        if key == _key(g.name) or key in g.aliases:
            return g
    known = {_key(g.name): g.name for g in GPUS.values()}
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
    hint = f"; did you mean {known[near[0]]}?" if near else ""
    raise InputError(f"unknown GPU {name!r}{hint} (known: {', '.join(GPUS)}; or give the "
                     "usable bytes as the budget)")
