"""A chunk's postgres sinks that append to one table, written as ONE transaction.

A chunked loop's command carries several iterations (items); each item's sink is a write
of its own, all-or-nothing with its iteration. When the items' sinks are postgres table
writes in ``append`` mode to the same table, credential and ledger, one transaction for
all of them costs the tools pod's event loop one pool checkout, one BEGIN and ledger
claim, one COPY and one COMMIT instead of one each per item (bench/sink.py, "sink" in
bench/RESULTS.md): actors/tools/running.py runs the items' tools, renders each sink, and
hands the appends here (`write_together`) a group at a time: at most `GROUP_ROWS` rows
held (a chunk's results are not all kept in memory until its end; an item of more rows
than that is written alone, as without this module).

Here the items are split by what one COPY can take (the same column set: a column one
item leaves out would get NULL in a common COPY, not the default its own write gives).
The combined write (actors/tools/pgwrite.py `write_appends`) claims each item's own
ledger row, so a redelivered chunk finds per item what the first delivery committed and
writes only the rest. How it ends decides each item's outcome:

- committed: every item succeeded (its result, or the first delivery's);
- a cancel: each item fails with it, as each would have alone;
- any other failure (a row the table refuses; the connection lost, a timeout, a deadlock
  or serialization failure, retryable or not): nothing of it stays, and each item is
  written alone, as a chunk without this module does. So each item meets its own
  outcome: an item the first delivery of the chunk committed answers its stored result
  (failing it with a retryable error would let a retry, a command of its own, write its
  rows again), and a bad row or a deadlock on one item's rows fails that item only.

Time (`write_together`): an item's write alone may take the step's `timeout` (`each`), as
in a chunk written one item after the other; the command may be held for
actors/tools/held.py's bound, `each` for every item's tool and every item's sink. A
combined write is tried only with time to spare on top of that: its budget is what is
left before the deadline less `each` for every write that may still come (this group's
items alone, should it fail, and what the caller `keep`s for the items after), at most
`each` (it holds at most `GROUP_ROWS` rows, what one item's write alone may hold in its
`each`). So a combined write that fails after its whole budget still leaves each item
its own `each` alone, and the command ends within its bound; the time to spare is what
the items' tools and writes did not use of theirs.

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

from actors.tools import pgwrite
from actors.tools.call import CommandIdentity, ToolCall
from actors.tools.executors import mask_failure, run_tool
from actors.tools.failures import ToolFailure, failure_from_exception
from actors.tools.kinds.postgres import credential_name
from actors.tools.limits import limited
from actors.tools.resources import ToolResources

__all__ = ["GROUP_ROWS", "SinkWrite", "alone_timeout", "group_key", "may_combine", "rows_in", "write_together"]

_APPEND = (None, "append")
# the rows a chunk's sinks hold before they are written (and one combined write takes at
# most): bench/sink.py's gain is in the round trips saved per item, which a few thousand
# rows already amortize; more would only hold more of a chunk's results in memory
GROUP_ROWS = 5_000
# a combined write's budget below this: not tried, the items are written one by one
_MIN_BUDGET = 0.05


def may_combine(sink_tool: dict[str, Any]) -> bool:
    """Whether a chunk's sink (as written, before rendering) may be a postgres append,
    so that its items' appends are written together."""
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
    table, ledger = tool.get("table"), tool.get("ledger", pgwrite.DEFAULT_LEDGER)
    if tool.get("kind") != "postgres" or tool.get("query") or tool.get("mode") not in _APPEND:
        return None
    if not isinstance(table, str) or not isinstance(ledger, str):
        return None
    try:
        name = credential_name(tool)
    except ToolFailure:
        return None  # said by the item's own write
    return name, table, ledger


def rows_in(args: Any, result: Any) -> int:
    """About how many rows a rendered sink writes (what it holds in memory until written):
    its arg `rows`, else (no args) the result it follows; 0 for what its write refuses."""
    value = args.get("rows") if isinstance(args, dict) and args else result
    return len(value) if isinstance(value, list) else 1 if isinstance(value, dict) else 0


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
    keep: float = 0.0,
) -> list[bytes | ToolFailure]:
    """The appends of `items` (one `group_key`), those of one column set as one
    transaction, else each alone (the module docstring): per item, its result's JSON text
    or its failure (masked, as `run_tool`'s). `each`: the seconds an item's write may take
    (the step's timeout); `deadline` (the event loop's clock): when the command must be
    done by, the time actors/tools/held.py allows it; `keep`: seconds of it to leave for
    what the command still runs after these items."""
    outcomes: list[bytes | ToolFailure | None] = [None] * len(items)
    batches: dict[tuple[Any, ...], list[tuple[int, pgwrite.Prepared]]] = {}
    alone: list[int] = []
    for k, item in enumerate(items):
        if k:
            await asyncio.sleep(0)  # each item's rows are checked in one go: the loop runs between two
        if rows_in(item.args, item.result) >= GROUP_ROWS:
            alone.append(k)  # written alone anyway: its rows are checked once, by its own write
            continue
        try:
            call = ToolCall(item.tool, item.args, None, None, resources, None, None, item.identity, item.result)
            w = pgwrite.prepared(call)
        except Exception:
            alone.append(k)  # its own write says why, as it would without this module
            continue
        batches.setdefault(pgwrite.shape(w), []).append((k, w))
    # each batch at most GROUP_ROWS rows (an item of more: alone), written in the items' order
    runs: list[list[tuple[int, pgwrite.Prepared]]] = []
    for batch in batches.values():
        run: list[tuple[int, pgwrite.Prepared]] = []
        held = 0
        for k, w in batch:
            n = pgwrite.row_count(w)
            if run and held + n > GROUP_ROWS:
                runs.append(run)
                run, held = [], 0
            run.append((k, w))
            held += n
        runs.append(run)
    runs.sort(key=lambda r: r[0][0])
    pending = len(items)  # the writes that may still be made one by one (the module docstring: time)
    for k in alone:
        outcomes[k] = await _alone(items[k], resources, cancel, each, deadline, keep + _times(each, pending - 1))
        pending -= 1
    for run in runs:
        members = [k for k, _ in run]
        pending -= len(members)
        after = keep + _times(each, pending)  # for the runs after this one
        budget = _within(each, deadline, after + _times(each, len(members)))
        if len(members) > 1 and (budget is None or budget >= _MIN_BUDGET):
            try:
                texts = await _combined(
                    [items[k] for k in members], [w for _, w in run], resources, cancel, each, budget
                )
            except ToolFailure as f:
                if cancel is not None and cancel.is_set():
                    for k in members:
                        outcomes[k] = f  # what each would have met alone
                    continue
            else:
                for k, text in zip(members, texts, strict=True):
                    outcomes[k] = text
                continue
        for n, k in enumerate(members):  # rolled back (or no time for it): each alone, its own outcome
            left = len(members) - n - 1
            outcomes[k] = await _alone(items[k], resources, cancel, each, deadline, after + _times(each, left))
    assert all(o is not None for o in outcomes)
    return [o for o in outcomes if o is not None]


def _times(each: float | None, n: int) -> float:
    return 0.0 if each is None else each * n


def alone_timeout(each: float | None, deadline: float | None, keep: float) -> float | None:
    """A write alone: `each`, within the deadline less `keep` (at least a moment: a write
    with no time left fails `Timeout` rather than running unbounded)."""
    timeout = _within(each, deadline, keep)
    return None if timeout is None else max(0.001, timeout)


def _within(seconds: float | None, deadline: float | None, keep: float) -> float | None:
    """`seconds`, cut to what is left before `deadline` less `keep` (None: unbounded)."""
    if deadline is None or math.isinf(deadline):
        return seconds
    left = deadline - keep - asyncio.get_running_loop().time()
    return left if seconds is None else min(seconds, left)


async def _alone(
    item: SinkWrite,
    resources: ToolResources,
    cancel: asyncio.Event | None,
    each: float | None,
    deadline: float | None,
    keep: float,
) -> bytes | ToolFailure:
    """The item's write alone, as a chunk without this module writes it."""
    try:
        return await run_tool(
            "postgres",
            item.tool,
            item.args,
            timeout=alone_timeout(each, deadline, keep),
            cancel=cancel,
            resources=resources,
            identity=item.identity,
            result=item.result,
        )
    except ToolFailure as f:
        return f


async def _combined(
    items: list[SinkWrite],
    writes: list[pgwrite.Prepared],
    resources: ToolResources,
    cancel: asyncio.Event | None,
    each: float | None,
    limit: float | None,
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
            write = pgwrite.write_appends(calls, writes, name, credential, deadline=deadline)
            try:
                return await limited(write, limit, cancel)
            except ToolFailure as f:
                if f.type != "Timeout" or limit is None or each is None:
                    raise
                # the step's timeout is what a user set: name it, and what this write was given
                raise ToolFailure(
                    "Timeout",
                    f"postgres appends of {len(items)} items together timed out after {limit:.3g}s"
                    f" (the step's timeout: {each:g}s)",
                    retryable=True,
                ) from None
        except (ToolFailure, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise failure_from_exception(exc) from exc
    except ToolFailure as f:
        mask_failure(f)  # as run_tool does for a write alone
        raise
