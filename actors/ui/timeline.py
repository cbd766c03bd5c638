"""PLACEHOLDER until engineer "ui-graph"'s branch is merged (it replaces this file): a
step timeline from the log's step.enter and step.exit events, one bar per activation.
Signature and JSON shape are the contract's (issue 14)."""

from __future__ import annotations

from typing import Any

from actors.client import LogItem


def step_timeline(items: list[LogItem]) -> dict[str, Any]:
    """Rows of bars: each step's activations, from entering to leaving it."""
    rows: dict[str, list[dict[str, Any]]] = {}
    open_bars: dict[str, dict[str, Any]] = {}
    start = items[0].at if items else 0.0
    end: float | None = None
    for item in items:
        if item.step is None:
            if item.type in ("playbook.completed", "playbook.failed", "execution.cancelled"):
                end = item.at
            continue
        if item.type == "step.enter":
            bar = {"attempt": 1, "iteration": None, "start": item.at, "end": None, "state": "running"}
            bar.update(kind="run", error=None)
            rows.setdefault(item.step, []).append(bar)
            open_bars[item.step] = bar
        elif item.type == "step.exit" and item.step in open_bars:
            bar = open_bars.pop(item.step)
            bar["end"] = item.at
            bar["state"] = str(item.data.get("status") or "COMPLETED").lower()
            error = item.data.get("error")
            bar["error"] = error.get("message") if isinstance(error, dict) else None
    return {"start": start, "end": end, "rows": [{"step": s, "bars": b} for s, b in rows.items()]}
