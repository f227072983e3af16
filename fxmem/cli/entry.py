"""The ``fxmem`` console script and ``python -m fxmem``: :func:`fxmem.cli.main`, then out
without the interpreter's teardown.

At exit Python frees, one by one, every object the analysis made (its traces, their sympy
expressions and graphs): Llama-3.1-8B's command over 8 ranks ended 1.6 s after its
report was written. :func:`run` flushes what is buffered, runs the exit handlers
(``atexit``: temporary directories are removed as at any exit) and ends the process with
:func:`os._exit` at the command's exit code. Callers in a process that goes on (tests, a
notebook) call :func:`fxmem.cli.main`, which raises ``SystemExit`` as before.
"""

from __future__ import annotations

import atexit
import os
import sys

import click

from .command import main


def run() -> None:
    """:func:`fxmem.cli.main` on ``sys.argv``, and the process ended at its exit code."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as Python's own exit prints it
        click.echo(code, err=True)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (fxmem ... | head), a closed stream
            pass
    os._exit(code)
