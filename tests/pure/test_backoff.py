"""The pure backoff function: bounds and determinism (property tests)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.backoff import base_delay, retry_delay, unit_random, with_jitter

pytestmark = [pytest.mark.timeout(60)]

backoffs = st.sampled_from(["fixed", "linear", "exponential"])
delays = st.floats(min_value=0, max_value=3600, allow_nan=False)


@given(backoffs, st.integers(1, 10_000), delays, st.floats(1, 10), delays)
def test_base_delay_never_exceeds_max_delay_and_is_not_negative(backoff, attempt, initial, factor, max_delay) -> None:  # type: ignore[no-untyped-def]
    d = base_delay(backoff, attempt=attempt, initial=initial, factor=factor, max_delay=max_delay)
    assert 0 <= d <= max_delay


@given(delays, st.floats(0, 1, exclude_max=True))
def test_jitter_stays_inside_its_bounds(delay: float, unit: float) -> None:
    assert with_jitter(delay, "none", unit) == delay
    assert 0 <= with_jitter(delay, "full", unit) <= delay
    assert delay / 2 <= with_jitter(delay, "equal", unit) <= delay


@given(st.text(), st.integers(0, 10**6), st.integers(1, 1000))
def test_the_random_unit_is_deterministic_and_in_range(eid: str, act: int, attempt: int) -> None:
    u = unit_random(eid, act, attempt)
    assert 0 <= u < 1
    assert u == unit_random(eid, act, attempt)


def test_exponential_doubles_then_caps() -> None:
    got = [base_delay("exponential", attempt=a, initial=0.5, factor=2, max_delay=3) for a in range(1, 6)]
    assert got == [0.5, 1.0, 2.0, 3, 3]
    assert [base_delay("linear", attempt=a, initial=1, factor=2, max_delay=10) for a in (1, 2, 3)] == [1, 2, 3]
    assert base_delay("fixed", attempt=9, initial=1.5, factor=2, max_delay=10) == 1.5


def test_full_jitter_spreads_across_attempts() -> None:
    units = [unit_random("exec", 0, a) for a in range(1, 200)]
    assert min(units) < 0.1 and max(units) > 0.9  # not a constant in disguise
    d = [
        retry_delay(backoff="fixed", jitter="full", attempt=1, initial=10, factor=2, max_delay=60, unit=u)
        for u in units
    ]
    assert all(0 <= x <= 10 for x in d)
