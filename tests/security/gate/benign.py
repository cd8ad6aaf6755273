"""Files as transformers, peft, Lightning, accelerate and DCP really write them (issue 27, class 7)."""

from __future__ import annotations

from pathlib import Path

from tests.security.corpus import Hostile


def build(folder: Path) -> list[Hostile]:
    return []
