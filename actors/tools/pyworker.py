"""What runs inside a python worker process, and the frames it speaks with the pool.

A worker is a fresh interpreter (``sys.executable -c BOOT``) that imports only this
module and its few dependencies. It talks to the pool over a private socketpair (not
stdin/stdout, so whatever the user's code prints cannot corrupt the protocol). Its
stdout and stderr are one file (actors/tools/capture.py) that the worker reads and
empties after each call and sends with the reply: a step's output, never the parent's
streams; both are line buffered here so they interleave as written. Frames are a 4-byte
big-endian length and a payload:

- parent -> worker: one kind byte, then for ``REQ`` the JSON ``{"c": code, "a": args,
  "o": bytes of output to keep}`` (orjson, msgspec for integers beyond 64 bits), with
  ``"k"``, the step's credential (given to ``main``'s ``credential`` parameter, if it
  declares one), ``"e"``, the step's ``env`` (set for this call only), and ``"f"``, the
  name to compile the code under (its playbook's file; the code is padded to its lines); for
  ``SKIP`` the sequence number (``SEQ``, counted from 0 per worker) of a request not to run.
- worker -> parent: one status byte, then for ``OK`` and ``ERR`` the output header
  (``OUT``: bytes printed, kept, tail; microseconds the call took), the kept output and
  its tail, and the JSON result (``OK``) or the JSON error ``{"type", "message",
  "traceback"}`` (``ERR``); ``SKIPPED`` for a request it was told to skip; the worker's
  pid once it is up (``READY``, sent once, before anything else).

The pool may send several requests before the first reply (see actors/tools/pypool.py):
they are run one at a time, in order, and answered in order. Before starting each one
the worker reads every frame already sent, so a ``SKIP`` that arrived while the previous
call ran is seen in time and the request is answered ``SKIPPED`` without running.

A worker caches compiled code by its text (LRU, up to `cache_size` snippets), so repeated calls with
the same code do not recompile; the module body is run in a fresh namespace each call,
then ``main(**args)`` (an ``async def main`` is run with `asyncio.run`). Module globals
do not survive a call; imported modules do (a worker imports a heavy library once).
``os.environ`` is put back as the worker started (the clean environment the pool gives
it) after every call, and so is the C environment subprocesses inherit (``os.putenv`` and
C code change it without ``os.environ`` knowing), so one step's ``env``, or what its code
set, is never seen by the next. The result is encoded once, here: that is the check that it is JSON data, and the pool
passes the same text on. Workers exit by themselves when the parent process disappears.
A worker makes itself undumpable before anything else: ``exec`` made it dumpable again.
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
from collections import OrderedDict, deque
from types import CodeType, TracebackType
from typing import Any

import orjson

from actors.runtime.children import make_undumpable
from actors.tools.capture import read_capture
from actors.wire.jsonvalues import dumps, loads

__all__ = ["BOOT", "ERR", "HDR", "OK", "OUT", "READY", "RECV", "REQ", "SEQ", "SKIP", "SKIPPED"]

HDR = struct.Struct("!I")
OK, ERR, READY, SKIPPED = 0, 1, 2, 3  # worker -> parent: the status byte
REQ, SKIP = 0, 1  # parent -> worker: the kind byte
SEQ = struct.Struct("!Q")  # a SKIP's request number
OUT = struct.Struct("!QIII")  # bytes printed, kept, tail; microseconds the call took
RECV = 1 << 18


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(1)


def _send(sock: socket.socket, status: int, body: bytes) -> None:
    sock.sendall(HDR.pack(len(body) + 1) + bytes((status,)) + body)


def _reply(sock: socket.socket, status: int, body: bytes, cap: int, micros: int) -> None:
    """The answer to one call, with what it printed (read from our stdout/stderr file,
    which is then emptied for the next call)."""
    kept = tail = b""
    size = 0
    try:
        size = os.fstat(1).st_size
        if size:
            got = read_capture(1, cap)
            kept, tail = got.kept, (b"" if got.size <= cap else got.tail)
            os.ftruncate(1, 0)
    except OSError:  # the code closed or replaced fd 1: nothing to report
        size = 0
    head = OUT.pack(size, len(kept), len(tail), min(micros, 0xFFFFFFFF))
    sock.sendall(
        b"".join(
            (HDR.pack(1 + len(head) + len(kept) + len(tail) + len(body)), bytes((status,)), head, kept, tail, body)
        )
    )


def _error(type_: str, message: str, tb: str | None = None) -> tuple[int, bytes]:
    return ERR, orjson.dumps({"type": type_, "message": message, "traceback": tb})


def _str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}>"


# a code's linecache key -> the name its traceback shows (the playbook's file): each
# code has a key of its own, so two playbooks named alike (or two versions of one) never
# show each other's lines
_SHOWN: dict[str, str] = {}


def _user_traceback(exc: BaseException) -> str:
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        # the frames' lines are read (under each code's own key) as it is made
        te = traceback.TracebackException(type(exc), exc, tb)
        for t in (te, *_chained(te)):
            for frame in t.stack:
                frame.filename = _SHOWN.get(frame.filename, frame.filename)
            if getattr(t, "filename", None) is not None:  # a SyntaxError raised by the user's code
                t.filename = _SHOWN.get(t.filename, t.filename)
        return "".join(te.format())
    except Exception:
        return f"{type(exc).__name__}: {_str(exc)}\n"


def _chained(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    """The exceptions `te` was raised from or during (each once)."""
    out: list[traceback.TracebackException] = []
    todo = [te]
    while todo:
        t = todo.pop()
        for nxt in (t.__cause__, t.__context__):
            if nxt is not None and all(nxt is not o for o in out):
                out.append(nxt)
                todo.append(nxt)
    return out


def _compile(code: str, cache: OrderedDict[Any, CodeType], cache_size: int, name: str | None = None) -> CodeType:
    # keyed by the text itself: a dict lookup, not a sha256 of it on every call (the
    # cache is bounded by `cache_size` snippets either way); with the name it is
    # compiled under when it has one (the playbook's file: the same code in two files
    # names each its own)
    ckey: Any = code if name is None else (name, code)
    co = cache.get(ckey)
    if co is not None:
        cache.move_to_end(ckey)
        return co
    key = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    # the linecache key is the code's own (its name and a hash of it); a traceback shows
    # the name (`_user_traceback`). A step's code is padded to its lines in the file, so
    # its own entry numbers lines as the file does
    filename = f"<python tool {key[:12]}>" if name is None else f"{name} <{key[:16]}>"
    try:
        co = compile(code, filename, "exec")
    except SyntaxError as exc:
        if name is not None and exc.filename == filename:
            exc.filename = name
        raise
    # lets tracebacks show the user's source lines (mtime None: never checked against
    # a file of that name on this machine)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    if name is not None:
        _SHOWN[filename] = name
    cache[ckey] = co
    while len(cache) > cache_size:
        _, old = cache.popitem(last=False)
        if not any(c.co_filename == old.co_filename for c in cache.values()):
            linecache.cache.pop(old.co_filename, None)
            _SHOWN.pop(old.co_filename, None)
    return co


def _execute(msg: Any, cache: OrderedDict[Any, CodeType], cache_size: int) -> tuple[int, bytes]:
    """One call, in the environment the worker started with plus the call's ``env``;
    that environment is restored afterwards whatever the code did to ``os.environ``."""
    try:
        code, args, credential, env, name = msg["c"], msg["a"], msg.get("k"), msg.get("e"), msg.get("f")
    except Exception as exc:
        return _error("ProtocolError", f"bad request to python worker: {_str(exc)}")
    try:
        if env:
            try:
                os.environ.update(env)
            except (ValueError, TypeError) as exc:  # a name with '=' or a NUL: the step's mistake
                return _error("ToolConfigError", f"python env: {_str(exc)}")
        return _call(code, args, credential, cache, cache_size, name if isinstance(name, str) else None)
    finally:
        if _environ_changed():
            os.environ.clear()
            os.environ.update(_BOOT_ENV)
        _restore_c_environ()


def _environ_changed() -> bool:
    """`os.environ` differs from the worker's boot environment. Compared as the bytes
    mapping under it when there is one (`os._Environ._data`, a plain dict: a C-speed
    comparison), not through the mapping's `__eq__`, which decodes every name and value
    (4.5 us a call with 3 variables, most of what a worker spent on a quick call's env)."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict) and _BOOT_ENV_DATA:
        return bool(data != _BOOT_ENV_DATA)
    return os.environ != _BOOT_ENV


def _c_environ() -> dict[bytes, bytes] | None:
    """The process's C environment (libc's ``environ``), which subprocesses inherit: not
    ``os.environ``, which ``os.putenv``, ``os.unsetenv`` and C extensions change behind its
    back. None where libc's ``environ`` cannot be read (not Linux)."""
    if _ENVIRON is None:
        return None
    env: dict[bytes, bytes] = {}
    i = 0
    while True:
        entry = _ENVIRON[i]
        if entry is None:
            return env
        name, _, value = entry.partition(b"=")
        env.setdefault(name, value)  # the first of a duplicated name is the one getenv finds
        i += 1


def _restore_c_environ() -> None:
    """Put the C environment back as the worker started: drop every name a call added
    (``os.putenv``, ctypes ``setenv``) and reset every one it changed or removed, so the
    next step's subprocesses never inherit what this step set."""
    now = _c_environ()
    if now is None or now == _BOOT_C_ENV:
        return
    for name in now.keys() - _BOOT_C_ENV.keys():
        try:
            os.unsetenv(name)
        except (OSError, ValueError):  # a name libc holds but cannot unset (no name, '=' in it): leave it
            pass
    for name, value in _BOOT_C_ENV.items():
        if now.get(name) != value:
            os.putenv(name, value)


def _libc_environ() -> Any:
    try:
        import ctypes

        return ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return None


def _wants_credential(main: Any) -> bool:
    try:
        return "credential" in inspect.signature(main).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): it declares nothing
        return False


def _call(
    code: str,
    args: dict[str, Any],
    credential: dict[str, str] | None,
    cache: OrderedDict[Any, CodeType],
    cache_size: int,
    name: str | None = None,
) -> tuple[int, bytes]:
    try:
        co = _compile(code, cache, cache_size, name)
    except SyntaxError as exc:
        text = (exc.text or "").strip()
        where = (f"{name}, " if name is not None else "") + f"line {exc.lineno}" + (f": {text}" if text else "")
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
_BOOT_ENV_DATA: dict[Any, Any] = {}  # the same, as `os.environ` holds it underneath (`_environ_changed`)
_BOOT_C_ENV: dict[bytes, bytes] = {}  # the same, as libc holds it (what subprocesses inherit)
_ENVIRON: Any = None  # libc's `environ` array, when it can be read


def _worker_main(fd: int, ppid: int, cache_size: int) -> None:
    """Entry point of a worker process: serve requests until the socket closes."""
    # first: what one step leaves in this process's memory (its credential, its values)
    # is not for another step of the same user to read through /proc (actors/runtime/children.py)
    make_undumpable()
    _BOOT_ENV.update(os.environ)
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        _BOOT_ENV_DATA.update(data)
    global _ENVIRON
    _ENVIRON = _libc_environ()
    _BOOT_C_ENV.update(_c_environ() or {})
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)  # the user's subprocesses must not hold our channel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True, name="parent-watch").start()
    sock.setblocking(True)
    for stream in (sys.stdout, sys.stderr):  # a file, not a terminal: keep prints in order
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    cache: OrderedDict[Any, CodeType] = OrderedDict()
    inbox = _Inbox()
    try:
        _send(sock, READY, str(os.getpid()).encode())
        while True:
            if not inbox.requests:
                if not inbox.receive(sock, wait=True):
                    return  # the pool closed our socket: exit quietly
                continue
            inbox.receive(sock, wait=False)  # a SKIP sent while the last call ran
            seq, request = inbox.requests.popleft()
            if inbox.skip:
                if seq in inbox.skip:
                    inbox.skip.discard(seq)
                    _send(sock, SKIPPED, b"")
                    continue
                inbox.skip = {n for n in inbox.skip if n > seq}  # skips that came too late
            started = time.perf_counter()
            cap = 0
            try:
                msg = loads(request)
                cap = int(msg.get("o", 0))
            except Exception as exc:
                status, body = _error("ProtocolError", f"bad request to python worker: {_str(exc)}")
            else:
                status, body = _execute(msg, cache, cache_size)
            for stream in (sys.stdout, sys.stderr):
                try:
                    if stream is not None:
                        stream.flush()
                except Exception:
                    pass
            _reply(sock, status, body, cap, int((time.perf_counter() - started) * 1e6))
    except OSError:
        return


class _Inbox:
    """Frames read from the pool: requests to run, in order, numbered; requests to skip."""

    __slots__ = ("buf", "next_seq", "requests", "skip")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.requests: deque[tuple[int, bytes]] = deque()
        self.skip: set[int] = set()
        self.next_seq = 0

    def receive(self, sock: socket.socket, *, wait: bool) -> bool:
        """Read what the pool sent (blocking until a whole request came when `wait`,
        else only what is already there); False once the socket is closed."""
        while True:
            try:
                chunk = sock.recv(RECV) if wait else sock.recv(RECV, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            if not chunk:
                return False
            self.buf += chunk
            self._parse()
            if not wait and len(chunk) < RECV:
                return True
            if wait and self.requests:
                return True

    def _parse(self) -> None:
        buf = self.buf
        while len(buf) >= 4:
            n = HDR.unpack_from(buf)[0]
            if len(buf) < 4 + n:
                return
            kind = buf[4]
            if kind == SKIP:
                self.skip.add(SEQ.unpack_from(buf, 5)[0])
            else:
                self.requests.append((self.next_seq, bytes(buf[5 : 4 + n])))
                self.next_seq += 1
            del buf[: 4 + n]
