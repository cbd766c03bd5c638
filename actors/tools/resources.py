"""What tool calls share, owned by one tool actor: the python worker pool (and the duckdb
steps' own), the HTTP session, made lazily on first use (a sink may call a kind its actor does not consume) and
closed by `close()` when the actor stops; where credentials are found; the clean
environment python and shell steps start from, and the user they run as (with, for
another user than the pod's, a directory of their own: actors/runtime/children.py). Tests that
call the executors make their own."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

from actors.runtime.children import RunAs, cannot_start_steps, step_home
from actors.tools.credentials import CredentialSource
from actors.tools.environment import base_environment
from actors.tools.failures import ToolFailure
from actors.tools.pgpool import PoolBounds, PostgresPools
from actors.tools.pypool import PythonPool

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ToolResources"]


class ToolResources:
    """The python pool (`python_workers` workers; None: the CPUs this process may use,
    `actors.tools.cpus.available_cpus`) and one aiohttp session, for one event loop;
    `credentials` (default: none); `environment`, what python and shell steps start from
    (default: `base_environment()`, a few of this process's variables); `run_as`, the
    user python and shell steps run as (default: this process's). Steps of another user
    get `home`, a directory of their own, as HOME, TMPDIR and working directory."""

    def __init__(
        self,
        *,
        python_workers: int | None = None,
        step_memory: int = 0,
        credentials: CredentialSource | None = None,
        environment: dict[str, str] | None = None,
        run_as: RunAs | None = None,
        duckdb_dirs: tuple[str, ...] = (),
        postgres_pool: PoolBounds | None = None,
    ) -> None:
        self.python_workers = python_workers
        self.step_memory = step_memory  # bytes of address space of a python step's worker; 0: none
        # what duckdb steps may open besides `home` (actors/tools/kinds/duckdb.py)
        self.duckdb_dirs = duckdb_dirs
        self.credentials = credentials if credentials is not None else CredentialSource()
        self.run_as = run_as
        # the pod's HOME and working directory are not another user's to write (nor, for a root pod, to read)
        self.home = step_home(run_as) if run_as is not None else None
        env = environment if environment is not None else base_environment()
        self.environment = env if self.home is None else {**env, "HOME": self.home, "TMPDIR": self.home}
        self._pool: PythonPool | None = None
        self._duckdb_pool: PythonPool | None = None
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        # postgres steps' and sinks' connections: a pool per credential (actors/tools/pgpool.py)
        self.postgres = PostgresPools(postgres_pool)

    def python_pool(self) -> PythonPool:
        """The pool (created on first use; again after it was closed)."""
        if self._pool is None or self._pool.closed:
            self._pool = PythonPool(
                size=self.python_workers,
                environment=self.environment,
                run_as=self.run_as,
                cwd=self.home,
                memory=self.step_memory,
            )
        return self._pool

    def duckdb_pool(self) -> PythonPool:
        """The duckdb steps' own worker pool (actors/tools/kinds/duckdb.py): the python
        pool's machinery, not its workers, whose address space a query bounds."""
        if self._duckdb_pool is None or self._duckdb_pool.closed:
            self._duckdb_pool = PythonPool(
                size=self.python_workers, environment=self.environment, run_as=self.run_as, cwd=self.home
            )
        return self._duckdb_pool

    async def warm_python(self) -> None:
        """Start every python worker now, not on the first step. When steps run as
        another user and a worker cannot start as that user (the interpreter, its
        packages or the temporary directory unreadable to it), raises `StepUserInvalid`:
        the pod says so when it starts, not at each step."""
        try:
            await self.python_pool().start()
        except (ToolFailure, OSError, subprocess.SubprocessError) as e:
            if self.run_as is None:
                raise
            raise cannot_start_steps(self.run_as, getattr(e, "message", None) or e) from None

    def http_session(self) -> aiohttp.ClientSession:
        """The shared ClientSession (created lazily, in the running loop: a session is
        bound to the loop it was made in)."""
        import aiohttp

        loop = asyncio.get_running_loop()
        s = self._session
        if s is None or s.closed or self._session_loop is not loop:
            s = self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                raise_for_status=False,
            )
            self._session_loop = loop
        return s

    async def close(self) -> None:
        """Kill and reap the pool's workers, close the HTTP session, remove the steps'
        directory."""
        pool, self._pool = self._pool, None
        # a forked child holds a copy of this object: the parent's workers are not its own
        mine = self._pid == os.getpid()
        if pool is not None and mine:
            await pool.close()
        duckdb_pool, self._duckdb_pool = self._duckdb_pool, None
        if duckdb_pool is not None and mine:
            await duckdb_pool.close()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
        if mine:
            await self.postgres.close()
        if self.home is not None and mine:  # what steps left there goes with them
            shutil.rmtree(self.home, ignore_errors=True)
