"""A checkpoint plan's step in arrays: what a planner's numbers need (:func:`fxmem.checkpoint.
plans.derive_numbers` makes them), kept small, without a record per op and storage.

>>> import numpy as np
>>> runs = np.array([[0, 3, 0], [1, 2, 1], [3, 2, 0]], np.int32)  # ops 0-2, 1-2 again, 3-4
>>> _expand(runs).tolist()
[0, 1, 2, 1, 2, 3, 4]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NEVER = -2  # ``Derived.freed``'s "never freed" (a trace's ``freed_after=None``)
_INDEX = np.int32  # op and storage indices in a derivation's arrays (a planner keeps hundreds)


class SizeValues:
    """A trace's storage sizes (device sizes, :class:`fxmem.formula.symbols.Size`) and their
    values at the last few batch sizes asked for, as int64 arrays: shared by every plan a
    planner derives from the trace (:func:`derive_numbers`)."""

    def __init__(self, sizes: tuple):
        self.sizes, self._at = tuple(sizes), {}

    def __len__(self) -> int:
        return len(self.sizes)

    def at(self, b: int):
        if b not in self._at:
            if len(self._at) >= 8:
                self._at.pop(next(iter(self._at)))
            self._at[b] = np.fromiter((z(b) for z in self.sizes), np.int64, len(self.sizes))
        return self._at[b]


@dataclass(frozen=True, eq=False)
class Derived:
    """A plan's step derived as :func:`derive` does, in arrays: what a planner's numbers
    need, without a record per op and storage (:func:`derive_numbers`). Per storage of the
    derived step: ``created`` (the op that makes it, -1: before the step) and ``freed``
    (the op after which it is freed, :data:`NEVER`: never), int32 arrays; its size is the
    base storage's (``base``, a :class:`SizeValues`), the first ``len(base)`` storages
    being the base's and each after them a re-run's copy of base storage ``copied[k]``.
    Per op: ``sources`` (the base op it is, or repeats) and ``recompute`` (a bool array:
    True where it re-runs one).

    Kept small (a planner keeps one per candidate, hundreds, each as long as the trace):
    the ops as runs of consecutive base ops (``runs``: start, length, re-run or not), and
    the storages as the base trace's (``bases``, shared) moved to the derived op indices,
    with the few that differ (``created_at``/``freed_at``: index and value) and the
    copies' (``tail``); the arrays are made when read (:meth:`of` from whole arrays)."""

    base: SizeValues
    copied: np.ndarray
    runs: np.ndarray  # (k, 3) int32: first base op, length, 1 where a re-run
    bases: tuple  # the base trace's (created_by, freed_after) arrays (_base)
    created_at: tuple  # (base storage indices, derived "created by") that the move misses
    freed_at: tuple  # likewise for "freed after"
    tail: tuple  # (created, freed) of the re-runs' copies
    # storages the plan does not make (a checkpointed layer's cache: fxmem.checkpoint.uncached),
    # counted as no bytes
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, _INDEX))

    @classmethod
    def of(cls, created, freed, base: SizeValues, copied, sources, recompute,
           bases: tuple, dropped=None) -> "Derived":
        """The derivation of the whole arrays (as the class docstring names them)."""
        sources, recompute = np.asarray(sources, _INDEX), np.asarray(recompute, bool)
        if len(sources):
            cut = np.flatnonzero((np.diff(sources) != 1) | (np.diff(recompute) != 0)) + 1
            firsts = np.concatenate([[0], cut])
            lengths = np.diff(np.concatenate([firsts, [len(sources)]]))
            runs = np.stack([sources[firsts], lengths, recompute[firsts]], 1).astype(_INDEX)
        else:
            runs = np.zeros((0, 3), _INDEX)
        moved_c, moved_f = _moved(runs, bases)
        n = len(moved_c)

        def diff(full, moved):
            at = np.flatnonzero(full[:n] != moved).astype(_INDEX)
            return at, full[:n][at].astype(_INDEX)
        return cls(base, np.asarray(copied, _INDEX), runs, bases, diff(created, moved_c),
                   diff(freed, moved_f), (np.asarray(created[n:], _INDEX),
                                          np.asarray(freed[n:], _INDEX)),
                   np.zeros(0, _INDEX) if dropped is None else np.asarray(dropped, _INDEX))

    @property
    def sources(self) -> np.ndarray:
        return _expand(self.runs)

    @property
    def recompute(self) -> np.ndarray:
        return np.repeat(self.runs[:, 2].astype(bool), self.runs[:, 1])

    @property
    def n_ops(self) -> int:
        return int(self.runs[:, 1].sum())

    def _arrays(self) -> tuple:
        """(created, freed) of every storage of the derived step."""
        created, freed = _moved(self.runs, self.bases)
        for arr, (at, v) in ((created, self.created_at), (freed, self.freed_at)):
            if len(at):
                arr[at] = v
        if len(self.tail[0]):
            created = np.concatenate([created, self.tail[0]])
            freed = np.concatenate([freed, self.tail[1]])
        return created, freed

    @property
    def created(self) -> np.ndarray:
        return self._arrays()[0]

    @property
    def freed(self) -> np.ndarray:
        return self._arrays()[1]

    def timeline(self, b: int) -> list:
        """Live bytes right after each op's allocations at batch size ``b``
        (:func:`fxmem.memory.liveness.timeline`)."""
        return self.live(b).tolist()

    def _values(self, b: int, base=None):
        base = self.base.at(b) if base is None else base
        v = np.concatenate([base, base[self.copied]]) if len(self.copied) else base
        if len(self.dropped):
            v = v.copy()
            v[self.dropped] = 0
        return v

    def live(self, b: int, base=None):
        """:meth:`timeline` as a numpy array of int64; ``base``: the base storages' bytes
        at ``b`` to count instead of their sizes' (an int64 array, e.g. some of them 0)."""
        n = self.n_ops
        v = self._values(b, base)
        created, freed = self._arrays()
        made = created >= 0
        delta = np.zeros(n + 1, np.int64)
        np.add.at(delta, created[made], v[made])
        gone = (freed != NEVER) & (freed + 1 <= n)
        np.add.at(delta, np.maximum(freed[gone] + 1, 0), -v[gone])
        return int(v[~made].sum()) + np.cumsum(delta[:n])

    def start_bytes(self, b: int) -> int:
        """Live bytes before the step's first op: of the base storages made before it (the
        move keeps an index's sign; a re-run's copy is made by an op)."""
        before = self.bases[0] < 0
        at, made = self.created_at
        if len(at):
            before = before.copy()
            before[at] = made < 0
        return int(self.base.at(b)[before].sum())

    def recomputed(self):
        """The base ops the derived step runs again, one entry per re-run (int32)."""
        return _expand(self.runs[self.runs[:, 2] != 0])


def _moved(runs, bases: tuple) -> tuple:
    """The base storages' created and freed (``bases``), moved to the derived op indices of
    the ops in ``runs``."""
    created, freed = bases
    pos = np.zeros(max(int((runs[:, 0] + runs[:, 1]).max(initial=0)), 1), _INDEX)
    own = runs[:, 2] == 0  # pos: base op -> its derived index
    at = np.cumsum(runs[:, 1]) - runs[:, 1]
    pos[_expand(runs[own])] = _expand(np.stack([at[own], runs[own, 1]], 1))
    made = np.where(created < 0, created, pos[np.maximum(created, 0)])
    gone = np.where(freed >= 0, pos[np.maximum(freed, 0)], freed)
    return made.astype(_INDEX), gone.astype(_INDEX)


def _expand(runs) -> np.ndarray:
    """The base ops of ``runs`` (first, length, ...) one after another (int32)."""
    lengths = runs[:, 1].astype(np.int64)
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, _INDEX)
    offsets = np.cumsum(lengths) - lengths  # where each run starts in the output
    return (np.arange(total) + np.repeat(runs[:, 0] - offsets, lengths)).astype(_INDEX)
