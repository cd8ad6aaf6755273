"""dtypecheck as users install it: a wheel, installed into a folder nobody may write, run from there.

numba's ``cache=True`` writes the compiled kernels beside their source; from a shared or read-only install that
pollutes or fails. The kernels' cache goes to the user's cache folder instead (``dtypecheck/scan/numba_cache.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from dtypecheck.scan.numba_cache import cache_root

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel built from this tree (offline: no index, no build isolation), installed with pip into a folder
    then made read-only."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "dtypecheck", source / "dtypecheck", ignore=shutil.ignore_patterns("__pycache__"))
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input")
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(source), "-w", str(work / "dist"))
    (wheel,) = (work / "dist").glob("dtypecheck-*.whl")
    site = work / "site"
    _run(*pip, "install", "--no-deps", "--no-index", "--no-compile", "-q", "--target", str(site), str(wheel))
    for path in [site, *site.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield site
    for path in [site, *site.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_scan_model_runs_from_a_read_only_wheel_install_and_writes_nothing_into_it(
    installed: Path, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(4096).astype(np.float32)
    weights[7] = 1e5  # beyond float16's 65504: one overflow, level fail
    save_file({"w": weights}, str(tmp_path / "model.safetensors"))
    cache = tmp_path / "cache"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "DTYPECHECK_"))},
        "PYTHONPATH": str(installed),
        "XDG_CACHE_HOME": str(cache),
        "PYTHONDONTWRITEBYTECODE": "1",  # (.pyc files are Python's business; this is about numba's cache)
    }
    before = _files(installed)
    # The command line, as a user runs it (a small file: the numpy kernels) ...
    done = _run(
        sys.executable, "-m", "dtypecheck", "scan-model", "model.safetensors", "-f", "json", env=env, cwd=tmp_path
    )
    doc = json.loads(done.stdout)
    assert done.returncode == 1
    assert doc["tensors"][0]["casts"]["float16"]["overflow"] == 1
    # ... and the compiled kernels, which a big checkpoint gets: the same counts, cached in the user's folder.
    script = (
        "import dtypecheck, json; "
        "r = dtypecheck.scan_checkpoint('model.safetensors', compiled=True); "
        "print(json.dumps([dtypecheck.__file__, r.tensors[0].casts['float16'].overflow]))"
    )
    where, overflow = json.loads(_run(sys.executable, "-c", script, env=env, cwd=tmp_path).stdout)
    assert Path(where).is_relative_to(installed)
    assert overflow == 1
    assert _files(installed) == before
    cached = sorted(p.name for p in (cache / "dtypecheck" / "numba").rglob("*.nbi"))
    assert cached, "numba cached nothing in the user's cache folder"
    assert all(name.startswith("kernel.") for name in cached)


def test_the_cache_folder_is_the_users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DTYPECHECK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "dtypecheck" / "numba"
    if sys.platform == "darwin":
        expected = Path.home() / "Library" / "Caches" / "dtypecheck" / "numba"
    if sys.platform != "win32":
        assert cache_root() == expected
    monkeypatch.setenv("DTYPECHECK_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine" / "numba"
