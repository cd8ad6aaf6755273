"""mkdocs hook: every console example on the site is generated at build time, every option table from the CLI.

Directives in a page's Markdown (HTML comments, so GitHub shows nothing odd):

- ``<!-- dtypecheck-file: NAME -->`` before a fenced block: the block is also written to NAME in the page's scratch
  folder (a training script the page shows, then runs).
- ``<!-- dtypecheck-run: dtypecheck ARGS -->``: replaced by a console block with the command and what it writes
  on stdout, run in the page's scratch folder (``dtypecheck-run-exit`` also shows ``$ echo $?`` and the exit code).
- ``<!-- dtypecheck-options: COMMAND -->``: replaced by a table of every option of COMMAND, from the CLI itself.

Each page runs in its own copy of a scratch folder holding ``examples/tiny_model.safetensors`` (``make demo``'s
example) and ``checkpoints/model.safetensors`` (the same file, as the CI guide names it). Tables are 120 columns
wide, as a pipe gets them. ``tests/test_docs_site.py`` checks that no page holds a console example of its own.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FILE = re.compile(r"<!-- dtypecheck-file: (\S+) -->\n+```[a-z]*\n(.*?)```", re.DOTALL)
RUN = re.compile(r"<!-- dtypecheck-run(-exit)?: (dtypecheck [^\n]*?) -->")
OPTIONS = re.compile(r"<!-- dtypecheck-options: ([a-z-]+) -->")
WIDTH = "120"

_base: dict[str, Path] = {}


def _base_folder() -> Path:
    """The inputs every page starts from, made once per build."""
    if "path" not in _base:
        folder = Path(tempfile.mkdtemp(prefix="dtypecheck-docs-"))
        (folder / "examples").mkdir()
        (folder / "checkpoints").mkdir()
        example = folder / "examples" / "tiny_model.safetensors"
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "make_example_checkpoint.py"), "--quiet", str(example)],
            check=True,
            timeout=300,
        )
        shutil.copy(example, folder / "checkpoints" / "model.safetensors")
        _base["path"] = folder
    return _base["path"]


def run_example(command: str, folder: Path) -> tuple[int, str]:
    """``command`` (``dtypecheck ARGS``) through the CLI's real entry, in ``folder``: (exit code, stdout)."""
    from dtypecheck.cli import main

    args = shlex.split(command)[1:]
    out = io.StringIO()
    saved_cwd, saved_columns = Path.cwd(), os.environ.get("COLUMNS")
    os.chdir(folder)
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(args)
    finally:
        os.chdir(saved_cwd)
        if saved_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved_columns
    return code, out.getvalue()


def options_table(command: str) -> str:
    """Every argument and option of ``command`` as a Markdown table, in the order ``--help`` lists them."""
    import typer

    from dtypecheck.cli import app

    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    rows = ["| option | meaning | default |", "|---|---|---|"]
    for param in click_command.params:
        if param.param_type_name == "argument":
            name = f"`{(param.metavar or param.name or '').upper()}`"
        else:
            names = [*param.opts, *getattr(param, "secondary_opts", [])]
            metavar = "" if getattr(param, "is_flag", False) else f" {param.metavar or param.name.upper()}"
            name = ", ".join(f"`{n}{metavar if i == 0 else ''}`" for i, n in enumerate(names))
        default = param.default
        shown = (
            ""
            if default in (None, False, ()) or getattr(param, "is_flag", False)
            else f"`{getattr(default, 'value', default)}`"
        )
        meaning = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
        rows.append(f"| {name.replace('|', chr(92) + '|')} | {meaning} | {shown} |")
    return "\n".join(rows)


def expand(markdown: str, folder: Path) -> str:
    """The page with every directive carried out, in order, in ``folder``."""
    for match in FILE.finditer(markdown):
        (folder / match.group(1)).write_text(match.group(2), encoding="utf-8")

    def run(match: re.Match[str]) -> str:
        code, output = run_example(match.group(2), folder)
        shown = f"$ {match.group(2)}\n{output}"
        if match.group(1):
            shown += f"$ echo $?\n{code}\n"
        return f"```console\n{shown.rstrip()}\n```"

    markdown = RUN.sub(run, markdown)
    return OPTIONS.sub(lambda m: options_table(m.group(1)), markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if "<!-- dtypecheck-" not in markdown:
        return markdown
    folder = Path(tempfile.mkdtemp(prefix="dtypecheck-page-"))
    shutil.copytree(_base_folder(), folder, dirs_exist_ok=True)
    try:
        return expand(markdown, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def on_post_build(**_: Any) -> None:
    if "path" in _base:
        shutil.rmtree(_base.pop("path"), ignore_errors=True)
