"""Headless Chromium (Debian's ``chromium`` package, which ``make test`` installs) opening an HTML report: the DOM
after its script ran, a screenshot, and every request the page made, read from Chromium's own network log.

The browser runs with a private profile, no background services, and every host name unresolvable, so nothing
leaves the machine even if a page asked; the network log still records the request, which is what a test checks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
TIMEOUT_S = 90


def chromium() -> str | None:
    """The browser on PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class Opened:
    dom: str
    """The document as the browser serialised it after loading the page and running its script."""
    requests: list[str]
    """URLs the page itself asked for (anything but ``file:``/``data:``), from the network log."""


def open_page(page: Path, *, screenshot: Path | None = None, width: int = 1280, height: int = 1600) -> Opened:
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("chromium")
    with tempfile.TemporaryDirectory(prefix="dtypecheck-chromium-") as scratch:
        netlog = Path(scratch) / "net.json"
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={scratch}/profile",
            f"--log-net-log={netlog}",
            f"--window-size={width},{height}",
        ]
        if screenshot is not None:
            command.append(f"--screenshot={screenshot}")
        command += ["--dump-dom", page.resolve().as_uri()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, cwd=scratch)
        if done.returncode != 0 or not done.stdout.strip():
            raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
        return Opened(done.stdout, page_requests(netlog))


def page_requests(netlog: Path) -> list[str]:
    """The URLs of the requests a page made (the browser's own, such as update checks, have no page as their
    site), except ``file:`` and ``data:`` ones."""
    log = json.loads(netlog.read_text(encoding="utf-8"))
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    found = []
    for event in log.get("events", ()):
        params = event.get("params") or {}
        if event.get("type") != start_job or "url" not in params:
            continue
        from_page = params.get("initiator") != "not an origin" or "site=file://" in params.get("site_for_cookies", "")
        if from_page and not str(params["url"]).startswith(("file:", "data:")):
            found.append(str(params["url"]))
    return found
