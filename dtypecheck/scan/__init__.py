"""``dtypecheck scan-model``: one module per concern.

``scan`` (the pipeline: chunks, threads, shards), ``scan_tensor`` (one tensor's statistics and casts),
``scan_kernel`` (the numba kernel), ``scan_thresholds`` (bit-pattern edges of each target), ``scan_values``
(exact value paths the kernel does not take), ``scan_report`` (the report dataclasses), ``scan_policy`` (the
project's tolerance policy), ``consistency`` (dtype census and mixed-dtype findings) and ``baseline`` (a
previous report, compared). The engine loads numba, so it is imported only when ``scan_checkpoint`` is used:
the report types stay cheap to import for the renderers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtypecheck.scan.targets import check_targets

if TYPE_CHECKING:
    from dtypecheck.scan.scan import scan_checkpoint

_ENGINE = ("scan_checkpoint",)


def __getattr__(name: str) -> object:
    if name in _ENGINE:
        from dtypecheck.scan import scan

        return getattr(scan, name)
    raise AttributeError(f"module 'dtypecheck.scan' has no attribute {name!r}")


__all__ = ["check_targets", "scan_checkpoint"]
