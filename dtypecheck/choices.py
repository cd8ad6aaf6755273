"""The base of every word list the CLI offers as choices (optimizers, strategies, losses...)."""

from __future__ import annotations

from enum import Enum


class StrChoice(str, Enum):
    """A str-valued enum that prints, formats and serialises as its value, as ``enum.StrEnum`` does from Python
    3.11 (the package supports 3.10). Typer offers its values as a command's choices."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The values it accepts, in declaration order (for validation messages and docs)."""
        return tuple(str(member.value) for member in cls)
