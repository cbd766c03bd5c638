"""A throwaway PostgreSQL 15 cluster for a bench: initdb in a temporary directory, the
server listening only on a unix socket there (no TCP port to collide with), stopped and
deleted at the end.

    pg = await Postgres.start(synchronous_commit=True)
    url = pg.url("dbos_bench")           # postgresql+psycopg://... for SQLAlchemy
    pg.pid                               # the postmaster (its children: checkpointer, backends, ...)
    await pg.stop()
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path

from streams.server import free_port

BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> str | None:
    """Why a cluster cannot be made here (None: it can)."""
    missing = [name for name in ("initdb", "pg_ctl") if not (BIN / name).exists()]
    return f"no {', '.join(missing)} in {BIN} (set PG_BIN)" if missing else None


def _as_owner() -> list[str]:
    # initdb and postgres refuse to run as root: run them as the `postgres` account then
    # (runuser, not create_subprocess_exec's `user`: uvloop has no such argument)
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


async def _run(*argv: str, log: Path) -> None:
    # output to a file, not a pipe: the postmaster pg_ctl leaves running would hold a
    # pipe open, and reading it to its end would never finish
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(*_as_owner(), *argv, stdout=out, stderr=out)
    if await proc.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _postmaster(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Postgres:
    def __init__(self, root: Path, port: int, pid: int) -> None:
        self.root, self.port, self.pid = root, port, pid

    @classmethod
    async def start(cls, *, synchronous_commit: bool) -> Postgres:
        root = Path(tempfile.mkdtemp(prefix="bench-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        data, port, log = root / "data", free_port(), root / "pg_ctl.log"
        try:
            await _run(str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", log=log)
            options = (
                f"-k {root} -p {port} -c listen_addresses='' -c max_connections=200"
                f" -c synchronous_commit={'on' if synchronous_commit else 'off'}"
            )
            pg_ctl = str(BIN / "pg_ctl")
            await _run(pg_ctl, "start", "-w", "-D", str(data), "-l", str(root / "log"), "-o", options, log=log)
            pid = _postmaster(data)
        except BaseException:  # interrupted or failed: no server left behind
            if (pid := _postmaster(data)) is not None:
                os.kill(pid, signal.SIGINT)  # fast shutdown
            shutil.rmtree(root, ignore_errors=True)
            raise
        assert pid is not None
        return cls(root, port, pid)

    def url(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3) of `database` over the unix socket."""
        return f"postgresql+psycopg://postgres@/{database}?host={self.root}&port={self.port}"

    async def stop(self) -> None:
        try:
            data, log = str(self.root / "data"), self.root / "pg_ctl.log"
            await _run(str(BIN / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", data, log=log)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
