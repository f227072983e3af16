"""Work done in a forked child while this process does its own: the ways out of a step
that does not fit (:func:`fxmem.report.fit.fit`, ``jobs=2``) are searched two at a time.

Each way is its own search (its traces, walks and replays), and most are independent of
the others: on a machine with a second core, a child process forked after the step's
trace searches some while this one searches the rest, each from the same state (the
trace, its caches). The child's answer comes back pickled through a pipe, with the
warnings it raised (raised again here, in order); when the child cannot run or fails,
:meth:`Child.collect` returns None and the caller does that work itself, so a
failure costs time, never an answer.

Nothing is forked where a child could not run safely: where ``os.fork`` is missing
(Windows), and where this process has initialised CUDA (a forked child cannot use it).

A child searching a way that may not be wanted (:mod:`fxmem.report.ahead`) is marked
:meth:`Child.background`: while this process does work its own answer waits on
(:func:`foreground`: a step traced under a checkpoint plan, the plan ``--checkpoint auto``
chose confirmed), the child is stopped, not sharing the machine's two cores' memory
bandwidth with it. Where that plan fits, the child's way is not wanted at all. Work that
can use the core those stopped children leave is given to :func:`meanwhile`: it is forked
as such a block begins (``--checkpoint auto``'s frontier table, computed while the plan
chosen is traced), and made by the caller itself where no block began.

>>> forked(lambda: 6 * 7).collect()
42
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import warnings
from dataclasses import dataclass

_background: dict = {}  # pid of a child marked Child.background -> the pid that forked it
_depth = [0]  # foreground blocks this process is in
_meanwhile: list = []  # (pid, Meanwhile): work forked as that process's next block begins


def can_fork() -> bool:
    """Whether :func:`forked` would fork: ``os.fork`` exists and CUDA is not initialised."""
    if not hasattr(os, "fork"):
        return False
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return cuda is None or not cuda.is_initialized()


def forked(run, niceness: int = 0):
    """``run()`` started in a forked child, as a :class:`Child`; None when nothing can be
    forked (:func:`can_fork`). ``niceness``: added to the child's (``os.nice``): a child
    whose work waits while this process does what is needed first yields the cores to it."""
    if not can_fork():
        return None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its answer, then out without running this process's exits
        os.close(r)
        code = 0
        if niceness:
            os.nice(niceness)
        # nothing written but the pipe: a lock of sys.stderr's that another thread of the
        # parent (the CLI's status line) held at the fork stays held here
        sys.unraisablehook = lambda unraisable: None
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                value = run()
            data = pickle.dumps(("ok", value, [(str(m.message), m.category, m.filename,
                                                m.lineno) for m in seen]))
        except BaseException:  # noqa: BLE001 - the parent does the work itself
            data, code = pickle.dumps(("failed", None, [])), 1
        try:
            with os.fdopen(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(code)
    os.close(w)
    return Child(pid, r)


class Child:
    """A forked child running a function: :meth:`collect` its result, or :meth:`cancel`."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    def background(self) -> Child:
        """This child, stopped while the process that forked it is in a :func:`foreground`
        block; returned."""
        _background[self.pid] = os.getpid()
        return self

    def ready(self) -> bool:
        """Whether the child has answered (or ended): :meth:`collect` would not wait."""
        import select

        return bool(select.select([self.fd], [], [], 0)[0])

    def collect(self):
        """The child's result, its warnings raised here; None when it failed."""
        if _background.pop(self.pid, None) is not None:
            _signal(self.pid, signal.SIGCONT)  # (never waited on while stopped)
        with os.fdopen(self.fd, "rb") as f:
            data = f.read()
        os.waitpid(self.pid, 0)
        try:
            status, value, seen = pickle.loads(data)
        except Exception:  # noqa: BLE001 - a child killed before it wrote
            return None
        for message, category, filename, lineno in seen:
            warnings.warn_explicit(message, category, filename, lineno)
        return value if status == "ok" else None

    def cancel(self) -> None:
        """Stop the child (this process failed; its answer is not wanted)."""
        _background.pop(self.pid, None)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        os.close(self.fd)


@dataclass
class ChildWay:
    """A way out searched in a forked ``child`` (None once taken or stopped):
    :meth:`ready`, :meth:`take` its answer, or :meth:`cancel` it. A way holding more than
    its child (a pipe) lets it go in :meth:`_release`."""

    child: Child | None

    def ready(self) -> bool:
        """Whether :meth:`take` would not wait (the child answered, or there is none)."""
        return self.child is None or self.child.ready()

    def take(self):
        """What the way yielded, or None (the child failed, or there is none)."""
        self._release()
        self.child, child = None, self.child
        return child.collect() if child is not None else None

    def cancel(self) -> None:
        """Stop the child (once; nothing after :meth:`take`)."""
        self._release()
        self.child, child = None, self.child
        if child is not None:
            child.cancel()

    def _release(self) -> None:
        """What the way holds besides its child, let go before it is taken or stopped."""


@contextlib.contextmanager
def foreground():
    """The children this process marked :meth:`Child.background` stopped (``SIGSTOP``)
    while the block runs, continued after it (the outermost block of nested ones): work
    this process's answer waits on runs with the cores' memory to itself. A child
    another process forked (a sibling, in a child of this one) is left alone."""
    mine = [pid for pid, owner in _background.items() if owner == os.getpid()] \
        if _depth[0] == 0 else []
    if _depth[0] == 0:
        for owner, work in _meanwhile:
            if owner == os.getpid() and work.child is None:
                work.child = forked(work.run) or False
    _depth[0] += 1
    stopped = [pid for pid in mine if _signal(pid, signal.SIGSTOP)]
    try:
        yield
    finally:
        _depth[0] -= 1
        for pid in stopped:
            _signal(pid, signal.SIGCONT)


class Meanwhile:
    """:func:`meanwhile`'s work: ``run``; ``child``, the :class:`Child` running it (None:
    not forked yet; False: none will be)."""

    def __init__(self, run, fork: bool = True):
        self.run, self.child = run, None if fork else False

    def result(self):
        """``run()``'s answer: the child's, waited for, where one was forked and answered,
        else ``run()`` here."""
        child, self.child = self.child, False  # (asked: nothing is forked for it after)
        got = child.collect() if child else None
        return self.run() if got is None else got


@contextlib.contextmanager
def meanwhile(run, fork: bool = True):
    """A :class:`Meanwhile` of ``run``, forked (where ``fork``) as the first
    :func:`foreground` block of this process inside this one begins (the children searching
    ways ahead are stopped then, so it has a core of its own), else made by
    :meth:`Meanwhile.result` where the caller asks. A child whose answer was not asked for
    in this block is killed at its end.

    >>> with meanwhile(lambda: 6 * 7) as work:
    ...     with foreground():
    ...         pass
    ...     forked_it = bool(work.child) or not can_fork()
    ...     answer = work.result()
    >>> forked_it, answer
    (True, 42)
    """
    work = Meanwhile(run, fork)
    _meanwhile.append((os.getpid(), work))
    try:
        yield work
    finally:
        _meanwhile.remove((os.getpid(), work))
        if work.child:  # forked, its answer not asked for
            work.child.cancel()


def _signal(pid: int, sig) -> bool:
    """``sig`` sent to ``pid``; False when it is gone."""
    try:
        os.kill(pid, sig)
    except OSError:
        return False
    return True
