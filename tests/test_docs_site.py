"""The docs site (mkdocs, built by ``make docs`` in ``make test``) and the README: every console example is either
generated at build time by ``docs/hooks/examples.py`` or checked here (or by the test named for it), and each
command's page lists every option the command has.

``pytest tests/test_docs_site.py --overwrite-golden`` rewrites the README's examples from a real run.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import typer

from dtypecheck.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMMANDS = ("info", "scan-model", "nan-trace", "estimate-memory")
CHECKED_ELSEWHERE = {
    "ci.md": "tests/scan/test_ci_flow.py::test_the_readme_baseline_commands_work_verbatim_with_the_readme_config",
}
"""Pages whose console block runs in another test (the CI guide's baseline commands, verbatim)."""
RUN_END_TO_END = {"walkthrough.md": "tests/test_walkthrough.py::test_the_walkthrough_runs_end_to_end"}
"""Pages whose console blocks, commands and the output shown, are run in order and compared by another test: a
walk-through's steps depend on each other (files written, checkpoints made), which the build's one-command
examples cannot show."""
README_BLOCK = re.compile(r"<!-- dtypecheck-run(-exit)?: (dtypecheck [^\n]*?) -->\n```console\n(.*?)```\n", re.DOTALL)


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dtypecheck_docs_hook", DOCS / "hooks" / "examples.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_mkdocs_lists_every_page_and_runs_the_example_hook() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["strict"] is True
    assert config["hooks"] == ["docs/hooks/examples.py"]

    def listed(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [page for item in nav for page in listed(item)]
        if isinstance(nav, dict):
            return [page for item in nav.values() for page in listed(item)]
        return []

    assert sorted(listed(config["nav"])) == sorted(p.relative_to(DOCS).as_posix() for p in _pages())


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_no_page_holds_a_console_example_of_its_own(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    own = re.findall(r"```console\n(.*?)```", text, re.DOTALL)
    if page.name in RUN_END_TO_END:
        assert own, page
        return
    if page.name in CHECKED_ELSEWHERE:
        assert len(own) == 1, page
        assert all(line.startswith("$ dtypecheck") for line in own[0].splitlines() if line.strip())
        return
    assert own == [], f"{page.name}: write <!-- dtypecheck-run: ... --> instead, so the build makes the output"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_page_lists_every_option(command: str) -> None:
    page = (DOCS / "commands" / f"{command}.md").read_text(encoding="utf-8")
    assert f"<!-- dtypecheck-options: {command} -->" in page
    assert re.search(r"<!-- dtypecheck-run(-exit)?: dtypecheck " + re.escape(command) + r"\b", page), command
    table = _hook().options_table(command)
    params = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    for param in params:
        for name in getattr(param, "opts", []):
            if name.startswith("-"):
                assert f"`{name}" in table, (command, name)
    assert table.count("\n") == len(params) + 1  # a header, a rule, a row per parameter


def test_the_hook_writes_files_and_shows_the_real_output(tmp_path: Path, cli, monkeypatch) -> None:
    hook = _hook()
    page = (
        "<!-- dtypecheck-file: step.py -->\n```python\nimport torch\ny = torch.log(torch.zeros(2) - 1)\n```\n\n"
        "<!-- dtypecheck-run-exit: dtypecheck nan-trace step.py -->\n\n<!-- dtypecheck-run: dtypecheck info e8m0 -->\n"
    )
    expanded = hook.expand(page, tmp_path)
    assert (tmp_path / "step.py").read_text() == "import torch\ny = torch.log(torch.zeros(2) - 1)\n"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    traced = cli("nan-trace", "step.py")
    info = cli("info", "e8m0")
    assert traced.exit_code == 1  # log(-1) is NaN
    assert f"```console\n$ dtypecheck nan-trace step.py\n{traced.stdout.rstrip()}\n$ echo $?\n1\n```" in expanded
    assert f"```console\n$ dtypecheck info e8m0\n{info.stdout.rstrip()}\n```" in expanded


def test_the_readme_is_a_five_minute_read_with_links_to_the_site() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300  # it was 1,128: the manual moved to docs/
    for page in ("docs/commands/scan-model.md", "docs/ci.md", "docs/json.md", "docs/reports.md", "docs/api.md"):
        assert f"({page})" in readme, page


def test_the_readme_examples_are_what_the_commands_print(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    hook = _hook()
    import shutil

    try:
        shutil.copytree(hook._base_folder(), tmp_path, dirs_exist_ok=True)
    finally:
        hook.on_post_build()  # the hook's scratch inputs, made for this test alone
    path = ROOT / "README.md"
    readme = path.read_text(encoding="utf-8")
    for match in hook.FILE.finditer(readme):
        (tmp_path / match.group(1)).write_text(match.group(2), encoding="utf-8")
    found = README_BLOCK.findall(readme)
    assert len(found) >= len(COMMANDS)

    def generated(match: re.Match[str]) -> str:
        code, output = hook.run_example(match.group(2), tmp_path)
        shown = f"$ {match.group(2)}\n{output}"
        if match.group(1):
            shown += f"$ echo $?\n{code}\n"
        return f"<!-- dtypecheck-run{match.group(1) or ''}: {match.group(2)} -->\n```console\n{shown.rstrip()}\n```\n"

    expected = README_BLOCK.sub(generated, readme)
    if request.config.getoption("--overwrite-golden"):
        path.write_text(expected, encoding="utf-8")
    assert readme == expected, (
        "README examples differ from a real run; pytest tests/test_docs_site.py --overwrite-golden"
    )
