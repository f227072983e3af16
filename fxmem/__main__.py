"""``python -m fxmem``: the same command as ``fxmem`` (see :mod:`fxmem.cli`)."""

from .cli.entry import run

if __name__ == "__main__":
    run()
