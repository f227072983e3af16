"""What the command line names, turned into Python objects: the model (``TARGET``: a file or
module, or a model family's name, :mod:`fxmem.cli.families`), example tensors
(``--input``/``--target``), sizes (``--budget``).

Models are built on the meta device (fxmem only reads shapes), so a preset with billions of
parameters costs no memory.

>>> parse_size("24GiB"), parse_size("500MB"), parse_size("4096")
(25769803776, 500000000, 4096)
>>> t = parse_tensor("B,3,32,32", batch=8)
>>> tuple(t.shape), t.dtype, t.device.type
((8, 3, 32, 32), torch.float32, 'meta')
>>> parse_tensor("B:int64:10", batch=8).dtype
torch.int64
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import InputError
from . import families

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
          "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "bool": torch.bool}


def parse_size(text: str) -> int:
    """Bytes from ``24GiB``, ``500MB``, ``1.5GiB`` or plain ``4096`` (units: B, KB, MB, GB,
    TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024; any case)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"not a size: {text!r} (write e.g. 24GiB, 500MB or 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_capability(text: str) -> tuple:
    """``(major, minor)`` from ``9.0`` or ``8.6`` (a GPU's compute capability).

    >>> parse_capability("8.6")
    (8, 6)
    """
    from ..trace.cuda.kernels import check_capability

    m = re.fullmatch(r"\s*(\d+)\.(\d)\s*", str(text))
    if not m:
        raise InputError(f"not a compute capability: {text!r} (write MAJOR.MINOR, e.g. 9.0)")
    return check_capability((int(m.group(1)), int(m.group(2))))


def parse_tensor(spec: str, batch: int, named: dict | None = None) -> torch.Tensor:
    """A meta tensor from ``DIMS[:DTYPE[:HIGH]]``: DIMS are comma-separated sizes, ``B`` the
    batch (at most once, at any position: :func:`batch_dim_of`), or other names whose sizes
    ``named`` gives (``{"L": 512}``: a named dim, a symbol like B); DTYPE defaults to float32; HIGH (integer tensors: values in
    [0, HIGH)) is accepted for documentation, values are never read."""
    named = named or {}
    dims, _, rest = spec.partition(":")
    dtype_name, _, high = rest.partition(":")
    shape = []
    for d in (x.strip() for x in dims.split(",")):
        if d == "B":
            shape.append(batch)
        elif d.isidentifier():
            if d not in named:
                raise InputError(f"bad tensor spec {spec!r}: give the size of dim {d} with "
                                 f"--dim {d}=SIZE")
            shape.append(named[d])
        else:
            try:
                shape.append(int(d))
            except ValueError:
                raise InputError(f"bad tensor spec {spec!r}: dims are integers, B or names, "
                                 "e.g. B,3,32,32, B,L:int64:50257 or B:int64:10") from None
    if not shape:
        raise InputError(f"bad tensor spec {spec!r}: give its dims, e.g. B,3,32,32")
    batch_dim_of(spec)  # B at most once
    dtype = DTYPES.get(dtype_name or "float32")
    if dtype is None:
        raise InputError(f"bad tensor spec {spec!r}: unknown dtype {dtype_name!r}; known: "
                         f"{', '.join(sorted(DTYPES))}")
    if high and not high.isdigit():
        raise InputError(f"bad tensor spec {spec!r}: HIGH must be an integer")
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def batch_dim_of(spec: str) -> int | None:
    """Where B is in a tensor spec: ``L,B,64`` has it at dim 1 (a sequence-first input),
    ``2,B,64`` too (an RNN's h0); None for a spec without B (a tensor with no batch dim).

    >>> batch_dim_of("B,3,32,32"), batch_dim_of("L,B,64:float32"), batch_dim_of("10,64")
    (0, 1, None)
    """
    names = [x.strip() for x in spec.partition(":")[0].split(",")]
    if names.count("B") > 1:
        raise InputError(f"bad tensor spec {spec!r}: B (the batch) may stand at one dim only")
    return names.index("B") if "B" in names else None


def named_dims(specs) -> dict:
    """The named dims of tensor specs (inputs then targets): name -> [(tensor, dim), ...].

    >>> named_dims(["B,L:int64:100", "B,L,8", "L,B:int64:10"])
    {'L': [(0, 1), (1, 1), (2, 0)]}
    """
    out: dict = {}
    for i, spec in enumerate(specs):
        for d, name in enumerate(x.strip() for x in spec.partition(":")[0].split(",")):
            if name.isidentifier() and name != "B":
                out.setdefault(name, []).append((i, d))
    return out


def parse_config(pairs) -> dict:
    """``key=value`` overrides; values read as int, float, true/false, or text."""
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise InputError(f"--config takes key=value, got {p!r}")
        low = value.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
            continue
        for kind in (int, float):
            try:
                out[key] = kind(value)
                break
            except ValueError:
                pass
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Target:
    """A model to analyse and how to call it. ``inputs``: default ``--input`` specs
    (presets); ``loss``: default loss name (``none``: the model returns its loss);
    ``dims``: default sizes of the named dims those specs use (presets: ``{"L": 512}``)."""

    model: torch.nn.Module
    name: str
    inputs: tuple = ()
    loss: str | None = None
    dims: dict = field(default_factory=dict)
    targets: tuple = ()  # default ``--target`` specs (a classifier's labels)


def _load_object(target: str):
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise InputError(f"TARGET is path/to/file.py:Name, package.module:Name or hf:PRESET, "
                         f"got {target!r}")
    if where.endswith(".py") or os.sep in where:
        if not os.path.exists(where):
            raise InputError(f"no such file: {where}")
        mod_name = "fxmem_target_" + re.sub(r"\W", "_", os.path.abspath(where))
        spec = importlib.util.spec_from_file_location(mod_name, where)
        module = importlib.util.module_from_spec(spec)
        folder = os.path.dirname(os.path.abspath(where))
        sys.path.insert(0, folder)  # the file's own imports (examples import each other)
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(folder)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise InputError(f"cannot import {where}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InputError(f"{where} has no {attr}") from None


def position_limit(model: torch.nn.Module) -> int | None:
    """The longest sequence a Hugging Face model takes (its config's
    ``max_position_embeddings`` or ``n_positions``), which no tensor shape shows; None for
    other models.

    >>> position_limit(torch.nn.Linear(2, 2)) is None
    True
    """
    for m in model.modules():
        config = getattr(m, "config", None)
        for key in ("max_position_embeddings", "n_positions"):
            value = getattr(config, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def load_target(target: str, config: dict | None = None, seq: int | None = None) -> Target:
    """The model named by ``target``, built on the meta device. ``config``: keyword
    arguments for the class or factory (presets: for the config class)."""
    config = config or {}
    if target.startswith("hf:"):
        model, name, specs, loss, dims = families.hf(target[3:], config, seq)
        return Target(model, name, specs, loss, dims)
    if target.startswith("timm:"):
        model, (x, y) = families.timm_model(target[5:], config)
        return Target(model, target, (x,), "cross_entropy", targets=(y,))
    if target.startswith("torchvision:"):
        model, (x, y) = families.torchvision_model(target[12:], config)
        return Target(model, target, (x,), "cross_entropy", targets=(y,))
    obj: Callable = _load_object(target)
    if not callable(obj):
        raise InputError(f"{target} is not a class or factory")
    try:
        with torch.device("meta"):
            model = obj(**config)
    except TypeError as e:
        raise InputError(f"cannot build {target}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{target} made a {type(model).__name__}, not a torch.nn.Module")
    return Target(model, target.rpartition(":")[2])
