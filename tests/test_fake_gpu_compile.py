"""Compiled steps (issue 39): ``fxmem.analyze(torch.compile(model), ...)`` traces inductor's
own code (fxmem.trace.compiled), checked against the same compiled step run on the fake GPU
(tests/fakegpu_compile_targets.py: PyTorch alone). Compiled once with B dynamic at
``COMPILED_AT``, then run at two other batch sizes."""

import os
import sys

import pytest

from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))
COMPILED_AT, BATCHES = 1024, (8, 512)


def _call(fn, **kwargs):
    from fxmem.validate.fakegpu.run import call

    return call(sys.executable, f"fakegpu_compile_targets:{fn}", kwargs=kwargs,
                sys_path=[HERE])


@pytest.fixture(scope="module")
def figures():
    predicted = {c: _call("predict", batches=list(BATCHES), compiled_at=COMPILED_AT,
                          compile=c) for c in (True, False)}
    measured = {c: {str(b): _call("measure", B=b, compiled_at=COMPILED_AT, compile=c)
                    for b in BATCHES} for c in (True, False)}
    return predicted, measured


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("kind", ["max_allocated", "max_reserved"])
def test_compiled_step_is_exact_on_the_fake_gpu(figures, B, kind):
    predicted, measured = figures
    assert predicted[True][str(B)][kind] == measured[True][str(B)][kind]


def test_compiled_and_eager_steps_differ(figures):
    """The case tells the two apart: at B=512 inductor's fused chain holds less than eager's
    outputs, and each prediction is its own step's."""
    predicted, measured = figures
    b = str(BATCHES[-1])
    assert measured[True][b]["max_allocated"] < measured[False][b]["max_allocated"]
    assert predicted[False][b] == measured[False][b]


def test_a_graph_break_is_named():
    """The eager code between two graphs would run unseen by the trace: refused, in one line
    naming dynamo's reason."""
    message = _call("graph_break")
    assert "graph break" in message and "fullgraph=True" in message and "\n" not in message
