"""Compiled steps (issue 39): ``fxmem.analyze(torch.compile(model), ...)`` traces inductor's
own code (fxmem.trace.compiled), checked against the same compiled step run on the fake GPU
(tests/fakegpu_compile_targets.py: PyTorch alone). Each case is compiled once with B
dynamic at its ``compiled_at`` batch size, then run at two other batch sizes.

The measured runs load their graphs from inductor's cache, filled by one run before them in
a cache folder of this module's own: a process that compiles a graph cold can end with
another ``max_reserved`` (docs/compiled.md, "Not yet"), and which one a run is must not
depend on what an earlier run left in the machine's cache."""

import os
import sys

import pytest

from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))
# case -> (compiled at, the batch sizes checked); GPT-2 compiles for about a minute: in the
# slow tier (CI runs it on 2.14.1)
CASES = {"pointwise": (1024, (8, 512)), "gpt2": (64, (4, 32))}
_seen: dict = {}
_cache: list = []


def _call(fn, **kwargs):
    import tempfile

    from fxmem.validate.fakegpu.run import call

    if not _cache:
        _cache.append(tempfile.mkdtemp(prefix="fxmem_inductor_"))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=_cache[0])
    return call(sys.executable, f"fakegpu_compile_targets:{fn}", kwargs=kwargs,
                sys_path=[HERE], env=env)


def _figures(name, compile=True):
    """(predicted, measured): {B: {"max_allocated", "max_reserved"}}, once per case."""
    if (name, compile) not in _seen:
        at, batches = CASES[name]
        predicted = _call("predict", name=name, batches=list(batches), compiled_at=at,
                          compile=compile)
        _call("measure", name=name, B=at, compiled_at=at, compile=compile)  # fills the cache
        measured = {str(b): _call("measure", name=name, B=b, compiled_at=at, compile=compile)
                    for b in batches}
        _seen[name, compile] = predicted, measured
    return _seen[name, compile]


@pytest.mark.parametrize("name", ["pointwise",
                                  pytest.param("gpt2", marks=pytest.mark.slow)])
def test_compiled_step_is_exact_on_the_fake_gpu(name):
    predicted, measured = _figures(name)
    assert predicted == measured


def test_compiled_and_eager_steps_differ():
    """The case tells the two apart: at B=512 inductor's fused chain holds less than eager's
    outputs, and each prediction is its own step's."""
    compiled, eager = _figures("pointwise")[1], _figures("pointwise", compile=False)
    b = str(CASES["pointwise"][1][-1])
    assert compiled[b]["max_allocated"] < eager[1][b]["max_allocated"]
    assert eager[0] == eager[1]


def test_a_graph_break_is_named():
    """The eager code between two graphs would run unseen by the trace: refused, in one line
    naming dynamo's reason."""
    message = _call("graph_break")
    assert "graph break" in message and "fullgraph=True" in message and "\n" not in message
