"""Compile ``stub.c`` into ``libcuda.so.1`` with gcc (no nvcc).

The stub is compiled against the CUDA headers of the Python environment it is meant for
(the ``nvidia`` wheels a CUDA build of PyTorch installs), because struct layouts such as
``cudaDeviceProp`` belong to that CUDA version.  Those wheels may lack the ``crt/``
internal headers that ``cuda_runtime_api.h`` includes; they are then taken from triton's
bundled copy or, last, from a CUDA toolkit.  When the environment's cuDNN wheel has its
headers (``nvidia/cudnn/include``), ``cudnn_stub.c`` is compiled into the same library, so
the one preloaded object also answers cuDNN; likewise ``nccl_stub.c`` when its NCCL wheel
has ``nccl.h`` (``nvidia/nccl/include``), for ProcessGroupNCCL.  Results are cached under
``out_dir`` by a hash of the sources, the headers used and the compiler command.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

STUB_SOURCE = Path(__file__).with_name("stub.c")
#: the cuDNN entry points, compiled into the same library when cuDNN's headers are found
CUDNN_SOURCE = Path(__file__).with_name("cudnn_stub.c")
#: the NCCL entry points, compiled in when NCCL's header is found
NCCL_SOURCE = Path(__file__).with_name("nccl_stub.c")
LIB_NAME = "libcuda.so.1"
HOOK_SOURCE = Path(__file__).with_name("alloc_hook.cpp")
#: beside the stub: zeroes each block the caching allocator hands out (stub.c, _child.py)
HOOK_NAME = "libfakegpu_hook.so"

#: headers whose contents decide the binary (struct layouts, enum values, versions)
_KEY_HEADERS = ("cuda.h", "cuda_runtime_api.h", "driver_types.h", "cublas_api.h",
                "cudnn_version.h", "cudnn_graph_v9.h", "nccl.h")


def site_packages(python_exe: str | os.PathLike | None = None) -> list[Path]:
    """The site-packages folders of ``python_exe`` (default: this interpreter)."""
    if python_exe is None or os.path.abspath(python_exe) == os.path.abspath(sys.executable):
        import site
        import sysconfig

        dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    else:
        code = (
            "import sysconfig, site, json; p = sysconfig.get_paths();"
            "print(json.dumps([p['purelib'], p['platlib']] + site.getsitepackages()))"
        )
        out = subprocess.run(
            [str(python_exe), "-c", code], check=True, capture_output=True, text=True
        ).stdout
        import json

        dirs = json.loads(out.strip().splitlines()[-1])
    seen: list[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen


def _toolkit_include_dirs() -> list[Path]:
    cands = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(Path(nvcc).resolve().parent.parent / "include")
    cands.append(Path("/usr/local/cuda/include"))
    cands += [Path(p) for p in sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)]
    return [c for c in cands if (c / "cuda.h").is_file()]


def find_include_dirs(python_exe: str | os.PathLike | None = None) -> list[Path]:
    """Include path for the stub: the venv's CUDA headers first, then a ``crt/`` provider."""
    sites = site_packages(python_exe)
    main: list[Path] = []
    for sp in sites:
        for pattern in ("nvidia/cu1*/include", "nvidia/cuda_runtime/include", "nvidia/*/include"):
            for d in sorted(glob.glob(str(sp / pattern))):
                p = Path(d)
                has = (p / "cuda.h").is_file() and (p / "cuda_runtime_api.h").is_file()
                if has and p not in main:
                    main.append(p)
    if not main:
        main = _toolkit_include_dirs()[:1]
    if not main:
        raise FileNotFoundError(
            "no CUDA headers (cuda.h, cuda_runtime_api.h) found in the nvidia wheels of "
            f"{python_exe or sys.executable} nor in a CUDA toolkit"
        )
    dirs = [main[0]]
    if not (main[0] / "crt" / "host_defines.h").is_file():
        crt = [Path(sp) / "triton/backends/nvidia/include" for sp in sites]
        crt += _toolkit_include_dirs()
        # any venv's triton copy will do: crt/ holds only compiler macros
        crt += [Path(p).parent.parent for p in glob.glob(str(
            Path(sys.prefix).parent / "*/lib/python3*/site-packages"
            / "triton/backends/nvidia/include/crt/host_defines.h"))]
        for c in crt:
            if (c / "crt" / "host_defines.h").is_file():
                dirs.append(c)
                break
        else:
            raise FileNotFoundError("no crt/host_defines.h found (triton or a CUDA toolkit)")
    return dirs


def find_cudnn_include_dir(python_exe: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``cudnn.h`` in ``python_exe``'s ``nvidia`` wheels (the cuDNN that
    its PyTorch loads), or None: the stub then leaves cuDNN to the real library."""
    for sp in site_packages(python_exe):
        for d in sorted(glob.glob(str(sp / "nvidia/cudnn/include"))) + sorted(
                glob.glob(str(sp / "nvidia/cu1*/include"))):
            if (Path(d) / "cudnn.h").is_file() and (Path(d) / "cudnn_graph.h").is_file():
                return Path(d)
    return None


def find_nccl_include_dir(python_exe: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``nccl.h`` in ``python_exe``'s ``nvidia`` wheels (the NCCL its
    PyTorch loads), or None: the stub then leaves NCCL to the real library."""
    for sp in site_packages(python_exe):
        for d in sorted(glob.glob(str(sp / "nvidia/nccl/include"))) + sorted(
                glob.glob(str(sp / "nvidia/cu1*/include"))):
            if (Path(d) / "nccl.h").is_file():
                return Path(d)
    return None


def _cublas_version(include_dirs: list[Path]) -> int:
    for d in include_dirs:
        f = d / "cublas_api.h"
        if f.is_file():
            text = f.read_text(errors="replace")
            parts = []
            for key in ("MAJOR", "MINOR", "PATCH"):
                m = re.search(rf"#define\s+CUBLAS_VER_{key}\s+(\d+)", text)
                if not m:
                    break
                parts.append(int(m.group(1)))
            if len(parts) == 3:
                return parts[0] * 10000 + parts[1] * 100 + parts[2]
    return 130000


def build(
    out_dir: str | os.PathLike,
    python_exe: str | os.PathLike | None = None,
    include_dirs: list[str | os.PathLike] | None = None,
    cc: str = "gcc",
) -> Path:
    """Compile the stub (and, with cuDNN's or NCCL's headers, their stubs) for ``python_exe``'s CUDA
    headers; return the path of libcuda.so.1.

    The library lands in ``out_dir/<hash>/libcuda.so.1`` (with a ``libcuda.so`` link beside
    it, for triton); an existing build with the same hash is reused.
    """
    incs = [Path(d) for d in include_dirs] if include_dirs else find_include_dirs(python_exe)
    sources = [STUB_SOURCE]
    if include_dirs:  # cuDNN is stubbed if the given folders hold its headers
        cudnn_inc = next((d for d in incs if (d / "cudnn_graph.h").is_file()), None)
    else:
        cudnn_inc = find_cudnn_include_dir(python_exe)
    if cudnn_inc is not None:
        sources.append(CUDNN_SOURCE)
        if cudnn_inc not in incs:
            incs = incs + [cudnn_inc]
    if include_dirs:
        nccl_inc = next((d for d in incs if (d / "nccl.h").is_file()), None)
    else:
        nccl_inc = find_nccl_include_dir(python_exe)
    if nccl_inc is not None:
        sources.append(NCCL_SOURCE)
        if nccl_inc not in incs:
            incs = incs + [nccl_inc]
    blas_ver = _cublas_version(incs)
    cmd_tail = [
        "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wno-deprecated-declarations",
        f"-DFAKEGPU_CUBLAS_VERSION={blas_ver}",
        *[f"-I{d}" for d in incs],
        "-Wl,-soname," + LIB_NAME,
        "-ldl",
    ]
    h = hashlib.sha256()
    for src in sources:
        h.update(src.read_bytes())
    h.update(" ".join([cc] + cmd_tail).encode())
    for name in _KEY_HEADERS:
        for d in incs:
            f = d / name
            if f.is_file():
                h.update(f.read_bytes())
                break
    torch_dir = next((sp / "torch" for sp in site_packages(python_exe)
                      if (sp / "torch/include/c10/cuda/CUDACachingAllocator.h").is_file()), None)
    if torch_dir is not None:
        h.update(HOOK_SOURCE.read_bytes())
        h.update((torch_dir / "include/c10/cuda/CUDACachingAllocator.h").read_bytes())
    key = h.hexdigest()[:16]
    dest_dir = Path(out_dir) / key
    lib = dest_dir / LIB_NAME
    if lib.is_file():
        return lib
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / f".{LIB_NAME}.{os.getpid()}.tmp"
    cmd = [cc, *[str(s) for s in sources], "-o", str(tmp), *cmd_tail]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the fake-GPU stub failed:\n{' '.join(cmd)}\n{res.stderr}")
    if torch_dir is not None:
        _build_hook(dest_dir, torch_dir, incs)
    _link_unversioned(dest_dir, tmp)  # first: a build found by its library has its link
    os.replace(tmp, lib)
    return lib


def _link_unversioned(dest_dir: Path, built: Path) -> None:
    """``libcuda.so`` beside ``libcuda.so.1`` (triton opens the unversioned name): a link, or a
    copy of ``built`` where links are refused, made under a name of this process's own and
    renamed into place, so processes building the same stub at once each succeed (pytest-xdist's
    workers do)."""
    tmp = dest_dir / f".libcuda.so.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(LIB_NAME)
    except OSError:
        shutil.copyfile(built, tmp)
    os.replace(tmp, dest_dir / "libcuda.so")


def _build_hook(dest_dir: Path, torch_dir: Path, incs, cxx: str = "g++") -> None:
    """``alloc_hook.cpp`` against the target torch's own headers and c10 libraries."""
    tmp = dest_dir / f".{HOOK_NAME}.{os.getpid()}.tmp"
    lib_dir = torch_dir / "lib"
    cmd = [cxx, str(HOOK_SOURCE), "-o", str(tmp), "-O1", "-fPIC", "-shared", "-std=c++20",
           "-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{torch_dir / 'include'}", *[f"-I{d}" for d in incs],
           f"-L{lib_dir}", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{lib_dir}", "-ldl"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the fake-GPU allocation hook failed:\n{' '.join(cmd)}\n"
                           f"{res.stderr[-4000:]}")
    os.replace(tmp, dest_dir / HOOK_NAME)
