"""numba is imported only when a scan wants the compiled kernels: a small checkpoint is scanned with numpy's.

Importing numba and its first dispatch cost ~0.3 s, about what a whole small scan takes without them; the
numpy kernels give the same results (``test_exact``, ``test_precision_kernels`` compare both).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.scan import blockscale, kernel, precision
from dtypecheck.scan.run import scan_checkpoint
from tests.security.harness import run_python


def test_the_kernels_chosen_by_size() -> None:
    assert not kernel.kernels(None, kernel.SMALL_SCAN_BYTES - 1).compiled
    assert kernel.kernels(None, kernel.SMALL_SCAN_BYTES).compiled == kernel.NUMBA
    assert kernel.kernels(None, None).compiled == kernel.NUMBA
    assert kernel.kernels(True, 0).compiled == kernel.NUMBA
    assert not kernel.kernels(False, 1 << 40).compiled
    assert not kernel.kernels(None, kernel.SMALL_PRECISION_SCAN_BYTES - 1, precision=True).compiled
    assert kernel.kernels(None, kernel.SMALL_PRECISION_SCAN_BYTES, precision=True).compiled == kernel.NUMBA


@pytest.mark.skipif(not kernel.NUMBA, reason="needs numba")
def test_compiling_makes_every_reference_a_dispatcher() -> None:
    """Compiled functions calling each other must see numba dispatchers, also through ``from ... import``."""
    kernel.kernels(True)
    for module in (kernel, precision, blockscale):
        lazy = [name for name, value in vars(module).items() if isinstance(value, kernel._Lazy)]
        assert lazy == [], module.__name__
    imported = vars(blockscale)["group_sums"]
    assert type(imported).__name__ == "CPUDispatcher"
    assert imported is precision.group_sums


SMALL_SCAN = textwrap.dedent(
    """
    import json, sys
    from dtypecheck.dtypes import lookup
    from dtypecheck.scan.run import scan_checkpoint
    targets = [lookup("float16"), lookup("float8_e4m3fn")]
    report = scan_checkpoint(sys.argv[1], targets, precision=True)
    print(json.dumps({"numba": "numba" in sys.modules, "absmax": report.tensors[0].absmax}))
    """
)


def test_a_small_scan_never_imports_numba(tmp_path: Path) -> None:
    path = tmp_path / "small.safetensors"
    x = np.random.default_rng(4).standard_normal((128, 64)).astype(np.float32)
    save_file({"w": torch.from_numpy(x)}, str(path))
    done = run_python(SMALL_SCAN, str(path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"numba": False, "absmax": float(np.abs(x).max())}


@pytest.mark.skipif(not kernel.NUMBA, reason="needs numba")
def test_small_and_large_choices_give_one_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w.safetensors"
    x = np.random.default_rng(6).standard_normal((96, 64)) * np.exp2(np.random.default_rng(7).uniform(-40, 20, 64))
    save_file({"w": torch.from_numpy(x.astype(np.float32))}, str(path))
    targets = [lookup(t) for t in ("float16", "bfloat16")]
    small = scan_checkpoint(str(path), targets)  # numpy kernels, by size
    monkeypatch.setattr(kernel, "SMALL_SCAN_BYTES", 0)
    large = scan_checkpoint(str(path), targets)  # numba's
    assert small == large


BROKEN_NUMBA = textwrap.dedent(
    """
    import json, sys
    from dtypecheck.scan import kernel
    from dtypecheck.scan.run import scan_checkpoint
    assert kernel.NUMBA  # installed...
    sys.modules["numba"] = None  # ...but its import fails
    report = scan_checkpoint(sys.argv[1], compiled=True, precision=True)
    print(json.dumps({"compiled": kernel.kernels(True).compiled, "absmax": report.tensors[0].absmax}))
    """
)


@pytest.mark.skipif(not kernel.NUMBA, reason="needs numba installed")
def test_a_numba_that_cannot_be_imported_leaves_the_numpy_kernels(tmp_path: Path) -> None:
    path = tmp_path / "small.safetensors"
    x = np.random.default_rng(8).standard_normal((32, 16)).astype(np.float32)
    save_file({"w": torch.from_numpy(x)}, str(path))
    done = run_python(BROKEN_NUMBA, str(path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"compiled": False, "absmax": float(np.abs(x).max())}
