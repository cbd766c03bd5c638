"""The bounded failure-context envelope a remediation step receives as `failure.envelope`
(docs/language.md, Failure).

Deterministic text: header fields, then at most MAX_CONTENT_CHARS of content between
markers, cut head-and-tail when longer, with the cut recorded. `untrusted_data: true`
because the content is whatever a failing tool said: a remediation step (or a model
it feeds) must treat it as data, never as instructions.
"""

from __future__ import annotations

import datetime
from typing import Any

MAX_CONTENT_CHARS = 6_000
POLICY_VERSION = 1


def truncate_head_tail(text: str, budget: int = MAX_CONTENT_CHARS) -> tuple[str, dict[str, Any]]:
    """Keep the head and the tail of `text` within `budget` characters (the marker that
    says how much was dropped counts against the budget)."""
    original = len(text)
    if original <= budget:
        return text, {
            "applied": False,
            "method": "none",
            "original_chars": original,
            "included_chars": original,
            "dropped_chars": 0,
        }
    dropped = original  # upper bound first: the marker only gets shorter after
    for _ in range(3):
        marker = f"\n[... {dropped} chars dropped ...]\n"
        keep = max(budget - len(marker), 0)
        head = (keep + 1) // 2
        tail = keep - head
        dropped = original - head - tail
    marker = f"\n[... {dropped} chars dropped ...]\n"
    content = text[:head] + marker + (text[original - tail :] if tail else "")
    if len(content) > budget:  # a budget smaller than the marker: the marker alone, cut
        content = content[:budget]
    return content, {
        "applied": True,
        "method": "head_tail",
        "original_chars": original,
        "included_chars": head + tail,
        "dropped_chars": dropped,
    }


def failure_content(
    *, error: dict[str, Any], attempt: int, max_attempts: int | None, retry_summary: dict[str, Any]
) -> str:
    lines = [
        f"attempt: {attempt}",
        f"max_attempts: {max_attempts if max_attempts is not None else 'none'}",
        f"retry_exhausted: {str(bool(retry_summary.get('exhausted'))).lower()}",
        f"error.type: {error.get('type')}",
        f"error.status: {error.get('status')}",
        f"error.retryable: {str(bool(error.get('retryable'))).lower()}",
        "error.message:",
        str(error.get("message") or ""),
    ]
    if error.get("traceback"):
        lines += ["error.traceback:", str(error["traceback"])]
    for i, e in enumerate(retry_summary.get("errors", []), 1):
        lines.append(f"retry[{i}]: {e}")
    return "\n".join(lines)


def build_envelope(
    *,
    execution_id: str,
    target_step: str,
    source_step: str,
    source_activation: int,
    source_attempt: int,
    created_at: float,
    content: str,
    budget: int = MAX_CONTENT_CHARS,
) -> tuple[str, dict[str, Any]]:
    body, trunc = truncate_head_tail(content, budget)
    stamp = datetime.datetime.fromtimestamp(created_at, datetime.UTC).isoformat(timespec="milliseconds")
    text = "\n".join(
        [
            "ACTORS_FAILURE_ROUTE_CONTEXT v1",
            f"policy_version: {POLICY_VERSION}",
            "untrusted_data: true",
            f"execution_id: {execution_id}",
            f"target_step: {target_step}",
            f"source_step: {source_step}",
            f"source_activation: {source_activation}",
            f"source_attempt: {source_attempt}",
            f"created_at: {stamp.replace('+00:00', 'Z')}",
            "truncation:",
            f"  applied: {str(trunc['applied']).lower()}",
            f"  method: {trunc['method']}",
            f"  original_chars: {trunc['original_chars']}",
            f"  included_chars: {trunc['included_chars']}",
            f"  dropped_chars: {trunc['dropped_chars']}",
            "content:",
            "<<<BEGIN>>>",
            body,
            "<<<END>>>",
        ]
    )
    return text, trunc
