"""``python -m fxmem``: the same command as ``fxmem`` (see :mod:`fxmem.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
