"""Child processes (issue 18.3): exactly one document, from the original process, whatever the script starts:
DataLoader workers under fork, spawn and forkserver (persistent or not), or its own ``os.fork`` and
``multiprocessing`` children. Run as child processes of the test: forks and descriptors must be real."""

from __future__ import annotations

import json

import pytest

from tests.nantrace._scripts import NanTrace, line_of

LOADER = """
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((3,), float(i))


def main():
    loader = DataLoader(
        Data(), batch_size=2, num_workers=2, multiprocessing_context=sys.argv[1],
        persistent_workers="persistent" in sys.argv,
    )
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2 if "persistent" in sys.argv else 1):
        for x in loader:
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
    print("trained", file=sys.stderr)


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    "start", [("fork",), ("spawn",), ("forkserver",), ("fork", "persistent"), ("spawn", "persistent")]
)
def test_dataloader_workers_leave_one_document_and_a_quiet_stderr(nantrace: NanTrace, start: tuple[str, ...]) -> None:
    script, _ = nantrace.write("loader.py", LOADER)
    done = nantrace.process(str(script), "--format", "json", "--", *start)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # one document: a second would not parse
    # 8 items in batches of 2: 4 optimizer steps per epoch, all in the parent.
    assert (doc["status"], doc["steps"]) == ("clean", 8 if "persistent" in start else 4)
    assert done.stderr.strip() == "trained"


OWN_CHILDREN = """
import multiprocessing
import os
import sys

import torch


def work(queue):
    queue.put(float(torch.ones(3).sum()))


if __name__ == "__main__":
    loss = torch.nn.Linear(3, 1)(torch.ones(2, 3)).pow(2).mean()
    loss.backward()
    pid = os.fork()
    if pid == 0:
        print("child ran on", file=sys.stderr)  # and then it runs off the end of the script
    else:
        os.waitpid(pid, 0)
        queue = multiprocessing.get_context("fork").Queue()
        process = multiprocessing.get_context("fork").Process(target=work, args=(queue,))
        process.start()
        print("from the multiprocessing child:", queue.get(), file=sys.stderr)
        process.join()
"""


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_a_script_that_forks_for_itself_gets_one_document(nantrace: NanTrace, fmt: str) -> None:
    script, _ = nantrace.write("forks.py", OWN_CHILDREN)
    done = nantrace.process(str(script), "--format", fmt)
    assert done.returncode == 0, done.stderr
    if fmt == "json":
        assert json.loads(done.stdout)["status"] == "clean"
    else:
        assert done.stdout.count("clean: no NaN or Inf in") == 1
    assert "child ran on" in done.stderr
    assert "from the multiprocessing child: 3.0" in done.stderr
    assert "error:" not in done.stderr
    assert "Traceback" not in done.stderr


WORKER_NAN = """
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.full((3,), float(i))
        if i == 5 and sys.argv[2] == "getitem":
            x = torch.log(x - 10)  # getitem
        if i == 5 and sys.argv[2] == "neginf":
            x = torch.log(x - 5)  # neginf
        return x


def collate(items):
    batch = torch.stack(items)
    if sys.argv[2] == "collate" and float(batch[0, 0]) == 6.0:
        batch = (batch - 6.0) / (batch - 6.0)  # collate
    return batch


def main():
    loader = DataLoader(Data(), batch_size=2, num_workers=2, multiprocessing_context=sys.argv[1], collate_fn=collate)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in loader:
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()  # consumed
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    ("method", "where", "op", "worker", "batch"),
    [
        # Item 5 is in batch 2 (items 4, 5); batches go to the 2 workers in turn: worker 0 makes batches 0 and 2.
        ("fork", "getitem", "aten.log.default", 0, 2),
        ("spawn", "getitem", "aten.log.default", 0, 2),
        ("forkserver", "getitem", "aten.log.default", 0, 2),
        # The batch starting with item 6 is batch 3, worker 1's second; 0 / 0 is NaN in its first row.
        ("fork", "collate", "aten.div.Tensor", 1, 3),
    ],
)
def test_a_nan_made_in_a_worker_is_named_at_the_workers_line(
    nantrace: NanTrace, method: str, where: str, op: str, worker: int, batch: int
) -> None:
    script, text = nantrace.write("worker_nan.py", WORKER_NAN)
    done = nantrace.process(str(script), "--format", "json", "--", method, where)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    first = json.loads(done.stdout)["first"]
    assert (first["kind"], first["op"], first["worker"], first["batch"]) == ("nan", op, worker, batch)
    assert first["location"]["line"] == line_of(text, where)
    assert first["location"]["function"] == ("__getitem__" if where == "getitem" else "collate")
    assert first["arrival"]["line"] == line_of(text, "consumed")
    assert first["cause"] == "invalid_math"
    # batch 2 is consumed in step 3, batch 3 in step 4 (one optimizer step per batch)
    assert (first["step"], first["consequence"]) == (batch + 1, "loss")


@pytest.mark.parametrize(
    ("method", "where", "watch"),
    [
        ("fork", "neginf", False),
        ("fork", "neginf", True),
        ("spawn", "neginf", True),
        ("fork", "getitem", True),  # collate_fn's batches take the same path (fetch) under watch mode
    ],
)
def test_a_value_made_in_a_worker_is_named_at_the_workers_line_in_both_modes(
    nantrace: NanTrace, method: str, where: str, watch: bool
) -> None:
    """Issue 30.4: a ``-inf`` made in a worker was named at the main process's ``addmm`` (which makes NaN of it,
    ``inf - inf``), worker and batch null, in both modes; under ``--watch`` a NaN from the same line was too.

    ``log(5 - 5)`` is ``-inf`` in all 3 features of item 5, which is in batch 2 (items 4, 5), worker 0's second;
    it is consumed in step 3 (one optimizer step per batch) and reaches the loss."""
    script, text = nantrace.write("worker_nan.py", WORKER_NAN)
    done = nantrace.process(*(["--watch"] if watch else []), str(script), "--format", "json", "--", method, where)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    first = doc["first"]
    kind, op, worker, batch = {
        "neginf": ("inf", "aten.log.default", 0, 2),
        "getitem": ("nan", "aten.log.default", 0, 2),
        "collate": ("nan", "aten.div.Tensor", 1, 3),
    }[where]
    assert (first["kind"], first["op"], first["worker"], first["batch"]) == (kind, op, worker, batch)
    assert (first["phase"], first["module"]) == ("other", None)
    assert first["location"]["line"] == line_of(text, where)
    assert first["arrival"]["line"] == line_of(text, "consumed")
    assert (first["step"], first["consequence"]) == (batch + 1, "loss")
    if where == "neginf":
        assert (first["counts"]["neginf"], first["counts"]["nan"]) == (3, 0)
    if watch:
        assert (doc["watch"]["detected_step"], doc["watch"]["exact"]) == (batch + 1, True)
