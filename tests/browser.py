"""A headless Chromium for the tests that look at the HTML report as a person would
(tests/test_html.py, tests/test_html_browser.py): where it is, and installing Debian's
``chromium`` package when it is missing (as root on Debian only).

Under ``CI`` a missing browser fails the tests that need one instead of skipping them, so a
CI run can never pass with its browser tests silently skipped."""

import os
import shutil
import subprocess

import pytest

# the real binary first: Debian's /usr/bin/chromium is a shell script that starts it
PATHS = ("/usr/lib/chromium/chromium",)
COMMANDS = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    """The path of a Chromium binary: ``$FXMEM_CHROMIUM``, Debian's, or one on ``PATH``."""
    given = os.environ.get("FXMEM_CHROMIUM")
    if given and os.access(given, os.X_OK):
        return given
    for path in PATHS:
        if os.access(path, os.X_OK):
            return path
    return next(filter(None, map(shutil.which, COMMANDS)), None)


def apt_install_chromium() -> None:
    """``apt-get install chromium`` (after ``apt-get update`` if the first try fails), quietly
    and with a time limit; only as root on Debian."""
    if getattr(os, "geteuid", lambda: -1)() != 0 or not os.path.exists("/etc/debian_version") \
            or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "chromium"]
    for cmd in (install, ["apt-get", "update", "-q"], install):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
        except (subprocess.TimeoutExpired, OSError):
            return
        if cmd is install and done.returncode == 0:
            return


def require_chromium() -> str:
    """A Chromium binary, installed if need be; without one the test is skipped, or fails
    under ``CI``."""
    exe = find_chromium()
    if exe is None:
        apt_install_chromium()
        exe = find_chromium()
    if exe is None:
        missing("no headless browser: none of chromium, chromium-browser, google-chrome is "
                "on PATH, and `apt-get install chromium` was not possible here")
    return exe


def missing(why: str) -> None:
    """Skip the test, or fail it under ``CI`` (where the browser tests must run)."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set, so the browser tests must run)")
    pytest.skip(why)
