"""Running the CLI on hostile inputs the way a user (or CI) does, and proving a canary payload live."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests._forks import run_each_forked

if TYPE_CHECKING:
    from tests.security.corpus import Hostile

REPO = Path(__file__).resolve().parents[2]

PROVE_BY_LOADER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    sys.path.insert(0, os.getcwd())  # as a script run from this folder imports its neighbours
    import torch
    for loader, path in zip(sys.argv[1::2], sys.argv[2::2]):  # (loader, path) pairs
        try:
            if loader == "jit.load":
                torch.jit.load(path)
            elif loader == "package.load":  # every pickle of a torch.package archive, as its users load them
                from torch.package import PackageImporter
                importer = PackageImporter(path)
                for name in importer.zip_reader.get_all_records():
                    if name.endswith(".pkl") and not name.startswith(".data/"):
                        package, _, resource = name.rpartition("/")
                        importer.load_pickle(package.replace("/", "."), resource)
            elif loader == "joblib.load":  # by its first bytes: raw, zlib, gzip, bz2, lzma, xz, lz4 or joblib's ZF
                import joblib
                joblib.load(path)
            elif loader == "np.load":  # an .npy, or every array of an .npz
                import numpy
                arrays = numpy.load(path, allow_pickle=True)
                if hasattr(arrays, "files"):
                    [arrays[key] for key in arrays.files]
            elif loader == "generate.custom_generate":  # a causal LM generating with the folder's own generate.py
                import transformers
                model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
                model.generate(torch.tensor([[1, 2]]), custom_generate=path, trust_remote_code=True, max_new_tokens=1)
            elif loader == "torch.hub":  # the folder as a local hub repository: hubconf.py and its entry point
                torch.hub.load(path, "model", source="local")
            elif loader == "sentence_transformers":  # CrossEncoder(folder) or SentenceTransformer(folder), as saved
                import json, sentence_transformers
                sys.path.insert(0, path)  # a script beside the model imports its neighbours
                with open(os.path.join(path, "config_sentence_transformers.json")) as handle:
                    kind = json.load(handle).get("model_type")
                cross = kind == "CrossEncoder"
                cls = sentence_transformers.CrossEncoder if cross else sentence_transformers.SentenceTransformer
                cls(path, trust_remote_code=True, local_files_only=True)
            elif loader.startswith("from_pretrained."):  # a model folder, as its config asks to be loaded
                import importlib
                name = loader.split(".", 1)[1]
                library = "diffusers" if name == "DiffusionPipeline" else "transformers"
                cls = getattr(importlib.import_module(library), name)
                cls.from_pretrained(path, trust_remote_code=True, local_files_only=True)
            elif loader == "dcp.load" or os.path.isdir(path):  # a torch.distributed.checkpoint folder
                import torch.distributed.checkpoint as dcp
                meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
                wanted = {k: torch.zeros(v.size) if hasattr(v, "size") else None for k, v in meta.items()}
                dcp.load(wanted, checkpoint_id=path)
            else:
                torch.load(path, weights_only=False)
        except BaseException:
            pass
    """
)


PROVE_UNDER_A_CAP = textwrap.dedent(
    r"""
    import resource, sys, time, warnings
    warnings.simplefilter("ignore")
    with open("/proc/self/status") as status:
        vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
    start = time.monotonic()
    try:
        torch.load(sys.argv[1], weights_only=False)
    except MemoryError:
        print("MemoryError")
    except RuntimeError as exc:
        print("RuntimeError", "alloc" in str(exc).lower() or "memory" in str(exc).lower(), str(exc)[:200])
    else:
        print("loaded", time.monotonic() - start)
    """
)
"""``torch.load(weights_only=False)`` of ``argv[1]`` with the address space capped at 2 GiB above what the process
holds once torch is imported: prints ``MemoryError``, ``RuntimeError True ...`` (the allocator's), or ``loaded
SECONDS``."""


def exhausts_each(paths: list[Path], timeout: float = 20) -> list[tuple[bool, str]]:
    """For each of ``paths``: (whether ``torch.load`` of it runs out of ``PROVE_UNDER_A_CAP``'s cap, what the proof
    printed): out of memory, killed by the kernel, or past ``timeout`` (a loop over ``range(10**12)`` takes
    hours). Each load is a process of its own, with its own cap and memory, forked from one interpreter that
    imported torch for them all (``tests/_forks.py``; a process per load cost ~2 CPU s of torch import each)."""
    prelude = "import warnings\nwarnings.simplefilter('ignore')\nimport torch"
    checks = [(PROVE_UNDER_A_CAP, ["-c", str(path)]) for path in paths]
    proofs = run_each_forked(prelude, checks, timeout=timeout, env=environment())
    found = []
    for proof in proofs:
        out = proof.stdout.strip()
        if proof.returncode is None:
            found.append((True, f"past {timeout:.0f} s"))
        else:
            exhausted = proof.returncode < 0 or out.startswith(("MemoryError", "RuntimeError True"))
            found.append((exhausted, out + proof.stderr[-400:]))
    return found


def prove_live(hostiles: list[Hostile], timeout: float = 300) -> set[str]:
    """Read every payload-carrying input as its ``loader`` would, those of each working folder in one throwaway
    process; the names of those whose canary then exists (canaries are removed first). A
    ``torch.load.capped`` payload (a memory or time bomb) is loaded in a process of its own under a cap
    (``exhausts_each``), and the proof makes its canary when the load exhausts it."""
    groups: dict[str, list[tuple[str, Hostile]]] = {}
    proven: list[Hostile] = []
    capped: list[tuple[Hostile, Path]] = []
    for hostile in hostiles:
        if hostile.canary is None or hostile.torch_load is None or hostile.loader == "none":
            continue
        proven.append(hostile)
        hostile.canary.unlink(missing_ok=True)
        # a folder: a DCP checkpoint, unless it names a loader of folders (from_pretrained, generate)
        loader = "dcp.load" if hostile.torch_load.is_dir() and hostile.loader == "torch.load" else hostile.loader
        if loader == "torch.load.capped":
            capped.append((hostile, hostile.torch_load))
            continue
        groups.setdefault(str(hostile.cwd or code_under_test()), []).append((loader, hostile))
    for (hostile, _), (exhausted, _printed) in zip(capped, exhausts_each([p for _, p in capped]), strict=True):
        if exhausted and hostile.canary is not None:
            hostile.canary.touch()
    for cwd, members in groups.items():
        # One process per working folder, every loader in it: importing torch, transformers and diffusers once per
        # loader was most of a class's proof (the folder loaders' took 25 s in seven processes).
        pairs = [str(part) for loader, hostile in members for part in (loader, hostile.torch_load)]
        subprocess.run(
            [sys.executable, "-c", PROVE_BY_LOADER, *pairs],
            check=False,
            capture_output=True,
            timeout=timeout,
            env=environment(),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    return {h.name for h in proven if h.canary is not None and h.canary.exists()}


def environment() -> dict[str, str]:
    """The environment of a child process: this checkout first on the path (or ``DTYPECHECK_CODE_UNDER_TEST``,
    another checkout to compare with, e.g. an older commit's)."""
    env = dict(os.environ)
    code = env.get("DTYPECHECK_CODE_UNDER_TEST") or str(REPO)
    # no empty entry: Python reads one as the working folder, which would import what a hostile folder ships
    env["PYTHONPATH"] = os.pathsep.join(part for part in (code, env.get("PYTHONPATH")) if part)
    env.pop("DTYPECHECK_TRACEBACK", None)
    return env


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` in a fresh process with this checkout first on the path."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(),
        check=False,
    )


def code_under_test() -> Path:
    """The checkout whose dtypecheck the child processes run (its folder is their working directory too, since
    ``python -m`` puts the working directory first on the path)."""
    return Path(os.environ.get("DTYPECHECK_CODE_UNDER_TEST") or REPO)


def run_cli(
    args: tuple[str, ...] | list[str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m dtypecheck ARGS`` in a fresh process (raises ``subprocess.TimeoutExpired`` on a hang)."""
    return subprocess.run(
        [sys.executable, "-m", "dtypecheck", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(),
        cwd=cwd or code_under_test(),
        stdin=subprocess.DEVNULL,
    )


def payload_scans(inputs: list[Hostile], cli: Callable[..., Any]) -> Iterator[tuple[Hostile, Any]]:
    """Each payload of ``inputs`` scanned in this process (``--format json``), its canary removed first (the live
    proof made it): (the payload, the CLI result), once its exit 1 and untouched canary are asserted."""
    for hostile in (h for h in inputs if not h.benign):
        assert hostile.canary is not None
        hostile.canary.unlink(missing_ok=True)
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 1, (hostile.name, result.stderr)
        assert not hostile.canary.exists(), hostile.name
        yield hostile, result


def assert_cli_fails_each_in_its_own_process(inputs: list[Hostile]) -> None:
    """As CI runs it (``python -m dtypecheck``, in a fresh process, not this one): every payload of ``inputs``
    scanned together fails in its own document of the JSON output (exit 1), with no traceback, and runs nothing
    (its canary, which the live proof made, is not made again); then the same as the table renderer shows them.
    (The tests' own process checks each payload's exit code alone: ``payload_scans``. A process per payload and
    format cost ~1.5 s each, mostly importing torch for its zip reader.)"""
    payloads = [h for h in inputs if not h.benign]
    for hostile in payloads:
        assert hostile.canary is not None
        hostile.canary.unlink(missing_ok=True)  # the live proof made it
    assert all(len(h.args) == 2 and h.args[0] == "scan-model" for h in payloads)  # a path each, no options
    paths = [h.args[1] for h in payloads]
    done = run_cli(("scan-model", *paths, "-f", "json"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    documents = json.loads(done.stdout)["checkpoints"] if len(paths) > 1 else [json.loads(done.stdout)]
    assert [d["source"] for d in documents] == paths
    assert all(d["summary"]["level"] == "fail" for d in documents), [d["summary"]["level"] for d in documents]
    done = run_cli(("scan-model", *paths))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not any(h.canary is not None and h.canary.exists() for h in payloads)


def torch_load_all(paths: list[Path], timeout: float = 300) -> None:
    """``torch.load(path, weights_only=False)`` of each path (``dcp.load`` of a folder) in one throwaway process
    (errors ignored)."""
    subprocess.run(
        [sys.executable, "-c", PROVE_BY_LOADER, *(part for path in paths for part in ("torch.load", str(path)))],
        check=False,
        capture_output=True,
        timeout=timeout,
        env=environment(),
        stdin=subprocess.DEVNULL,
    )


@dataclass(frozen=True)
class Stderr:
    """What the contract looks at in a command's standard error, read once (``read_stderr``)."""

    lines: tuple[str, ...]
    """Its lines that are not blank."""
    last: str
    """The last line of its stripped text ("" when there is none)."""
    traceback: bool
    """A Python traceback appears in it."""
    own_traceback: bool
    """The traceback runs through dtypecheck's own code (the traceback of the user's own code that raised, which a
    ``file.py:factory`` error shows above its ``error:`` line, is not dtypecheck's)."""

    @property
    def one_error_line(self) -> bool:
        """The contract's failure output: exactly one line, starting ``error: ``, and no traceback."""
        return len(self.lines) == 1 and self.lines[0].startswith("error: ") and not self.traceback

    def handled(self, returncode: int, expect: frozenset[int]) -> bool:
        """The contract for a hostile input: an allowed exit code, no traceback, and for errors exactly one line."""
        if returncode not in expect or self.traceback:
            return False
        return returncode in (0, 1) or self.one_error_line


def read_stderr(stderr: str) -> Stderr:
    package = str(Path(code_under_test()) / "dtypecheck")
    all_lines = stderr.splitlines()
    frames = [line for line in all_lines if line.lstrip().startswith('File "')]
    traceback = "Traceback" in stderr
    own = traceback and (not frames or any(package in line or "/dtypecheck/" in line for line in frames))
    last = (stderr.strip().splitlines() or [""])[-1]
    return Stderr(tuple(line for line in all_lines if line.strip()), last, traceback, own)


def one_error_line(stderr: str) -> bool:
    """``Stderr.one_error_line`` of ``stderr``."""
    return read_stderr(stderr).one_error_line


def own_traceback(stderr: str) -> bool:
    """``Stderr.own_traceback`` of ``stderr``."""
    return read_stderr(stderr).own_traceback


def handled(returncode: int, stderr: str, expect: frozenset[int]) -> bool:
    """``Stderr.handled`` of ``stderr``."""
    return read_stderr(stderr).handled(returncode, expect)


def run_hostile(hostile: Hostile, timeout: float) -> tuple[int, str, float]:
    """Run one corpus input in its own process, through its driver: (exit code, stderr, seconds).
    ``subprocess.TimeoutExpired`` means a hang."""
    start = time.monotonic()
    if hostile.driver == "interrupt":
        Path(hostile.extra["started"]).unlink(missing_ok=True)  # a marker from an earlier run would fire too soon
    if not hostile.driver:
        done = run_cli(hostile.args, timeout=timeout, cwd=hostile.cwd)
        return done.returncode, done.stderr, time.monotonic() - start
    process = subprocess.Popen(
        [sys.executable, "-m", "dtypecheck", *hostile.args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environment(),
        cwd=code_under_test(),
    )
    try:
        if hostile.driver == "truncate":  # once the scan maps the file, cut it short under it
            target = Path(hostile.args[1])
            _wait_for(lambda: str(target) in _maps_of(process.pid), process, timeout)
            os.truncate(target, 4096)
        elif hostile.driver == "interrupt":  # once the user's factory runs, press Ctrl-C
            started = Path(hostile.extra["started"])
            _wait_for(started.exists, process, timeout)
            process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=timeout)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return process.returncode, stderr, time.monotonic() - start


def _maps_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _wait_for(condition: Callable[[], bool], process: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(process.args, timeout)
        time.sleep(0.005)
