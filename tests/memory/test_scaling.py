"""``scaling.py``: each moment of a pass as a polynomial in the size, from traces at consecutive sizes."""

from __future__ import annotations

from dtypecheck.memory.scaling import ScaledExtrapolation, ScaledProfile, scale
from dtypecheck.memory.tracing import ActivationProfile, ExtrapolatedProfile


def _trace(timeline: list[tuple[int, int]], retained: int) -> ActivationProfile:
    peak = max(a for a, _ in timeline)
    return ActivationProfile(peak, tuple(timeline), len(timeline), retained, (), tuple(timeline))


def test_linear_moments_by_hand():
    # At x = 3 and 4: moment one grows 2 B per row, moment two 6 B (and 1 B of gradients) per row.
    scaled = scale([_trace([(10, 0), (30, 5)], 7), _trace([(12, 0), (36, 6)], 9)], 3)
    assert isinstance(scaled, ScaledProfile)
    assert scaled.grows
    at_10 = scaled.at(10)  # moments (24, 0) and (72, 12)
    assert at_10.peak_activations == 72
    assert at_10.peak() == 84
    assert at_10.peak(0.5) == 78
    assert at_10.retained_bytes == 7 + 7 * 2


def test_quadratic_moments_by_hand():
    # One moment 5 + x^2 at x = 2, 3, 4 (9, 14, 21): at x = 10, 105.
    scaled = scale([_trace([(9, 0)], 0), _trace([(14, 0)], 0), _trace([(21, 0)], 0)], 2)
    assert isinstance(scaled, ScaledProfile)
    assert scaled.at(10).peak() == 105
    assert scaled.at(1000).peak() == 5 + 1000**2


def test_no_model_when_the_ops_differ_and_flat_when_nothing_grows():
    assert scale([_trace([(1, 0)], 0), _trace([(1, 0), (2, 0)], 0)], 1) is None
    flat = scale([_trace([(8, 1)], 3), _trace([(8, 1)], 3)], 1)
    assert flat is not None
    assert not flat.grows


def test_an_extrapolated_pass_scales_both_of_its_traces():
    small = [_trace([(10, 0)], 0), _trace([(12, 0)], 0)]  # 1 block: 10 + 2 (x - 1)
    large = [_trace([(15, 0)], 0), _trace([(18, 0)], 0)]  # 2 blocks: 15 + 3 (x - 1)
    deep = [ExtrapolatedProfile(s, big, 1, 10) for s, big in zip(small, large, strict=True)]
    scaled = scale(list(deep), 1)
    assert isinstance(scaled, ScaledExtrapolation)
    # At x = 5: 1 block 18, 2 blocks 27, so 10 blocks 27 + 8 * 9 = 99.
    assert scaled.at(5).peak() == 99
