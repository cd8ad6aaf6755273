"""``python -m dtypecheck.nantrace.torchrun ARGS``: ``torch.distributed.run ARGS`` for ``nan-trace --nproc``,
without the launcher's own failure report.

When a rank exits non-zero (the script raised: each rank has said so on its own ``error:`` line), torchrun logs the
failure and ends in a ``ChildFailedError`` traceback and a table of the ranks' exit codes on stderr: 40 lines that
repeat what the ranks said, where nan-trace promises one line and exit 3. Here the launcher's agent logs nothing
(its records are dropped by a filter on the handlers of this process only: the ranks' output is theirs), and the
exit code is the first failed rank's own (3 when it died of a signal).
"""

from __future__ import annotations

import logging
import sys

AGENT_LOGGERS = "torch.distributed.elastic"
"""The loggers of torchrun's agent (its failure report, its "closing signal" warnings)."""

RANK_CODES = (1, 2, 3)
"""Exit codes a rank's nan-trace gives (``docs/contract.md``); any other (a signal, an abort) is reported as 3."""


class _NotTheAgents(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(AGENT_LOGGERS)


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    quiet = _NotTheAgents()
    loggers = [
        logging.getLogger(),
        *(v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for logger in loggers:  # torch's handlers sit on "torch" and "torch.distributed", which do not propagate
        for handler in logger.handlers:
            handler.addFilter(quiet)
    try:
        run(parse_args(argv))  # type: ignore[no-untyped-call]
    except ChildFailedError as failed:
        _, failure = failed.get_first_failure()
        return failure.exitcode if failure.exitcode in RANK_CODES else 3
    except Exception as exc:  # noqa: BLE001  (the agent itself failed, its rendezvous say: one line, not its traceback)
        said = str(exc).strip().splitlines()
        sys.stderr.write(f"error: the launcher of the ranks failed: {type(exc).__name__}: {said[0] if said else ''}\n")
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
