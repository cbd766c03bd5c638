"""Tool executors: run one tool call and return its result as JSON text.

Pure executors, no NATS: the tool actor renders the tool mapping and the step's args,
then calls `run_tool` with its `ToolResources`. Every failure comes out as `ToolFailure`
(never another exception type; see `actors.tools.failures`). The result is encoded once,
here (python: in the worker): that checks it is JSON data, and the same bytes are
measured and put in the answer (`msgspec.Raw`).

Kinds (the table `EXECUTORS`, one module each under `actors.tools.kinds`):

- ``noop``: returns ``args`` as given.
- ``sleep``: ``seconds`` from the tool or the args (args win); returns ``{"slept": seconds}``.
- ``python``: ``code`` defining ``def main(**args)``; runs in a worker process of
  the resources' `PythonPool`, outside the event loop, with ``env`` over the clean
  environment for the call; a ``credential`` parameter of ``main`` gets the credential.
- ``shell``: ``command`` run by ``/bin/sh -c`` in its own session/process group, in
  the clean environment (actors/tools/environment.py) with ``env`` and the credential's
  keys over it, and ``cwd``. Each step arg is exported as the
  environment variable ``ARG_<NAME>`` (name upper-cased, characters other than
  ``[A-Za-z0-9_]`` replaced by ``_``); a string value as is, any other value as JSON.
  Returns ``{"stdout", "stderr", "exit_code"}``; a non-zero exit is ``ShellError``.
- ``http``: ``method``, ``url``, ``params``, ``headers``, ``json`` or ``body``,
  ``timeout``, ``raise_for_status`` (default true). When the step has ``args`` and
  the tool gives neither ``json`` nor ``body``: for GET, DELETE, HEAD and OPTIONS the
  args are sent as query parameters (``params`` win on a clash), for any other method
  they are the JSON body. Returns ``{"status", "headers", "data"}``; ``data`` is the
  parsed JSON when the content type is JSON, else the text.
- ``duckdb``: ``query`` (SQL, ``$name`` parameters bound from the args), ``max_rows``,
  ``database``, ``inputs``, ``memory``, ``threads``; runs in a worker process of the
  resources' duckdb pool (the python pool's machinery, workers of its own: see
  actors/tools/kinds/duckdb.py). Returns ``{"rows", "row_count", "columns"}``.
- ``postgres``: ``query`` (SQL, or a list of statements; ``%(name)s`` parameters bound
  by the driver from the args), ``credential`` or ``auth: {type: postgres, credential}``,
  ``max_rows``; one transaction per call on the resources' pool for the credential
  (actors/tools/pgpool.py, actors/tools/kinds/postgres.py). Returns ``{"columns",
  "rows", "row_count"}``, or ``{"row_count", "status"}`` for a command without rows.
  With ``table`` instead of ``query``: the arg ``rows`` written (``mode``, ``key``,
  ``columns``; actors/tools/pgwrite.py), once per command; ``{"table", "mode", "row_count"}``.
- ``playbook``: runs in the engine, never here (``ToolConfigError``).

Credentials (``credential``: a name) are resolved for ``http``, ``python``, ``shell`` and ``postgres``
from the resources' `CredentialSource` at each call (`CredentialNotFound`,
`CredentialInvalid`). Whatever leaves `run_tool` other than a result the tool returned
itself is masked (actors/tools/redact.py): a failure's type (a python step names its
exception's class, which may be any text), message, traceback and data, what the tool
printed, a shell step's stdout and stderr.

`timeout` bounds the whole call; on expiry the work is stopped (python, duckdb: the worker
process is killed; shell: the process group is killed; http: the request is
cancelled) and ``ToolFailure(type="Timeout", retryable=True)`` is raised. Setting
`cancel` stops the work the same way and raises ``ToolFailure(type="Cancelled")``.
Cancelling the calling task itself stops the work too, and lets `CancelledError`
propagate (that is the caller's cancellation, not a tool failure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from actors.tools import fields
from actors.tools.call import CommandIdentity, ToolCall
from actors.tools.capture import OutputBox
from actors.tools.failures import ToolFailure, failure_from_exception
from actors.tools.kinds.basic import run_noop, run_sleep
from actors.tools.kinds.duckdb import run_duckdb
from actors.tools.kinds.http import run_http
from actors.tools.kinds.postgres import run_postgres
from actors.tools.kinds.python import run_python
from actors.tools.kinds.shell import run_shell
from actors.tools.redact import REDACTOR
from actors.tools.resources import ToolResources
from actors.wire.messages import CodeAt

__all__ = ["EXECUTORS", "USES_CREDENTIAL", "Executor", "run_tool"]

# (tool, args, timeout, cancel, resources) -> the result's JSON text
Executor = Callable[[ToolCall], Awaitable[bytes]]

EXECUTORS: dict[str, Executor] = {
    "python": run_python,
    "noop": run_noop,
    "sleep": run_sleep,
    "shell": run_shell,
    "http": run_http,
    "postgres": run_postgres,
    "duckdb": run_duckdb,
}
# the kinds a `credential` is resolved for (noop and sleep have no use for one)
USES_CREDENTIAL = frozenset({"http", "python", "shell", "postgres"})


async def run_tool(
    kind: str,
    tool: dict[str, Any],
    args: dict[str, Any],
    *,
    timeout: float | None,
    resources: ToolResources,
    cancel: asyncio.Event | None = None,
    output: OutputBox | None = None,
    identity: CommandIdentity | None = None,
    result: Any = None,
    code_at: CodeAt | None = None,
) -> bytes:
    """Run one tool call; return its result as JSON text or raise `ToolFailure`.

    `tool` is the rendered tool mapping (``{"kind": "http", "url": ..., ...}``), `args`
    the step's rendered args, `timeout` the seconds the whole call may take (None: no
    limit), `resources` the pool and session the call may use, `cancel` an event that
    stops the call when set, `output` where what the tool printed goes (python and
    shell fill it, whatever the outcome). `identity`: the command the call runs for
    (a postgres write's ledger key); `result`: for a sink, the step's result it follows;
    `code_at`: where a python tool's code starts in its playbook (its tracebacks say so).
    The failure's type, message, traceback and data and the output are masked (see the
    module docstring).
    """
    try:
        try:  # one coroutine for the checks and the call: a python call resumes through it once
            if args is None:
                args = {}
            if not isinstance(args, dict):
                raise ToolFailure("ToolConfigError", f"step args must be a mapping, got {type(args).__name__}")
            if timeout is not None:
                timeout = fields.seconds(timeout, "timeout")
            executor = EXECUTORS.get(kind)
            if executor is None:
                if kind == "playbook":
                    raise ToolFailure("ToolConfigError", "playbook tool runs in the engine")
                raise ToolFailure("ToolConfigError", f"unknown tool kind {kind!r}")
            name = tool.get("credential")
            credential = resources.credentials.resolve(name) if name is not None and kind in USES_CREDENTIAL else None
            call = ToolCall(tool, args, timeout, cancel, resources, output, credential, identity, result, code_at)
            return await executor(call)
        except (ToolFailure, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise failure_from_exception(exc) from exc
    except ToolFailure as f:
        mask_failure(f)
        raise
    finally:
        if output is not None and output.captured is not None:
            output.captured = REDACTOR.captured(output.captured)


def mask_failure(f: ToolFailure) -> None:
    """Every credential value out of a failure a tool raised (its type, message,
    traceback and data), before it is answered, logged or stored."""
    f.type = REDACTOR.text(f.type)
    f.message = REDACTOR.text(f.message)
    f.traceback = REDACTOR.maybe(f.traceback)
    f.data = REDACTOR.value(f.data)
    f.args = (f"{f.type}: {f.message}",)
