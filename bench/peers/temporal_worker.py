"""The Temporal side's worker, in its own process (`python -m bench.peers.temporal_worker
ADDRESS QUEUE`): workflow `Chain(i, steps)`, `steps` activities `add` in a row, each
`i + 1`; unsandboxed, async activities (no thread pool). Says {"ready": true} on stdout
once polling, stops when its stdin closes. Temporal wants workflow classes at module
level, hence a module of its own (temporal_side.py imports no temporalio at import time,
so the bench can skip Temporal where it is missing)."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.peers.side import TIMEOUT

WORKFLOW = "Chain"


@activity.defn(name="add")
async def add(i: int) -> int:
    return i + 1


@workflow.defn(name=WORKFLOW)
class Chain:
    @workflow.run
    async def run(self, i: int, steps: int) -> int:
        for _ in range(steps):
            i = await workflow.execute_activity(add, i, start_to_close_timeout=timedelta(seconds=TIMEOUT))
        return i


async def main(address: str, queue: str) -> None:
    client = await Client.connect(address)
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[Chain],
        activities=[add],
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_concurrent_workflow_tasks=500,
        max_concurrent_activities=500,
    )
    async with worker:
        print(json.dumps({"ready": True}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the driver closes it


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
