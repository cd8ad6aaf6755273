"""Which tensors of a checkpoint a scan reads: ``--include``/``--exclude`` globs and ``--weights-only``.

Globs match a tensor's whole key path as the config's ignore rules do (``fnmatch.fnmatchcase``: ``*`` also crosses
dots, case matters). A tensor is scanned when it matches one of ``include`` (or there is none), matches none of
``exclude``, and, with ``weights_only``, is one of the model's parameters or buffers (``roles``: role ``model``, or
a buffer such as ``num_batches_tracked``), not optimizer, scheduler or trainer state (its role, from
``roles.assign_roles``). Tensors left out are not read.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from dtypecheck.scan.roles import RoleRule


@dataclass(frozen=True)
class Selection:
    include: tuple[str, ...] = ()
    """Globs of the tensors to scan; empty: every tensor."""
    exclude: tuple[str, ...] = ()
    """Globs of the tensors to leave out (they win over ``include``)."""
    weights_only: bool = False
    """Only the model's parameters and buffers."""

    def keeps(self, name: str, rule: RoleRule | None = None) -> bool:
        """Whether the tensor named ``name`` is scanned; ``rule`` is its role (None: the model's)."""
        if self.include and not any(fnmatch.fnmatchcase(name, glob) for glob in self.include):
            return False
        if any(fnmatch.fnmatchcase(name, glob) for glob in self.exclude):
            return False
        if self.weights_only:
            return rule is None or rule.model_buffer
        return True

    def describe(self) -> str:
        """How a finding names the selection: ``include 'a.*', exclude '*.bias', weights only``."""
        parts = [f"include {glob!r}" for glob in self.include] + [f"exclude {glob!r}" for glob in self.exclude]
        return ", ".join(parts + (["weights only"] if self.weights_only else []))


EVERYTHING = Selection()

__all__ = ["EVERYTHING", "Selection"]
