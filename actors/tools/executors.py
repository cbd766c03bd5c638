"""Tool executors: run one tool call and return its JSON-able result.

Pure executors, no NATS: the tool actor renders the tool mapping and the step's args,
then calls `run_tool`. Every failure comes out as `ToolFailure` (never another
exception type), whose `to_error()` is the `error` mapping of shared/DSL.md:
`type` is the exception class name (`ValueError`) or one of `Timeout`, `Cancelled`,
`HTTPError`, `ConnectionError`, `ShellError`, `ToolConfigError`, `WorkerCrashed`,
`ResultNotSerialisable`, `ArgsNotSerialisable`; `retryable` is true for timeouts,
connection errors and HTTP 408, 429 and 5xx.

Kinds (see `run_tool`):

- ``noop``: returns ``args`` as given.
- ``sleep``: ``seconds`` from the tool or the args (args win); returns ``{"slept": seconds}``.
- ``python``: ``code`` defining ``def main(**args)``; runs in a worker process of
  `actors.tools.pyrunner.default_pool()`, outside the event loop.
- ``shell``: ``command`` run by ``/bin/sh -c`` in its own session/process group, with
  ``env`` merged over ``os.environ`` and ``cwd``. Each step arg is exported as the
  environment variable ``ARG_<NAME>`` (name upper-cased, characters other than
  ``[A-Za-z0-9_]`` replaced by ``_``); a string value as is, any other value as JSON.
  Returns ``{"stdout", "stderr", "exit_code"}``; a non-zero exit is ``ShellError``.
- ``http``: ``method``, ``url``, ``params``, ``headers``, ``json`` or ``body``,
  ``timeout``, ``raise_for_status`` (default true). When the step has ``args`` and
  the tool gives neither ``json`` nor ``body``: for GET, DELETE, HEAD and OPTIONS the
  args are sent as query parameters (``params`` win on a clash), for any other method
  they are the JSON body. Returns ``{"status", "headers", "data"}``; ``data`` is the
  parsed JSON when the content type is JSON, else the text.
- ``playbook``: runs in the engine, never here (``ToolConfigError``).

`timeout` bounds the whole call; on expiry the work is stopped (python: the worker
process is killed; shell: the process group is killed; http: the request is
cancelled) and ``ToolFailure(type="Timeout", retryable=True)`` is raised. Setting
`cancel` stops the work the same way and raises ``ToolFailure(type="Cancelled")``.
Cancelling the calling task itself stops the work too, and lets `CancelledError`
propagate (that is the caller's cancellation, not a tool failure).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import traceback as _traceback
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from actors.jsonvalues import dumps, loads

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ToolFailure", "check_serialisable", "close_http", "run_tool"]

T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({408, 429})
_QUERY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})
_EXCERPT = 200


class ToolFailure(Exception):
    """A tool call failed. `type`/`message`/`retryable`/`status` are the DSL's `error`."""

    def __init__(
        self,
        type: str,
        message: str,
        *,
        retryable: bool = False,
        status: int | None = None,
        traceback: str | None = None,
        data: Any = None,
    ) -> None:
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message
        self.retryable = retryable
        self.status = status
        self.traceback = traceback
        self.data = data

    def to_error(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "message": self.message,
            "retryable": self.retryable,
            "status": self.status,
            "traceback": self.traceback,
        }

    def __repr__(self) -> str:
        return f"ToolFailure(type={self.type!r}, message={self.message!r}, retryable={self.retryable!r}, status={self.status!r})"


class CancelSignal(asyncio.Event):
    """An `asyncio.Event` that also runs plain callbacks when set, so code waiting for a
    call *or* a cancel needs no task of its own to watch the cancel (the tool actor
    gives one to every command)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def add_callback(self, cb: Callable[[], None]) -> None:
        """Run `cb` once when set (not if already set: check `is_set()` first)."""
        self._callbacks.append(cb)

    def remove_callback(self, cb: Callable[[], None]) -> None:
        try:
            self._callbacks.remove(cb)
        except ValueError:
            pass


def timeout_failure(timeout: float | None) -> ToolFailure:
    return ToolFailure(
        "Timeout",
        f"tool call timed out after {timeout:g}s" if timeout is not None else "tool call timed out",
        retryable=True,
    )


def cancelled_failure(what: str = "tool call cancelled") -> ToolFailure:
    return ToolFailure("Cancelled", what)


def failure_from_exception(exc: BaseException) -> ToolFailure:
    """An unexpected exception (a bug, a bad value) as a ToolFailure of its class name."""
    if isinstance(exc, ToolFailure):
        return exc
    return ToolFailure(
        type(exc).__name__,
        _safe_str(exc),
        traceback="".join(_traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}>"


def check_serialisable(result: Any) -> Any:
    """`result` if it is JSON data, else ToolFailure(ResultNotSerialisable)."""
    try:
        dumps(result)
    except TypeError as exc:
        raise ToolFailure("ResultNotSerialisable", f"tool result is not JSON-serialisable: {exc}") from None
    return result


# --- entry point ----------------------------------------------------------------------


async def run_tool(
    kind: str,
    tool: dict[str, Any],
    args: dict[str, Any],
    *,
    timeout: float | None,
    cancel: asyncio.Event | None = None,
) -> Any:
    """Run one tool call; return its JSON-able result or raise `ToolFailure`.

    `tool` is the rendered tool mapping (``{"kind": "http", "url": ..., ...}``), `args`
    the step's rendered args, `timeout` the seconds the whole call may take (None: no
    limit), `cancel` an event that stops the call when set.
    """
    try:
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ToolFailure("ToolConfigError", f"step args must be a mapping, got {type(args).__name__}")
        if timeout is not None:
            timeout = _seconds(timeout, "timeout")
        if kind == "python":
            return await _run_python(tool, args, timeout, cancel)
        if kind == "noop":
            if cancel is not None and cancel.is_set():
                raise cancelled_failure()
            return check_serialisable(args)
        if kind == "sleep":
            return check_serialisable(await _run_sleep(tool, args, timeout, cancel))
        if kind == "shell":
            return check_serialisable(await _limited(_run_shell(tool, args), timeout, cancel))
        if kind == "http":
            t = tool.get("timeout")
            if t is not None:
                t = _seconds(t, "http timeout")
                timeout = t if timeout is None else min(t, timeout)
            return check_serialisable(await _limited(_run_http(tool, args), timeout, cancel))
        if kind == "playbook":
            raise ToolFailure("ToolConfigError", "playbook tool runs in the engine")
        raise ToolFailure("ToolConfigError", f"unknown tool kind {kind!r}")
    except ToolFailure:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise failure_from_exception(exc) from exc


# --- limits: timeout and cancel for in-loop work -------------------------------------


async def _limited(coro: Coroutine[Any, Any, T], limit: float | None, cancel: asyncio.Event | None) -> T:
    """Run `coro` as a task bounded by `limit` seconds and `cancel`.

    On expiry or cancel the task is cancelled (its cleanup kills what it started) and
    awaited, then ToolFailure(Timeout / Cancelled) is raised.
    """
    if cancel is not None and cancel.is_set():
        coro.close()
        raise cancelled_failure()
    if limit is not None and limit <= 0:
        coro.close()
        raise timeout_failure(limit)
    loop = asyncio.get_running_loop()
    task = loop.create_task(coro)
    waiters: set[asyncio.Future[Any]] = {task}
    cancel_task: asyncio.Task[Any] | None = None
    if cancel is not None:
        cancel_task = loop.create_task(cancel.wait())
        waiters.add(cancel_task)
    try:
        try:
            await asyncio.wait(waiters, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cancel_task is not None:
                cancel_task.cancel()
    except asyncio.CancelledError:
        await _stop_task(task)
        raise
    if task.done():
        return task.result()
    await _stop_task(task)
    if cancel is not None and cancel.is_set():
        raise cancelled_failure()
    raise timeout_failure(limit)


async def _stop_task(task: asyncio.Task[Any]) -> None:
    task.cancel()
    try:
        await asyncio.shield(_wait_quietly(task))
    except asyncio.CancelledError:
        # we are cancelled ourselves while cleaning up: let the cleanup finish anyway
        pass


async def _wait_quietly(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except BaseException:
        pass


def _seconds(value: Any, what: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        s = float(value)
    except (TypeError, ValueError):
        raise ToolFailure("ToolConfigError", f"{what} must be a number of seconds, got {value!r}") from None
    if math.isnan(s):
        raise ToolFailure("ToolConfigError", f"{what} must be a number of seconds, got {value!r}")
    return s


def _mapping(value: Any, what: str) -> dict[str, Any] | None:
    """A rendered field that must be a mapping (a JSON object string is accepted)."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = loads(value)
        except ValueError:
            raise ToolFailure("ToolConfigError", f"{what} must be a mapping, got the string {value[:80]!r}") from None
    if not isinstance(value, dict):
        raise ToolFailure("ToolConfigError", f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _flag(value: Any, what: str, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "yes", "on", "1"):
            return True
        if v in ("false", "no", "off", "0", "none", "null", ""):
            return False
    raise ToolFailure("ToolConfigError", f"{what} must be a boolean, got {value!r}")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value).decode()


# --- sleep ----------------------------------------------------------------------------


async def _run_sleep(
    tool: dict[str, Any], args: dict[str, Any], limit: float | None, cancel: asyncio.Event | None
) -> Any:
    raw = args["seconds"] if "seconds" in args else tool.get("seconds", 0.0)
    seconds = _seconds(raw, "sleep seconds")
    await _limited(asyncio.sleep(max(0.0, seconds)), limit, cancel)
    return {"slept": raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else seconds}


# --- python ---------------------------------------------------------------------------


async def _run_python(
    tool: dict[str, Any], args: dict[str, Any], limit: float | None, cancel: asyncio.Event | None
) -> Any:
    from actors.tools.pyrunner import default_pool

    code = tool.get("code")
    if not isinstance(code, str) or not code.strip():
        raise ToolFailure("ToolConfigError", "python tool needs `code` defining def main(**args)")
    return await default_pool().run(code, args, timeout=limit, cancel=cancel)


# --- shell ----------------------------------------------------------------------------

_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")


def _arg_env_name(name: str) -> str:
    return "ARG_" + _ENV_NAME.sub("_", str(name)).upper()


async def _run_shell(tool: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    command = tool.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolFailure("ToolConfigError", "shell tool needs a `command`")
    env = dict(os.environ)
    for k, v in args.items():
        env[_arg_env_name(k)] = "" if v is None else _text(v)
    extra = _mapping(tool.get("env"), "shell env")
    if extra:
        for k, v in extra.items():
            env[str(k)] = "" if v is None else str(v)
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
            cwd=cwd or None,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolFailure("ToolConfigError", f"cannot start shell command: {exc}") from None
    try:
        out, err = await proc.communicate()
    except BaseException:
        # timeout / cancel / anything: kill the whole process group, then reap sh
        _killpg(proc.pid)
        await asyncio.shield(_wait_quietly(proc.wait()))
        raise
    code = proc.returncode if proc.returncode is not None else -1
    stderr = err.decode("utf-8", errors="replace")
    result: dict[str, Any] = {"stdout": out.decode("utf-8", errors="replace"), "stderr": stderr, "exit_code": code}
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


# --- http -----------------------------------------------------------------------------

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


def _session() -> aiohttp.ClientSession:
    """The shared ClientSession of the running event loop (created lazily)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    s = _sessions.get(loop)
    if s is None or s.closed:
        s = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            raise_for_status=False,
        )
        _sessions[loop] = s
    return s


async def close_http() -> None:
    """Close the running loop's shared HTTP session (if any)."""
    loop = asyncio.get_running_loop()
    s = _sessions.pop(loop, None)
    if s is not None and not s.closed:
        await s.close()


def _param_value(v: Any) -> str | int | float | list[str | int | float] | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        out: list[str | int | float] = []
        for x in v:
            px = _param_value(x)
            if isinstance(px, list):
                out.append(_text(x))
            elif px is not None:
                out.append(px)
        return out
    return _text(v)


def _is_json_type(content_type: str) -> bool:
    ct = content_type.lower()
    return ct == "application/json" or ct.endswith("+json") or ct.endswith("/json")


async def _run_http(tool: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    url = tool.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ToolFailure("ToolConfigError", "http tool needs a `url`")
    method = str(tool.get("method") or "GET").upper()
    params = _mapping(tool.get("params"), "http params") or {}
    headers = {
        str(k): str(v) for k, v in (_mapping(tool.get("headers"), "http headers") or {}).items() if v is not None
    }
    raise_for_status = _flag(tool.get("raise_for_status"), "raise_for_status", True)
    json_body = tool.get("json")
    body = tool.get("body")
    if args and json_body is None and body is None:
        if method in _QUERY_METHODS:
            params = {**args, **params}
        else:
            json_body = args

    query: dict[str, Any] = {}
    for k, v in params.items():
        pv = _param_value(v)
        if pv is not None:
            query[str(k)] = pv
    data: bytes | None = None
    if json_body is not None:
        try:
            data = dumps(json_body)
        except TypeError as exc:
            raise ToolFailure("ToolConfigError", f"http json body is not JSON-serialisable: {exc}") from None
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    elif body is not None:
        data = body.encode() if isinstance(body, str) else _text(body).encode()

    try:
        async with _session().request(method, url, params=query or None, headers=headers or None, data=data) as resp:
            raw = await resp.read()
            status = resp.status
            reason = resp.reason or ""
            rheaders: dict[str, str] = {}
            for hk, hv in resp.headers.items():
                k, v = str(hk), str(hv)  # multidict's istr keys are not plain str
                rheaders[k] = f"{rheaders[k]}, {v}" if k in rheaders else v
            charset = resp.charset or "utf-8"
            content_type = resp.content_type
    except aiohttp.InvalidURL as exc:
        raise ToolFailure("ToolConfigError", f"invalid url {url!r}: {exc}") from None
    except TimeoutError:
        raise ToolFailure("Timeout", f"http {method} {url} timed out", retryable=True) from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise ToolFailure(
            "ConnectionError", f"http {method} {url}: {_safe_str(exc) or type(exc).__name__}", retryable=True
        ) from None
    except aiohttp.ClientError as exc:
        raise ToolFailure(type(exc).__name__, f"http {method} {url}: {_safe_str(exc)}") from None

    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    payload: Any = text
    if _is_json_type(content_type):
        if not raw.strip():
            payload = None
        else:
            try:
                payload = loads(raw)
            except ValueError:
                payload = text
    result = {"status": status, "headers": rheaders, "data": payload}
    if status >= 400 and raise_for_status:
        excerpt = " ".join(text.split())[:_EXCERPT]
        msg = f"HTTP {status}{' ' + reason if reason else ''} for {method} {url}" + (f": {excerpt}" if excerpt else "")
        retryable = status in _RETRYABLE_STATUS or status >= 500
        raise ToolFailure("HTTPError", msg, retryable=retryable, status=status, data=result)
    return result
