"""The `shell` kind: ``command`` run by ``/bin/sh -c`` in its own session/process group
(killed whole on timeout or cancel), in the clean environment (actors/tools/environment.py)
with the step's args exported as ``ARG_<NAME>``, its ``env``, and its credential's keys
as variables (upper-cased; they win over ``env``), as the user steps run as (in their
directory, unless the step gives ``cwd``: actors/runtime/children.py). Its stdout and
stderr are read as they come: the step's printed output (`OutputBox`) is both, in the
order they arrived (published while it runs: `LiveOutput`), its result has each apart.
A command killed on timeout or cancel keeps what it printed until then."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from typing import Any

from actors.tools import fields
from actors.tools.call import ToolCall
from actors.tools.capture import TAIL, Captured, OutputBox
from actors.tools.environment import credential_environment, step_environment
from actors.tools.failures import ToolFailure, result_json
from actors.tools.limits import limited, wait_quietly
from actors.tools.redact import REDACTOR
from actors.tools.resources import ToolResources

__all__ = ["run_shell"]

_EXCERPT = 200


async def run_shell(call: ToolCall) -> bytes:
    """``{"stdout", "stderr", "exit_code"}``; a non-zero exit is ``ShellError``."""
    shell = _shell(call.tool, call.args, call.output, call.resources, call.credential)
    return result_json(await limited(shell, call.limit, call.cancel))


_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")


def _arg_env_name(name: str) -> str:
    return "ARG_" + _ENV_NAME.sub("_", str(name)).upper()


async def _shell(
    tool: dict[str, Any],
    args: dict[str, Any],
    output: OutputBox | None,
    resources: ToolResources,
    credential: dict[str, str] | None,
) -> dict[str, Any]:
    command = tool.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolFailure("ToolConfigError", "shell tool needs a `command`")
    env = dict(resources.environment)
    for k, v in args.items():
        env[_arg_env_name(k)] = "" if v is None else fields.text(v)
    env.update(step_environment(tool.get("env"), "shell env"))
    if credential is not None:
        env.update(credential_environment(credential))
    cwd = tool.get("cwd")
    if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
        raise ToolFailure("ToolConfigError", f"shell cwd must be a path, got {cwd!r}")
    try:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd or resources.home,
            start_new_session=True,
            preexec_fn=resources.run_as.become if resources.run_as is not None else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolFailure("ToolConfigError", f"cannot start shell command: {exc}") from None
    printed = _Printed(output)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        await asyncio.gather(printed.read(proc.stdout, printed.out), printed.read(proc.stderr, printed.err))
        await proc.wait()
    except BaseException:
        # timeout / cancel / anything: kill the whole process group, then reap sh
        _killpg(proc.pid)
        await asyncio.shield(wait_quietly(proc.wait()))
        printed.keep()  # what it printed until then
        raise
    code = proc.returncode if proc.returncode is not None else -1
    printed.keep()
    out, err = b"".join(printed.out), b"".join(printed.err)
    # captured text, not a value the command chose to return: masked like its printed output
    stderr = REDACTOR.text(err.decode("utf-8", errors="replace"))
    stdout = REDACTOR.text(out.decode("utf-8", errors="replace"))
    result: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "exit_code": code}
    if code != 0:
        tail = stderr.strip()[-_EXCERPT:]
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        msg = f"shell command {how}" + (f": {tail}" if tail else "")
        raise ToolFailure("ShellError", msg, data=result)
    return result


class _Printed:
    """A command's stdout and stderr as read: each apart (its result), and both in the
    order they came (its printed output: the first `cap` bytes, the tail, the count),
    fed to the output's live parts as they come."""

    __slots__ = ("both", "err", "out", "output", "size", "tail")

    def __init__(self, output: OutputBox | None) -> None:
        self.output = output
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.both = bytearray()  # the first `cap` bytes of both
        self.tail = b""
        self.size = 0

    async def read(self, stream: asyncio.StreamReader, into: list[bytes]) -> None:
        while True:
            chunk = await stream.read(_READ)
            if not chunk:
                return
            into.append(chunk)
            output = self.output
            if output is None:
                continue
            self.size += len(chunk)
            room = output.cap - len(self.both)
            if room > 0:
                self.both += chunk[:room]
            self.tail = (self.tail + chunk)[-TAIL:]
            if output.live is not None:
                output.live.feed(chunk)

    def keep(self) -> None:
        if self.output is not None and self.size:
            self.output.captured = Captured(size=self.size, kept=bytes(self.both), tail=self.tail)


_READ = 1 << 16


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
