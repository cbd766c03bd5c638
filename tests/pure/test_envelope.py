"""The failure envelope: bounded, deterministic, honest about what it cut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.envelope import MAX_CONTENT_CHARS, build_envelope, truncate_head_tail

pytestmark = [pytest.mark.timeout(60)]


@given(st.text(max_size=30_000), st.integers(min_value=60, max_value=10_000))
def test_any_text_fits_its_budget_and_the_cut_adds_up(text: str, budget: int) -> None:
    content, t = truncate_head_tail(text, budget)
    assert len(content) <= budget
    assert t["included_chars"] + t["dropped_chars"] == t["original_chars"] == len(text)
    if len(text) <= budget:
        assert content == text and t["applied"] is False and t["method"] == "none"
    else:
        assert t["applied"] is True and t["method"] == "head_tail"
        head = (t["included_chars"] + 1) // 2
        tail = t["included_chars"] - head
        assert content.startswith(text[:head])
        assert content.endswith(text[len(text) - tail :]) if tail else True
        assert f"[... {t['dropped_chars']} chars dropped ...]" in content
    assert truncate_head_tail(text, budget) == (content, t)  # deterministic


@given(st.text(max_size=20_000))
def test_the_envelope_has_its_header_and_at_most_6000_chars_of_content(text: str) -> None:
    env, _ = build_envelope(
        execution_id="e1",
        target_step="cleanup",
        source_step="load",
        source_activation=3,
        source_attempt=2,
        created_at=1_800_000_000.0,
        content=text,
    )
    assert env.startswith("ACTORS_FAILURE_ROUTE_CONTEXT v1\npolicy_version: 1\nuntrusted_data: true\n")
    body = env.split("<<<BEGIN>>>\n", 1)[1].rsplit("\n<<<END>>>", 1)[0]
    assert len(body) <= MAX_CONTENT_CHARS
    assert f"original_chars: {len(text)}" in env
    assert "source_step: load" in env and "source_attempt: 2" in env
    assert "created_at: 2027-01-15T08:00:00.000Z" in env


def test_a_long_traceback_keeps_its_first_and_last_lines() -> None:
    text = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "ValueError: the real cause"
    content, t = truncate_head_tail(text)
    assert content.startswith("Traceback (most recent call last):")
    assert content.endswith("ValueError: the real cause")
    assert t["dropped_chars"] > 0 and len(content) <= MAX_CONTENT_CHARS
