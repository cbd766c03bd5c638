"""`Client.run`: start an execution and wait for its terminal status, with the status
watch made before the start, so the wait needs no read of the status key (a request to
the server per execution, on the client and on the server) and misses nothing."""

from __future__ import annotations

import uuid
from typing import Any

from actors.client.reading import Reader
from actors.client.watch import StatusWatch
from actors.client.writing import Writer
from actors.wire.messages import ExecutionStatus


class Runs(Writer, Reader):
    async def run(
        self,
        playbook: str,
        *,
        payload: dict[str, Any] | None = None,
        version: int | None = None,
        timeout: float | None = None,
    ) -> tuple[str, ExecutionStatus]:
        """Start `playbook` as a new execution (a fresh id) and wait until its status is
        terminal: (execution id, status). `start` then `wait`, without `wait`'s read of
        the key: a status stored after the subscription comes on it, and a fresh id has
        none before. Past `timeout` seconds TimeoutError (the execution goes on)."""
        eid = uuid.uuid4().hex
        watch = await StatusWatch.open(self.nc, eid, self.codec)
        try:
            await self.start(playbook, payload=payload, version=version, execution_id=eid)
        except BaseException:
            await watch.close()
            raise
        return eid, await self._wait(eid, timeout, watch)
