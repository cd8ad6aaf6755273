"""Inputs that once hung: reads must be linear and bounded (issue 27, class 5)."""

from __future__ import annotations

from pathlib import Path

from tests.security.corpus import Hostile


def build(folder: Path) -> list[Hostile]:
    return []
