"""The PyTorch releases fxmem says it works with (issue 37): a release no test ran on is a
one-line warning at import, a tested one says nothing."""

import subprocess
import sys

import torch

from fxmem.trace.kernels.compat import TESTED, TORCH, untested_release


def _import_fxmem_as(version: str) -> str:
    code = f"import torch; torch.__version__ = {version!r}; import fxmem"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True).stderr


def test_the_running_release_is_tested():
    assert TORCH in TESTED and untested_release() is None, torch.__version__


def test_an_untested_release_warns_once_at_import():
    err = _import_fxmem_as("2.16.0")
    assert err.count("fxmem has not been tested with torch 2.16.0") == 1
    assert "(tested: 2.13, 2.14, 2.15): its predictions may be off" in err
    assert _import_fxmem_as("2.15.1+cu132") == ""


def test_the_declared_range_starts_at_the_oldest_tested():
    import os
    import re

    text = open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")).read()
    low = re.search(r'"torch>=(\d+)\.(\d+)"', text)
    assert low and (int(low[1]), int(low[2])) == min(TESTED)
    assert not re.search(r'"torch[^"]*<', text), "no upper bound without a known break"
