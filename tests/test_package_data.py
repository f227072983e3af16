"""Every file fxmem reads from its own folder ships in the wheel: each non-Python file under
``fxmem/`` matches a ``[tool.setuptools.package-data]`` pattern of its package (a pip-installed
fxmem without the fake GPU's C sources could not build the stub)."""

import fnmatch
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data_files():
    for folder, dirs, files in os.walk(os.path.join(ROOT, "fxmem")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith((".py", ".pyc")):
                yield os.path.relpath(os.path.join(folder, name), ROOT)


def _shipped(path, package_data):
    parts = path.split(os.sep)
    for cut in range(1, len(parts)):
        package, rest = ".".join(parts[:cut]), "/".join(parts[cut:])
        if any(fnmatch.fnmatch(rest, pattern) for pattern in package_data.get(package, ())):
            return True
    return False


def test_every_data_file_is_package_data():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    files = sorted(_data_files())
    assert "fxmem/validate/fakegpu/stub.c" in files
    assert [f for f in files if not _shipped(f, package_data)] == []
