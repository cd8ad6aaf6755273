"""``dtypecheck info --list``: every dtype name this torch build has, and the spellings dtypecheck accepts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dtypecheck.display import ShowsAsHtml
from dtypecheck.dtypes import REGISTRY, Kind


@dataclass(frozen=True)
class DtypeName:
    """One dtype this torch build has, as ``dtypecheck`` accepts it on the command line."""

    name: str
    """torch's name without ``torch.``."""
    kind: Kind
    bits: int
    """Bits of one value (4 for float4 and int4; both components of a complex)."""
    packed: int
    """Values per torch element (2 for float4_e2m1fn_x2)."""
    aliases: tuple[str, ...]
    """The other spellings accepted (case-insensitive; a ``torch.`` prefix is accepted too)."""


@dataclass(frozen=True)
class DtypeList(ShowsAsHtml):
    """The report of ``dtypecheck info --list``."""

    SCHEMA: ClassVar[str] = "dtypecheck.info-list/1"

    dtypes: tuple[DtypeName, ...]
    """Every dtype of this torch build that dtypecheck knows, in registry order (floats widest first)."""
    not_in_this_torch: tuple[str, ...]
    """Dtypes dtypecheck knows that this torch build lacks (newer torch has them)."""
    not_described: tuple[str, ...]
    """torch dtypes dtypecheck has no facts for (untyped bit containers such as ``bits8``)."""
    torch_version: str


def torch_dtype_names() -> list[str]:
    """Every ``torch.dtype`` this torch build exposes, by name, sorted."""
    import torch

    return sorted({str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)})


def list_dtypes() -> DtypeList:
    """The names report: what this torch build has and the spellings dtypecheck accepts for each."""
    import torch

    known = {spec.name for spec in REGISTRY}
    return DtypeList(
        dtypes=tuple(DtypeName(s.name, s.kind, s.bits, s.packed, s.aliases) for s in REGISTRY if s.available),
        not_in_this_torch=tuple(s.name for s in REGISTRY if not s.available),
        not_described=tuple(name for name in torch_dtype_names() if name not in known),
        torch_version=torch.__version__,
    )
