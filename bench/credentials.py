"""What credentials, masking and the clean environment cost a tool call, in this process
(no NATS: the tool actor's own part of a step).

    python -m bench.credentials [--calls 500]

Medians over `--calls` calls, in microseconds, each against its baseline measured in the
same run (the three python calls interleaved):
* `python`: a trivial python step through `run_tool` (one worker), without a credential
  (the baseline) and with one (a folder of two files, read at each call), with an `env`
  of two variables (set, then the worker's environment put back): ratios to the baseline;
* `resolve`: `CredentialSource.resolve` of that folder alone, as a share of the baseline
  python call;
* `mask`: masking a 4 KiB error message with 20 credential values known, against the
  same text with none known (only the URL check runs).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.tools.credentials import CredentialSource
from actors.tools.executors import run_tool
from actors.tools.redact import Redactor
from actors.tools.resources import ToolResources

CODE = "def main(credential=None, **args):\n    return 1\n"


async def _median_us(calls: int, step: Any) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def main(calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "db"
        folder.mkdir()
        (folder / "username").write_text("bench-user")
        (folder / "password").write_text("bench-password-123")
        source = CredentialSource(d)
        resources = ToolResources(python_workers=1, credentials=source)
        try:
            await resources.python_pool().start()
            plain = {"code": CODE}
            creds = {"code": CODE, "credential": "db"}
            env = {"code": CODE, "env": {"A": "1", "B": "2"}}

            async def call(tool: dict[str, Any]) -> None:
                await run_tool("python", tool, {}, timeout=30, resources=resources)

            for tool in (plain, creds, env):  # warm
                await call(tool)
            # interleaved, so a change in the machine's load weighs on all three alike
            times: dict[str, list[float]] = {"plain": [], "creds": [], "env": []}
            for _ in range(calls):
                for name, tool in (("plain", plain), ("creds", creds), ("env", env)):
                    t0 = time.perf_counter()
                    await call(tool)
                    times[name].append(time.perf_counter() - t0)
            baseline, with_cred, with_env = (statistics.median(times[k]) * 1e6 for k in ("plain", "creds", "env"))

            async def resolve() -> None:
                source.resolve("db")

            resolved = await _median_us(calls, resolve)
        finally:
            await resources.close()

    text = ("error: request to db failed " * 150)[:4096]
    none, many = Redactor(), Redactor()
    many.add([f"secret-value-{i:02d}-abcdef" for i in range(20)])

    async def mask_none() -> None:
        none.text(text)

    async def mask_many() -> None:
        many.text(text)

    unmasked = await _median_us(calls, mask_none)
    masked = await _median_us(calls, mask_many)
    return {
        "calls": calls,
        "python_us": round(baseline, 1),
        "python_credential_ratio": round(with_cred / baseline, 3),
        "python_env_ratio": round(with_env / baseline, 3),
        "resolve_us": round(resolved, 1),
        "resolve_share_of_python_call": round(resolved / baseline, 4),
        "mask_4k_none_us": round(unmasked, 2),
        "mask_4k_20_values_ratio": round(masked / unmasked, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    result = asyncio.run(main(parser.parse_args().calls))
    print(json.dumps(result))
