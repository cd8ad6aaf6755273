"""Inputs that once gave dtypecheck's own traceback (issue 27, class 6)."""

from __future__ import annotations

from pathlib import Path

from tests.security.corpus import Hostile


def build(folder: Path) -> list[Hostile]:
    return []
