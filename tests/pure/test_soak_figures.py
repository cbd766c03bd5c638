"""bench/soak.py's figures for issue #34, on made-up samples: flatness (a level that swings
around a constant is flat by its 5-minute means and its trend, however far single samples
swing; a level that grows is not) and the marginal cost of a retained execution."""

from __future__ import annotations

import pytest

from bench.soak import flat_ratio_of_means, marginal, trend_percent

pytestmark = [pytest.mark.timeout(30)]


def _swinging(minutes: int, level: float, growth_per_hour: float = 0.0) -> list[tuple[float, float]]:
    """A sample every 10 s: `level` plus a sawtooth of +-20 MB (blocks loaded and dropped)."""
    return [
        (t, level + growth_per_hour * t / 3600 + (20.0 if (t // 30) % 2 else -20.0)) for t in range(0, minutes * 60, 10)
    ]


def test_a_level_swinging_around_a_constant_is_flat_by_its_means_and_its_trend() -> None:
    points = _swinging(60, 150.0)
    assert max(p[1] for p in points) / min(p[1] for p in points) > 1.3  # the samples alone say "not flat"
    assert flat_ratio_of_means(points) == pytest.approx(1.0, abs=0.01)
    assert trend_percent(points) == pytest.approx(0.0, abs=1.0)


def test_a_growing_level_shows_in_both() -> None:
    points = _swinging(60, 150.0, growth_per_hour=30.0)  # +20% of the level over the hour
    ratio = flat_ratio_of_means(points)
    assert ratio is not None and ratio > 1.15
    trend = trend_percent(points)
    assert trend is not None and 17.0 < trend < 22.0


def test_too_short_a_run_has_no_ratio_of_means() -> None:
    assert flat_ratio_of_means(_swinging(7, 150.0)) is None  # one whole span and a short one
    assert flat_ratio_of_means([]) is None
    assert trend_percent([(0.0, 1.0), (10.0, 1.0)]) is None


def test_the_marginal_cost_is_the_slope_between_a_short_and_a_long_run() -> None:
    short = {"retained_after_idle": 30_000, "server_rss_mb_after_idle": 200.0, "heap_inuse_mb_after_idle": 140.0}
    long = {"retained_after_idle": 90_000, "server_rss_mb_after_idle": 290.0, "heap_inuse_mb_after_idle": 224.0}
    got = marginal(short, long)
    assert got["server_rss_kb_per_further_execution"] == pytest.approx(1.536)  # 90 MB over 60,000
    assert got["heap_inuse_kb_per_further_execution"] == pytest.approx(1.434)
    assert got["heap_alloc_kb_per_further_execution"] is None  # not sampled
    assert got["server_rss_mb_at_none_retained"] == pytest.approx(155.0)  # kept whatever is retained
    assert marginal(short, short)["server_rss_kb_per_further_execution"] is None
