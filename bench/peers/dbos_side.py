"""DBOS 3.4 on a throwaway PostgreSQL 15 cluster, `synchronous_commit=on` with
`--sync always`, `off` otherwise. Needs `pip install dbos==3.4.0` (not a dependency of
the project; skipped with a message when it is not importable).

The DBOS app runs in a child process (`python -m bench.peers.dbos_side URL`): three
steps doing `i + 1` (or a chain of 50), started with DBOS's fastest client shape, the
app's own `DBOS.start_workflow` then `handle.get_result()`, timed inside the app.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peers import postgres
from bench.peers.side import CHAIN, ChildApp, check

DATABASE = "dbos_bench"


def available() -> str | None:
    if importlib.util.find_spec("dbos") is None:
        return "dbos is not importable (pip install dbos==3.4.0)"
    return postgres.available()


class DbosSide:
    name = "dbos"

    def __init__(self, *, sync: str) -> None:
        self.synchronous_commit = sync == "always"
        self.pg: postgres.Postgres | None = None
        self.app: ChildApp | None = None
        self.logs = tempfile.TemporaryDirectory(prefix="bench-peers-dbos-")

    async def start(self, wrap: Sequence[str] = ()) -> None:
        self.pg = await postgres.Postgres.start(synchronous_commit=self.synchronous_commit, wrap=wrap)
        self.app = await ChildApp.start(
            "bench.peers.dbos_side", self.pg.url(DATABASE), log=Path(self.logs.name) / "app.log"
        )

    async def _ask(self, **request: Any) -> dict[str, Any]:
        assert self.app is not None
        return await self.app.ask(**request)

    async def one_3step(self) -> float:
        a = await self._ask(op="run", steps=3)
        check("dbos 3-step", a["value"], 3)
        return float(a["seconds"])

    async def chain50(self) -> float:
        a = await self._ask(op="run", steps=CHAIN)
        check(f"dbos chain of {CHAIN}", a["value"], CHAIN)
        return float(a["seconds"])

    async def concurrent(self, n: int) -> float:
        a = await self._ask(op="many", n=n)
        for v in a["values"]:
            check("dbos concurrent 3-step", v, 3)
        if len(a["values"]) != n:
            raise RuntimeError(f"dbos concurrent: {len(a['values'])} results of {n}")
        return float(a["seconds"])

    def fsync_pids(self) -> list[int]:
        assert self.pg is not None
        return [self.pg.pid]

    def versions(self) -> dict[str, str]:
        return {"dbos": importlib.metadata.version("dbos"), "postgres": "15"}

    async def stop(self) -> None:
        try:
            if self.app is not None:
                await self.app.stop()
        finally:
            if self.pg is not None:
                await self.pg.stop()
            self.logs.cleanup()


# --- the app, in its child process ------------------------------------------------------


def app_main(url: str) -> None:
    from dbos import DBOS, DBOSConfig

    from bench.peers.side import serve_lines

    @DBOS.step()
    def add(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    def chain(i: int, steps: int) -> int:
        for _ in range(steps):
            i = add(i)
        return i

    config: DBOSConfig = {"name": "bench_peers", "system_database_url": url, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()

    def run(steps: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        value = DBOS.start_workflow(chain, 0, steps).get_result()
        return {"seconds": time.perf_counter() - t0, "value": value}

    def many(n: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        handles = [DBOS.start_workflow(chain, 0, 3) for _ in range(n)]
        values = [h.get_result() for h in handles]
        return {"seconds": time.perf_counter() - t0, "values": values}

    try:
        serve_lines({"run": run, "many": many}, {"id": uuid.uuid4().hex})
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    app_main(sys.argv[1])
