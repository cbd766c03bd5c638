"""The `noop` and `sleep` kinds: no work of their own (tests, pacing, loops' overhead)."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.tools import fields
from actors.tools.failures import cancelled_failure, result_json
from actors.tools.limits import limited
from actors.tools.resources import ToolResources

__all__ = ["run_noop", "run_sleep"]


async def run_noop(
    tool: dict[str, Any],
    args: dict[str, Any],
    limit: float | None,
    cancel: asyncio.Event | None,
    resources: ToolResources,
) -> bytes:
    """``args`` as given."""
    if cancel is not None and cancel.is_set():
        raise cancelled_failure()
    return result_json(args)


async def run_sleep(
    tool: dict[str, Any],
    args: dict[str, Any],
    limit: float | None,
    cancel: asyncio.Event | None,
    resources: ToolResources,
) -> bytes:
    """``seconds`` from the tool or the args (args win); ``{"slept": seconds}``."""
    raw = args["seconds"] if "seconds" in args else tool.get("seconds", 0.0)
    seconds = fields.seconds(raw, "sleep seconds")
    await limited(asyncio.sleep(max(0.0, seconds)), limit, cancel)
    return result_json({"slept": raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else seconds})
