"""The Python client, end to end: register examples/hello.yaml, start it, wait for it,
print its result and its log.

    python examples/client_example.py
        NATS_URL unset: starts a private nats-server and every actor in this process
        (like `actors-cli run`), and stops them at the end.
    NATS_URL=nats://127.0.0.1:4222 python examples/client_example.py
        against a running system (`actors-cli dev`, or `serve` pods); credentials go in
        the URL, a cluster's nodes separated by commas.

Exit code 0 when the execution COMPLETED."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from actors.client import Client
from actors.wire.events import TERMINAL_EVENTS

HELLO = Path(__file__).with_name("hello.yaml")


async def use(client: Client) -> int:
    entry = await client.register(HELLO)  # catalog path "examples/hello", a version
    eid = await client.start(entry.path, payload={"name": "client"})  # returns once the start is stored
    status = await client.wait(eid, timeout=60)  # the terminal status
    print(f"execution {eid}: {status.state}")
    log = await client.events(eid)  # the whole log, in order
    for item in log:
        print(f"  {item.type} {item.step or ''}".rstrip())
    terminal = next(i for i in reversed(log) if i.type in TERMINAL_EVENTS)
    print("result:", json.dumps(await client.result(terminal)))
    return 0 if status.state == "COMPLETED" else 1


async def embedded() -> int:
    from actors.pod.roles import connect, start_roles
    from streams.server import NatsServer

    server = await NatsServer.start()
    try:
        nc = await connect(server.url)
        runtime = await start_roles(nc)  # every actor, in this process
        try:
            async with Client.connect(server.url) as client:
                return await use(client)
        finally:
            await runtime.stop()
            await nc.close()
    finally:
        await server.stop()


async def main() -> int:
    url = os.environ.get("NATS_URL")
    if not url:
        return await embedded()
    async with Client.connect(url, timeout=30) as client:
        return await use(client)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
