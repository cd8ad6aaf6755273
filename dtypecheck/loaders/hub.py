"""Hugging Face Hub ids, ``org/name`` or ``org/name@revision``, resolved to a local snapshot folder.

The local cache is tried first, without the network (``local_files_only``), so a cached model scans offline. Only
when it is not cached (or cached without weights) and ``HF_HUB_OFFLINE`` is not set are its weight files
downloaded: the safetensors files if the repository has any, else its torch files, never the rest of the repository.
Needs ``huggingface_hub`` (the ``hf`` extra). A local path that exists always wins over a hub id.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders.formats import checkpoint_suffixes, detect

HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]*))?$"
)
NOT_A_REPO = (*checkpoint_suffixes(), ".py", ".json", ".index.json")
"""A missing ``dir/model.safetensors`` is a mistyped path, not a repository: it is never looked up on the Hub."""
WEIGHT_CHOICES = (
    (".safetensors", ".safetensors.index.json"),
    (".bin", ".pt", ".pth", ".ckpt", ".bin.index.json"),
)
"""Which top-level files of a repository are downloaded: the first group the repository has any file of."""
_TRUE = {"1", "ON", "YES", "TRUE"}


def parse_hub_id(target: str) -> tuple[str, str | None] | None:
    """``org/name[@revision]`` -> ``(repo_id, revision or None)``; None when ``target`` is not shaped like one."""
    found = HUB_ID.match(target)
    if found is None or found["repo"].lower().endswith(NOT_A_REPO):
        return None
    return found["repo"], found["revision"]


def resolve_hub_id(target: str) -> Path | None:
    """The local snapshot folder of hub id ``target``, fetched if needed; None when ``target`` is a local path that
    exists or is not shaped like a hub id. ``InputError`` when it cannot be had (not cached while offline, not on
    the Hub, no huggingface_hub)."""
    parsed = parse_hub_id(target)
    if parsed is None or Path(target).exists():
        return None
    repo_id, revision = parsed
    huggingface_hub = _hub_package(target)
    _refuse_special_ref(huggingface_hub, repo_id, revision)
    cached = _cached_snapshot(huggingface_hub, repo_id, revision)
    if cached is not None and _holds_weights(cached):
        return cached
    if offline():
        where = "is cached without weight files" if cached is not None else "is not in the local Hugging Face cache"
        raise InputError(
            f"{target}: no such file or directory, and as a Hub id it {where} "
            f"({cache_dir() or _default_cache(huggingface_hub)}) "
            "while HF_HUB_OFFLINE is set; fetch it once online or name a local path"
        )
    return _download(huggingface_hub, target, repo_id, revision)


def resolve_hub_config(target: str) -> Path | None:
    """The ``config.json`` of hub id ``org/name[@revision]`` (estimate-memory reads no weights): from the local
    cache first, without the network; else (unless ``HF_HUB_OFFLINE``) that one file is downloaded. None when
    ``target`` is not shaped like a hub id."""
    parsed = parse_hub_id(target)
    if parsed is None:
        return None
    repo_id, revision = parsed
    huggingface_hub = _hub_package(target)
    from huggingface_hub.errors import LocalEntryNotFoundError

    _refuse_special_ref(huggingface_hub, repo_id, revision)
    fetch = huggingface_hub.hf_hub_download
    try:
        return Path(fetch(repo_id, "config.json", revision=revision, cache_dir=cache_dir(), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        pass
    if offline():
        raise InputError(
            f"{target}: no such file or directory, and as a Hub id its config.json is not in the local Hugging Face "
            "cache while HF_HUB_OFFLINE is set; fetch it once online or name a local path"
        )
    try:
        return Path(fetch(repo_id, "config.json", revision=revision, cache_dir=cache_dir()))
    except Exception as exc:  # noqa: BLE001  (not found, gated, no network: one line either way)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"{target}: cannot fetch config.json from the Hugging Face Hub ({first})") from None


def _hub_package(target: str) -> Any:
    """``huggingface_hub``, or the one-line error that says a hub id needs it."""
    try:
        import huggingface_hub
    except ImportError:
        raise InputError(
            f"{target}: no such file or directory; as a Hugging Face Hub id it needs huggingface_hub "
            "(pip install 'dtypecheck[hf]')"
        ) from None
    return huggingface_hub


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as the environment says now (huggingface_hub reads it once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def cache_dir() -> str | None:
    """The hub cache the environment names now, or None for huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _refuse_special_ref(hub: Any, repo_id: str, revision: str | None) -> None:
    """An ``InputError`` when the cache's ``refs/<branch>`` for ``repo_id`` is a FIFO, socket or device:
    huggingface_hub reads it with a plain ``open().read()``, which a FIFO blocks forever."""
    from dtypecheck.loaders._io.regular import require_regular

    cache = Path(cache_dir() or _default_cache(hub))
    ref = cache / ("models--" + repo_id.replace("/", "--")) / "refs" / (revision or "main")
    if ref.is_symlink() or ref.exists():
        require_regular(ref)


def _default_cache(hub: Any) -> str:
    """huggingface_hub's own cache folder (its ``constants`` submodule is not loaded by ``import huggingface_hub``)."""
    import importlib

    return str(importlib.import_module(f"{hub.__name__}.constants").HF_HUB_CACHE)


def _cached_snapshot(hub: Any, repo_id: str, revision: str | None) -> Path | None:
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = hub.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir(), local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None  # not cached (an incomplete or unreadable cache entry counts as not cached)
    return Path(folder)


def _holds_weights(folder: Path) -> bool:
    return any(path.is_file() and detect(path) is not None for path in folder.iterdir()) or any(
        folder.glob("*.index.json")
    )


def weight_files(files: list[str]) -> list[str]:
    """The top-level files of a repository listing worth downloading to scan its weights (``WEIGHT_CHOICES``)."""
    top = [name for name in files if "/" not in name]
    for group in WEIGHT_CHOICES:
        chosen = [name for name in top if name.lower().endswith(group)]
        if chosen:
            return sorted(chosen)
    return []


def _download(hub: Any, target: str, repo_id: str, revision: str | None) -> Path:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        files = hub.HfApi().list_repo_files(repo_id, revision=revision)
        chosen = weight_files(list(files))
        if not chosen:
            raise InputError(f"{target}: the Hugging Face Hub repository has no safetensors or torch weight files")
        folder = hub.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir(), allow_patterns=chosen)
    except InputError:
        raise
    except RevisionNotFoundError:
        raise InputError(f"{target}: no revision {revision!r} in that Hugging Face Hub repository") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise InputError(
            f"{target}: no such file or directory, nor a Hugging Face Hub repository you can read "
            "(private or gated ones need `hf auth login`)"
        ) from None
    except Exception as exc:  # noqa: BLE001  (network, HTTP and cache errors all mean: could not fetch it)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{target}: could not fetch it from the Hugging Face Hub ({reason})") from None
    return Path(folder)
