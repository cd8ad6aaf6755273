"""Project configuration: ``[tool.dtypecheck]`` in the invocation folder's ``pyproject.toml``, or ``--config``.

Like ruff and mypy, the nearest ``pyproject.toml`` that has a ``[tool.dtypecheck]`` table wins, searched from the
working directory upwards; ``--config FILE`` points elsewhere (a ``pyproject.toml``, or a ``dtypecheck.toml`` whose
top level is the table itself). Nothing shipped with a checkpoint governs its scan: the search never starts from a
checkpoint's folder, and skips any file inside a scanned checkpoint folder or a Hub snapshot (a download's
``pyproject.toml`` would otherwise set the targets, ignore rules, ``fail-on`` and baseline of its own gate).
Configuration files found with the checkpoints and not read are listed (``Config.ignored``) for a note. Every key
is validated here, so an unknown key or a bad value is a usage error naming it, before any work starts. Options
given on the command line override the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtypecheck.dtypes import lookup_available
from dtypecheck.errors import UsageError
from dtypecheck.memory_words import DeviceKind, LossName, Optimizer, Strategy
from dtypecheck.output import OutputFormat
from dtypecheck.usercode import python_target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

LEVELS = ("fail", "warn")
CHECKS = ("nonfinite", "overflow", "underflow", "subnormal", "scaled_underflow")


@dataclass(frozen=True)
class IgnoreRule:
    """Tensors whose name matches ``pattern`` (a glob) are exempt from ``checks`` for ``targets``."""

    pattern: str
    reason: str
    checks: tuple[str, ...] = CHECKS
    targets: tuple[str, ...] = ()
    """Empty: every target."""

    def matches(self, tensor: str, check: str, target: str | None) -> bool:
        if check not in self.checks or not fnmatch.fnmatchcase(tensor, self.pattern):
            return False
        return not self.targets or target is None or target in self.targets


@dataclass(frozen=True)
class ScanPolicy:
    """How scan findings are judged: what is ignored, and how much underflow is acceptable per target."""

    ignore: tuple[IgnoreRule, ...] = ()
    max_underflow_fraction: Mapping[str, float] = field(default_factory=dict)
    max_subnormal_fraction: Mapping[str, float] = field(default_factory=dict)

    def ignored(self, tensor: str, check: str, target: str | None = None) -> IgnoreRule | None:
        return next((rule for rule in self.ignore if rule.matches(tensor, check, target)), None)

    def tolerated(self, check: str, target: str, count: int, numel: int) -> bool:
        """True when ``count`` of ``numel`` values is within the configured fraction for ``target``."""
        limits = {"underflow": self.max_underflow_fraction, "subnormal": self.max_subnormal_fraction}.get(check)
        if not limits or target not in limits or numel == 0:
            return False
        return count <= limits[target] * numel


@dataclass(frozen=True)
class Config:
    """Validated settings; ``sections`` maps a command name to its option values (CLI spelling, dashes)."""

    path: Path | None
    sections: Mapping[str, Mapping[str, Any]]
    scan_policy: ScanPolicy = field(default_factory=ScanPolicy)
    ignored: tuple[Path, ...] = ()
    """Configuration files shipped with the scanned checkpoints (in or beside them, or a search from their folder
    would have found them): never read, listed so that the command can say so."""

    def get(self, command: str, key: str, default: Any = None) -> Any:
        """The command's own setting, else the top-level one, else ``default``."""
        for section in (command, ""):
            values = self.sections.get(section, {})
            if key in values:
                return values[key]
        return default

    def where(self, command: str, key: str) -> str | None:
        """Where the value ``get`` gives was set, as messages name it (``pyproject.toml: [tool.dtypecheck.nan-trace]
        device``), or None when the configuration does not set it."""
        for section in (command, ""):
            if key in self.sections.get(section, {}):
                table = f"tool.dtypecheck.{section}" if section else "tool.dtypecheck"
                return f"{self.path}: [{table}] {key}"
        return None


EMPTY = Config(None, {})

# --- validation ----------------------------------------------------------------------------------------

Validator = Callable[[str, Any], Any]


def _fail(where: str, message: str) -> UsageError:
    return UsageError(f"{where}: {message}")


def _one_of(*choices: str) -> Validator:
    def check(where: str, value: Any) -> Any:
        if value not in choices:
            raise _fail(where, f"expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        return value

    return check


def _boolean(where: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise _fail(where, f"expected true or false, got {value!r}")
    return value


def _positive_int(where: str, value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _fail(where, f"expected a positive integer, got {value!r}")
    return value


def _non_negative_int(where: str, value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _fail(where, f"expected an integer of 0 or more, got {value!r}")
    return value


def _fraction(where: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise _fail(where, f"expected a number between 0 and 1, got {value!r}")
    return float(value)


def _decibels(where: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise _fail(where, f"expected a number of decibels (0 or more), got {value!r}")
    return float(value)


def _string(where: str, value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise _fail(where, f"expected a non-empty string, got {value!r}")
    return value


def _dtype(where: str, value: Any) -> str:
    _string(where, value)
    try:
        return lookup_available(value).name
    except UsageError as exc:
        raise _fail(where, exc.message()) from None


def _dtype_list(where: str, value: Any) -> Any:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not value:
        raise _fail(where, f"expected a list of dtype names, got {value!r}")
    return [_dtype(f"{where}[{i}]", v) for i, v in enumerate(value)]


def _target_list(where: str, value: Any) -> Any:
    """``_dtype_list`` of dtypes a scan can cast to (the same rule as ``--target``)."""
    from dtypecheck.dtypes import lookup
    from dtypecheck.targets import target_problem

    names = _dtype_list(where, value)
    for i, name in enumerate(names):
        problem = target_problem(lookup(name))
        if problem is not None:
            raise _fail(f"{where}[{i}]", problem)
    return names


def _per_target_fraction(where: str, value: Any) -> Any:
    if not isinstance(value, dict):
        raise _fail(where, f"expected a table of target = fraction, got {value!r}")
    return {_dtype(f"{where}.{k}", k): _fraction(f"{where}.{k}", v) for k, v in value.items()}


def _ignore_rules(where: str, value: Any) -> Any:
    if not isinstance(value, list):
        raise _fail(where, "expected an array of tables ([[...ignore]] with pattern and reason)")
    rules = []
    for i, entry in enumerate(value):
        here = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise _fail(here, "expected a table with pattern and reason")
        unknown = set(entry) - {"pattern", "reason", "checks", "targets"}
        if unknown:
            raise _fail(here, f"unknown key {sorted(unknown)[0]!r} (allowed: pattern, reason, checks, targets)")
        if "reason" not in entry:
            raise _fail(here, "an ignore rule needs a reason, so the next reader knows why")
        checks = entry.get("checks", list(CHECKS))
        if not isinstance(checks, list) or any(c not in CHECKS for c in checks):
            raise _fail(f"{here}.checks", f"expected a list drawn from {', '.join(CHECKS)}, got {checks!r}")
        targets = _dtype_list(f"{here}.targets", entry["targets"]) if "targets" in entry else []
        rules.append(
            IgnoreRule(
                _string(f"{here}.pattern", entry.get("pattern")),
                _string(f"{here}.reason", entry["reason"]),
                tuple(checks),
                tuple(targets),
            )
        )
    return tuple(rules)


COMMON_KEYS: dict[str, Validator] = {
    "fail-on": _one_of(*LEVELS),
    "format": _one_of(*(fmt.value for fmt in OutputFormat)),
    "quiet": _boolean,
}
SECTION_KEYS: dict[str, dict[str, Validator]] = {
    "": COMMON_KEYS,
    "info": {**COMMON_KEYS},
    "scan-model": {
        **COMMON_KEYS,
        "targets": _target_list,
        "all": _boolean,
        "ignore": _ignore_rules,
        "max-underflow-fraction": _per_target_fraction,
        "max-subnormal-fraction": _per_target_fraction,
        "baseline": _string,
        "keep-float32-sqnr-db": _decibels,
    },
    "nan-trace": {
        **COMMON_KEYS,
        "warn-frac": _fraction,
        "history": _non_negative_int,  # as --history: 0 shows no ops before an event
        "steps": _positive_int,
        "keep-going": _boolean,
        "watch": _boolean,
        "max-skipped-steps": _positive_int,
        "autocast": _one_of("float16", "bfloat16", "fp16", "bf16"),
        "device": _string,
    },
    "estimate-memory": {
        **COMMON_KEYS,
        "dtypes": _dtype_list,
        "optimizer": _one_of(*Optimizer.names()),
        "world-size": _positive_int,
        "strategy": _one_of(*Strategy.names()),
        "batch-size": _positive_int,
        "seq-len": _positive_int,
        "grad-accum": _positive_int,
        "loss": _one_of(*LossName.names()),
        "device": _one_of(*DeviceKind.names()),
        "fit": _string,
        "reserve": _string,
        "fit-workers": _positive_int,
    },
}


def validate(table: Mapping[str, Any], origin: str) -> Config:
    """Validate a ``[tool.dtypecheck]`` table; ``origin`` names the file in messages."""
    sections: dict[str, dict[str, Any]] = {"": {}}
    for key, value in table.items():
        where = f"{origin}: [tool.dtypecheck] {key}"
        if key in SECTION_KEYS and key != "":
            if not isinstance(value, dict):
                raise _fail(where, "expected a table")
            allowed = SECTION_KEYS[key]
            checked: dict[str, Any] = {}
            for sub, sub_value in value.items():
                if sub not in allowed:
                    raise _fail(
                        f"{origin}: [tool.dtypecheck.{key}]",
                        f"unknown key {sub!r} (allowed: {', '.join(sorted(allowed))})",
                    )
                checked[sub] = allowed[sub](f"{origin}: [tool.dtypecheck.{key}] {sub}", sub_value)
            sections[key] = checked
        elif key in COMMON_KEYS:
            sections[""][key] = COMMON_KEYS[key](where, value)
        else:
            known = sorted(set(COMMON_KEYS) | {k for k in SECTION_KEYS if k})
            raise _fail(f"{origin}: [tool.dtypecheck]", f"unknown key {key!r} (allowed: {', '.join(known)})")
    scan = sections.get("scan-model", {})
    policy = ScanPolicy(
        ignore=scan.get("ignore", ()),
        max_underflow_fraction=scan.get("max-underflow-fraction", {}),
        max_subnormal_fraction=scan.get("max-subnormal-fraction", {}),
    )
    return Config(Path(origin), sections, policy)


MAX_CONFIG_BYTES = 16 << 20


def _read_toml(path: Path) -> dict[str, Any]:
    from dtypecheck.errors import InputError
    from dtypecheck.loaders._io.regular import read_regular_file

    try:
        document: dict[str, Any] = tomllib.loads(read_regular_file(path, MAX_CONFIG_BYTES).decode("utf-8"))
        return document
    except InputError as exc:  # a FIFO, a device, an oversized file: refused before reading
        raise UsageError(f"cannot read config {exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML (not UTF-8: {exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise UsageError(f"{path}: not valid TOML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"{path}: not valid TOML (nested too deeply)") from None


def _table_of(path: Path, document: dict[str, Any]) -> dict[str, Any] | None:
    if path.name == "pyproject.toml":
        tool = document.get("tool", {})
        found = tool.get("dtypecheck") if isinstance(tool, dict) else None
        if found is not None and not isinstance(found, dict):
            raise UsageError(f"{path}: [tool.dtypecheck] must be a table")
        return found
    return document.get("tool", {}).get("dtypecheck", document) if "tool" in document else document


CONFIG_NAMES = ("pyproject.toml", ".dtypecheck.toml", "dtypecheck.toml")
"""The files a checkpoint might ship to configure its own scan (only ``pyproject.toml`` is ever searched for)."""


def _has_table(candidate: Path) -> bool:
    """Whether ``candidate`` is a ``pyproject.toml`` with a ``[tool.dtypecheck]`` table (a broken one that mentions
    the table is a usage error naming the problem; someone else's broken pyproject is not ours to judge)."""
    if not candidate.is_file():
        return False
    try:
        with candidate.open("rb") as handle:
            document = tomllib.load(handle)
    except (OSError, ValueError, RecursionError):  # ValueError: invalid TOML, UTF-8, or a huge integer
        with contextlib.suppress(OSError):
            if b"dtypecheck" in candidate.read_bytes():
                _read_toml(candidate)  # raises the usage error that names the problem
        return False
    return isinstance(document.get("tool"), dict) and "dtypecheck" in document["tool"]


def _in_hub_snapshot(path: Path) -> bool:
    """Whether ``path`` lies in a Hugging Face cache snapshot (``models--org--name/snapshots/REV/...``)."""
    parts = path.parts
    return any(
        parts[i] == "snapshots" and parts[i - 1].startswith(("models--", "datasets--", "spaces--"))
        for i in range(1, len(parts) - 1)
    )


def model_folders(targets: Sequence[str]) -> tuple[Path, ...]:
    """The folders that came with the checkpoints scanned: each checkpoint folder itself (resolved). A
    ``file.py:factory``, a Hub id and a file name none (a file's folder is the working folder's project when the
    search from there reaches it, and otherwise never searched)."""
    folders = []
    for target in targets:
        if python_target(target) is None:
            with contextlib.suppress(OSError):
                path = Path(target)
                if path.is_dir():
                    folders.append(path.resolve())
    return tuple(folders)


def _shipped(candidate: Path, folders: Sequence[Path]) -> bool:
    resolved = candidate.resolve()
    return _in_hub_snapshot(resolved) or any(resolved.is_relative_to(folder) for folder in folders)


def find_config(start: Path | None = None, *, scanned: Sequence[str] = ()) -> Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.dtypecheck]`` table, from ``start`` (the working folder)
    upwards, passing over those shipped with the ``scanned`` checkpoints (inside one of their folders, or in a Hub
    snapshot)."""
    here = (start or Path.cwd()).resolve()
    folders = model_folders(scanned)
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if _shipped(candidate, folders) or not candidate.is_file():
            continue
        if _has_table(candidate):
            return candidate
    return None


def _mentions_dtypecheck(path: Path) -> bool:
    """A cheap, bounded look at a file nobody asked us to read: a regular file that names dtypecheck (or is named
    for it)."""
    from dtypecheck.errors import InputError
    from dtypecheck.loaders._io.regular import read_regular_file

    if path.name != "pyproject.toml":
        return path.is_file()
    try:
        return b"dtypecheck" in read_regular_file(path, MAX_CONFIG_BYTES)
    except (InputError, OSError):
        return False


def shipped_configs(scanned: Sequence[str], used: Path | None, start: Path | None = None) -> tuple[Path, ...]:
    """Configuration files that came with the ``scanned`` checkpoints and are not read: every configuration file
    in a checkpoint folder or beside a checkpoint file, each ``pyproject.toml`` a search from a checkpoint's folder
    upwards would have met before the working folder's project (``used``), and those the search from the working
    folder passed over. Read only to see that they mention dtypecheck; never parsed."""
    found: dict[Path, None] = {}
    used_resolved = used.resolve() if used is not None else None
    here = (start or Path.cwd()).resolve()
    folders = model_folders(scanned)
    looked: set[Path] = set()  # pre-commit passes many files of one folder: look at each folder once
    for target in scanned:
        path = Path(target)
        try:
            if python_target(target) is not None or not path.exists():
                continue
            folder = path.resolve() if path.is_dir() else path.resolve().parent
        except OSError:
            continue
        if (here.is_relative_to(folder) and folder not in folders) or folder in looked:
            continue  # a file in the working folder (or above it): that folder's own search decides
        looked.add(folder)
        for name in CONFIG_NAMES:
            if _mentions_dtypecheck(folder / name):
                found[folder / name] = None
        for above in folder.parents:
            if above == here or here.is_relative_to(above):
                break  # from here on, the working folder's own search decides
            if _mentions_dtypecheck(above / "pyproject.toml"):
                found[above / "pyproject.toml"] = None
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if _shipped(candidate, folders) and _mentions_dtypecheck(candidate):
            found[candidate.resolve()] = None
    return tuple(path for path in found if path.resolve() != used_resolved)


def load_config(explicit: Path | None = None, start: Path | None = None, *, scanned: Sequence[str] = ()) -> Config:
    """Load and validate the configuration; ``EMPTY`` when there is none.

    ``explicit`` (``--config``) wins; else the nearest one above ``start`` (default: the working directory) that
    was not shipped with a ``scanned`` checkpoint (``find_config``). ``Config.ignored`` lists the configuration
    files that came with the ``scanned`` checkpoints and were not read.
    """
    if explicit is not None:
        if not explicit.exists():
            raise UsageError(f"--config {explicit}: no such file")
        table = _table_of(explicit, _read_toml(explicit))
        if table is None:
            raise UsageError(f"--config {explicit}: no [tool.dtypecheck] table in it")
        config = validate(table, str(explicit))
    else:
        found = find_config(start, scanned=scanned)
        config = EMPTY if found is None else validate(_table_of(found, _read_toml(found)) or {}, str(found))
    ignored = shipped_configs(scanned, explicit or config.path, start) if scanned else ()
    return dataclasses.replace(config, ignored=ignored) if ignored else config
