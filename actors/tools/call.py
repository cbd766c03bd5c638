"""One tool call as an executor gets it (actors/tools/executors.py `EXECUTORS`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from actors.tools.capture import OutputBox
from actors.tools.resources import ToolResources


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool: dict[str, Any]  # the rendered tool mapping (its `kind` chose the executor)
    args: dict[str, Any]  # the step's rendered args
    limit: float | None  # seconds the whole call may take (None: no limit)
    cancel: asyncio.Event | None  # stops the call when set
    resources: ToolResources  # the pool and session the call may use
    output: OutputBox | None = None  # where what the tool printed goes (python, shell)
    credential: dict[str, str] | None = None  # the tool's `credential`, resolved (http, python, shell)
