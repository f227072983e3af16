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

import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import InputError, one_line
from ..trace.kernels import (  # noqa: F401 - DTYPES: the table
    DTYPES,
    INTEGER,
    accepted,
    dtype_of,
    internal_file,
)
from . import families

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from ``24GiB``, ``500MB``, ``1.5GiB`` or plain ``4096`` (units: B, KB, MB, GB,
    TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024; any case)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"not a size: {text!r} (write e.g. 24GiB, 500MB or 4096 bytes; "
                         "units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_capability(text: str) -> tuple:
    """``(major, minor)`` from ``9.0`` or ``8.6`` (a GPU's compute capability).

    >>> parse_capability("8.6")
    (8, 6)
    """
    from ..trace.kernels import check_capability

    m = re.fullmatch(r"\s*(\d+)\.(\d)\s*", str(text))
    if not m:
        raise InputError(f"not a compute capability: {text!r} (write MAJOR.MINOR, e.g. 9.0)")
    return check_capability((int(m.group(1)), int(m.group(2))))


def parse_tensor(spec: str, batch: int, named: dict | None = None) -> torch.Tensor:
    """A meta tensor from ``DIMS[:DTYPE[:HIGH]]``: DIMS are comma-separated sizes, ``B`` the
    batch (at most once, at any position: :func:`batch_dim_of`), or other names whose sizes
    ``named`` gives (``{"L": 512}``: a named dim, a symbol like B); DTYPE defaults to
    float32; HIGH (integer tensors: values in [0, HIGH)) is accepted for documentation,
    values are never read."""
    named = named or {}
    if spec.count(":") > 2:
        raise InputError(f"bad tensor spec {spec!r}: too many ':' (write DIMS[:DTYPE[:HIGH]], "
                         "e.g. B,128:int64:50257)")
    dims, _, rest = spec.partition(":")
    dtype_name, _, high = rest.partition(":")
    shape = []
    for d in (x.strip() for x in dims.split(",")):
        if d == "B":
            shape.append(batch)
        elif d.isidentifier():
            if d not in named:
                raise InputError(f"bad tensor spec {spec!r}: give the size of dim {d} with "
                                 f"--dim {d}=SIZE" + (" (the batch is B, upper case)"
                                                      if d == "b" else ""))
            shape.append(named[d])
        else:
            try:
                shape.append(int(d))
            except ValueError:
                raise InputError(f"bad tensor spec {spec!r}: dims are integers, B or names, "
                                 "e.g. B,3,32,32, B,L:int64:50257 or B:int64:10") from None
            if shape[-1] < 1:
                raise InputError(f"bad tensor spec {spec!r}: dim {len(shape) - 1} is "
                                 f"{shape[-1]}; sizes are positive integers")
    if not shape:
        raise InputError(f"bad tensor spec {spec!r}: give its dims, e.g. B,3,32,32")
    batch_dim_of(spec)  # B at most once
    try:
        dtype = dtype_of(dtype_name or "float32")
    except InputError:
        raise InputError(f"bad tensor spec {spec!r}: unknown dtype {dtype_name!r}; known: "
                         f"{accepted()}") from None
    if high and (not high.strip().isdigit() or int(high) < 1):
        raise InputError(f"bad tensor spec {spec!r}: HIGH must be a positive integer (the "
                         f"values are in [0, HIGH)), got {high!r}")
    if high and dtype not in INTEGER:
        raise InputError(f"bad tensor spec {spec!r}: HIGH is for integer tensors (values in "
                         f"[0, HIGH)); a {dtype_name} tensor takes none")
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


def parse_config(pairs, option: str = "--config") -> dict:
    """``key=value`` overrides; values read as int, float, true/false, or text. A key given
    twice is an error (which would win is a guess).

    >>> parse_config(["n_layer=6", "dropout=0.1", "bias=false", "act=gelu"])
    {'n_layer': 6, 'dropout': 0.1, 'bias': False, 'act': 'gelu'}
    """
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"{option} takes key=value, got {p!r}")
        if key in out:
            raise InputError(f"{option} {key} is given twice: give it once")
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
    # default ``--input`` specs of an ``--inference`` step, when they differ from ``inputs``
    # (a Hugging Face model's inputs without the labels it would compute a loss from)
    inference_inputs: tuple | None = None


def load_object(target: str, what: str = "TARGET"):
    """The object ``path/to/file.py:Name`` or ``package.module:Name`` names; a one-line
    :class:`fxmem.InputError` naming ``what`` (the option) when it cannot be had."""
    if "::" in target:
        raise InputError(f"{what} takes one colon, file.py:Name (not pytest's ::), got "
                         f"{target!r}; write {target.replace('::', ':', 1)!r}")
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        forms = "path/to/file.py:Name, package.module:Name" + (
            " or hf:PRESET" if what == "TARGET" else "")
        raise InputError(f"{what} is {forms}, got {target!r}")
    if where.endswith(".py") or os.sep in where:
        if not os.path.exists(where):
            hint = f"; did you mean {where}.py:{attr}?" if os.path.isfile(where + ".py") else ""
            raise InputError(f"no such file: {where}{hint}")
        if not os.path.isfile(where) or not where.endswith(".py"):
            raise InputError(f"{where} is not a Python file: {what} is path/to/file.py:Name")
        mod_name = "fxmem_target_" + re.sub(r"\W", "_", os.path.abspath(where))
        spec = importlib.util.spec_from_file_location(mod_name, where)
        module = importlib.util.module_from_spec(spec)
        folder = os.path.dirname(os.path.abspath(where))
        sys.path.insert(0, folder)  # the file's own imports (examples import each other)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file: one line naming where
            raise InputError(f"cannot load {where}: {failure(e)}") from None
        finally:
            sys.path.remove(folder)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:  # noqa: BLE001 - ImportError, or the module's own error
            path = where.replace(".", os.sep) + ".py"
            hint = f"; for the file, write {path}:{attr}" if os.path.isfile(path) else ""
            raise InputError(f"cannot import {where}: {failure(e)}{hint}") from None
    if not hasattr(module, attr):
        names = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                 and getattr(v, "__module__", None) == module.__name__]
        near = families.closest(attr, names)
        raise InputError(f"{where} has no {attr}" + (f"; did you mean {near}?" if near else
                         f"; it defines {', '.join(names[:8])}" if names else ""))
    return getattr(module, attr)


def failure(e: BaseException) -> str:
    """``Type: message`` of an error in the user's code, with the user's line it came from
    (a syntax error's own line).

    >>> failure(ValueError("bad\\nvalue"))
    'ValueError: bad value'
    """
    if isinstance(e, SyntaxError) and e.filename:
        return f"SyntaxError: {e.msg} (at {e.filename}:{e.lineno})"
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if not internal_file(f.filename)]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" \
        if frames else ""
    return f"{type(e).__name__}: {one_line(str(e))}{where}"


def position_limit(model: torch.nn.Module) -> int | None:
    """The longest sequence a Hugging Face model takes (its config's
    ``max_position_embeddings`` or ``n_positions``), which no tensor shape shows; None for
    other models.

    >>> position_limit(torch.nn.Linear(2, 2)) is None
    True
    """
    found = _position_field(model)
    return found[1] if found else None


def longest_rows(report, name: str, budget_bytes: int, batch: int,
                 limit: int | None, cudnn_workspace: int = 0, unplanned: bool = False) -> dict:
    """The report's rows for ``--budget`` with one named dim ``name``: the largest value
    within the budget at ``batch``, answered as the report's largest B is (on CUDA, its
    steps replayed through the caching allocator: the length way's own answer; "none
    fits"; where the trace ends first and it fits there, that value "or more"), then on
    CUDA where it differs the largest whose live bytes fit, and the model's own ``limit``
    of positions. ``unplanned``: the report leads with a plan ``--checkpoint auto`` chose
    at the asked length, ``report`` is the step without it: its largest value whose live
    bytes fit alone, said so (the allocator's replay of a step the report is not about had
    taken 2.1 s of Llama-3.1-8B's ``--fsdp 8 --checkpoint auto``)."""
    from ..report.fit import longest
    from ..report.ways import Check, default_by

    by = "live" if unplanned else default_by(report)
    key = f"largest {name} within the budget at B={batch}" + (
        " without the plan (live tensors)" if unplanned else "")
    rows = {key: _length(longest(Check(by, budget_bytes, cudnn_workspace), report, batch,
                                 limit), name)}
    if by == "device":
        live = _length(longest(Check("live", budget_bytes, 0), report, batch, limit), name)
        if live != rows[key]:
            rows[f"largest {name} whose live tensors fit (the formula)"] = live
    if limit is not None:
        rows[f"{name} limit (the model's positions)"] = limit
    return rows


def _length(n, name: str):
    """A row's value of :func:`fxmem.report.fit.longest`'s answer ``n``."""
    from ..report.fit import NoLength

    if isinstance(n, NoLength):  # (shorter ones run other code: not traced)
        none = "none runs" if n.runs else "none fits"
        return f"{none} from {n.floor} on (where the trace holds)" if n.floor > 2 else none
    value = f"{n} or more (the trace ends there)" if n.beyond else int(n)
    return f"{value} ({name} a multiple of {n.multiple})" if n.multiple > 1 else value


class SetupRows(Mapping):
    """The setup's rows: ``rows``, then those each of ``extra`` gives (callables returning
    rows), made when first read (the summary's, while a child may search a way out).

    >>> s = SetupRows({"model": "m"}, [lambda: {"dim L": 8}])
    >>> dict(s)
    {'model': 'm', 'dim L': 8}
    """

    def __init__(self, rows: dict, extra: list):
        self._rows, self._extra = rows, extra

    @functools.cached_property
    def _made(self) -> dict:
        return {**self._rows, **{k: v for f in self._extra for k, v in f().items()}}

    def __getitem__(self, key):
        return self._made[key]

    def __iter__(self):
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._made)


def _position_field(model: torch.nn.Module):
    """``(config key, value)`` of a Hugging Face model's longest sequence, or None."""
    for m in model.modules():
        config = getattr(m, "config", None)
        for key in ("max_position_embeddings", "n_positions"):
            value = getattr(config, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return None


def load_target(target: str, config: dict | None = None, seq: int | None = None) -> Target:
    """The model named by ``target``, built on the meta device. ``config``: keyword
    arguments for the class or factory (presets: for the config class)."""
    config = config or {}
    if target.startswith("hf:"):
        model, name, specs, loss, dims = families.hf(target[3:], config, seq)
        return Target(model, name, specs, loss, dims, inference_inputs=specs[:1])
    if target.startswith("timm:"):
        model, (x, y) = families.timm_model(target[5:], config)
        return Target(model, target, (x,), "cross_entropy", targets=(y,))
    if target.startswith("torchvision:"):
        model, (x, y) = families.torchvision_model(target[12:], config)
        return Target(model, target, (x,), "cross_entropy", targets=(y,))
    obj: Callable = load_object(target)
    if isinstance(obj, torch.nn.Module):  # a model the file made: used as it is
        if config:
            raise InputError(f"--config: {target} is a model already made, not a class or "
                             "factory to pass keywords to")
        return Target(obj, target.rpartition(":")[2])
    if not callable(obj):
        raise InputError(f"{target} is not a class or factory")
    _check_keywords(obj, config, target)
    try:
        with torch.device("meta"):
            model = obj(**config)
    except Exception as e:  # noqa: BLE001 - the user's constructor: one line naming where
        raise InputError(f"cannot build {target}{_built_with(config)}: {failure(e)}"
                         f"{_needs_config(obj, config)}") from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{target} made a {type(model).__name__}, not a torch.nn.Module")
    return Target(model, target.rpartition(":")[2])


def _built_with(config: dict) -> str:
    """`` with --config a=1, b='x'`` (what the constructor was given), or ``""``."""
    return (" with --config " + ", ".join(f"{k}={v!r}" for k, v in config.items())
            if config else "")


def _needs_config(obj, config: dict) -> str:
    """A hint naming the required arguments no ``--config`` gave, or ``""``."""
    import inspect

    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return ""
    missing = [p.name for p in params if p.default is p.empty and p.name not in config
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return (f"; give its arguments with --config ({' '.join(f'--config {m}=...' for m in missing)})"
            if missing else "")


def _check_keywords(obj, config: dict, target: str) -> None:
    """``--config`` keys the class or factory takes (unless it takes ``**kwargs``), or an
    error naming the closest parameter."""
    import inspect

    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in config:
        if key not in known:
            near = families.closest(key, known)
            hint = f"did you mean {near}?" if near else (
                f"it takes {', '.join(known)}" if known else "it takes no arguments")
            raise InputError(f"--config {key}: {target} has no parameter {key}; {hint}")


def check_positions(model, specs, sizes: dict) -> None:
    """A Hugging Face text model's sequences (dim 1 of each input, a number or a named dim)
    fit its position embeddings (:func:`position_limit`), which no shape check sees."""
    found = _position_field(model)
    if found is None:
        return
    key, limit = found
    for spec in specs:
        dims = [d.strip() for d in spec.partition(":")[0].split(",")]
        if len(dims) < 2:
            continue
        length = sizes.get(dims[1]) if dims[1].isidentifier() else int(dims[1])
        if isinstance(length, int) and length > limit:
            what = f"{dims[1]}={length}" if dims[1].isidentifier() else f"{length}"
            raise InputError(f"sequence length {what} is past the model's {limit} positions "
                             f"({key}): give at most {limit} (--seq, --dim or --input), or "
                             f"more positions with --config {key}=...")
