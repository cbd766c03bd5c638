"""The `duckdb` kind: SQL run by DuckDB in a worker process, never on the pod's event loop.

The workers are a `PythonPool` of their own (`ToolResources.duckdb_pool`): the python
pool's machinery (a fresh interpreter in its own process group, the clean environment,
the step user and directory, SIGKILL and a replacement on timeout, cancel or crash, a
call waiting for a worker charged to its timeout), not its workers: a duckdb call lowers
its worker's address-space limit and holds DuckDB's threads and memory, which python
steps must not share. Each call runs `actors.tools.duckdbrun.main` there (fixed code, so
the worker compiles it once); what it returns is checked and encoded there.

Fields (rendered like any tool field, except `query`, which is never a template):
``query`` (SQL, one or more statements; values come in as ``$name`` parameters bound
from the step's args), ``max_rows`` (default 10,000), ``database`` (a DuckDB file; default
in-memory), ``inputs`` (name -> a list of mappings, each a temporary table), ``memory``
(MiB DuckDB may use, default 1024) and ``threads`` (default 1). Files are opened only
in the pod's ``ACTORS_DUCKDB_DIRS`` and the steps' own directory (`allowed_dirs`).
"""

from __future__ import annotations

import os
import re

from actors.tools.call import ToolCall
from actors.tools.cpus import available_cpus
from actors.tools.failures import ToolFailure

__all__ = ["DEFAULT_MAX_ROWS", "DEFAULT_MEMORY_MB", "allowed_dirs", "duckdb_dirs", "run_duckdb"]

DEFAULT_MAX_ROWS = 10_000
DEFAULT_MEMORY_MB = 1024
MAX_MEMORY_MB = 1 << 20  # a typo guard (1 TiB), not a policy: the pod's own memory bounds it
_CODE = "from actors.tools.duckdbrun import main\n"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def duckdb_dirs(setting: str | None) -> tuple[str, ...]:
    """`ACTORS_DUCKDB_DIRS` read: absolute directories, `:`-separated (ValueError names a
    relative one: relative to what a step's worker runs in is not what an operator means)."""
    dirs: list[str] = []
    for part in (setting or "").split(":"):
        part = part.strip()
        if not part:
            continue
        if not os.path.isabs(part):
            raise ValueError(f"ACTORS_DUCKDB_DIRS: {part!r} is not an absolute path")
        dirs.append(os.path.normpath(part))
    return tuple(dirs)


def allowed_dirs(call: ToolCall) -> list[str]:
    """The directories a duckdb step may open files in: the pod's `ACTORS_DUCKDB_DIRS`
    and, when steps run as another user, their own directory (their HOME, TMPDIR and
    working directory). Symlinks resolved: DuckDB compares paths as text."""
    res = call.resources
    dirs = list(res.duckdb_dirs) + ([res.home] if res.home else [])
    return [os.path.realpath(d) for d in dirs]


def _whole(value: object, what: str, default: int, low: int, high: int) -> int:
    if value is None or value == "":
        return default
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        n = int(str(value)) if not isinstance(value, (int, float)) else int(value)
    except (TypeError, ValueError):
        raise ToolFailure("ToolConfigError", f"duckdb {what} must be a whole number, got {value!r}") from None
    if not low <= n <= high:
        raise ToolFailure("ToolConfigError", f"duckdb {what} must be between {low:,} and {high:,}, got {n:,}")
    return n


def _inputs(value: object) -> dict[str, list[object]]:
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise ToolFailure("ToolConfigError", f"duckdb inputs must be a mapping of names to lists, got {value!r:.80}")
    for name, rows in value.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolFailure(
                "ToolConfigError", f"duckdb input name {name!r} must be a plain SQL name (letters, digits, _)"
            )
        if not isinstance(rows, list):
            raise ToolFailure(
                "ToolConfigError", f"duckdb input {name!r} must be a list of mappings, got {type(rows).__name__}"
            )
    return value


async def run_duckdb(call: ToolCall) -> bytes:
    """The JSON text of ``{"rows", "row_count", "columns"}`` the worker wrote."""
    tool = call.tool
    query = tool.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolFailure("ToolConfigError", "duckdb tool needs `query` (SQL)")
    database = tool.get("database")
    if database is not None and (not isinstance(database, str) or not database.strip()):
        raise ToolFailure("ToolConfigError", f"duckdb database must be a file path, got {database!r}")
    request = {
        "query": query,
        "params": call.args,
        "inputs": _inputs(tool.get("inputs")),
        "database": database or None,
        "max_rows": _whole(tool.get("max_rows"), "max_rows", DEFAULT_MAX_ROWS, 0, 1 << 40),
        "memory": _whole(tool.get("memory"), "memory (MiB)", DEFAULT_MEMORY_MB, 16, MAX_MEMORY_MB),
        "threads": _whole(tool.get("threads"), "threads", 1, 1, available_cpus()),
        "dirs": allowed_dirs(call),
    }
    try:
        return await call.resources.duckdb_pool().run_json(
            _CODE, request, timeout=call.limit, cancel=call.cancel, output=call.output
        )
    except ToolFailure as f:
        if f.type not in ("Timeout", "Cancelled", "WorkerCrashed"):
            # a DuckDB error's message says what and where (its LINE and caret); the
            # traceback would only show this package's frames in the worker
            f.traceback = None
        elif f.type == "WorkerCrashed":
            f.message += (
                f" (a duckdb step's worker may use {request['memory']:,} MiB of DuckDB memory and its "
                "engine's overhead; past that the process is stopped)"
            )
        raise
