"""``fxmem.validate.fakegpu.build``'s cache folder when processes build the same stub at once
(pytest-xdist's workers do): the compiler is stood in for, so this runs on any build of torch."""

import importlib
import os
import subprocess

import pytest

# the module (the package's ``build`` is its function)
fakegpu_build = importlib.import_module("fxmem.validate.fakegpu.build")


@pytest.fixture
def compiled_as_a_file(monkeypatch):
    """gcc and g++ stood in for: the ``-o`` file is written, nothing compiled."""

    def run(cmd, **kwargs):
        out = cmd[cmd.index("-o") + 1]
        with open(out, "wb") as f:
            f.write(b"stub")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fakegpu_build.subprocess, "run", run)


@pytest.fixture
def headers(tmp_path):
    """An empty include folder: no CUDA header is read (the compiler is stood in for)."""
    folder = tmp_path / "include"
    folder.mkdir()
    return folder


def _build(out_dir, headers):
    return fakegpu_build.build(out_dir, include_dirs=[headers])


def test_a_build_meeting_the_link_another_process_made_succeeds(tmp_path, headers,
                                                                compiled_as_a_file,
                                                                monkeypatch):
    """Another process building the same stub puts ``libcuda.so`` in place (a link to
    ``libcuda.so.1``) just before this one makes its own: the folder's link is that one, or
    this one's put over it, and the build returns its library."""
    real_symlink = os.symlink

    def symlink(src, dst, *args, **kwargs):
        other = os.path.join(os.path.dirname(dst), "libcuda.so")
        if not os.path.lexists(other):
            real_symlink(fakegpu_build.LIB_NAME, other)
        real_symlink(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "symlink", symlink)
    lib = _build(tmp_path / "cache", headers)
    assert lib.is_file() and (lib.parent / "libcuda.so").resolve() == lib.resolve()


def test_a_library_found_in_the_cache_has_its_link_beside_it(tmp_path, headers,
                                                             compiled_as_a_file, monkeypatch):
    """The link is in place before the library is: a process that finds the library (and so
    does not build) finds the link too."""
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        if os.fspath(dst).endswith(fakegpu_build.LIB_NAME):
            seen.append(os.path.lexists(os.path.join(os.path.dirname(dst), "libcuda.so")))
        real_replace(src, dst)

    monkeypatch.setattr(fakegpu_build.os, "replace", replace)
    _build(tmp_path / "cache", headers)
    assert seen == [True]


def test_processes_building_at_once_each_return_the_library(tmp_path, headers,
                                                            compiled_as_a_file):
    """Eight processes forked together build the same stub: each returns it, and nothing of
    theirs is left in the folder but the library, its link and (where torch has its headers)
    the hook."""
    lib = _build(tmp_path / "probe", headers)
    pids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:  # the child: exit 0 if its build returned the same library
            code = 1
            try:
                code = 0 if _build(tmp_path / "cache", headers).name == lib.name else 2
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes == [0] * 8
    folder = tmp_path / "cache" / lib.parent.name
    names = {p.name for p in folder.iterdir()}
    assert names - {fakegpu_build.HOOK_NAME} == {fakegpu_build.LIB_NAME, "libcuda.so"}
