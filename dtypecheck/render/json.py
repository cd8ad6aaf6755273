"""JSON rendering: one document, non-finite floats as strings, every other float round-trips (repr)."""

from __future__ import annotations

import json
from typing import Any

from dtypecheck.output import document, jsonable

__all__ = ["document", "jsonable", "render_json"]


def render_json(report: Any) -> str:
    return json.dumps(document(report), indent=2, allow_nan=False) + "\n"
