"""The `noop` and `sleep` kinds: no work of their own (tests, pacing, loops' overhead)."""

from __future__ import annotations

import asyncio

from actors.tools import fields
from actors.tools.call import ToolCall
from actors.tools.failures import cancelled_failure, result_json
from actors.tools.limits import limited

__all__ = ["run_noop", "run_sleep"]


async def run_noop(call: ToolCall) -> bytes:
    """``args`` as given."""
    if call.cancel is not None and call.cancel.is_set():
        raise cancelled_failure()
    return result_json(call.args)


async def run_sleep(call: ToolCall) -> bytes:
    """``seconds`` from the tool or the args (args win); ``{"slept": seconds}``."""
    raw = call.args["seconds"] if "seconds" in call.args else call.tool.get("seconds", 0.0)
    seconds = fields.seconds(raw, "sleep seconds")
    await limited(asyncio.sleep(max(0.0, seconds)), call.limit, call.cancel)
    return result_json({"slept": raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else seconds})
