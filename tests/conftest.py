import os
import sys
import warnings
import zlib

# inductor compiles in the process that asks, without its pool of compile workers (the
# children inherit it: the fake GPU's compiled steps): on these 2 cores the pool's processes,
# each importing torch, cost more than they save (a rank's compiled FSDP2 step on 2.14.1:
# 18.6 s to 12.5 s, the same figures). Before torch: inductor's config reads it at import
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=UserWarning)


@pytest.fixture(scope="session", autouse=True)
def _fake_gpu_children_forked():
    """The fake GPU's children are forked from a process per Python and environment that
    has imported torch (fxmem.validate.fakegpu.forkserver): each saves seconds of imports.
    tests/test_fake_gpu_forkserver.py checks they measure what children started afresh do."""
    from fxmem.validate.fakegpu.forkserver import forkserver

    with forkserver():
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _routes():
    """The kernels fxmem.trace.kernels.cuda.kernels replaces while it traces for CUDA."""
    return tuple(torch._C._dispatch_dump(f"aten::{n}")
                 for n in ("dropout", "scaled_dot_product_attention", "log_softmax.int",
                           "_fused_rms_norm", "lstm.input", "_cudnn_rnn",
                           "_thnn_fused_gru_cell"))


def _global_hooks(m):
    """How many entries each of nn.Module's global hook tables holds (a removed hook's
    with-kwargs flag left behind makes dynamo warn at every torch.compile(module) call)."""
    return tuple((n, len(v)) for n, v in sorted(vars(m).items())
                 if n.startswith("_global_") and "hooks" in n and isinstance(v, dict))


@pytest.fixture(autouse=True)
def _global_state_unchanged():
    """Every test, passing or failing, must leave PyTorch's global state as it found it."""
    from torch.nn.modules import module as m
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    before = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.clear_autocast_cache,
              torch._C._dispatch_dump("aten::softmax.int"), _routes(), torch.is_autocast_enabled("cpu"),
              len(_get_current_dispatch_mode_stack()), len(_get_current_function_mode_stack()),
              _global_hooks(m), sys.excepthook)
    yield
    after = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.clear_autocast_cache,
              torch._C._dispatch_dump("aten::softmax.int"), _routes(), torch.is_autocast_enabled("cpu"),
             len(_get_current_dispatch_mode_stack()), len(_get_current_function_mode_stack()),
             _global_hooks(m), sys.excepthook)
    assert after == before, "global state changed"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current output instead of comparing")


@pytest.fixture
def golden(request):
    """``golden(name, text)``: compare ``text`` with tests/golden/<name>, or rewrite it with
    ``pytest --update-golden``."""
    update = request.config.getoption("--update-golden")

    def check(name, text):
        path = os.path.join(os.path.dirname(__file__), "golden", name)
        if update:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return
        with open(path, encoding="utf-8") as f:
            expected = f.read()
        assert text == expected, (f"{name} differs from tests/golden/{name}; if the change is "
                                  "intended, run pytest --update-golden")

    return check


def pytest_configure(config):
    """Under pytest-xdist (the README's ``-n 2``) each worker runs one intra-op thread: two
    workers on two cores instead of four threads fighting over them (the bytes counted, live
    storages, do not depend on the thread count)."""
    if hasattr(config, "workerinput"):
        torch.set_num_threads(1)
    # the files in the order pytest_collection_modifyitems puts them (the longest first),
    # not xdist's (the most tests first)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # the process's first backward a plain one, before any test's own FakeTensorMode
    # backward: on a CUDA build, forked ranks (fxmem.measure(parallel=)) can then run
    # autograd (fxmem.trace.kernels.compat.plain_backward_first)
    from fxmem.trace.kernels.compat import plain_backward_first

    plain_backward_first()


def _slow_list() -> set[str]:
    from tiers import LIST

    return {line.strip() for line in LIST.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")}


# The fake GPU's parallel and compiled checks (a quarter of an hour in each CUDA build): CI
# runs each case on one of its two CUDA builds (marked ``newest_build`` or ``older_build``,
# ``-m "not older_build"`` on 2.15, ``-m "not newest_build"`` on 2.14.1), so that both builds
# run each kind of check and no case runs twice; run alone, every case runs.
SPLIT = frozenset({"tests/test_fake_gpu_parallel.py", "tests/test_fake_gpu_compile.py"})


def build_half(nodeid: str, params: dict, name: str, split_with=None) -> str | None:
    """The marker of the CUDA build CI runs a test of :data:`SPLIT` on (None for the others):
    by its case, its first string parameter (a case's tests share its measurement, so they
    stay together; else the test), or the case its module's ``SPLIT_WITH`` names for it (a
    case whose tests read another's figures), hashed, which splits the time about in half.

    >>> build_half("tests/test_fake_gpu_parallel.py::t[fsdp-8]", {"name": "fsdp", "B": 8}, "t")
    'newest_build'
    >>> build_half("tests/test_fake_gpu_parallel.py::t[x]", {"name": "x"}, "t", {"x": "fsdp"})
    'newest_build'
    >>> build_half("tests/test_cli.py::t", {}, "t") is None
    True
    """
    path = nodeid.split("::")[0]
    if path not in SPLIT:
        return None
    case = next((v for v in params.values() if isinstance(v, str)), name)
    case = (split_with or {}).get(case, case)
    return ("newest_build", "older_build")[zlib.crc32(f"{path}::{case}".encode()) % 2]


def pytest_collection_modifyitems(session, config, items):
    """Mark ``slow`` the tests tests/slow.txt lists (tests/tiers.py writes it from a measured
    run): the README's test command, run by CI, leaves them out with ``-m "not slow"``. Mark
    the fake GPU's parallel and compiled cases with the CUDA build CI runs them on
    (:func:`build_half`; a test a release skips is left to run where it runs). Put the
    files in the order tests/longest_first.py gives."""
    listed = _slow_list()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
        callspec = getattr(item, "callspec", None)
        own_skip = any(m.name == "skipif" for m in item.own_markers)  # one release's test
        half = None if own_skip else build_half(
            item.nodeid, callspec.params if callspec else {}, item.name.split("[")[0],
            getattr(getattr(item, "module", None), "SPLIT_WITH", None))
        if half:
            item.add_marker(getattr(pytest.mark, half))
    collected = {item.nodeid for item in items}
    files = {n.split("::")[0] for n in collected}
    config._fxmem_unknown_slow = {n for n in listed - collected if n.split("::")[0] in files}
    # the longest files first (tests/longest_first.py): xdist's workers end together
    import longest_first

    items[:] = [items[i] for i in longest_first.order([it.nodeid for it in items],
                                                      longest_first.read())]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The listed slow tests a run did not find in files it collected whole (renamed or
    removed: run tests/tiers.py again)."""
    unknown = getattr(config, "_fxmem_unknown_slow", set())
    if unknown and not config.getoption("keyword") and "::" not in " ".join(config.args):
        terminalreporter.write_line(f"tests/slow.txt lists {len(unknown)} tests that do not "
                                    f"exist, e.g. {sorted(unknown)[0]}: run tests/tiers.py")
