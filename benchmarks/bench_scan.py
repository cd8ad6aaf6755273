"""Speed and memory of ``dtypecheck scan-model`` on a 4 GiB float32 safetensors file (issue 3).

Two figures, each the median of several runs:

- **time**: whole-process wall time of ``dtypecheck scan-model FILE --format json --quiet`` against a floor
  script that only opens the same file (memory-mapped, as the loader does) and runs ``torch.aminmax`` once per
  tensor. Runs alternate back to back with a warm page cache; the target ratio is <= 1.2 (issue 23). The children's CPU
  time (user + system) is reported too: on shared cores it is the steadier figure.
- **memory**: peak private (anonymous) memory of the scan, sampled from ``/proc/PID/status`` ``RssAnon`` every
  millisecond; the target is <= 768 MiB. ``VmHWM`` and ``/usr/bin/time``'s max RSS would count the file's
  page-cache pages that the memory map touches (4 GiB here), which are shared and reclaimable, not the
  process's own memory.

The file (one 1 GiB tensor and twelve of 256 MiB, normal values with a few float16 overflows) is written to
``bench-data/`` (git-ignored) and deleted afterwards unless ``--keep``. ``--cold`` also times both with the
file dropped from the page cache before each run (``posix_fadvise(DONTNEED)``).

    .venv/bin/python benchmarks/bench_scan.py --repeats 5

``--versus=--precision`` times the plain scan against the scan with those options instead of the floor (issue
23: ``--precision`` within 2x the plain scan, 3x with float8/float4 targets); ``--gib 1`` uses a 1 GiB file of the
one large tensor instead of the 4 GiB one:

    .venv/bin/python benchmarks/bench_scan.py --gib 1 --repeats 5 --versus=--precision
    .venv/bin/python benchmarks/bench_scan.py --gib 1 --repeats 5 --versus='--precision --target fp16,bf16,e4m3'

``--base`` gives the plain side options of its own, e.g. the same targets, to time what ``--precision`` adds to them:

    .venv/bin/python benchmarks/bench_scan.py --gib 1 --repeats 5 --base='--target fp16,bf16,e4m3' \
        --versus='--precision --target fp16,bf16,e4m3'

``--before DIR`` also times the same commands with dtypecheck imported from DIR, in the same rounds, so that a
change is measured before and after side by side (each command runs once untimed first: numba's cache and the
page cache are warm for both):

    git archive BASE | tar -x -C /tmp/before
    .venv/bin/python benchmarks/bench_scan.py --keep --repeats 5 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
BIG = ("big.weight", (16384, 16384))  # 1 GiB of float32
SMALL = [(f"layers.{i}.weight", (8192, 8192)) for i in range(12)]  # 12 x 256 MiB

FLOOR = """
import json, mmap, struct, sys, warnings
import torch

with open(sys.argv[1], "rb") as handle:
    (length,) = struct.unpack("<Q", handle.read(8))
    header = json.loads(handle.read(length))
    data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
warnings.simplefilter("ignore")  # torch warns that the buffer is read-only
base = 8 + length
for name, entry in header.items():
    if name != "__metadata__":
        start, stop = entry["data_offsets"]
        torch.aminmax(torch.frombuffer(memoryview(data)[base + start : base + stop], dtype=torch.float32))
"""


def write_checkpoint(path: Path, tensors: list[tuple[str, tuple[int, int]]]) -> None:
    """A float32 safetensors file, written block by block from one reusable random block (fast, 64 MiB RAM)."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in tensors:
        nbytes = shape[0] * shape[1] * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    block = (np.random.default_rng(0).standard_normal(16 * MIB, dtype=np.float32) * np.float32(0.02)).copy()
    block[:: 4 * MIB + 7] = 7e4  # a few values beyond float16's max, so there is something to count
    tmp = path.with_suffix(".partial")
    with tmp.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for index, (_, shape) in enumerate(tensors):
            count = shape[0] * shape[1]
            scale = np.float32(2.0 ** (index % 5 - 2))
            for start in range(0, count, block.size):
                handle.write((block[: min(block.size, count - start)] * scale).tobytes())
    tmp.replace(path)


def warm(path: Path) -> None:
    with path.open("rb") as handle:
        while handle.read(64 * MIB):
            pass


def drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _anon_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(command: list[str], code: Path | None = None) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RssAnon bytes, stdout) of one whole process (importing dtypecheck from ``code``)."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    cpu_before = _cpu_of_children()
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            kib = _anon_kib(child.pid)
            if kib is not None:
                peak = max(peak, kib)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate()
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    if child.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({child.returncode}):\n{err}")
    return elapsed, _cpu_of_children() - cpu_before, peak * 1024, out


def scan_command(path: Path, extra: list[str] | None = None) -> list[str]:
    script = Path(sys.executable).parent / "dtypecheck"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "dtypecheck"]
    return [*head, "scan-model", str(path), "--format", "json", "--quiet", *(extra or [])]


def measure(
    path: Path,
    repeats: int,
    cold: bool,
    extra: list[str] | None = None,
    *,
    tensors: int,
    versus: bool = False,
    before: Path | None = None,
    base: list[str] | None = None,
) -> dict[str, list[float]]:
    """Alternating runs of the floor (or, ``versus``, the plain scan) and the scan with ``extra``; with ``before``
    (a checkout of earlier code) the same scan commands of that code run in the same rounds (``before_*``)."""
    floor_command = scan_command(path, base) if versus else [sys.executable, "-c", FLOOR, str(path)]
    contenders: list[tuple[str, list[str], Path | None]] = [
        ("floor", floor_command, ROOT if versus else None),
        ("scan", scan_command(path, extra), ROOT),
    ]
    if before is not None:
        if versus:
            contenders.append(("before_floor", floor_command, before))
        contenders.append(("before_scan", scan_command(path, extra), before))
    results: dict[str, list[float]] = {}
    for _, command, code in contenders:  # one untimed run each: numba's cache filled, the file in the page cache
        run(command, code)
    for _ in range(repeats):
        for name, command, code in contenders:
            if cold:
                drop_from_cache(path)
            else:
                warm(path)
            wall, cpu, anon, out = run(command, code)
            results.setdefault(name, []).append(wall)
            results.setdefault(f"{name}_cpu", []).append(cpu)
            if name.endswith("scan"):
                results.setdefault(f"{name}_anon", []).append(anon)
                summary = json.loads(out)["summary"]
                assert summary["tensors"] == tensors, summary
    return results


def report(label: str, results: dict[str, list[float]], check: bool, versus: str = "", base: str = "") -> bool:
    ok = True
    print(f"{label}: median of {len(results['scan'])} runs each")
    for prefix, code in (("", "this code"), ("before_", "the code before")):
        if f"{prefix}scan" not in results:
            continue
        floor_key = f"{prefix}floor" if f"{prefix}floor" in results else "floor"
        floor, scan = statistics.median(results[floor_key]), statistics.median(results[f"{prefix}scan"])
        floor_cpu = statistics.median(results[f"{floor_key}_cpu"])
        scan_cpu = statistics.median(results[f"{prefix}scan_cpu"])
        anon = statistics.median(results[f"{prefix}scan_anon"]) / MIB
        ratio = scan / floor
        every = {name: " ".join(f"{t:.2f}" for t in results[name]) for name in (floor_key, f"{prefix}scan")}
        print(f" {code}:")
        if versus:
            plain = (
                f"dtypecheck scan-model --format json {base}" if base else "plain dtypecheck scan-model --format json"
            )
            print(f"  {plain}: wall {floor:6.2f} s   cpu {floor_cpu:6.2f} s")
            print(f"  ... with {versus}: wall {scan:6.2f} s   cpu {scan_cpu:6.2f} s")
            cpu_ratio = scan_cpu / floor_cpu
            print(f"  ratio wall {ratio:.2f}x   ratio cpu {cpu_ratio:.2f}x   peak private memory {anon:.0f} MiB")
            print(f"  every wall time: plain {every[floor_key]}   with the options {every[f'{prefix}scan']}")
            continue
        print(f"  floor (mmap + torch.aminmax per tensor): wall {floor:6.2f} s   cpu {floor_cpu:6.2f} s")
        print(f"  dtypecheck scan-model --format json:     wall {scan:6.2f} s   cpu {scan_cpu:6.2f} s")
        print(f"  ratio wall {ratio:.2f}x (target <= 1.2x)   ratio cpu {scan_cpu / floor_cpu:.2f}x")
        print(f"  scan peak private memory (RssAnon): {anon:.0f} MiB (target <= 768 MiB)")
        print(f"  every wall time: floor {every[floor_key]}   scan {every[f'{prefix}scan']}")
        if not prefix:
            ok = not check or (ratio <= 1.2 and anon <= 768)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the generated 4 GiB file")
    parser.add_argument("--cold", action="store_true", help="also time with the file dropped from the page cache")
    parser.add_argument(
        "--scan-args",
        default="",
        help="extra scan-model options, e.g. '--target fp16,bf16,e4m3 --precision' (the targets stay default)",
    )
    parser.add_argument("--gib", type=int, choices=(1, 4), default=4, help="file size: 1 GiB (one tensor) or 4 GiB")
    parser.add_argument("--versus", default="", help="time the plain scan against the scan with these options")
    parser.add_argument("--base", default="", help="with --versus: options of the plain scan (e.g. its --target)")
    parser.add_argument(
        "--before", type=Path, help="a checkout of earlier code (e.g. from git archive) to time in the same rounds"
    )
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    tensors = [BIG, *SMALL] if args.gib == 4 else [BIG]
    path = args.dir / f"bench_scan_{args.gib}gib.safetensors"
    needed = sum(s[0] * s[1] * 4 for _, s in tensors)
    if not (path.exists() and path.stat().st_size > needed):
        if shutil.disk_usage(args.dir).free < needed + 512 * MIB:
            sys.exit(f"not enough free disk in {args.dir} for a {needed / 2**30:.0f} GiB file")
        print(f"writing {path} ...", flush=True)
        write_checkpoint(path, tensors)
    try:
        versus = bool(args.versus)
        extra = (args.versus or args.scan_args).split()
        results = measure(
            path,
            args.repeats,
            cold=False,
            extra=extra,
            tensors=len(tensors),
            versus=versus,
            before=args.before,
            base=args.base.split(),
        )
        ok = report("warm page cache", results, check=not versus, versus=args.versus, base=args.base)
        if args.cold:
            cold = measure(
                path,
                max(1, args.repeats // 2),
                cold=True,
                extra=extra,
                tensors=len(tensors),
                versus=versus,
                before=args.before,
                base=args.base.split(),
            )
            report("cold page cache", cold, check=False, versus=args.versus, base=args.base)
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
