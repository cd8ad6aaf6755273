"""dtypecheck against the pickle scanners people already use, on the same live payloads and benign checkpoints.

Anchors: picklescan, modelscan and fickling, installed from the package registry into a throwaway virtual
environment of their own (``--venv``, default ``bench-data/anchors-venv``, git-ignored), pinned below; nothing is
installed into the environment that runs this script. If pip cannot reach the registry the anchors are left out
and only dtypecheck's column is printed.

Inputs, all generated (``tests/security/corpus.py``), nothing stored:

- **live payloads**: every input of the corpus classes that carry code (``globals``, ``unread-pickles``,
  ``differentials``, ``loadable-files``, ``gadgets`` and issue 27's classes in ``tests/security/gate/``) whose
  payload is *proven live*: after the scans, ``torch.load(weights_only=False)`` (or ``torch.jit.load``,
  ``dcp.load``) of it in a throwaway process, from the working folder it needs, creates its canary file.
- **benign checkpoints** shaped like real ones: a Lightning ``.ckpt``, a Hugging Face Trainer checkpoint folder
  (``model.safetensors``, ``training_args.bin``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``), a
  ``torch.distributed.checkpoint`` folder, an optimizer state, a legacy (non-zip) ``torch.save``, a safetensors file;
  and every corpus input marked ``benign`` (files the real transformers, peft, Lightning, accelerate and DCP write,
  and harmless look-alikes of the attacks).

Each tool gets the path a user would give it (a file or a folder; fickling, which reads one file, gets each file of a
folder in turn) and is judged by its exit status: flagged (1), clean (0), errored (anything else, or a crash).
dtypecheck is "flagged" when ``scan-model`` exits 1 with a ``fail`` finding of a security kind (a global, a
differential, a smuggled copy, code in an archive, an unreadable pickle), not merely a numeric one.

    .venv/bin/python benchmarks/anchor_scanners.py [--timeout 120] [--keep DIR] [--venv DIR] [--no-anchors]
        [--gate] [--jobs N]

``--gate``: issue 27's classes only (``tests/security/gate/``) and the benign checkpoints; ``--jobs N``: run N
tools' processes at a time (each input is still scanned in a process of its own).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtypecheck import findings  # noqa: E402
from tests.security import corpus  # noqa: E402
from tests.security.harness import environment, prove_live  # noqa: E402

ANCHORS = {"picklescan": "picklescan==1.0.5", "modelscan": "modelscan==0.8.8", "fickling": "fickling==0.1.12"}
EXTRA_REQUIREMENTS = ("typing_extensions==4.16.0",)  # fickling 0.1.12 imports it without declaring it
LIVE_CLASSES = ("globals", "unread-pickles", "differentials", "loadable-files", "gadgets", *corpus.GATE_CLASSES)
SECURITY_KINDS = {*findings.SECURITY_KINDS, "unreadable-file"}
"""What makes dtypecheck's verdict "flagged": a security finding (``contains-code`` of a TorchScript archive included)
or a pickle it could not read to the end."""


def install_anchors(where: Path) -> Path | None:
    """The anchors' own virtual environment (created and filled once), or None when pip cannot get them."""
    python = where / "bin" / "python"
    marker = where / "installed.txt"
    wanted = "\n".join([*ANCHORS.values(), *EXTRA_REQUIREMENTS])
    if marker.exists() and marker.read_text() == wanted:
        return python
    if not python.exists():
        venv.create(where, with_pip=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *ANCHORS.values(), *EXTRA_REQUIREMENTS],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        print(f"anchors left out: pip install failed ({done.stderr.strip().splitlines()[-1:]})", flush=True)
        return None
    marker.write_text(wanted)
    return python


def benign_checkpoints(folder: Path) -> list[Path]:
    """Real-shaped checkpoints that hold nothing hostile."""
    import dataclasses
    import random

    import numpy as np
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(4, 8)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=100)
    # Lightning keeps hparams in an AttributeDict but saves dict(hparams) (checkpoint_connector.dump_checkpoint)
    hparams = {"lr": 1e-3, "hidden": 8}
    lightning = {
        "epoch": 1,
        "global_step": 10,
        "pytorch-lightning_version": "2.5.0",
        "state_dict": model.state_dict(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None}},
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [scheduler.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": hparams,
    }
    made = [folder / "lightning.ckpt", folder / "trainer-checkpoint", folder / "dcp", folder / "optimizer.pt"]
    torch.save(lightning, made[0])
    trainer = made[1]
    trainer.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, trainer / "model.safetensors")
    torch.save(optimizer.state_dict(), trainer / "optimizer.pt")
    torch.save(scheduler.state_dict(), trainer / "scheduler.pt")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    torch.save(rng, trainer / "rng_state.pth")
    try:
        from transformers import TrainingArguments
        from transformers.trainer_utils import IntervalStrategy

        arguments = object.__new__(TrainingArguments)  # as Trainer saves it, without building its devices
        for spec in dataclasses.fields(TrainingArguments):
            if spec.default is not dataclasses.MISSING:
                setattr(arguments, spec.name, spec.default)
            elif spec.default_factory is not dataclasses.MISSING:
                setattr(arguments, spec.name, spec.default_factory())
        arguments.output_dir = "out"
        arguments.eval_strategy = IntervalStrategy("steps")
        torch.save(arguments, trainer / "training_args.bin")
    except ImportError:
        pass
    (trainer / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 8}))
    (trainer / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": []}))
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_save({"model": model.state_dict(), "step": 10}, checkpoint_id=made[2])
    torch.save(optimizer.state_dict(), made[3])
    legacy = folder / "legacy.pt"
    torch.save(model.state_dict(), legacy, _use_new_zipfile_serialization=False)
    weights = folder / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    return [*made, legacy, weights]


FICKLING_DRIVER = """
import sys
from fickling.analysis import Severity
from fickling.loader import scan_file, scan_zip_archive
path = sys.argv[1]
with open(path, "rb") as handle:
    is_zip = handle.read(4) == b"PK\\x03\\x04"
found = scan_zip_archive(path, graceful=True).values() if is_zip else [scan_file(path, graceful=True)]
unsafe = any(r.severity > Severity.LIKELY_SAFE and r.results for r in found)
sys.exit(1 if unsafe else 2 if any(r.errors for r in found) else 0)
"""
"""fickling's own verdict (``severity`` above ``LIKELY_SAFE``, as its ``--check-safety`` exits 1), through the
scanner it has for zip archives; a file it cannot parse is an error, as its CLI exits 2."""


def _status(returncode: int) -> str:
    return {0: "clean", 1: "flagged"}.get(returncode, "errored")


def run_tool(
    tool: str, python: Path | None, path: Path, timeout: float, args: tuple[str, ...] = (), cwd: Path | None = None
) -> str:
    """flagged / clean / errored for one tool on one input (``args``: dtypecheck's own options for it, as the
    corpus gives them; ``cwd``: the folder the tool runs in, the input's own by default)."""
    if tool == "fickling" and path.is_dir():  # it reads one file: every file of the folder in turn
        results = [run_tool(tool, python, p, timeout, cwd=cwd) for p in sorted(path.rglob("*")) if p.is_file()]
        return next((r for r in ("flagged", "errored") if r in results), "clean")
    if tool == "dtypecheck":
        command = [sys.executable, "-m", "dtypecheck", "scan-model", str(path), *args, "--format", "json"]
    elif tool == "fickling":  # its CLI reads a file as stacked pickles; zips go through its own zip scanner
        assert python is not None
        command = [str(python), "-c", FICKLING_DRIVER, str(path)]
    else:
        assert python is not None
        command = [str(python.parent / tool), "-p", str(path)]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",  # a tool may print a file name or bytes that are not UTF-8
            timeout=timeout,
            check=False,
            env=environment(),
            cwd=cwd or path.parent,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return "errored"
    if tool != "dtypecheck":
        return _status(done.returncode)
    if done.returncode not in (0, 1):
        return "errored"
    if done.returncode == 0:
        return "clean"
    document = json.loads(done.stdout)
    findings = [f for d in document.get("checkpoints", [document]) for f in d.get("findings", [])]
    security = [f for f in findings if f["kind"] in SECURITY_KINDS and f["level"] == "fail"]
    return "flagged" if security else "clean"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--keep", type=Path, help="build the inputs in DIR and keep them")
    parser.add_argument("--venv", type=Path, default=ROOT / "bench-data" / "anchors-venv")
    parser.add_argument("--no-anchors", action="store_true", help="dtypecheck's column only")
    parser.add_argument("--gate", action="store_true", help="issue 27's classes only (tests/security/gate/)")
    parser.add_argument("--jobs", type=int, default=1, help="processes run at a time")
    options = parser.parse_args()
    folder = options.keep or Path(tempfile.mkdtemp(prefix="dtypecheck-anchors-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    python = None if options.no_anchors else install_anchors(options.venv)
    tools = ["dtypecheck", *(ANCHORS if python is not None else ())]
    try:
        classes = corpus.GATE_CLASSES if options.gate else LIVE_CLASSES
        built = [h for h in corpus.build(folder / "hostile", classes) if h.args[:1] == ("scan-model",)]
        hostile = [h for h in built if h.canary is not None]
        for h in hostile:
            h.canary.unlink(missing_ok=True)  # type: ignore[union-attr]
        shaped = benign_checkpoints(folder / "benign")
        targets = [(h.name, Path(h.args[1]), h.args[2:], h.cwd) for h in [*hostile, *(h for h in built if h.benign)]]
        targets += [(f"benign/{p.name}", p, (), None) for p in shaped]
        benign = [h.name for h in built if h.benign] + [f"benign/{p.name}" for p in shaped]
        klass = {h.name: h.klass for h in built} | {f"benign/{p.name}": "benign-shaped" for p in shaped}
        results: dict[str, dict[str, str]] = {tool: {} for tool in tools}

        def one(tool: str, name: str, target: Path, args: tuple[str, ...], cwd: Path | None) -> None:
            own = args if tool == "dtypecheck" else ()
            results[tool][name] = run_tool(tool, python, target, options.timeout, own, cwd)
            print(f"{tool:11} {results[tool][name]:8} {name}", flush=True)

        with concurrent.futures.ThreadPoolExecutor(max(1, options.jobs)) as pool:
            runs = [pool.submit(one, tool, *target) for tool in tools for target in targets]
            for run in runs:
                run.result()
        ran = [h.name for h in hostile if h.canary is not None and h.canary.exists()]
        live = sorted(prove_live(hostile, timeout=600))
        report(results, live, benign, ran, time.monotonic() - started, klass)
    finally:
        if options.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def report(
    results: dict[str, dict[str, str]],
    live: list[str],
    benign: list[str],
    ran: list[str],
    took: float,
    klass: dict[str, str],
) -> None:
    print()
    print(f"live payloads (proven by torch.load): {len(live)}; benign checkpoints: {len(benign)}")
    tools = list(results)
    heads = ["class", "live", *(f"{t} flagged" for t in tools), "benign", *(f"{t} false alarms" for t in tools)]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for name in sorted(set(klass.values())):
        members = [n for n in live if klass.get(n) == name]
        harmless = [n for n in benign if klass.get(n) == name]
        flagged = [sum(results[t][n] == "flagged" for n in members) for t in tools]
        alarmed = [sum(results[t][n] == "flagged" for n in harmless) for t in tools]
        print(
            f"| {name} | {len(members)} | "
            + " | ".join(map(str, flagged))
            + f" | {len(harmless)} | "
            + " | ".join(map(str, alarmed))
            + " |"
        )
    print()
    print(f"{'tool':11} {'flagged':>8} {'missed':>7} {'errored':>8} {'false alarms':>13} {'benign errored':>15}")
    for tool, outcome in results.items():
        on_live = [outcome[name] for name in live]
        on_benign = [outcome[name] for name in benign]
        print(
            f"{tool:11} {on_live.count('flagged'):>8} {on_live.count('clean'):>7} {on_live.count('errored'):>8} "
            f"{on_benign.count('flagged'):>13} {on_benign.count('errored'):>15}"
        )
    anchors = [outcome for tool, outcome in results.items() if tool != "dtypecheck"]
    anyone = {name for outcome in anchors for name in live if outcome[name] == "flagged"}
    missed = sorted(name for name in anyone if results["dtypecheck"][name] != "flagged")
    print(f"flagged by an anchor but not by dtypecheck: {missed or 'none'}")
    for tool, outcome in results.items():
        misses = [name for name in live if outcome[name] != "flagged"]
        alarms = [name for name in benign if outcome[name] == "flagged"]
        print(f"  {tool}: not flagged {misses or '-'}; false alarms {alarms or '-'}")
    print(f"code executed during the scans: {len(ran)} (canaries; must be 0)")
    print(f"total time: {took:.0f} s")


if __name__ == "__main__":
    main()
