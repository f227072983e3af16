"""``python -m fxmem.validate``: the same command as ``fxmem validate`` (an entry point, like
``fxmem/__main__.py``: the one place the validation package reaches up to :mod:`fxmem.cli`)."""

import sys

from ..cli import main

if __name__ == "__main__":
    main(["validate", *sys.argv[1:]])
