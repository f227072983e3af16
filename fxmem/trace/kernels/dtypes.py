"""Dtype names: torch's (``float16``, ``torch.float16``) and the short ones (``fp16``,
``half``), one table for every place a dtype is written (``--input``, ``--amp``,
``Step(amp=...)``).

>>> dtype_of("fp16"), dtype_of("torch.bfloat16"), dtype_of("Long")
(torch.float16, torch.bfloat16, torch.int64)
>>> dtype_of("bf16", AMP, what="amp")
torch.bfloat16
>>> dtype_of("float32", AMP, what="amp")
Traceback (most recent call last):
...
fxmem.errors.InputError: amp: 'float32' is not one of float16 (fp16, half), bfloat16 (bf16)
"""

from __future__ import annotations

import torch

from ...errors import InputError

# dtype -> its names: the first is the one shown, then torch's, then the short ones
NAMES = {
    torch.float32: ("float32", "fp32", "float"),
    torch.float16: ("float16", "fp16", "half"),
    torch.bfloat16: ("bfloat16", "bf16"),
    torch.float64: ("float64", "fp64", "double"),
    torch.int64: ("int64", "long"),
    torch.int32: ("int32", "int"),
    torch.int16: ("int16", "short"),
    torch.int8: ("int8",),
    torch.uint8: ("uint8",),
    torch.bool: ("bool",),
    torch.complex64: ("complex64", "cfloat"),
    torch.complex128: ("complex128", "cdouble"),
}
DTYPES = {name: dt for dt, names in NAMES.items() for name in names}
AMP = (torch.bfloat16, torch.float16)  # what autocast can compute in
INTEGER = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


def accepted(allowed=None) -> str:
    """The names of ``allowed`` dtypes (default all), for help texts and errors.

    >>> accepted(AMP)
    'float16 (fp16, half), bfloat16 (bf16)'
    """
    return ", ".join(f"{names[0]} ({', '.join(names[1:])})" if names[1:] else names[0]
                     for dt, names in NAMES.items() if allowed is None or dt in allowed)


def dtype_of(name, allowed=None, what: str = "dtype") -> torch.dtype:
    """The dtype ``name`` (any case, ``torch.`` prefix or not, or a ``torch.dtype``), one of
    ``allowed`` if given; an :class:`fxmem.InputError` listing what is accepted otherwise."""
    if isinstance(name, torch.dtype):
        dt = name
    else:
        text = str(name).strip().lower()
        dt = DTYPES.get(text.removeprefix("torch."))
    if dt is None or allowed is not None and dt not in allowed:
        raise InputError(f"{what}: {name!r} is not one of {accepted(allowed)}")
    return dt
