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

A forked child may also go on ahead of its own search (:class:`Ahead`): where a core is idle
and the search has a guess at its answer (the plan a walk over the caching allocator's replay
has found so far, which it then traces), a copy of the child is forked that goes on as if
the guess were the answer, up to a point where it waits (:meth:`Ahead.wait`), while the child
searches on. When the search ends on that guess, the copy is told to go on and its answer is
the child's (sent on as the child's own, the warnings of both in the order one process would
have raised them); else the copy is killed (and one ahead of a child that dies dies too).

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
_answer: list = []  # in a forked child: [the fd its answer is written to, the warnings it saw]
_stands_in: list = []  # in a copy gone ahead (Ahead): the pid of the child it may become
GO_AHEAD = None  # Ahead: None, where a CPU is idle; True, always (tests); False, never
AHEAD_NICENESS = 10  # of work meanwhile forked by a copy gone ahead (Ahead)


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
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: its answer, then out without running this process's exits
        os.close(r)
        code = 0
        if _stands_in:  # forked by a copy gone ahead (Ahead): ends with it
            _die_with(parent)
            _stands_in.clear()
        if niceness:
            os.nice(niceness)
        # nothing written but the pipe: a lock of sys.stderr's that another thread of the
        # parent (the CLI's status line) held at the fork stays held here
        sys.unraisablehook = lambda unraisable: None
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                _answer[:] = [w, seen]
                value = run()
            data = pickle.dumps(("ok", value, _told(seen)))
        except _Handed as handed:  # a copy gone ahead answered (Ahead.hand_over)
            data = handed.data
        except BaseException:  # noqa: BLE001 - the parent does the work itself
            data, code = pickle.dumps(("failed", None, [])), 1
        try:
            with os.fdopen(_answer[0], "wb") as f:  # (a copy gone ahead: to the child)
                f.write(data)
        finally:
            os._exit(code)
    os.close(w)
    return Child(pid, r)


def send(fd: int, value) -> bool:
    """``value`` pickled down the pipe ``fd``, its length first (:func:`receive` reads it);
    False where no process reads it any more."""
    data = pickle.dumps(value)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(len(data).to_bytes(8, "little") + data)
    except OSError:  # the reader ended
        return False
    return True


def receive(f, missing=None):
    """The next value :func:`send` wrote to the pipe ``f`` (a file): its length first (a
    process forked later may hold the pipe too, so its end is not the sign); None where
    there is none (``missing``: raised instead)."""
    n = int.from_bytes(f.read(8) or bytes(8), "little")
    data = f.read(n) if n else b""
    if len(data) < n or not n:
        if missing is not None:
            raise missing("the value sent never came")
        return None
    return pickle.loads(data)


def readable(fd: int) -> bool:
    """Whether reading ``fd`` would not wait."""
    import select

    return bool(select.select([fd], [], [], 0)[0])


class Child:
    """A forked child running a function: :meth:`collect` its result, or :meth:`cancel`."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    def background(self) -> Child:
        """This child, stopped while the process that forked it is in a :func:`foreground`
        block; returned."""
        _background[self.pid] = os.getpid()
        return self

    def wanted(self) -> Child:
        """This child no longer :meth:`background`: its answer is awaited now (a way fit
        searches), so this process's :func:`foreground` blocks leave it running; returned."""
        if _background.pop(self.pid, None) is not None:
            _signal(self.pid, signal.SIGCONT)  # (stopped only inside such a block)
        return self

    def ready(self) -> bool:
        """Whether the child has answered (or ended): :meth:`collect` would not wait."""
        return readable(self.fd)

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

    def wanted(self) -> None:
        """The child's answer is awaited now (:meth:`Child.wanted`)."""
        if self.child is not None:
            self.child.wanted()

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
            elif _stands_in and owner == _stands_in[0] and work.child is None:
                # (it ends with this copy, if killed; niced: the copy's block, on which the
                # answer waits, keeps a CPU while the child it went ahead of searches on)
                work.child = forked(work.run, AHEAD_NICENESS) or False
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


def _told(seen) -> list:
    """Recorded warnings as a child sends them: (message, category, file, line)."""
    return [(str(m.message), m.category, m.filename, m.lineno) for m in seen]


class _Handed(BaseException):  # noqa: N818 - not an error: the child's answer, made ahead
    """Raised in a forked child whose copy gone ahead answered: ``data``, its answer."""

    def __init__(self, data: bytes):
        super().__init__()
        self.data = data


class Ahead:
    """A copy of this forked child going on ahead of it on a guess at what the child is
    still searching for (the module's docstring). :meth:`guess` forks the copy (the one
    before killed); the copy goes on as the child would with that answer, forking only the
    work given :func:`meanwhile` (niced, and ending with the copy), until :meth:`wait`,
    where it waits before anything else (reading from another process, answering). The
    child, its search done, calls :meth:`hand_over`: the copy whose guess it found is told
    to go on, and its answer becomes the child's; any other is killed. Only in a forked
    child (:func:`forked`) on Linux with no child of its own yet to collect
    (:func:`can_go_ahead`), and (``GO_AHEAD`` None) where a CPU was idle at the first guess.

    >>> def search():
    ...     ahead = Ahead()
    ...     for guess in (3, 5, 4):  # each found better than the last
    ...         if ahead.guess(guess):
    ...             break  # the copy: on with this guess
    ...     else:
    ...         ahead.hand_over(4)  # the search found 4: the copy on 4 answers
    ...         guess = 4  # (where no copy went ahead)
    ...     ahead.wait()
    ...     return guess * 10
    >>> forked(search).collect()
    40
    """

    def __init__(self):
        self.pid = self.key = None  # here: the copy gone ahead, its guess
        self._go = self._out = None  # the pipes: the word to go on; the copy's answer
        self._seen = 0  # warnings this child had seen when the copy was forked
        self._idle = None  # whether a CPU was idle at the first guess (the copies' own)

    @property
    def is_copy(self) -> bool:
        """Whether this process is a copy waiting to go on (:meth:`wait`)."""
        return bool(_stands_in)

    def guess(self, key) -> bool:
        """A copy forked to go on with ``key`` as the answer (the copy before stopped): True
        in the copy, False here and where none is forked."""
        self.stop()
        if self._idle is None:  # a copy killed for this guess leaves its CPU to the next
            self._idle = GO_AHEAD is True or _idle_cpu()
        if not (self._idle and can_go_ahead()):
            return False
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        child = os.getpid()
        pid = os.fork()
        if pid == 0:
            _die_with(child)
            os.close(go_w)
            os.close(out_r)
            os.close(_answer[0])
            _answer[0], self._go = out_w, go_r
            _stands_in[:] = [child]
            return True
        os.close(go_r)
        os.close(out_w)
        self.pid, self.key, self._go, self._out = pid, key, go_w, out_r
        self._seen = len(_answer[1])
        return False

    def wait(self) -> None:
        """In a copy: wait until the child hands over to it (then it is the child, the
        child's work meanwhile its own), or end where it does not."""
        if not _stands_in:
            return
        with os.fdopen(self._go, "rb") as f:
            word = f.read(1)
        if word != b"1":
            os._exit(0)
        child, me = _stands_in.pop(), os.getpid()
        for i, (owner, work) in enumerate(_meanwhile):
            if owner == child:
                _meanwhile[i] = (me, work)

    def hand_over(self, key) -> None:
        """The search ended on ``key``: where the copy went ahead with it, raise the copy's
        answer as this child's (:class:`_Handed`, which :func:`forked`'s child sends on);
        else stop the copy. A copy that ended without answering (killed) leaves the work to
        this child: it returns."""
        if self.pid is None:
            return
        if key != self.key:
            self.stop()
            return
        try:
            os.write(self._go, b"1")
        except OSError:  # the copy is gone
            self.stop()
            return
        os.close(self._go)
        with os.fdopen(self._out, "rb") as f:
            data = f.read()
        os.waitpid(self.pid, 0)
        self.pid = None
        if data:
            raise _Handed(_merged(data, self._seen, _told(_answer[1][self._seen:])))

    def stop(self) -> None:
        """Kill the copy gone ahead (none: nothing)."""
        if self.pid is None:
            return
        _signal(self.pid, signal.SIGKILL)
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        for fd in (self._go, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
        self.pid = None


def can_go_ahead() -> bool:
    """Whether this process may fork a copy to go ahead of it (:class:`Ahead`; where a CPU
    is idle, unless ``GO_AHEAD`` is True)."""
    me = os.getpid()
    return bool(_answer) and not _stands_in and GO_AHEAD is not False \
        and sys.platform.startswith("linux") and can_fork() \
        and not any(owner == me for owner in _background.values()) \
        and not any(owner == me and work.child for owner, work in _meanwhile)


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def _idle_cpu() -> bool:
    """Whether fewer tasks are running now than this process may use CPUs (Linux's
    ``/proc/loadavg``: running over all, this process among the running)."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return running < cpus()


def _die_with(parent: int) -> None:
    """This process killed when ``parent`` ends (Linux's ``PR_SET_PDEATHSIG``); ended now
    when it has already."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def _merged(data: bytes, at: int, also: list) -> bytes:
    """A child's answer ``data`` with the warnings ``also`` put after its first ``at``."""
    if not also:
        return data
    try:
        status, value, seen = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a copy killed before it wrote: the parent's work
        return data
    return pickle.dumps((status, value, [*seen[:at], *also, *seen[at:]]))


def _signal(pid: int, sig) -> bool:
    """``sig`` sent to ``pid``; False when it is gone."""
    try:
        os.kill(pid, sig)
    except OSError:
        return False
    return True
