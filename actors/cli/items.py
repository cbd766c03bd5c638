"""`actors-cli items ID [STEP] [--failed] [--after K] [--limit N] [--json]`: the iterations
of an execution's loops that failed for good, a page at a time (actors/client/items.py),
and the summary `run` prints after a loop that tolerated failures."""

from __future__ import annotations

import argparse
from typing import Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_OK
from actors.cli.inputs import checked_execution_id
from actors.cli.output import json_text, print_json, when

FIRST_FEW = 3  # failed items `run` shows under its summary
MESSAGE_WIDTH = 100  # characters of an error message on a listing's line


def add_items_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "items",
        help="the failed items of an execution's loops: index, element, attempts, error (paged)",
        description="Lists the iterations of an execution's loops that failed for good, in loop order then "
        "the order they failed, a page at a time, and how many failed in all. Redrive them with "
        "`actors-cli retry ID --failed-items`.\n\nexample: actors-cli items 3f2a fan --limit 20 --after 4-1:5120",
    )
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("step", nargs="?", help="only this loop step's items")
    sp.add_argument(
        "--failed",
        action="store_true",
        help="the failed items (the default, and for now the only listing: succeeded items keep no record)",
    )
    sp.add_argument("--limit", type=int, default=50, help="at most this many (1 to 1000, default 50)")
    sp.add_argument(
        "--after", metavar="K", help="the page after this one: the `--after` a page prints (LOOP:SEQ, its last item)"
    )
    sp.add_argument(
        "--json",
        action="store_true",
        help='one object: {"execution_id", "step", "total", "items": [{"step", "loop_id", "index", "attempts", '
        '"error", "element" or "element_head", "at"}], "next_after"}',
    )
    return sp


async def cmd_items(args: argparse.Namespace) -> int:
    eid = checked_execution_id(args.execution_id)
    assert eid is not None
    async with connection(args) as client:
        page = await client.failed_items(eid, args.step, after=args.after, limit=args.limit)
    if args.json:
        print_json(page.as_json())
        return EXIT_OK
    where = f"step '{args.step}' of execution {eid}" if args.step else f"execution {eid}"
    if not page.total:
        print(f"no failed items in {where}")
        return EXIT_OK
    print(f"{page.total:,} failed items in {where}; {len(page.items)} shown")
    for line in item_lines(page.items):
        print(line)
    if page.next_after is not None:
        step = f" {args.step}" if args.step else ""
        print(f"next page: actors-cli items {eid}{step} --after {page.next_after}")
    return EXIT_OK


def item_lines(items: list[Any]) -> list[str]:
    """One line per failed item: step, index, attempts, error, element (or its head)."""
    out = []
    for i in items:
        element = i.element_head + "…" if i.element_head is not None else json_text(i.element)
        message = " ".join(str(i.message).split())
        if len(message) > MESSAGE_WIDTH:
            message = message[: MESSAGE_WIDTH - 1] + "…"
        tries = "attempt" if i.attempts == 1 else "attempts"
        out.append(
            f"  {i.step}[{i.index}]  {i.attempts} {tries}  {i.error_type}: {message}  element: {element}"
            f"  ({when(i.at)})"
        )
    return out


async def loop_failures_summary(client: Any, execution_id: str) -> list[str]:
    """What `run` prints after an execution whose loops tolerated failures: per loop,
    "8 of 2,000 items failed (tolerated)", that loop's first few, and how to see the rest."""
    lines: list[str] = []
    for item in await client.events(execution_id):
        data = item.data or {}
        if item.type != "iterator.completed" or not data.get("failed"):
            continue
        step = data.get("step") or item.step or ""
        lines.append(f"{step}: {data['failed']:,} of {data.get('total', 0):,} items failed (tolerated)")
        loop_id = data.get("loop_id")
        page = await client.failed_items(
            execution_id, step, limit=FIRST_FEW, loop_id=loop_id if isinstance(loop_id, str) else None
        )
        lines += item_lines(page.items)
        if page.total > len(page.items):
            lines.append(f"  all of them: actors-cli items {execution_id} {step}")
    if lines:
        lines.append(f"run them again: actors-cli retry {execution_id} --failed-items")
    return lines
