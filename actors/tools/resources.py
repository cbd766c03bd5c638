"""What tool calls share, owned by one tool actor: the python worker pool and the HTTP
session, made lazily on first use (a sink may call a kind its actor does not consume) and
closed by `close()` when the actor stops; where credentials are found; the clean
environment python and shell steps start from. Tests that call the executors make their own."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from actors.tools.credentials import CredentialSource
from actors.tools.environment import base_environment
from actors.tools.pypool import PythonPool

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ToolResources"]


class ToolResources:
    """The python pool (`python_workers` workers; None: the CPUs this process may use,
    `actors.tools.cpus.available_cpus`) and one aiohttp session, for one event loop;
    `credentials` (default: none); `environment`, what python and shell steps start from
    (default: `base_environment()`, a few of this process's variables)."""

    def __init__(
        self,
        *,
        python_workers: int | None = None,
        credentials: CredentialSource | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.python_workers = python_workers
        self.credentials = credentials if credentials is not None else CredentialSource()
        self.environment = environment if environment is not None else base_environment()
        self._pool: PythonPool | None = None
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()

    def python_pool(self) -> PythonPool:
        """The pool (created on first use; again after it was closed)."""
        if self._pool is None or self._pool.closed:
            self._pool = PythonPool(size=self.python_workers, environment=self.environment)
        return self._pool

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
        """Kill and reap the pool's workers, close the HTTP session."""
        pool, self._pool = self._pool, None
        # a forked child holds a copy of this object: the parent's workers are not its own
        if pool is not None and self._pid == os.getpid():
            await pool.close()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
