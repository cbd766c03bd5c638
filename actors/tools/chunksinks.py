"""A chunk's postgres sinks that append to one table, written as ONE transaction.

A chunked loop's command carries several iterations (items); each item's sink is a write
of its own, all-or-nothing with its iteration. When the items' sinks are postgres table
writes in ``append`` mode to the same table, credential and ledger, one transaction for
all of them costs the tools pod's event loop one pool checkout, one BEGIN and ledger
claim, one COPY and one COMMIT instead of one each per item (bench/sink.py, "sink" in
bench/RESULTS.md): actors/tools/running.py runs the items' tools first, renders each
sink, and hands the appends here (`write_together`).

The combined write (actors/tools/pgwrite.py `write_appends`) claims each item's own
ledger row, so a redelivered chunk finds per item what the first delivery committed and
writes only the rest. How it ends decides each item's outcome:

- committed: every item succeeded (its result, or the first delivery's);
- a failure that is not retryable (a row of one item the table refuses: a constraint, a
  type; a setting): nothing of it stays, and each item is written alone, as a chunk
  without this module does, so only the bad item fails its iteration;
- a retryable failure (the connection lost, a timeout, a deadlock) or a cancel: each item
  fails with it, as each would have alone, and retry rules see it.

`upsert` and `replace` keep one transaction per item: there the order of the items'
writes is part of the outcome (an upsert's last row of a key wins; a replace leaves the
last item's rows), and a fallback after a failure of the whole would write them in
another order than the one the items committed in before.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from actors.tools.call import CommandIdentity, ToolCall
from actors.tools.executors import run_tool
from actors.tools.failures import ToolFailure, failure_from_exception, timeout_failure
from actors.tools.kinds.postgres import credential_name
from actors.tools.limits import limited
from actors.tools.pgwrite import DEFAULT_LEDGER, write_appends
from actors.tools.redact import REDACTOR
from actors.tools.resources import ToolResources

__all__ = ["SinkWrite", "group_key", "may_combine", "write_together"]

_APPEND = (None, "append")


def may_combine(sink_tool: dict[str, Any]) -> bool:
    """Whether a chunk's sink (as written, before rendering) may be a postgres append,
    so that its items' tools run first and their appends are written together."""
    return (
        sink_tool.get("kind") == "postgres"
        and sink_tool.get("table") is not None
        and not sink_tool.get("query")
        and sink_tool.get("mode") in _APPEND
    )


def group_key(tool: dict[str, Any]) -> tuple[str, str, str] | None:
    """A rendered sink's group: the appends of one credential, table and ledger go
    together; None for any other write (it runs alone). upsert and replace keep one
    transaction per item: the order of the items' writes decides what the table holds
    there (the module docstring)."""
    table, ledger = tool.get("table"), tool.get("ledger", DEFAULT_LEDGER)
    if tool.get("kind") != "postgres" or tool.get("query") or tool.get("mode") not in _APPEND:
        return None
    if not isinstance(table, str) or not isinstance(ledger, str):
        return None
    try:
        name = credential_name(tool)
    except ToolFailure:
        return None  # said by the item's own write
    return name, table, ledger


@dataclass(frozen=True, slots=True)
class SinkWrite:
    """One item's sink, rendered: what `run_tool` would get for it alone."""

    tool: dict[str, Any]
    args: dict[str, Any]
    identity: CommandIdentity
    result: Any  # the item's tool's result (the rows of a sink without args)


async def write_together(
    items: list[SinkWrite],
    *,
    resources: ToolResources,
    cancel: asyncio.Event | None,
    each: float | None,
    deadline: float | None,
) -> list[bytes | ToolFailure]:
    """The appends of `items` (one `group_key`) as one transaction, else each alone (the
    module docstring): per item, its result's JSON text or its failure (masked, as
    `run_tool`'s). `each`: the seconds an item's write may take (the step's timeout);
    `deadline` (the event loop's clock): when the command must be done by, the time
    actors/tools/held.py allows it. The combined write may take `each` per item, within
    the deadline; a write alone after it, `each`, within the deadline too."""
    limit = _left(None if each is None else each * len(items), deadline)
    try:
        return list(await _combined(items, resources, cancel, limit))
    except ToolFailure as f:
        if f.retryable or (cancel is not None and cancel.is_set()):
            return [f] * len(items)  # what each would have met alone
    outcomes: list[bytes | ToolFailure] = []
    for item in items:  # rolled back: each item alone, so only a bad one fails
        try:
            outcomes.append(
                await run_tool(
                    "postgres",
                    item.tool,
                    item.args,
                    timeout=_left(each, deadline),
                    cancel=cancel,
                    resources=resources,
                    identity=item.identity,
                    result=item.result,
                )
            )
        except ToolFailure as f:
            outcomes.append(f)
    return outcomes


def _left(seconds: float | None, deadline: float | None) -> float | None:
    """`seconds`, cut to what is left before `deadline` (at least a moment: a write with
    no time left fails `Timeout` rather than running unbounded)."""
    if deadline is None or math.isinf(deadline):
        return seconds
    left = max(0.001, deadline - asyncio.get_running_loop().time())
    return left if seconds is None else min(seconds, left)


async def _combined(
    items: list[SinkWrite], resources: ToolResources, cancel: asyncio.Event | None, limit: float | None
) -> list[bytes]:
    """`write_appends` bounded by `limit` and `cancel`; failures as `ToolFailure`, masked
    as `run_tool` masks a tool's."""
    try:
        try:
            first = items[0].tool
            name = credential_name(first)
            credential = resources.credentials.resolve(name)
            calls = [
                ToolCall(i.tool, i.args, limit, cancel, resources, None, credential, i.identity, i.result)
                for i in items
            ]
            deadline = None if limit is None else asyncio.get_running_loop().time() + limit
            if limit is not None and limit <= 0.001:
                raise timeout_failure(limit)
            return await limited(write_appends(calls, name, credential, deadline=deadline), limit, cancel)
        except (ToolFailure, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise failure_from_exception(exc) from exc
    except ToolFailure as f:
        f.type = REDACTOR.text(f.type)
        f.message = REDACTOR.text(f.message)
        f.traceback = REDACTOR.maybe(f.traceback)
        f.data = REDACTOR.value(f.data)
        f.args = (f"{f.type}: {f.message}",)
        raise
