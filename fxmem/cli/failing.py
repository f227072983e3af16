"""The command's errors: each one line on stderr, ``fxmem: error: ...``, in the command's
words (an option, not the library's argument), with an exit code: 2 bad usage or input, 3
the step could not be traced, 4 the step does not fit the budget, 130 interrupted, 1 a
bug in fxmem (``--debug`` shows the traceback); and no other library's log line or
warning on the command's output."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
import warnings

import click

from ..errors import FxmemError, InfeasibleBudgetError, TraceError, one_line

EXIT_INTERNAL, EXIT_USAGE, EXIT_TRACE, EXIT_BUDGET, EXIT_INTERRUPTED = 1, 2, 3, 4, 130


class Exit(Exception):
    """An error of the command's own, with its exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def exit_code(e: BaseException) -> int:
    """The exit code of fxmem's error ``e``."""
    if isinstance(e, InfeasibleBudgetError):
        return EXIT_BUDGET
    if isinstance(e, TraceError):
        return EXIT_TRACE
    return EXIT_USAGE


@contextlib.contextmanager
def failing(debug: bool):
    """Every error of the block as one line on stderr and its exit code: fxmem's own (2, 3,
    4), or a bug in fxmem (1, with --debug's traceback)."""
    try:
        yield
    except (FxmemError, Exit) as e:
        fail(e, debug)
    except KeyboardInterrupt as e:  # before click, which would print a blank line first
        fail(Exit(EXIT_INTERRUPTED, "interrupted"), debug, e)
    except Exception as e:  # noqa: BLE001 - a bug in fxmem: still one line, exit 1
        fail(Exit(EXIT_INTERNAL, f"internal error, {type(e).__name__}: {e} (--debug shows "
                                  "the traceback; please report it)"), debug, e)


@contextlib.contextmanager
def silenced():
    """No log line nor warning of another library's on the command's output (the models'
    libraries too: transformers, timm), restored after."""
    disabled = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(disabled)


# the library's words for what the command's options say
API_WORDS = (("loss=None needs the model", "--loss none needs the model"),
             ("give a loss function (and its targets)",
              "give --target (the loss is then cross_entropy; --loss picks another)"),
             ("pass fxmem.TP(world_size, plan) with yours",
              "give --tp-plan FILE.py:NAME, a dict of module path to a parallel style"),
             ("pass fxmem.TP(world_size, plan) with your own", "give --tp-plan FILE.py:NAME"),
             ("FSDP: replicate is the number", "--replicate is the number"))


def fail(e, debug: bool, cause: BaseException | None = None):
    """``e`` as one line on stderr in the command's words (``cause``'s traceback first with
    ``debug``), then exit with its code."""
    if debug:
        traceback.print_exception(cause or e, file=sys.stderr)
    msg = one_line(str(e), 2000) or type(e).__name__
    for api, cli_words in API_WORDS:
        msg = msg.replace(api, cli_words)
    if getattr(e, "cli_hint", None):
        msg += f"; {e.cli_hint}"
    click.echo(f"fxmem: error: {msg}", err=True)
    sys.exit(e.code if isinstance(e, Exit) else exit_code(e))
