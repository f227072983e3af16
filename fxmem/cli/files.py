"""The command's output files: checked before any work, written whole or not at all."""

from __future__ import annotations

import contextlib
import io
import os
import secrets

from ..errors import InputError


def check_out(path, option: str = "--out") -> None:
    """``--out``'s (``option``'s) folder exists and takes a new file, before any work."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"{option} {path} is a folder: give a file name")
    if not os.path.isdir(folder):
        raise InputError(f"{option} {path}: no such folder {folder}: create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: cannot write in {folder}")


def plain_text(renderable) -> str:
    """The table format's rich renderable as plain text (no colour codes), for a file."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None, force_terminal=False).print(renderable)
    return buf.getvalue()


def write_file(path: str, text: str) -> None:
    """``text`` into ``path`` whole or not at all: written to a new file beside it, then
    renamed over it (an error leaves no file, or the old one, never half of one)."""
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
