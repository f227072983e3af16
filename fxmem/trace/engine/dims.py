"""The trace's symbols: B and the named dims of the inputs (``dims``), checked
(:func:`check_dims`) and made in the ShapeEnv (:func:`symbols`)."""

from __future__ import annotations

from torch.fx.experimental.symbolic_shapes import DimDynamic

from ...errors import InputError
from ..ledger.records import B_RANGE_MAX
from .step import StepSpec


def check_dims(dims, spec: StepSpec) -> dict:
    """``dims``: name -> [(tensor, dim), ...], where tensor indexes the inputs followed by
    the targets and dim is any dim but the tensor's batch dim. Each place of a name must
    have the same size in the example tensors. Returns the mapping with lists of int pairs.
    """
    if not dims:
        return {}
    if not isinstance(dims, dict):
        raise InputError(f"dims must be a dict name -> [(tensor, dim), ...], got {dims!r}")
    tensors = spec.inputs + spec.targets
    out = {}
    for name, places in dims.items():
        if not isinstance(name, str) or not name.isidentifier() or name == "B":
            raise InputError(f"a dim name is an identifier other than B, got {name!r}")
        if not isinstance(places, (tuple, list)):
            raise InputError(f"dims[{name!r}] is a list of (tensor, dim) places, e.g. "
                             f"{{{name!r}: [(0, 1)]}} for dim 1 of the first input; got "
                             f"{places!r}")
        places = [places] if isinstance(places, tuple) else list(places)
        if not places:
            raise InputError(f"dim {name} names no (tensor, dim) place")
        sizes = set()
        for place in places:
            if (not isinstance(place, tuple) or len(place) != 2
                    or not all(isinstance(v, int) for v in place)):
                raise InputError(f"dim {name}: a place is (tensor index, dim), got {place!r}")
            t_i, d = place
            if not 0 <= t_i < len(tensors):
                raise InputError(f"dim {name}: tensor {t_i} does not exist (inputs then "
                                 f"targets: {len(tensors)} tensors)")
            bd = spec.batch_dims[t_i]
            if not 0 <= d < tensors[t_i].dim() or d == bd:
                where = "B" if d == bd else "no such dim"
                raise InputError(f"dim {name}: tensor {t_i} of shape {tuple(tensors[t_i].shape)} "
                                 f"has {where} at dim {d}")
            sizes.add(int(tensors[t_i].shape[d]))
        if len(sizes) > 1:
            raise InputError(f"dim {name} has different sizes in the example tensors: "
                             f"{sorted(sizes)}")
        out[name] = places
    return out


def symbols(shape_env, spec: StepSpec, hint: int, concrete_batch, dims,
             concrete_dims=None) -> tuple:
    """The trace's symbols: B's (and the SymInt the inputs' batch dims take, or
    ``concrete_batch``), each named dim's, and the inputs' named dims as SymInts (or their
    sizes in ``concrete_dims``: tensor index -> {dim: SymInt or int}), each ranged
    1..:data:`B_RANGE_MAX`."""
    from torch._dynamo.source import ConstantSource

    concrete_dims = concrete_dims or {}
    def symbol(name: str, hint: int):
        s = shape_env.create_symbol(hint, source=ConstantSource(name),
                                    dynamic_dim=DimDynamic.DYNAMIC)
        # A finite range lets checks such as eager indexing's "skip a full slice"
        # (B <= stop) be decided statically, as they are for concrete sizes; the bound
        # itself is never hit.
        shape_env.constrain_symbol_range(s, compiler_min=1, compiler_max=B_RANGE_MAX)
        return s

    sym = symbol("B", hint)
    batch = shape_env.create_symintnode(sym, hint=hint) if concrete_batch is None else \
        concrete_batch
    dim_syms, named = {}, {}
    for name, places in check_dims(dims, spec).items():
        t_i, d = places[0]
        size = int((spec.inputs + spec.targets)[t_i].shape[d])
        dim_syms[name] = symbol(name, size)
        node = concrete_dims[name] if name in concrete_dims else \
            shape_env.create_symintnode(dim_syms[name], hint=size)
        for t_i, d in places:
            named.setdefault(t_i, {})[d] = node
    return sym, batch, dim_syms, named
