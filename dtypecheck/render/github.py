"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` annotation per finding."""

from __future__ import annotations

from dtypecheck.diagnostics import RULE_BY_ID, diagnostics

_COMMAND = {"fail": "error", "warn": "warning", "note": "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: object) -> str:
    return github_annotations(report)


def github_annotations(report: object) -> str:
    """One workflow command per diagnostic (with a baseline, only the new and worse ones)."""
    lines = []
    for d in diagnostics(report):
        properties = []
        if d.file:
            properties.append(f"file={_escape_property(d.file)}")
            if d.line:
                properties.append(f"line={d.line}")
        properties.append(f"title={_escape_property(f'{d.rule_id} {RULE_BY_ID[d.rule_id].name}')}")
        lines.append(f"::{_COMMAND[d.level]} {','.join(properties)}::{_escape_data(d.message)}")
    return "".join(line + "\n" for line in lines)
