"""Configuration and baselines shipped with the checkpoint (issue 27, class 3).

A model folder (a download, a Hub snapshot, a pull request's new checkpoint) may carry a ``pyproject.toml`` with a
``[tool.dtypecheck]`` table, a ``.dtypecheck.toml`` or a baseline file. None of it may govern the checkpoint's own
scan: configuration comes from the invocation folder's project (or ``--config``), and security findings are never
accepted by any baseline or ignore rule. Each input is a victim's project folder (``cwd``, with or without a
configuration of its own) and a model folder beside it carrying the attacker's files.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from tests.security.corpus import Hostile, call, glob, program, rebuild, safetensors_raw, text, torch_zip

KLASS = "shipped-config"

IGNORE_EVERYTHING = """
[tool.dtypecheck.scan-model]
targets = ["float16"]

[[tool.dtypecheck.scan-model.ignore]]
pattern = "*"
reason = "shipped with the model: trust me"
"""


def weights(path: Path, values: list[float]) -> Path:
    """A float32 safetensors file holding one tensor ``w`` with ``values``."""
    header = {"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}}
    return safetensors_raw(path, header, struct.pack(f"<{len(values)}f", *values))


def system_checkpoint(path: Path, marker: Path) -> Path:
    """A torch zip ``{"w": tensor([1.0]), "x": posix.system("touch MARKER")}``: its torch.load runs the command."""
    body = b"}(" + text("w") + rebuild((1,), (1,), 0, 1) + text("x")
    body += call(glob("posix", "system"), text(f"touch {marker}")) + b"u"
    return torch_zip(path, program(body), {"0": struct.pack("<f", 1.0)})


def recorded_baseline(checkpoint: Path, baseline: Path, cwd: Path) -> Path:
    """The checkpoint's own ``scan-model --format json`` report, as its author would ship it: a baseline (the
    single-report kind, valid for whichever one checkpoint is scanned alone) that records every finding."""
    from tests.security.harness import run_cli

    done = run_cli(("scan-model", str(checkpoint), "--format", "json", "--quiet", "--no-baseline"), cwd=cwd)
    document = json.loads(done.stdout)
    assert document["summary"]["level"] == "fail", done.stderr  # the payload's global is there to be accepted
    baseline.write_text(json.dumps(document))
    return baseline


def build(folder: Path) -> list[Hostile]:
    out: list[Hostile] = []
    root = folder / "shipped-config"

    def case(name: str) -> tuple[Path, Path]:
        """A victim's project folder (the working folder of the scan) and the downloaded model folder beside it."""
        project, model = root / name / "project", root / name / "downloads" / "model"
        project.mkdir(parents=True)
        model.mkdir(parents=True)
        return project, model

    def add(
        name: str,
        args: tuple[str, ...],
        cwd: Path,
        expect: int = 1,
        canary: Path | None = None,
        torch_load: Path | None = None,
    ) -> None:
        loader = "none" if torch_load is None else "torch.load"
        command = ("scan-model", *args)
        out.append(Hostile(name, KLASS, command, frozenset({expect}), canary, torch_load, cwd=cwd, loader=loader))

    # 1. A NaN, and beside it a pyproject.toml whose ignore rule passes every check of every tensor.
    project, model = case("ignores-every-nonfinite")
    ckpt = weights(model / "model.safetensors", [math.nan, 1.0])
    (model / "pyproject.toml").write_text(IGNORE_EVERYTHING)
    add("shipped-ignore-file", (str(ckpt),), project)
    add("shipped-ignore-folder", (str(model),), project)
    # ... and the same from inside the model folder: the folder scanned is no project of the user's.
    add("shipped-ignore-from-inside", (".",), model)
    # ... and the same ignore rule as .dtypecheck.toml and dtypecheck.toml (never read: only --config reads those).
    project, model = case("dotfile-ignores")
    ckpt = weights(model / "model.safetensors", [math.nan, 1.0])
    body = IGNORE_EVERYTHING.replace("[tool.dtypecheck.scan-model]", "[scan-model]").replace(
        "tool.dtypecheck.scan-model.ignore", "scan-model.ignore"
    )
    (model / ".dtypecheck.toml").write_text(body)
    (model / "dtypecheck.toml").write_text(body)
    add("shipped-dotfile-ignore", (str(model),), project)

    # 2. An empty nested table nearer the checkpoint than the project's own configuration, which asks for
    # fail-on warn: found first by a search from the checkpoint's folder, it dropped the project's strictness.
    project, _ = case("empty-table")
    (project / "pyproject.toml").write_text('[tool.dtypecheck]\nfail-on = "warn"\n')
    vendored = project / "vendor" / "model"
    vendored.mkdir(parents=True)
    ckpt = weights(vendored / "model.safetensors", [1e-10, 1.0])  # flushes to zero in float16: a warning
    (vendored / "pyproject.toml").write_text("[tool.dtypecheck.scan-model]\n")
    add("shipped-empty-table-drops-fail-on-warn", (str(ckpt),), project)
    add("shipped-empty-table-folder", (str(vendored),), project)

    # 3. Targets and tolerances: float64 holds 1e6 (float16 does not); a whole tensor of flushed values tolerated.
    project, model = case("targets")
    ckpt = weights(model / "model.safetensors", [1e6, 1.0])
    (model / "pyproject.toml").write_text('[tool.dtypecheck.scan-model]\ntargets = ["float64"]\n')
    add("shipped-targets-float64", (str(ckpt),), project)
    project, model = case("tolerance")
    (project / "pyproject.toml").write_text('[tool.dtypecheck]\nfail-on = "warn"\n')
    ckpt = weights(model / "model.safetensors", [1e-10, 1e-10])
    (model / "pyproject.toml").write_text(
        '[tool.dtypecheck.scan-model]\nmax-underflow-fraction = { float16 = 1.0 }\nfail-on = "fail"\n'
    )
    add("shipped-tolerance-and-fail-on", (str(ckpt),), project)

    # 4. A Hub snapshot in the cache, scanned from inside it: its pyproject.toml is the download's, not a project.
    snapshot = root / "hub" / "models--org--name" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    weights(snapshot / "model.safetensors", [math.nan])
    (snapshot / "pyproject.toml").write_text(IGNORE_EVERYTHING)
    add("shipped-hub-snapshot", ("model.safetensors",), snapshot)

    # 5. A payload whose global the shipped baseline (its own scan report) accepts; and a shipped config naming it.
    project, model = case("baseline-accepts-system")
    marker = model / "canary-shipped-baseline"
    ckpt = system_checkpoint(model / "model.pt", marker)
    recorded_baseline(ckpt, model / "dtypecheck-baseline.json", project)
    (model / "pyproject.toml").write_text('[tool.dtypecheck.scan-model]\nbaseline = "dtypecheck-baseline.json"\n')
    add("shipped-baseline-accepts-system", (str(ckpt),), project, canary=marker, torch_load=ckpt)
    # ... the same baseline given on the command line (or committed by a project that once accepted it): a
    # security finding is never accepted by a baseline, whoever names it.
    add(
        "baseline-flag-accepts-system",
        (str(ckpt), "--baseline", str(model / "dtypecheck-baseline.json")),
        project,
        canary=marker,
        torch_load=ckpt,
    )
    # ... nor by an ignore rule of the project's own configuration.
    project, model = case("ignore-accepts-system")
    marker = model / "canary-ignore-rule"
    ckpt = system_checkpoint(model / "model.pt", marker)
    (project / "pyproject.toml").write_text(IGNORE_EVERYTHING)
    add("ignore-rule-accepts-system", (str(ckpt),), project, canary=marker, torch_load=ckpt)
    # ... nor by writing it into a baseline: --update-baseline records it, and still gates on it.
    project, model = case("update-accepts-system")
    marker = model / "canary-update"
    ckpt = system_checkpoint(model / "model.pt", marker)
    (project / "pyproject.toml").write_text('[tool.dtypecheck.scan-model]\nbaseline = "baseline.json"\n')
    add("update-baseline-accepts-system", (str(ckpt), "--update-baseline"), project, canary=marker, torch_load=ckpt)

    # 6. A shipped config whose baseline points into the victim's project: --update-baseline would write there.
    project, model = case("baseline-escapes")
    ckpt = weights(model / "model.safetensors", [1.0])
    target = project / "written-by-the-model"
    (model / "pyproject.toml").write_text(f'[tool.dtypecheck.scan-model]\nbaseline = "{target}"\n')
    add("shipped-baseline-path-writes-outside", (str(ckpt), "--update-baseline"), project, expect=2, canary=target)

    # Benign: the project's own configuration still governs its checkpoints (kept beside it, or in a folder of it),
    # and --config FILE reads exactly the file it names, wherever it lies.
    project, model = case("own-project")
    (project / "pyproject.toml").write_text(IGNORE_EVERYTHING)
    weights(project / "model.safetensors", [math.nan, 1.0])
    (project / "checkpoints").mkdir()
    weights(project / "checkpoints" / "model.safetensors", [math.nan, 1.0])
    for name, target_path in (("own-config-beside", "model.safetensors"), ("own-config-below", "checkpoints")):
        out.append(
            Hostile(name, KLASS, ("scan-model", target_path), frozenset({0}), cwd=project, loader="none", benign=True)
        )
    weights(model / "model.safetensors", [math.nan, 1.0])
    (model / "reviewed.toml").write_text(IGNORE_EVERYTHING)
    args = ("scan-model", str(model), "--config", str(model / "reviewed.toml"))
    out.append(Hostile("explicit-config", KLASS, args, frozenset({0}), cwd=project, loader="none", benign=True))
    return out
