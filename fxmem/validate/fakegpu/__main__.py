"""``python -m fxmem.validate.fakegpu build OUT_DIR [PYTHON]``: compile the stub, print its path.
``python -m fxmem.validate.fakegpu run PYTHON module:function [JSON_KWARGS]``: measure a step."""

import json
import sys

from .build import build
from .run import measure_step


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "build":
        print(build(argv[1], argv[2] if len(argv) > 2 else None))
    elif len(argv) >= 3 and argv[0] == "run":
        kw = json.loads(argv[3]) if len(argv) > 3 else {}
        r = measure_step(argv[1], argv[2], kwargs=kw)
        print(json.dumps({k: v for k, v in r.__dict__.items() if k != "raw"}))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
