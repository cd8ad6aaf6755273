"""Make docs/img/<command>.png: each command's HTML report on the tests' tiny inputs, as headless Chromium shows it.

Run from the repository root: ``make screenshots`` (or ``.venv/bin/python docs/screenshots.py``).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtypecheck.cli import main  # noqa: E402
from tests._documents import command_args  # noqa: E402
from tests.render._browser import open_page  # noqa: E402

# A NaN born inside a module (blocks.1.attn), so the page shows its module tree with the culprit highlighted.
MODULE_SCRIPT = """\
import torch


class Attention(torch.nn.Module):
    def forward(self, x):
        scores = x @ x.T
        return torch.log(scores - scores.max())  # log(0) = -inf, log of negatives = NaN


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.attn = Attention()

    def forward(self, x):
        return self.attn(self.norm(x))


torch.manual_seed(0)
blocks = torch.nn.ModuleDict({"embed": torch.nn.Linear(4, 4), "blocks": torch.nn.Sequential(Block(), Block())})
x = blocks["embed"](torch.randn(3, 4))
loss = blocks["blocks"](x).sum()
loss.backward()
"""


def main_() -> None:
    target = ROOT / "docs" / "img"
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        runs = command_args(Path())
        Path("model_step.py").write_text(MODULE_SCRIPT, encoding="utf-8")
        runs["nan-trace"] = ["nan-trace", "model_step.py", "--quiet"]
        for command in ("scan-model", "nan-trace", "estimate-memory", "info"):
            page = Path(f"{command}.html")
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                main([*runs[command], "--format", "html", "--output", str(page), "--quiet"])
            shot = target / f"{command}.png"
            opened = open_page(page, screenshot=shot, width=1200, height=2000 if command == "nan-trace" else 1400)
            if opened.requests:
                raise SystemExit(f"{command}: the page asked for {opened.requests}")
            print(f"wrote {shot.relative_to(ROOT)}")


if __name__ == "__main__":
    main_()
