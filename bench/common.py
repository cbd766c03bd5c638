"""What several benches share: the embedded nats-server they run against, with the
durability a run asks for (`--sync default|always`, see README "Durability").

    from bench.common import add_sync_flag, start_server
    add_sync_flag(parser)                      # --sync default|always
    server = await start_server(sync=args.sync)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from streams.server import SYNC_DEFAULT, SYNC_MODES, NatsServer

ROOT = Path(__file__).resolve().parents[1]  # the repository

__all__ = [
    "ROOT",
    "add_sync_flag",
    "chain_playbook",
    "checkout_of",
    "process_tree",
    "start_server",
    "worktree_add",
    "worktree_remove",
]


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


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now, from /proc's children lists (Linux); a process
    gone meanwhile is left out."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            threads = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # gone
        for t in threads:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass  # gone meanwhile
    return out


def worktree_add(commit: str, where: Path) -> None:
    """`commit` checked out at `where` (a git worktree of this repository)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def worktree_remove(where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def checkout_of(commit: str | None) -> Iterator[Path | None]:
    """An earlier commit to run beside this checkout (`--baseline REV`): its worktree
    in a temporary directory, removed at the end; None when no commit is asked for."""
    if commit is None:
        yield None
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    try:
        worktree_add(commit, tmp / "old")
        yield tmp / "old"
    finally:
        worktree_remove(tmp / "old")
        shutil.rmtree(tmp, ignore_errors=True)
