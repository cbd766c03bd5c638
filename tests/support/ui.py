"""The web UI's tests: the playbooks they run, registering them, and reading the HTTP
API's answers and live feeds (server-sent events)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from tests.conftest import System

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s, path: %s}\n"


QUICK = HEAD % ("quick", "ui/quick") + "workflow:\n  - step: one\n    tool: noop\n"


PRINTS = (
    HEAD % ("prints", "ui/prints")
    + """workflow:
  - step: talk
    tool: {kind: python, code: "def main(who):\\n    print('hello', who)\\n    return who"}
    args: {who: "{{ workload.who }}"}
"""
)


SLOW = HEAD % ("slow", "ui/slow") + "workflow:\n  - step: nap\n    tool: {kind: sleep, seconds: 60}\n"


BREAKS = (
    HEAD % ("breaks", "ui/breaks")
    + """workflow:
  - step: first
    tool: noop
    next: boom
  - step: boom
    tool: {kind: python, code: "def main(msg):\\n    raise ValueError(msg)"}
    args: {msg: "{{ workload.msg }}"}
"""
)


LOOP = (
    HEAD % ("loop", "ui/loop")
    + """workflow:
  - step: each
    tool: noop
    args: {x: "{{ n }}"}
    loop: {collection: "{{ range(workload.n) | list }}", element: n}
"""
)


CHILD = (
    HEAD % ("child", "ui/child")
    + """workflow:
  - step: work
    tool: {kind: python, code: "def main():\\n    raise ValueError('child broke')"}
"""
)


PARENT = (
    HEAD % ("parent", "ui/parent")
    + """workflow:
  - step: call_child
    tool: {kind: playbook, path: ui/child}
    on_failure: fallback
  - step: fallback
    args: {reason: "{{ failure.error.message }}"}
"""
)


async def register(system: System, text: str) -> str:
    path = system.tmp / f"pb{abs(hash(text))}.yaml"
    path.write_text(text)
    return (await system.client.register(path)).path


async def ok(resp: ClientResponse) -> Any:
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def post(ui: TestClient[Any, Any], path: str, body: Any = None, **headers: str) -> ClientResponse:
    return await ui.post(path, json=body or {}, headers=headers)


class Events:
    """Server-sent events read off a streaming response."""

    def __init__(self, resp: ClientResponse) -> None:
        self.resp = resp

    async def next(self, event: str) -> Any:
        kind = None
        while True:
            line = (await self.resp.content.readline()).decode()
            assert line, "the stream ended"
            if line.startswith("event: "):
                kind = line[7:].strip()
            elif line.startswith("data: ") and kind == event:
                return json.loads(line[6:])

    async def until(self, event: str, predicate: Any, timeout: float = 20) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                data = await self.next(event)
                if predicate(data):
                    return data
