"""A release is real: one version, a changelog entry for it, the tag the README's pre-commit snippet and the example
workflow name, and that snippet run by the real pre-commit on this repository in a throw-away git repo, offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.numpy import save_file

from dtypecheck import __version__

ROOT = Path(__file__).resolve().parent.parent
CI_GUIDE = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")  # (the README's "Use as a CI gate", moved)
TAG = f"v{__version__}"
SITE_PACKAGES = [p for p in sys.path if p.endswith("site-packages")]


def _snippet() -> dict[str, object]:
    (block,) = re.findall(r"\*\*pre-commit\*\*.*?```yaml\n(.*?)```", CI_GUIDE, re.DOTALL)
    (repo,) = yaml.safe_load(block)
    assert isinstance(repo, dict)
    return repo


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_one_version_a_changelog_entry_and_the_tag_the_snippets_name() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(__version__)} \(\d{{4}}-\d\d-\d\d\)$", changelog, re.MULTILINE)
    assert _snippet()["rev"] == TAG
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "dtypecheck.yml").read_text(encoding="utf-8"))
    assert workflow["env"]["DTYPECHECK_SOURCE"].endswith(f"@{TAG}")


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this repository that has the release tag: the tag itself where this checkout has it, else (a
    clone made without tags, as CI's may be) the tag put on the clone's HEAD, which must then hold this version."""
    clone = tmp_path_factory.mktemp("release") / "dtypecheck"
    _git("clone", "-q", "--no-hardlinks", str(ROOT), str(clone))
    if not _git("tag", "--list", TAG, cwd=clone):
        if _git("tag", "--list", cwd=ROOT):  # this checkout has tags, but not this one: the release was not tagged
            raise AssertionError(f"no git tag {TAG}: the docs' pre-commit snippet and the CI workflow name it")
        _git("tag", TAG, "HEAD", cwd=clone)
    return clone


def test_the_tag_exists_and_holds_this_version(released: Path) -> None:
    assert _git("tag", "--list", TAG, cwd=released) == TAG
    tagged = _git("show", f"{TAG}:dtypecheck/__init__.py", cwd=released)
    assert f'__version__ = "{__version__}"' in tagged
    assert f"## {__version__} (" in _git("show", f"{TAG}:CHANGELOG.md", cwd=released)


def _offline_hook_environment(home: Path) -> dict[str, str]:
    """pre-commit builds the hook's environment with pip from the tagged clone. Offline, dtypecheck itself is built
    and installed there (no index, no build isolation: setuptools from this environment); its dependencies (torch,
    numba...), which a user's pip downloads, come from this test environment's site-packages."""
    return {
        **os.environ,
        "PRE_COMMIT_HOME": str(home / "pre-commit"),
        "VIRTUALENV_OVERRIDE_APP_DATA": str(home / "virtualenv"),
        "PIP_NO_INDEX": "1",
        "PIP_NO_DEPS": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # (pip's inverted spelling: 0 turns build isolation off)
        "PYTHONPATH": os.pathsep.join(SITE_PACKAGES),
        "XDG_CACHE_HOME": str(home / "cache"),
    }


def test_the_readme_pre_commit_snippet_runs_as_written(tmp_path: Path, released: Path) -> None:
    import numpy as np

    repo = tmp_path / "project"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    save_file({"w": np.array([1.0, 7e4], dtype=np.float32)}, str(repo / "bad.safetensors"))  # 7e4 > fp16's 65504
    save_file({"w": np.array([1.0, -2.0], dtype=np.float32)}, str(repo / "good.safetensors"))
    snippet = {**_snippet(), "repo": str(released)}  # "<this repository>": here, a clone of this checkout
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [snippet]}), encoding="utf-8")
    _git("add", "-A", cwd=repo)
    env = _offline_hook_environment(tmp_path)
    pre_commit = [sys.executable, "-m", "pre_commit", "run", "--color", "never", "--files"]

    def run(*files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*pre_commit, *files], cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False
        )

    failed = run("bad.safetensors", "good.safetensors")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert re.search(
        r"^dtypecheck scan-model \(checkpoints survive their target dtypes\)\.+Failed$", failed.stdout, re.M
    )
    assert "bad.safetensors (safetensors) → float16, bfloat16" in failed.stdout
    passed = run("good.safetensors")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert re.search(r"\.+Passed$", passed.stdout, re.M)


def test_the_workflow_installs_the_tagged_release(tmp_path: Path, released: Path) -> None:
    # examples/ci/dtypecheck.yml: pip install "dtypecheck @ git+https://github.com/OWNER/dtypecheck@v0.1.0", with
    # this checkout for the placeholder.
    requirement = f"dtypecheck @ git+file://localhost{released.as_posix()}@{TAG}"  # (PEP 508 wants a host)
    env = _offline_hook_environment(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(tmp_path / "site"), requirement],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    installed = (tmp_path / "site" / "dtypecheck" / "__init__.py").read_text(encoding="utf-8")
    assert f'__version__ = "{__version__}"' in installed
