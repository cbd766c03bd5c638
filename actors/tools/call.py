"""One tool call as an executor gets it (actors/tools/executors.py `EXECUTORS`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from actors.tools.capture import OutputBox
from actors.tools.resources import ToolResources
from actors.wire.messages import CodeAt


@dataclass(frozen=True, slots=True)
class CommandIdentity:
    """Which command a call runs for (actors/tools/running.py): what a postgres write
    records in its ledger so that a second delivery of the command writes nothing more.
    `command_id` names the attempt too (streams/ids.py: `<activation>-<attempt>`,
    `<loop>x<index>-<attempt>`, `<loop>c<first>-<attempt>` for a chunk), so each attempt is
    its own command; `iteration_index` tells a chunk's iterations apart; `run` is the
    step's own tool or its sink (both may write)."""

    execution_id: str
    command_id: str
    iteration_index: int | None
    run: Literal["tool", "sink"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool: dict[str, Any]  # the rendered tool mapping (its `kind` chose the executor)
    args: dict[str, Any]  # the step's rendered args
    limit: float | None  # seconds the whole call may take (None: no limit)
    cancel: asyncio.Event | None  # stops the call when set
    resources: ToolResources  # the pool and session the call may use
    output: OutputBox | None = None  # where what the tool printed goes (python, shell)
    credential: dict[str, str] | None = None  # the tool's `credential`, resolved (http, python, shell)
    identity: CommandIdentity | None = None  # the command it runs for (None: called directly, as tests do)
    result: Any = None  # a sink's call: the result of the step's tool it follows
    code_at: CodeAt | None = None  # a python tool's: where its code starts in the playbook (tracebacks)
