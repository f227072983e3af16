"""A checkpoint plan as data: which forwards run under ``torch.utils.checkpoint``, and how.

A plan is a :class:`Plan`, a tuple of entries, each one checkpointed region:

- a module path (``"blocks.3"``): the module's forward is one non-reentrant checkpoint, that
  saves nothing (everything it saved for backward is recomputed);
- a :class:`Region`: one module or several consecutive sibling modules (``blocks.0`` ..
  ``blocks.3``, Chen et al.'s segments) run as *one* checkpoint, and optionally a selective
  checkpointing policy, ``save``: the op calls whose outputs are kept from the forward
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``, ``MUST_SAVE``) instead
  of being recomputed. An op call is named ``(op, n)``: the n-th call (from 0) of that aten
  overload in the region's forward, counted as selective checkpointing counts them (the
  ops of ``torch.utils.checkpoint.SAC_IGNORED_OPS`` are not counted).

A plan prints for people (``str``) and round-trips through JSON for a training script
(:meth:`Plan.to_json` / :meth:`Plan.from_json`, or :func:`fxmem.load_plan`), which hands it
to :func:`fxmem.apply_checkpoints`.

>>> p = Plan.of(["blocks.1", Region(("blocks.2", "blocks.3")),
...              Region(("blocks.0",), save=(("aten.mm.default", 0),))])
>>> print(p)
blocks.0 (saving 1 op output), blocks.1, blocks.2..blocks.3
>>> Plan.from_json(p.to_json()) == p
True
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ...errors import InputError

FORMAT = "fxmem.checkpoint-plan/1"


@dataclass(frozen=True)
class Region:
    """One checkpointed region: ``modules`` (one path, or consecutive siblings run as one
    segment, in call order) and ``save``, the ``(op, n)`` calls whose outputs selective
    checkpointing keeps (empty: recompute everything, a plain checkpoint)."""

    modules: tuple[str, ...]
    save: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        if isinstance(self.modules, str):
            raise InputError(f"Region.modules is a tuple of module paths, got the string "
                             f"{self.modules!r} (write ({self.modules!r},))")
        mods = tuple(self.modules)
        if not mods or not all(isinstance(m, str) and m for m in mods):
            raise InputError(f"a checkpoint region needs non-empty module paths, got {mods!r}")
        if len(set(mods)) != len(mods):
            raise InputError(f"checkpoint region {mods!r} names a module twice")
        save = []
        for s in self.save:
            if not (isinstance(s, (tuple, list)) and len(s) == 2 and isinstance(s[0], str)
                    and isinstance(s[1], int) and not isinstance(s[1], bool) and s[1] >= 0):
                raise InputError(f"checkpoint region {_label(mods)}: an op call to save is "
                                 f"(aten op name, n >= 0), got {s!r}")
            save.append((s[0], s[1]))
        object.__setattr__(self, "modules", mods)
        object.__setattr__(self, "save", tuple(sorted(set(save))))

    @property
    def is_group(self) -> bool:
        """More than one module, checkpointed as one segment."""
        return len(self.modules) > 1

    def __str__(self) -> str:
        n = len(self.save)
        return _label(self.modules) + (f" (saving {n} op output{'s' * (n != 1)})" if n else "")

    def __repr__(self) -> str:  # the saved op calls can be dozens: counted, not listed
        return f"<Region {self}>"


def _label(mods) -> str:
    return mods[0] if len(mods) == 1 else f"{mods[0]}..{mods[-1]}"


def simple(entry):
    """An entry in its plainest form: a :class:`Region` of one module saving nothing is
    its path."""
    if isinstance(entry, Region) and not entry.is_group and not entry.save:
        return entry.modules[0]
    return entry


def modules_of(entry) -> tuple[str, ...]:
    """The module paths an entry checkpoints."""
    return (entry,) if isinstance(entry, str) else entry.modules


def sort_key(entry):
    """Plan order: module paths with their numbers as numbers (``h.2`` before ``h.10``)."""
    return (tuple(_natural(m) for m in modules_of(entry)), getattr(entry, "save", ()))


def _natural(path: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split("."))


class Plan(tuple):
    """A checkpoint plan: a sorted tuple of entries (module paths and :class:`Region` s).

    A tuple, so ``plan == ("blocks.0", "blocks.1")`` holds for a plan of two whole
    modules; ``str(plan)`` and its repr are the readable form (a selective region's saved op
    calls counted, not listed: ``plan.regions`` has them), :meth:`to_json` the loadable one.

    >>> Plan.of(["h.1", Region(("h.0",), save=(("aten.mm.default", 0),))])
    <Plan: h.0 (saving 1 op output), h.1>
    """

    @classmethod
    def of(cls, entries) -> Plan:
        """A plan from a :class:`Plan`, an iterable of entries, or a parsed JSON dict."""
        if isinstance(entries, Plan):
            return entries
        if entries is None:
            return cls(())
        if isinstance(entries, dict):
            return cls.from_dict(entries)
        if isinstance(entries, str):
            raise InputError(f"a checkpoint plan is a collection of module paths, got the "
                             f"string {entries!r} (write [{entries!r}])")
        if not isinstance(entries, Iterable):
            raise InputError(f"a checkpoint plan is a collection of module paths and "
                             f"fxmem.Region s, got {type(entries).__name__}")
        out = []
        for e in entries:
            if isinstance(e, dict):
                e = Region(tuple(e.get("modules", ())), tuple(map(tuple, e.get("save", ()))))
            if not isinstance(e, (str, Region)) or e == "":
                raise InputError(f"checkpoint plan entries are non-empty module paths or "
                                 f"fxmem.Region s, got {e!r}")
            out.append(simple(e))
        return cls(sorted(set(out), key=sort_key))

    @property
    def modules(self) -> tuple[str, ...]:
        """Every module path the plan names."""
        return tuple(m for e in self for m in modules_of(e))

    @property
    def regions(self) -> tuple[Region, ...]:
        """Every entry as a :class:`Region`."""
        return tuple(e if isinstance(e, Region) else Region((e,)) for e in self)

    def __str__(self) -> str:
        return ", ".join(map(str, self)) if self else "(no checkpoint)"

    def __repr__(self) -> str:
        return f"<Plan: {self}>"

    def to_dict(self) -> dict:
        return {"format": FORMAT,
                "regions": [{"modules": list(r.modules), "save": [list(s) for s in r.save]}
                            for r in self.regions]}

    def to_json(self, **kwargs) -> str:
        """The plan as JSON (``json.dumps`` keyword arguments pass through)."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        if d.get("format") != FORMAT or not isinstance(d.get("regions"), list):
            raise InputError(f"not an fxmem checkpoint plan (expected format {FORMAT!r} and a "
                             f"'regions' list, got format {d.get('format')!r})")
        return cls.of(d["regions"])

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan :meth:`to_json` wrote."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"a checkpoint plan's JSON does not parse: {e}") from None
        if not isinstance(d, dict):
            raise InputError("not an fxmem checkpoint plan (a JSON object expected)")
        return cls.from_dict(d)


def load_plan(source) -> Plan:
    """A plan from a JSON file path, JSON text, or a parsed dict (what :meth:`Plan.to_json`
    wrote), for :func:`fxmem.apply_checkpoints`.

    >>> load_plan('{"format": "fxmem.checkpoint-plan/1", "regions": [{"modules": ["fc"]}]}')
    <Plan: fc>
    """
    if isinstance(source, dict):
        return Plan.from_dict(source)
    text = str(source)
    if not text.lstrip().startswith("{"):
        try:
            with open(text) as f:
                text = f.read()
        except OSError as e:
            raise InputError(f"cannot read the checkpoint plan {source!r}: {e.strerror}") from None
    return Plan.from_json(text)
