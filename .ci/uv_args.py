"""Print the arguments that make ``uv pip install`` see the same packages ``pip install`` would on this machine.

uv does not read pip's configuration (``pip.conf``, ``PIP_*`` variables). This machine's index, extra indexes,
local wheel folders and constraints (the CPU torch build on disk, its version cap) live there, so the Makefile
passes them on: ``uv pip install $(python .ci/uv_args.py) -r requirements-dev.txt``. A local index or folder
that does not exist is left out (pip only warns about it; uv would stop). Standard library only: it runs before
anything is installed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
"""pip's option name -> uv's, for each option that decides which packages are found."""


def _pip_config() -> dict[str, list[str]]:
    """Each option's values from ``pip config list`` (files, then ``PIP_*`` variables: pip's own precedence)."""
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    found: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in OPTIONS and value:
            found[name] = shlex.split(value.strip().strip("'\""))
    for name in OPTIONS:
        variable = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if variable:
            found[name] = variable.split()
    return found


def _usable(value: str) -> bool:
    parsed = urlparse(value)
    if parsed.scheme in ("http", "https"):
        return True
    path = parsed.path if parsed.scheme == "file" else value
    return Path(path).exists()


def uv_args() -> list[str]:
    # pip takes the best version from all indexes together; uv by default only looks at the first index that
    # lists a package (this machine's local extra index lists typer, at other versions).
    args = ["--index-strategy", "unsafe-best-match"]
    for name, values in _pip_config().items():
        usable = [value for value in values if _usable(value)]
        if name == "index-url":
            usable = usable[:1]
        for value in usable:
            args += [OPTIONS[name], value]
    return args


if __name__ == "__main__":
    print(shlex.join(uv_args()))
