"""Instructions per execution or per loop iteration, counted by valgrind (callgrind):
a figure that does not move with the host's noise, to compare two versions of the code.

    python -m bench.profile.instructions [--what e2e|fanout] [--tool sleep|python|noop] [--n 100]
                                 [--parser reader|nats-py] [--start run|request]

Wall time and CPU time on a shared host drift by 2x from minute to minute; instruction
counts repeat within about 0.2% for the same code and input. Each measurement runs the
workload twice under ``valgrind --tool=callgrind`` (one fresh nats-server each, not
itself counted): once with `--n` executions or iterations, once with one, and reports the
difference divided by `n - 1` (start-up, imports and stream set-up cancel out).

* ``--what e2e``: every actor and the client in one process, as ``actors-cli run`` does;
  a 3-step playbook of `--tool` steps (``sleep`` 0 s: no worker process; ``python``: the
  pool's workers are not counted, only the process that talks to them), 10 executions at
  a time, each ``Client.run`` (``--start request``: ``Client.start`` then ``Client.wait``,
  as before `Client.run` existed).
* ``--what fanout``: ``bench/loop_fanout.py``'s loop child (one loop step of `--n`
  iterations of `--tool` in async mode, then a step reading the results).

``--parser nats-py``: the connections read with nats-py's own parser instead of the
actors' reader (actors/natsio/reader.py), to see what the reader saves. To compare two
commits, run this file from a worktree of each. Needs valgrind; slow (about 50x, and 30 s
of start-up per run). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import chain_playbook, start_server

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository


async def e2e_child(url: str, n: int, tool: str, how: str) -> None:
    """`n` executions of a 3-step playbook, every actor and the client in this process."""
    from actors.client import Client
    from actors.pod.roles import connect, start_roles
    from streams.layout import Layout

    nc_pod = await connect(url, name="instructions-pod")
    runtime = await start_roles(nc_pod, layout=Layout())
    nc = await connect(url, name="instructions-client")
    client = Client(nc, layout=Layout())
    with tempfile.TemporaryDirectory() as d:
        pb = Path(d) / "chain.yaml"
        pb.write_text(chain_playbook("instructions", 3, tool))
        entry = await client.register(pb)

    async def one() -> None:
        if how == "run":
            _, status = await client.run(entry.path, version=entry.version, timeout=600)
        else:
            eid = await client.start(entry.path, version=entry.version)
            status = await client.wait(eid, timeout=600)
        assert status.state == "COMPLETED", status

    for start in range(0, n, 10):
        await asyncio.gather(*(one() for _ in range(min(10, n - start))))
    await runtime.stop()
    await nc.close()
    await nc_pod.close()


def counted(cmd: list[str], env: dict[str, str]) -> int:
    """Instructions callgrind counted for `cmd` (its own process, not its children)."""
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out", *cmd],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            cwd=ROOT,  # `-m bench...` imports from the repository
        )
    found = re.findall(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(cmd)} failed under callgrind:\n{out.stderr[-3000:]}")
    return int(found[-1])


async def measure(what: str, tool: str, n: int, parser: str, how: str) -> int:
    server = await start_server()
    try:
        env = {**os.environ, "ACTORS_BENCH_PARSER": parser, "ACTORS_BENCH_START": how}
        if what == "e2e":
            cmd = [
                sys.executable,
                "-m",
                "bench.profile.instructions",
                "--child",
                "--url",
                server.url,
                "--n",
                str(n),
                "--tool",
                tool,
            ]
        else:  # loop_fanout.py's own child, run through this file (`--parser`)
            cmd = [
                sys.executable,
                "-m",
                "bench.profile.instructions",
                "--fanout-child",
                "--child",
                "loop",
                "--url",
                server.url,
            ]
            cmd += ["--n", str(n), "--tool", tool, "--server-pid", str(server.proc.pid)]
        return await asyncio.to_thread(counted, cmd, env)
    finally:
        await server.stop()


def use_parser(parser: str) -> None:
    """In a child: read with nats-py's own parser when asked (the reader is installed
    by `runtime.connect`)."""
    if parser == "nats-py":
        import actors.pod.roles

        actors.pod.roles.install_reader = lambda nc: nc  # type: ignore[assignment]


def main() -> int:
    if sys.argv[1:2] == ["--fanout-child"]:
        use_parser(os.environ.get("ACTORS_BENCH_PARSER", "reader"))
        sys.argv = ["bench.loop_fanout", *sys.argv[2:]]
        runpy.run_module("bench.loop_fanout", run_name="__main__", alter_sys=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=["e2e", "fanout"], default="e2e")
    ap.add_argument("--tool", default=None, help="e2e: sleep (default) or python; fanout: noop (default) or python")
    ap.add_argument("--n", type=int, default=None, help="executions (e2e, default 100) or iterations (fanout, 5000)")
    ap.add_argument("--parser", choices=["reader", "nats-py"], default="reader")
    ap.add_argument("--start", choices=["run", "request"], default="run", help="e2e: Client.run, or start then wait")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        import uvloop

        use_parser(os.environ.get("ACTORS_BENCH_PARSER", "reader"))
        uvloop.run(e2e_child(a.url, a.n, a.tool, os.environ.get("ACTORS_BENCH_START", "run")))
        return 0
    tool = a.tool or ("sleep" if a.what == "e2e" else "noop")
    n = a.n or (100 if a.what == "e2e" else 5000)
    if n < 2:
        raise SystemExit("--n must be at least 2")
    full = asyncio.run(measure(a.what, tool, n, a.parser, a.start))
    one = asyncio.run(measure(a.what, tool, 1, a.parser, a.start))
    per = (full - one) / (n - 1)
    unit = "execution" if a.what == "e2e" else "iteration"
    print(f"{a.what} {tool} ({a.parser}): {per:,.0f} instructions per {unit} ({n} against 1: {full:,} - {one:,})")
    print(
        json.dumps(
            {
                "bench": "instructions",
                "what": a.what,
                "tool": tool,
                "parser": a.parser,
                "start": a.start,
                "n": n,
                "instructions_total": full,
                "instructions_start_up": one,
                f"instructions_per_{unit}": round(per),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
