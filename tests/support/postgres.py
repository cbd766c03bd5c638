"""A throwaway PostgreSQL cluster (Debian's `postgresql` package, 15 on bookworm): initdb in
a temporary directory, the server on a unix socket there and, when asked, on a free
loopback port with password authentication; stopped and deleted at the end. The tests'
session fixture (tests/conftest.py) and the benches (bench/peers/postgres.py) share it.

    pg = await Postgres.start(synchronous_commit=True, tcp=True)
    pg.url("dbos_bench")                 # postgresql+psycopg://... for SQLAlchemy
    pg.conninfo("postgres")              # the superuser over the socket (trust)
    await pg.add_user("app", "S3cret...")   # a role that logs in over TCP with a password
    pg.pid                               # the postmaster (its children: checkpointer, backends, ...)
    await pg.stop()

`Postgres.start(wrap=[...])` starts the postmaster under a command (the benches' strace,
bench/peers/fsync.py).
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streams.server import free_port

__all__ = ["BIN", "Database", "Postgres", "available", "find_bin", "start_database"]


def find_bin() -> Path:
    """Where initdb and pg_ctl are: PG_BIN, else Debian's newest /usr/lib/postgresql/N/bin,
    else the folder of an `initdb` on PATH."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name or 0))
    if found:
        return Path(found[-1])
    on_path = shutil.which("initdb")
    return Path(on_path).resolve().parent if on_path else Path("/usr/lib/postgresql/15/bin")


BIN = find_bin()


def available() -> str | None:
    """Why a cluster cannot be made here (None: it can)."""
    missing = [name for name in ("initdb", "pg_ctl") if not (BIN / name).exists()]
    if missing:
        return f"no {', '.join(missing)} in {BIN} (install Debian's `postgresql` package, or set PG_BIN)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root and no `runuser` to run the server as the `postgres` account"
    return None


def _as_owner() -> list[str]:
    # initdb and postgres refuse to run as root: run them as the `postgres` account then
    # (runuser, not create_subprocess_exec's `user`: uvloop has no such argument)
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


async def _run(*argv: str, log: Path, wrap: Sequence[str] = ()) -> None:
    # output to a file, not a pipe: the postmaster pg_ctl leaves running would hold a
    # pipe open, and reading it to its end would never finish
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(*wrap, *_as_owner(), *argv, stdout=out, stderr=out)
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
    """A running cluster: `root` (its directory and socket folder), `port`, `pid`
    (the postmaster), `tcp` (listening on 127.0.0.1:`port` too)."""

    def __init__(self, root: Path, port: int, pid: int, tcp: bool) -> None:
        self.root, self.port, self.pid, self.tcp = root, port, pid, tcp

    @classmethod
    async def start(
        cls,
        *,
        synchronous_commit: bool = True,
        tcp: bool = False,
        max_connections: int = 200,
        wrap: Sequence[str] = (),
    ) -> Postgres:
        """initdb and start. The superuser `postgres` connects over the socket without a
        password; with `tcp`, 127.0.0.1:port takes scram-sha-256 passwords (`add_user`).
        `wrap`: a command `pg_ctl start` runs under (`[*wrap, pg_ctl, "start", ...]`), so
        the postmaster it forks and all the postmaster's children do too; it must leave
        pg_ctl in the process it was given and return once pg_ctl does (strace's `-D`:
        the tracer runs detached, `-f` follows pg_ctl's fork into the postmaster)."""
        root = Path(tempfile.mkdtemp(prefix="actors-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        data, port, log = root / "data", free_port(), root / "pg_ctl.log"
        try:
            await _run(
                str(BIN / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                log=log,
            )
            listen = "127.0.0.1" if tcp else ""
            options = (
                f"-k {root} -p {port} -c listen_addresses='{listen}' -c max_connections={max_connections}"
                f" -c synchronous_commit={'on' if synchronous_commit else 'off'}"
            )
            pg_ctl = str(BIN / "pg_ctl")
            start = [pg_ctl, "start", "-w", "-D", str(data), "-l", str(root / "log"), "-o", options]
            await _run(*start, log=log, wrap=wrap)
            pid = _postmaster(data)
        except BaseException:  # interrupted or failed: no server left behind
            if (pid := _postmaster(data)) is not None:
                os.kill(pid, signal.SIGINT)  # fast shutdown
            shutil.rmtree(root, ignore_errors=True)
            raise
        assert pid is not None
        return cls(root, port, pid, tcp)

    def url(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3) of `database` over the unix socket."""
        return f"postgresql+psycopg://postgres@/{database}?host={self.root}&port={self.port}"

    def conninfo(self, database: str = "postgres") -> str:
        """libpq connection string of the superuser over the unix socket (no password)."""
        return f"host={self.root} port={self.port} dbname={database} user=postgres"

    async def sql(self, statement: str, database: str = "postgres") -> None:
        """Run `statement` as the superuser (autocommit: CREATE DATABASE works)."""
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.conninfo(database), autocommit=True) as conn:
            await conn.execute(statement.encode())

    async def add_user(self, user: str, password: str, *, database: str | None = None) -> None:
        """A login role with `password` (owner of `database`, made when given)."""
        from psycopg import sql

        async def run(q: sql.Composed) -> None:
            import psycopg

            async with await psycopg.AsyncConnection.connect(self.conninfo(), autocommit=True) as conn:
                await conn.execute(q)

        await run(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(user), sql.Literal(password)))
        if database is not None:
            await run(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(user)))

    async def stop(self) -> None:
        try:
            data, log = str(self.root / "data"), self.root / "pg_ctl.log"
            await _run(str(BIN / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", data, log=log)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@dataclass(frozen=True)
class Database:
    """A database of a running cluster and the role that owns it (password over TCP)."""

    pg: Postgres
    name: str
    user: str
    password: str

    def credential(self) -> dict[str, str]:
        """The keys a `postgres` credential gives (host, port, database, user, password)."""
        return {
            "host": "127.0.0.1",
            "port": str(self.pg.port),
            "database": self.name,
            "user": self.user,
            "password": self.password,
            "sslmode": "disable",
        }

    def url(self) -> str:
        """The same as one `postgresql://` URL (a credential's `dsn`)."""
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.pg.port}/{self.name}?sslmode=disable"

    def admin(self) -> str:
        """The superuser over the socket, in this database (no password)."""
        return self.pg.conninfo(self.name)


def start_database(password: str) -> tuple[Postgres, Database]:
    """A cluster listening on TCP with database `actors_test` owned by role `actors_app` (`password`),
    made in a loop of its own (for a session fixture, outside any test's loop)."""

    async def make() -> tuple[Postgres, Database]:
        pg = await Postgres.start(tcp=True, synchronous_commit=False)
        try:
            await pg.add_user("actors_app", password, database="actors_test")
        except BaseException:
            await pg.stop()
            raise
        return pg, Database(pg, "actors_test", "actors_app", password)

    return asyncio.run(make())
