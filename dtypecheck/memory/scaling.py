"""A pass's live bytes at any batch (or sequence length) from traces at two (or three) consecutive sizes.

For a fixed graph every moment of a pass holds tensors whose sizes are polynomials in the batch (degree 1) or the
sequence length (degree 2: attention scores), so the bytes alive after each op are too. Traces at ``x0`` and
``x0 + 1`` (and ``x0 + 2``) that ran the same ops give each moment's polynomial exactly, in integers; its value at
any ``x`` is then the trace that would have run there, if the graph is the same. ``--fit`` searches that model and
checks its answer with real traces (``fit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtypecheck.memory.tracing import ActivationProfile, ExtrapolatedProfile, Profile


@dataclass(frozen=True)
class _Poly:
    """``v0 + t*d1 + t*(t-1)/2*d2`` at ``t = x - x0``: the Newton form through consecutive integers."""

    v0: int
    d1: int
    d2: int = 0

    @classmethod
    def through(cls, values: tuple[int, ...]) -> _Poly:
        if len(values) == 2:
            return cls(values[0], values[1] - values[0])
        v0, v1, v2 = values
        return cls(v0, v1 - v0, v2 - 2 * v1 + v0)

    def at(self, t: int) -> int:
        return self.v0 + t * self.d1 + t * (t - 1) // 2 * self.d2


@dataclass(frozen=True)
class ScaledProfile:
    """One traced pass (an ``ActivationProfile``) as polynomials in the size, from ``x0`` on."""

    x0: int
    moments: tuple[tuple[_Poly, _Poly], ...]
    """(activation bytes, gradient bytes) of every distinct moment of the pass."""
    retained: _Poly
    ops: int
    notes: tuple[str, ...]
    ungraded: tuple[str, ...] = ()

    def at(self, x: int) -> ActivationProfile:
        t = x - self.x0
        moments = {(a.at(t), g.at(t)) for a, g in self.moments}
        peak = max((a for a, _ in moments), default=0)
        frontier = tuple(sorted(moments, reverse=True))
        return ActivationProfile(peak, frontier, self.ops, self.retained.at(t), self.notes, ungraded=self.ungraded)

    @property
    def grows(self) -> bool:
        """Whether any figure changes with the size."""
        polys = [p for moment in self.moments for p in moment] + [self.retained]
        return any(p.d1 or p.d2 for p in polys)


@dataclass(frozen=True)
class ScaledExtrapolation:
    """A deep model's pass, extrapolated from two shallow ones, each scaled."""

    smaller: ScaledProfile
    larger: ScaledProfile
    base: int
    layers: int

    def at(self, x: int) -> ExtrapolatedProfile:
        return ExtrapolatedProfile(self.smaller.at(x), self.larger.at(x), self.base, self.layers)

    @property
    def grows(self) -> bool:
        return self.smaller.grows or self.larger.grows


Scaled = ScaledProfile | ScaledExtrapolation


def scale(profiles: list[Profile], x0: int) -> Scaled | None:
    """The model through ``profiles``, traced at ``x0, x0 + 1[, x0 + 2]``; None when the traces did not run the
    same ops (the graph changed with the size), so that no moment-by-moment model exists."""
    if all(isinstance(p, ActivationProfile) for p in profiles):
        traces = [p for p in profiles if isinstance(p, ActivationProfile)]
        if len({(len(p.timeline), p.ops, p.ungraded) for p in traces}) != 1:
            return None
        moments = {
            (_Poly.through(tuple(m[0] for m in moment)), _Poly.through(tuple(m[1] for m in moment)))
            for moment in zip(*(p.timeline for p in traces), strict=True)
        }
        retained = _Poly.through(tuple(p.retained_bytes for p in traces))
        return ScaledProfile(x0, tuple(moments), retained, traces[0].ops, traces[-1].notes, traces[0].ungraded)
    if all(isinstance(p, ExtrapolatedProfile) for p in profiles):
        deep = [p for p in profiles if isinstance(p, ExtrapolatedProfile)]
        if len({(p.base, p.layers) for p in deep}) != 1:
            return None
        smaller = scale([p.smaller for p in deep], x0)
        larger = scale([p.larger for p in deep], x0)
        if not isinstance(smaller, ScaledProfile) or not isinstance(larger, ScaledProfile):
            return None
        return ScaledExtrapolation(smaller, larger, deep[0].base, deep[0].layers)
    return None
