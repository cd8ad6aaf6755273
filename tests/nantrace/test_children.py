"""Child processes (issue 18.3): exactly one document, from the original process, whatever the script starts:
DataLoader workers under fork, spawn and forkserver (persistent or not), or its own ``os.fork`` and
``multiprocessing`` children. Run as child processes of the test: forks and descriptors must be real."""

from __future__ import annotations

import json

import pytest

from tests.nantrace._scripts import NanTrace

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
