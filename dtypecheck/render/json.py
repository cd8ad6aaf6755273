"""JSON rendering: one document, non-finite floats as strings, every other float round-trips (repr)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

from dtypecheck import __version__


def jsonable(value: Any) -> Any:
    """Convert a result tree of frozen dataclasses, tuples and mappings into JSON-ready values."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def document(report: Any) -> dict[str, Any]:
    body = jsonable(report)
    if not isinstance(body, dict):
        raise TypeError("a report must be a dataclass")
    return {"schema": report.SCHEMA, "dtypecheck_version": __version__, **body}


def render_json(report: Any) -> str:
    return json.dumps(document(report), indent=2, allow_nan=False) + "\n"
