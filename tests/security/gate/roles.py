"""Numbers hidden behind a bookkeeping name (issue 27, class 4)."""

from __future__ import annotations

from pathlib import Path

from tests.security.corpus import Hostile


def build(folder: Path) -> list[Hostile]:
    return []
