"""Randomly damaged checkpoints of every format: each either opens and reads, or raises one InputError.

Deterministic (fixed seed) and small; a wider run of the same loop found the cases the loaders now guard.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from dtypecheck.errors import InputError
from dtypecheck.loaders import open_checkpoint
from tests.security.corpus import damage


def _originals(folder: Path) -> dict[str, bytes]:
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "view": torch.arange(6.0).reshape(2, 3).t()}
    torch.save({"model": tensors, "step": 3}, folder / "z.pt")
    torch.save(tensors, folder / "l.pt", _use_new_zipfile_serialization=False)
    save_file({"a": torch.arange(6.0), "i": torch.tensor([1, 2], dtype=torch.int8)}, folder / "s.safetensors")
    files = {name: (folder / name).read_bytes() for name in ("z.pt", "l.pt", "s.safetensors")}
    try:
        import gguf
    except ImportError:  # the optional package is missing: fuzz the other formats
        return files
    writer = gguf.GGUFWriter(str(folder / "m.gguf"), "llama")
    writer.add_array("tags", ["x", "y"])
    writer.add_tensor("t", np.arange(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    files["m.gguf"] = (folder / "m.gguf").read_bytes()
    return files


def test_damaged_files_open_or_raise_input_error(tmp_path: Path) -> None:
    originals = _originals(tmp_path)
    rng = random.Random(20261130)
    outcomes = {"read": 0, "input_error": 0}
    messages: list[str] = []
    for index in range(240):
        name, data = sorted(originals.items())[index % len(originals)]
        path = tmp_path / f"damaged_{name}"
        path.write_bytes(damage(data, rng))
        try:
            checkpoint = open_checkpoint(str(path))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for record in checkpoint.records():
                    if record.source is not None:
                        for chunk in record.source.iter_chunks(16):
                            assert chunk.dim() == 1
            checkpoint.close()
            outcomes["read"] += 1
        except InputError as error:
            messages.append(str(error))
            outcomes["input_error"] += 1
    assert outcomes["read"] > 0
    assert outcomes["input_error"] > 0
    assert all("\n" not in message and message.startswith(str(tmp_path)) for message in messages)
