"""The browser the dashboard test drives: a Chromium found on this machine, else Debian's package
installed once, so `python -m pytest` on a fresh machine needs no step of its own.

Playwright's own browser download reaches a CDN that a closed network refuses; Debian's mirrors
are what CI and a fresh machine can reach. Installing needs root (or password-less sudo) and
apt-get; where neither exists, the failure says what to install.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def _apt(*args: str) -> list[str]:
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    return [*prefix, "apt-get", *args]


def chromium() -> str:
    """A Chromium executable; installs Debian's `chromium` package when none is found."""
    found = find_chromium()
    if found:
        return found
    if shutil.which("apt-get") is None or (os.geteuid() != 0 and shutil.which("sudo") is None):
        raise RuntimeError("the dashboard test needs Chromium: install your system's chromium package")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (_apt("update", "-qq"), _apt("install", "-y", "-qq", "chromium")):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"installing chromium failed ({' '.join(cmd)}): {tail}")
    found = find_chromium()
    if not found:
        raise RuntimeError("chromium was installed but is not on PATH")
    return found


@contextlib.contextmanager
def page_at(url: str, width: int = 1400, height: int = 1000) -> Iterator[tuple[Any, list[str]]]:
    """A headless Chromium page (driven by Playwright) opened at `url`, and the list the page's
    uncaught JavaScript errors are collected in."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            yield page, errors
        finally:
            browser.close()
