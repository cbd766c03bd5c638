"""What several benches share: the embedded nats-server they run against, with the
durability a run asks for (`--sync default|always`, see README "Durability").

    from bench.common import add_sync_flag, start_server
    add_sync_flag(parser)                      # --sync default|always
    server = await start_server(sync=args.sync)
"""

from __future__ import annotations

import argparse

from streams.server import SYNC_DEFAULT, SYNC_MODES, NatsServer

__all__ = ["add_sync_flag", "chain_playbook", "start_server"]


def add_sync_flag(parser: argparse.ArgumentParser) -> None:
    """`--sync`: when the bench's nats-server fsyncs JetStream writes."""
    parser.add_argument(
        "--sync",
        choices=SYNC_MODES,
        default=SYNC_DEFAULT,
        help="JetStream file store sync: default (every 2 minutes) or always (fsync before each PubAck)",
    )


async def start_server(*, sync: str = SYNC_DEFAULT) -> NatsServer:
    """A fresh embedded nats-server (temporary store) with `sync`."""
    return await NatsServer.start(sync=sync)


def chain_playbook(name: str, steps: int, tool: str) -> str:
    """A playbook `bench/<name>` of `steps` steps in a row, each adding 1 to the last
    one's result: `python` (a worker call) or `sleep` 0 s (the same engine path, no
    worker process)."""
    lines = ["apiVersion: actors/v1", "kind: Playbook", "metadata:", f"  name: bench_{name}", f"  path: bench/{name}"]
    lines += ["workload:", "  i: 0", "workflow:"]
    for k in range(1, steps + 1):
        prev = "workload.i" if k == 1 else f"s{k - 1}"
        lines.append(f"  - step: s{k}")
        if tool == "python":
            lines += [
                "    tool:",
                "      kind: python",
                "      code: |",
                "        def main(i):",
                "            return i + 1",
            ]
        else:
            lines += ["    tool:", "      kind: sleep", "      seconds: 0"]
        lines += ["    args:", f'      i: "{{{{ {prev} }}}}"']
        if k < steps:
            lines.append(f"    next: s{k + 1}")
    return "\n".join(lines) + "\n"
