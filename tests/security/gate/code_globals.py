"""Globals that run code under torch.load, however they are reached (issue 27, class 1)."""

from __future__ import annotations

from pathlib import Path

from tests.security.corpus import Hostile


def build(folder: Path) -> list[Hostile]:
    return []
