"""``dtypecheck scan-model``: one module per concern.

``run`` (the pipeline: chunks, threads, shards), ``tensor`` (one tensor's statistics and casts),
``kernel`` (the numba kernel), ``thresholds`` (bit-pattern edges of each target), ``values``
(exact value paths the kernel does not take), ``report`` (the report dataclasses), ``policy`` (the
project's tolerance policy), ``document`` (a JSON report read back), ``consistency`` (dtype census and
mixed-dtype findings), ``roles`` (what a training checkpoint's tensors are, and which are judged), ``select``
(include/exclude globs, weights only), ``verdicts`` (one answer per target), ``baseline`` (a previous report,
compared) and ``gate`` (several checkpoints against their baseline files, and the exit code). The engine loads
numba, so it is imported only when ``scan_checkpoint`` is used: the report types stay cheap to import for the
renderers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtypecheck.targets import check_targets

if TYPE_CHECKING:
    from dtypecheck.scan.run import scan_checkpoint

_ENGINE = ("scan_checkpoint",)


def __getattr__(name: str) -> object:
    if name in _ENGINE:
        from dtypecheck.scan import run

        return getattr(run, name)
    raise AttributeError(f"module 'dtypecheck.scan' has no attribute {name!r}")


__all__ = ["check_targets", "scan_checkpoint"]
