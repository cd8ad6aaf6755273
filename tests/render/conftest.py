"""One real run of each command on its tiny input (``tests/_documents.py``), keeping the report object the CLI
rendered, so that its HTML page and its JSON document describe the same run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dtypecheck.render import OutputFormat, render


@dataclass(frozen=True)
class Run:
    folder: Path
    report: Any
    document: dict[str, Any]
    html: str


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    import json

    from tests._documents import EXIT_CODES, command_args, run_json

    folder = tmp_path_factory.mktemp("html-runs")
    seen: list[Any] = []

    def spy(report: Any, fmt: OutputFormat, **kwargs: Any) -> str:
        seen.append(report)
        return render(report, fmt, **kwargs)

    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dtypecheck.cli._app.render", spy)
        for command, args in command_args(folder).items():
            code, document = run_json(args)
            assert code == EXIT_CODES[command], command
            report = seen[-1]
            assert json.loads(render(report, OutputFormat.json))["schema"] == document["schema"]
            found[command] = Run(folder, report, document, render(report, OutputFormat.html))
    return found
