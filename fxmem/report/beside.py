"""Ways searched in a forked child beside this process, in two parts: the first sent back as
soon as it is found, the rest at the end (:func:`fxmem.report.fit.fit` under FSDP2 with
``jobs=2``: the checkpoint way first, which the fewest GPUs' search in this process reads
once its own walk is made, then the longest length).

Either part missing (the child failed, or could not be forked) is for the caller to search
itself: :meth:`Beside.first` and :meth:`Beside.rest` then give None.

>>> b = Beside(lambda ways: {k: [10 * k] for k in ways}, (1,), (4,), kept=lambda: "memo")
>>> b.first(), b.rest()
({1: [10]}, ({4: [40]}, 'memo'))
"""

from __future__ import annotations

import os

from .forked import forked, readable, receive, send


class Beside:
    """``run(first)`` then ``run(rest)`` in a forked child (``run(ways)``: a dict of what
    each way yielded); ``kept()``: what else the child's search made that this process
    reads, sent back with the rest (None: nothing); ``niceness``: the child's
    (:func:`fxmem.report.forked.forked`)."""

    def __init__(self, run, first: tuple, rest: tuple, kept=lambda: None, niceness: int = 0):
        r, w = os.pipe()

        def ways():
            os.close(r)
            send(w, run(first))
            os.close(w)
            return run(rest), kept()
        self.child = forked(ways, niceness)
        os.close(w)
        if self.child is None:
            os.close(r)
        self.fd = None if self.child is None else r

    def first_ready(self) -> bool:
        """Whether :meth:`first` would not wait (sent, or the child ended, or none)."""
        return self.fd is None or readable(self.fd)

    def first(self):
        """The first part's dict, or None (the child failed before it, or there is none,
        or it was read already)."""
        if self.fd is None:
            return None
        with os.fdopen(self.fd, "rb") as f:
            self.fd = None
            return receive(f)

    def rest(self):
        """``(the rest's dict, kept())``, or None (the child failed, or there is none)."""
        self._close()
        child, self.child = self.child, None
        return None if child is None else child.collect()

    def cancel(self) -> None:
        """Stop the child (this process failed; its answer is not wanted)."""
        self._close()
        child, self.child = self.child, None
        if child is not None:
            child.cancel()

    def _close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
