"""What runs inside a python worker process, and the frames it speaks with the pool.

A worker is a fresh interpreter (``sys.executable -c BOOT``) that imports only this
module and its few dependencies. It talks to the pool over a private socketpair (not
stdin/stdout, so whatever the user's code prints cannot corrupt the protocol). Its
stdout and stderr are one file the pool empties before each call and reads after it
(actors/tools/capture.py): a step's output, never the parent's streams; both are line
buffered here so they interleave as written. Frames are a 4-byte big-endian length and a payload:

- parent -> worker: JSON ``{"c": code, "a": args}`` (orjson, msgspec for integers beyond 64 bits),
  with ``"k"``, the step's credential (given to ``main``'s ``credential`` parameter, if
  it declares one), and ``"e"``, the step's ``env`` (set for this call only)
- worker -> parent: one status byte, then the JSON result (``OK``), the JSON error
  ``{"type", "message", "traceback"}`` (``ERR``), or the worker's pid once it is
  up (``READY``, sent once, before anything else).

A worker runs one call at a time and caches compiled code by the sha256 of its text
(LRU), so repeated calls with the same code do not recompile; the module body is run
in a fresh namespace each call, then ``main(**args)`` (an ``async def main`` is run
with `asyncio.run`). Module globals do not survive a call; imported modules do (a
worker imports a heavy library once). ``os.environ`` is put back as the worker started
(the clean environment the pool gives it) after every call, so one step's ``env``, or
what its code set, is never seen by the next. The result is encoded once, here: that is the
check that it is JSON data, and the pool passes the same text on. Workers exit by
themselves when the parent process disappears.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import linecache
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import OrderedDict
from types import CodeType, TracebackType
from typing import Any

import orjson

from actors.jsonvalues import dumps, loads

__all__ = ["BOOT", "ERR", "HDR", "OK", "READY", "RECV"]

HDR = struct.Struct("!I")
OK, ERR, READY = 0, 1, 2
RECV = 1 << 18


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(1)


def _send(sock: socket.socket, status: int, body: bytes) -> None:
    sock.sendall(HDR.pack(len(body) + 1) + bytes((status,)) + body)


def _error(type_: str, message: str, tb: str | None = None) -> tuple[int, bytes]:
    return ERR, orjson.dumps({"type": type_, "message": message, "traceback": tb})


def _str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}>"


def _user_traceback(exc: BaseException) -> str:
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:
        return f"{type(exc).__name__}: {_str(exc)}\n"


def _compile(code: str, cache: OrderedDict[str, CodeType], cache_size: int) -> CodeType:
    key = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    co = cache.get(key)
    if co is not None:
        cache.move_to_end(key)
        return co
    filename = f"<python tool {key[:12]}>"
    co = compile(code, filename, "exec")
    # lets tracebacks show the user's source lines
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    cache[key] = co
    while len(cache) > cache_size:
        _, old = cache.popitem(last=False)
        linecache.cache.pop(old.co_filename, None)
    return co


def _execute(request: bytes, cache: OrderedDict[str, CodeType], cache_size: int) -> tuple[int, bytes]:
    """One call, in the environment the worker started with plus the call's ``env``;
    that environment is restored afterwards whatever the code did to ``os.environ``."""
    try:
        msg = loads(request)
        code, args, credential, env = msg["c"], msg["a"], msg.get("k"), msg.get("e")
    except Exception as exc:
        return _error("ProtocolError", f"bad request to python worker: {_str(exc)}")
    try:
        if env:
            try:
                os.environ.update(env)
            except (ValueError, TypeError) as exc:  # a name with '=' or a NUL: the step's mistake
                return _error("ToolConfigError", f"python env: {_str(exc)}")
        return _call(code, args, credential, cache, cache_size)
    finally:
        if os.environ != _BOOT_ENV:
            os.environ.clear()
            os.environ.update(_BOOT_ENV)


def _wants_credential(main: Any) -> bool:
    try:
        return "credential" in inspect.signature(main).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): it declares nothing
        return False


def _call(
    code: str,
    args: dict[str, Any],
    credential: dict[str, str] | None,
    cache: OrderedDict[str, CodeType],
    cache_size: int,
) -> tuple[int, bytes]:
    try:
        co = _compile(code, cache, cache_size)
    except SyntaxError as exc:
        text = (exc.text or "").strip()
        where = f"line {exc.lineno}" + (f": {text}" if text else "")
        return _error("SyntaxError", f"{exc.msg} ({where})", "".join(traceback.format_exception_only(type(exc), exc)))
    except Exception as exc:
        return _error(type(exc).__name__, _str(exc), _user_traceback(exc))
    ns: dict[str, Any] = {"__name__": "__tool__", "__builtins__": builtins}
    try:
        exec(co, ns)
        main = ns.get("main")
        if not callable(main):
            return _error("ToolConfigError", "python code must define a function main(**args)")
        if credential is not None and _wants_credential(main):
            if "credential" in args:
                return _error("ToolConfigError", "the step's args name `credential`, which its credential fills")
            args = {**args, "credential": credential}
        result = main(**args)
        if hasattr(result, "__await__"):
            import asyncio as _asyncio

            async def _wait(aw: Any) -> Any:
                return await aw

            result = _asyncio.run(_wait(result))
    except BaseException as exc:
        return _error(type(exc).__name__, _str(exc), _user_traceback(exc))
    try:
        return OK, dumps(result)
    except Exception as exc:
        return _error("ResultNotSerialisable", f"main() returned a value that is not JSON-serialisable: {_str(exc)}")


# what a worker process runs: argv = [sys.path as JSON, socket fd, parent pid, cache size]
BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    f"from {__name__} import _worker_main; "
    "_worker_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))"
)


_BOOT_ENV: dict[str, str] = {}  # the environment the worker started with: every call starts from it


def _worker_main(fd: int, ppid: int, cache_size: int) -> None:
    """Entry point of a worker process: serve requests until the socket closes."""
    _BOOT_ENV.update(os.environ)
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)  # the user's subprocesses must not hold our channel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True, name="parent-watch").start()
    sock.setblocking(True)
    for stream in (sys.stdout, sys.stderr):  # a file, not a terminal: keep prints in order
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    cache: OrderedDict[str, CodeType] = OrderedDict()
    buf = bytearray()
    try:
        _send(sock, READY, str(os.getpid()).encode())
        while True:
            while len(buf) < 4 or len(buf) < 4 + HDR.unpack_from(buf)[0]:
                chunk = sock.recv(RECV)
                if not chunk:
                    return  # the pool closed our socket: exit quietly
                buf += chunk
            n = HDR.unpack_from(buf)[0]
            request = bytes(buf[4 : 4 + n])
            del buf[: 4 + n]
            status, body = _execute(request, cache, cache_size)
            for stream in (sys.stdout, sys.stderr):
                try:
                    if stream is not None:
                        stream.flush()
                except Exception:
                    pass
            _send(sock, status, body)
    except OSError:
        return
