"""The `shell` kind: ``command`` run by ``/bin/sh -c`` in its own session/process group
(killed whole on timeout or cancel), in the clean environment (actors/tools/environment.py)
with the step's args exported as ``ARG_<NAME>``, its ``env``, and its credential's keys
as variables (upper-cased; they win over ``env``), as the user steps run as (in their
directory, unless the step gives ``cwd``: actors/runtime/children.py). Its
output (stdout, then stderr) is also the step's printed output (`OutputBox`) once the
command has ended; a command killed on timeout or cancel leaves none."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from typing import Any

from actors.tools import fields
from actors.tools.call import ToolCall
from actors.tools.capture import OutputBox, captured_bytes
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
    try:
        out, err = await proc.communicate()
    except BaseException:
        # timeout / cancel / anything: kill the whole process group, then reap sh
        _killpg(proc.pid)
        await asyncio.shield(wait_quietly(proc.wait()))
        raise
    code = proc.returncode if proc.returncode is not None else -1
    if output is not None:
        output.captured = captured_bytes(out, err, cap=output.cap)
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


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
