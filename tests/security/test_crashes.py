"""Class "crashes": a checkpoint truncated while it is being scanned ends in one error line, not SIGBUS.

Each case runs in its own process: if the data were still read through the memory map, touching a page past the
new end of the file would kill that process with SIGBUS (and would kill pytest itself if run here).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests._forks import Forked, run_each_forked
from tests.security import corpus
from tests.security.harness import environment, handled, run_hostile, run_python

TRUNCATE_AFTER_FIRST_CHUNK = textwrap.dedent(
    """
    import os, sys
    from dtypecheck.errors import InputError
    from dtypecheck.loaders import open_checkpoint
    from dtypecheck.loaders._io import mapped
    path = sys.argv[1]
    mapped.STRIDED_COPY_LIMIT = int(sys.argv[2])  # 0: gather a strided view from the map, checking the size first
    checkpoint = open_checkpoint(path)
    record = max(checkpoint.records(), key=lambda r: r.nbytes)
    chunks = record.source.iter_chunks(1 << 20)
    first = next(chunks)
    os.truncate(path, 4096)
    try:
        for chunk in chunks:
            float(chunk.float().sum())
    except InputError as exc:
        print("input-error", exc)
    """
)


CASES = [("safetensors", 1 << 26), ("torch-zip", 1 << 26), ("torch-zip-strided", 0), ("gguf", 1 << 26)]


@pytest.fixture(scope="module")
def truncated_scans(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Forked]:
    """Each case of ``CASES`` scanned and truncated under its scan in a process of its own, forked from one
    interpreter that imported torch for them all (``tests/_forks.py``): a SIGBUS kills only that case's child."""
    checks = []
    for layout, copy_limit in CASES:
        path = corpus.big_checkpoint(tmp_path_factory.mktemp(layout), layout, megabytes=24)
        checks.append((TRUNCATE_AFTER_FIRST_CHUNK, ["-c", str(path), str(copy_limit)]))
    done = run_each_forked("import torch", checks, env=environment())
    return dict(zip(CASES, done, strict=True))


@pytest.mark.parametrize(("layout", "copy_limit"), CASES)
def test_truncation_during_the_scan_is_an_input_error(
    truncated_scans: dict[tuple[str, int], Forked], layout: str, copy_limit: int
) -> None:
    done = truncated_scans[layout, copy_limit]
    assert done.returncode == 0, done.stderr  # -7 would be SIGBUS
    assert done.stdout.startswith("input-error"), done.stdout
    assert "shrank to 4096 bytes" in done.stdout


def test_the_cli_survives_truncation_mid_scan(tmp_path: Path) -> None:
    (hostile,) = [h for h in corpus.build(tmp_path, ("crashes",)) if h.name == "truncated-during-scan"]
    try:
        returncode, stderr, _seconds = run_hostile(hostile, timeout=120)
    finally:
        Path(hostile.args[1]).unlink(missing_ok=True)  # 256 MB: not kept with pytest's last temporary folders
    assert handled(returncode, stderr, hostile.expect), stderr


TRUNCATE_BEFORE_PARSING = textwrap.dedent(
    """
    import os, sys
    from dtypecheck.errors import InputError
    from dtypecheck.loaders._io.mapped import FileMap
    from dtypecheck.loaders.formats.torch_zip import TorchArchive
    path = sys.argv[1]
    mapped = FileMap(path)  # mapped at its full size, as when a scan opens it
    os.truncate(path, 100)
    try:
        TorchArchive(mapped.buffer, 0, mapped.size, path, mapped.size)  # the zip directory is past the new end
    except InputError as exc:
        print("input-error", exc)
    """
)


def test_truncation_while_headers_are_parsed_is_an_input_error(tmp_path: Path) -> None:
    path = corpus.big_checkpoint(tmp_path, "torch-zip", megabytes=1)
    done = run_python(TRUNCATE_BEFORE_PARSING, str(path))
    assert done.returncode == 0, done.stderr  # -7 would be SIGBUS: parsers read with pread too, not the map
    assert done.stdout.startswith("input-error"), done.stdout
