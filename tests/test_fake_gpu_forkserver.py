"""Fake-GPU children forked from a server that imported torch
(:mod:`fxmem.validate.fakegpu.forkserver`, which tests/conftest.py opens for the whole run)
measure what children started afresh measure, see what they see and end as they end."""

import os
import subprocess
import sys

import pytest

from fakegpu_marks import FAKE_GPU
from fxmem.validate.fakegpu import measure_step
from fxmem.validate.fakegpu.forkserver import ForkServerError, forkserver
from fxmem.validate.fakegpu.ranks import call_ranks
from fxmem.validate.fakegpu.run import FakeGPUError, call

pytestmark = FAKE_GPU
HERE = os.path.dirname(os.path.abspath(__file__))


def _both(fn):
    """``fn()`` with children started afresh, then forked (the run's servers)."""
    with forkserver(enabled=False):
        afresh = fn()
    return afresh, fn()


def _figures(r):
    return {k: v for k, v in r.raw.items() if k != "seconds"}


def test_a_step_measured_in_a_forked_child_is_one_measured_afresh():
    afresh, forked = _both(lambda: measure_step(sys.executable, "fakegpu_targets:mlp",
                                                kwargs={"B": 64}, sys_path=[HERE]))
    assert _figures(forked) == _figures(afresh)
    assert afresh.max_reserved > afresh.max_allocated > afresh.baseline_allocated > 0


def test_a_compiled_step_measured_in_a_forked_child_is_one_measured_afresh(tmp_path):
    """Inductor imported by the server: a graph loaded from the cache a run filled gives the
    figures it gives a child that imports inductor itself."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    kw = {"name": "pointwise", "compiled_at": 1024, "batches": [8, 512]}

    def each(fn):
        return call(sys.executable, f"fakegpu_compile_targets:{fn}", kwargs=kw,
                    sys_path=[HERE], env=env)

    each("measure_each")  # fills the cache
    afresh, forked = _both(lambda: each("measure_each"))
    assert forked == afresh
    assert afresh["512"]["max_reserved"] > afresh["8"]["max_reserved"] > 0


def test_ranks_forked_measure_what_ranks_started_afresh_do():
    afresh, forked = _both(lambda: call_ranks(
        sys.executable, "fakegpu_parallel_targets:measure_each", 2,
        kwargs={"name": "fsdp", "batches": [4, 16]}, sys_path=[HERE]))
    assert forked == afresh
    assert [r["16"]["rank"] for r in afresh] == [0, 1]


def test_a_forked_child_sees_its_own_environment_folder_and_arguments(tmp_path, monkeypatch):
    call(sys.executable, "fakegpu_forkserver_targets:server_pid", sys_path=[HERE])
    monkeypatch.chdir(tmp_path)  # (the server started in another folder)
    names = ["RANK", "WORLD_SIZE", "FAKEGPU_NCCL_DIR", "LD_PRELOAD", "FXMEM_FAKE_GPU"]
    afresh, forked = _both(lambda: call_ranks(
        sys.executable, "fakegpu_forkserver_targets:seen", 2, kwargs={"names": names},
        sys_path=[HERE]))
    for a, f in zip(afresh, forked):
        nccl = "FAKEGPU_NCCL_DIR"
        assert (a["env"][nccl] is None) == (f["env"][nccl] is None) is False
        assert {**f, "env": {**f["env"], nccl: 0}} == {**a, "env": {**a["env"], nccl: 0}}
    assert [r["env"]["RANK"] for r in forked] == ["0", "1"]
    assert forked[0]["cwd"] == str(tmp_path) and forked[0]["stdin"] == os.devnull


@pytest.mark.parametrize("how, code", [("exit 5", 5), ("segv", -11)])
def test_a_forked_child_ends_with_its_own_exit_code_or_signal(how, code):
    """As :class:`subprocess.Popen` reports a child started afresh: the code it exited
    with, or minus the signal that ended it."""
    with pytest.raises(FakeGPUError, match=rf"^the fake-GPU child produced no result "
                                           rf"\(exit code {code}\)"):
        call(sys.executable, "fakegpu_forkserver_targets:ends", kwargs={"how": how},
             sys_path=[HERE])


def test_a_forked_child_past_its_timeout_is_killed(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        call(sys.executable, "fakegpu_forkserver_targets:ends", timeout=3,
             kwargs={"how": "hang", "pid_file": str(pid_file)}, sys_path=[HERE])
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_the_servers_end_with_their_block():
    with forkserver():
        first = call(sys.executable, "fakegpu_forkserver_targets:server_pid", sys_path=[HERE])
        again = call(sys.executable, "fakegpu_forkserver_targets:server_pid", sys_path=[HERE])
        assert again == first != os.getpid()  # one server, forked from twice
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)


def test_a_server_that_cannot_import_its_preloads_says_so():
    with forkserver(preload=("no_such_module_here",)), pytest.raises(
            ForkServerError, match=r"did not start:(.|\n)*No module named "
                                   r"'no_such_module_here'"):
        call(sys.executable, "fakegpu_forkserver_targets:server_pid", sys_path=[HERE])
