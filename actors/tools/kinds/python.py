"""The `python` kind: ``code`` defining ``def main(**args)``, run in a worker process of the
actor's pool (`ToolResources.python_pool`), outside the event loop."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.tools.failures import ToolFailure
from actors.tools.resources import ToolResources

__all__ = ["run_python"]


async def run_python(
    tool: dict[str, Any],
    args: dict[str, Any],
    limit: float | None,
    cancel: asyncio.Event | None,
    resources: ToolResources,
) -> bytes:
    """The JSON text the worker wrote (checked there: passed on as is, never encoded again)."""
    code = tool.get("code")
    if not isinstance(code, str) or not code.strip():
        raise ToolFailure("ToolConfigError", "python tool needs `code` defining def main(**args)")
    return await resources.python_pool().run_json(code, args, timeout=limit, cancel=cancel)
