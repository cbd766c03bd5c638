"""Tool executors (actors/tools/executors.py, actors/tools/kinds/) and the python worker pool
(actors/tools/pypool.py and its worker): results, failures as ToolFailure, real kills on timeout and
cancel, no zombies. No NATS here."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from actors.tools import executors
from actors.tools.cpus import available_cpus
from actors.tools.failures import CancelSignal, ToolFailure
from actors.tools.pypool import PythonPool
from actors.tools.resources import ToolResources
from actors.wire.jsonvalues import loads
from tests.conftest import wait_for

pytestmark = [pytest.mark.timeout(30)]


# --- helpers --------------------------------------------------------------------------


_current: ToolResources | None = None  # the running test's, for the helpers below


@pytest_asyncio.fixture
async def resources() -> AsyncIterator[ToolResources]:
    """The pool and session of this test's tool calls, closed after it (its workers reaped)."""
    global _current
    _current = res = ToolResources()
    try:
        yield res
    finally:
        _current = None
        await res.close()


async def run_tool(kind: str, tool: dict[str, Any], args: Any, **kw: Any) -> Any:
    """The executor, with the test's resources; its result (JSON text) decoded."""
    assert _current is not None, "the test needs the `resources` fixture"
    return loads(await executors.run_tool(kind, tool, args, resources=_current, **kw))


async def py(code: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
    kw.setdefault("timeout", 10.0)
    return await run_tool("python", {"kind": "python", "code": code}, args or {}, **kw)


async def failure(coro: Any) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        await coro
    return info.value


def gone(pid: int, within: float = 5.0) -> bool:
    """True once `pid` has exited (a zombie counts as exited): waits on a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], within)
        return bool(readable)
    finally:
        os.close(fd)


def _proc_exists(pid: int) -> bool:
    """A process (a zombie too) has an entry in /proc until it is reaped."""
    return os.path.exists(f"/proc/{pid}")


def reaped(pid: int) -> bool:
    """Our child `pid` is fully gone: not running and not a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not (or no longer) our child: already reaped
    else:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def accept_one(server: socket.socket) -> None:
    """Wait (without polling) until a tool's code connects to `server`."""
    conn, _ = await asyncio.get_running_loop().sock_accept(server)
    conn.close()


def listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.setblocking(False)
    return s, s.getsockname()[1]


# --- noop, sleep, unknown -------------------------------------------------------------


@pytest.mark.asyncio
async def test_noop_returns_args(resources: ToolResources) -> None:
    args = {"a": 1, "b": [1, 2], "c": {"d": None}}
    assert await run_tool("noop", {"kind": "noop"}, args, timeout=None) == args


@pytest.mark.asyncio
async def test_noop_non_serialisable_args(resources: ToolResources) -> None:
    f = await failure(run_tool("noop", {}, {"s": {1, 2}}, timeout=None))
    assert f.type == "ResultNotSerialisable"


@pytest.mark.asyncio
async def test_unknown_and_playbook_kinds(resources: ToolResources) -> None:
    f = await failure(run_tool("ftp", {"kind": "ftp"}, {}, timeout=1))
    assert f.type == "ToolConfigError" and not f.retryable
    f = await failure(run_tool("playbook", {"kind": "playbook", "path": "x"}, {}, timeout=1))
    assert f.type == "ToolConfigError"
    assert f.message == "playbook tool runs in the engine"
    assert set(f.to_error()) == {"type", "message", "retryable", "status", "traceback"}


@pytest.mark.asyncio
async def test_sleep_tool(resources: ToolResources) -> None:
    assert await run_tool("sleep", {"kind": "sleep", "seconds": 0.01}, {}, timeout=5) == {"slept": 0.01}
    # args win over the tool field
    assert await run_tool("sleep", {"kind": "sleep", "seconds": 10}, {"seconds": 0.02}, timeout=5) == {"slept": 0.02}
    assert await run_tool("sleep", {"kind": "sleep", "seconds": "0.01"}, {}, timeout=5) == {"slept": 0.01}


@pytest.mark.asyncio
async def test_sleep_timeout_and_cancel(resources: ToolResources) -> None:
    f = await failure(run_tool("sleep", {"seconds": 30}, {}, timeout=0.1))
    assert f.type == "Timeout" and f.retryable  # a 30 s sleep ended by its 0.1 s timeout
    cancel = asyncio.Event()
    task = asyncio.create_task(run_tool("sleep", {"seconds": 30}, {}, timeout=None, cancel=cancel))
    await asyncio.sleep(0)  # let it start
    cancel.set()
    f = await failure(task)
    assert f.type == "Cancelled" and not f.retryable


@pytest.mark.asyncio
async def test_bad_field_is_tool_failure(resources: ToolResources) -> None:
    f = await failure(run_tool("sleep", {"seconds": "soon"}, {}, timeout=1))
    assert f.type == "ToolConfigError"


# --- python ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_python_returns_value(resources: ToolResources) -> None:
    code = "import math\ndef main(x, y=2):\n    return {'sum': x + y, 'sqrt': math.sqrt(x), 'list': (1, 2)}\n"
    assert await py(code, {"x": 16}) == {"sum": 18, "sqrt": 4.0, "list": [1, 2]}
    # the same code again (cached compile), other args
    assert await py(code, {"x": 4, "y": 0}) == {"sum": 4, "sqrt": 2.0, "list": [1, 2]}


@pytest.mark.asyncio
async def test_python_fresh_namespace_each_call(resources: ToolResources) -> None:
    code = "count = 0\ndef main():\n    global count\n    count += 1\n    return count\n"
    assert [await py(code) for _ in range(3)] == [1, 1, 1]


@pytest.mark.asyncio
async def test_python_async_main(resources: ToolResources) -> None:
    code = "import asyncio\nasync def main(n):\n    await asyncio.sleep(0)\n    return n * 2\n"
    assert await py(code, {"n": 21}) == 42


@pytest.mark.asyncio
async def test_python_exception(resources: ToolResources) -> None:
    code = "def helper(v):\n    raise ValueError(f'bad value {v}')\n\ndef main(v):\n    return helper(v)\n"
    f = await failure(py(code, {"v": 7}))
    assert f.type == "ValueError"
    assert f.message == "bad value 7"
    assert not f.retryable and f.status is None
    assert f.traceback is not None
    assert "Traceback (most recent call last)" in f.traceback
    assert "raise ValueError(f'bad value {v}')" in f.traceback  # the user's source line
    assert "line 2, in helper" in f.traceback
    assert "ValueError: bad value 7" in f.traceback
    assert "pyworker" not in f.traceback  # the worker's own frames are trimmed
    assert f.to_error()["traceback"] == f.traceback


@pytest.mark.asyncio
async def test_python_system_exit_is_a_failure_not_a_crash(resources: ToolResources) -> None:
    f = await failure(py("import sys\ndef main():\n    sys.exit(3)\n"))
    assert f.type == "SystemExit" and f.message == "3"
    assert await py("def main():\n    return 'alive'\n") == "alive"


@pytest.mark.asyncio
async def test_python_missing_main(resources: ToolResources) -> None:
    f = await failure(py("x = 1\n"))
    assert f.type == "ToolConfigError"
    f = await failure(py("main = 3\n"))
    assert f.type == "ToolConfigError"
    f = await failure(run_tool("python", {"kind": "python"}, {}, timeout=5))
    assert f.type == "ToolConfigError"


@pytest.mark.asyncio
async def test_python_syntax_error(resources: ToolResources) -> None:
    f = await failure(py("def main():\n    return (1 +\n\nx = = 2\n"))
    assert f.type == "SyntaxError"
    assert "line 2" in f.message or "line 4" in f.message
    f = await failure(py("def main():\n    return 1\nx = = 2\n"))
    assert f.type == "SyntaxError"
    assert "line 3" in f.message and "x = = 2" in f.message


@pytest.mark.asyncio
async def test_python_error_at_import_time(resources: ToolResources) -> None:
    f = await failure(py("import no_such_module_xyz\ndef main():\n    return 1\n"))
    assert f.type == "ModuleNotFoundError"


@pytest.mark.asyncio
async def test_python_bad_args(resources: ToolResources) -> None:
    f = await failure(py("def main(a):\n    return a\n", {"b": 1}))
    assert f.type == "TypeError"
    f = await failure(py("def main(**a):\n    return 1\n", {"s": {1, 2}}))
    assert f.type == "ArgsNotSerialisable"


@pytest.mark.asyncio
async def test_python_non_serialisable_result(resources: ToolResources) -> None:
    f = await failure(py("def main():\n    return {1, 2, 3}\n"))
    assert f.type == "ResultNotSerialisable"
    f = await failure(py("def main():\n    return object()\n"))
    assert f.type == "ResultNotSerialisable"
    assert await py("def main():\n    return 'fine'\n") == "fine"


@pytest.mark.asyncio
async def test_python_prints_do_not_corrupt_the_channel(resources: ToolResources) -> None:
    code = (
        "import sys, os\n"
        "def main():\n"
        "    print('x' * 100000)\n"
        "    sys.stderr.write('noise\\n')\n"
        "    os.write(1, b'\\x00\\x00\\x00\\x05hello')\n"
        "    return 'ok'\n"
    )
    assert await py(code) == "ok"
    assert await py(code) == "ok"


@pytest.mark.asyncio
async def test_python_big_args_and_result(resources: ToolResources) -> None:
    blob = "y" * 3_000_000
    assert await py("def main(s):\n    return s + s\n", {"s": blob}) == blob + blob


@pytest.mark.asyncio
async def test_python_infinite_loop_timeout_kills_worker(resources: ToolResources) -> None:
    pool = resources.python_pool()
    await pool.start()
    before = set(pool.pids())
    t0 = time.monotonic()
    f = await failure(py("def main():\n    while True:\n        pass\n", timeout=0.5))
    elapsed = time.monotonic() - t0
    assert f.type == "Timeout" and f.retryable
    assert elapsed > 0.4  # killed at its timeout, not before (that it returned at all: the loop never ends)
    killed = before - set(pool.pids())
    assert len(killed) == 1
    assert all(reaped(pid) for pid in killed)
    # the pool still works, with a replacement worker
    assert await py("def main():\n    return 5\n") == 5
    assert len(pool.pids()) == pool.size


@pytest.mark.asyncio
async def test_python_timeout_kills_the_workers_subprocesses(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, time\n"
        "def main(path):\n"
        "    p = subprocess.Popen(['sleep', '30'])\n"
        "    open(path, 'w').write(str(p.pid))\n"
        "    time.sleep(30)\n"
    )
    pool = PythonPool(size=1)
    try:
        f = await failure(pool.run(code, {"path": str(pidfile)}, timeout=1.0))
        assert f.type == "Timeout"
        assert gone(int(pidfile.read_text()))
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_python_worker_crash_is_reported_and_replaced() -> None:
    pool = PythonPool(size=1)
    try:
        assert await pool.run("def main():\n    return 1\n", {}, timeout=10) == 1
        (pid,) = pool.pids()
        f = await failure(pool.run("import os\ndef main():\n    os._exit(1)\n", {}, timeout=10))
        assert f.type == "WorkerCrashed"
        assert "exit code 1" in f.message
        assert reaped(pid)
        f = await failure(
            pool.run("import os, signal\ndef main():\n    os.kill(os.getpid(), signal.SIGSEGV)\n", {}, timeout=10)
        )
        assert f.type == "WorkerCrashed" and "SIGSEGV" in f.message
        assert await pool.run("def main(a):\n    return a\n", {"a": [1]}, timeout=10) == [1]
        assert pid not in pool.pids()
    finally:
        await pool.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("signal_type", [asyncio.Event, CancelSignal])
async def test_python_cancel_stops_a_running_call(resources: ToolResources, signal_type: type[asyncio.Event]) -> None:
    server, port = listener()
    code = (
        "import socket, time\n"
        "def main(port):\n"
        "    socket.create_connection(('127.0.0.1', port)).close()\n"
        "    time.sleep(30)\n"
    )
    cancel = signal_type()
    try:
        task = asyncio.create_task(py(code, {"port": port}, timeout=None, cancel=cancel))
        await asyncio.wait_for(accept_one(server), 10)  # the code is running now
        pids = set(resources.python_pool().pids())
        cancel.set()
        f = await failure(task)
        assert f.type == "Cancelled" and not f.retryable
        assert all(reaped(pid) for pid in pids - set(resources.python_pool().pids()))
        assert await py("def main():\n    return 'next'\n") == "next"
        # already set: refused at once
        f = await failure(py("def main():\n    return 1\n", cancel=cancel))
        assert f.type == "Cancelled"
    finally:
        server.close()


@pytest.mark.asyncio
async def test_python_caller_task_cancelled_kills_the_worker() -> None:
    server, port = listener()
    pool = PythonPool(size=1)
    code = (
        "import socket, time\ndef main(port):\n"
        "    socket.create_connection(('127.0.0.1', port)).close()\n    time.sleep(30)\n"
    )
    try:
        task = asyncio.create_task(pool.run(code, {"port": port}, timeout=None))
        await asyncio.wait_for(accept_one(server), 10)
        (pid,) = pool.pids()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gone(pid)
        assert await pool.run("def main():\n    return 2\n", {}, timeout=10) == 2
    finally:
        server.close()
        await pool.close()


@pytest.mark.asyncio
async def test_python_calls_run_in_parallel() -> None:
    """Each call connects and waits until the test has accepted both connections:
    possible only while both run at once, one per worker."""
    server, port = listener()
    pool = PythonPool(size=2)
    code = (
        "import socket\ndef main(port):\n    c = socket.create_connection(('127.0.0.1', port))\n"
        "    c.recv(1)\n    return 1\n"
    )
    try:
        calls = asyncio.gather(pool.run(code, {"port": port}, timeout=20), pool.run(code, {"port": port}, timeout=20))
        loop = asyncio.get_running_loop()
        both = [(await asyncio.wait_for(loop.sock_accept(server), 10))[0] for _ in range(2)]
        for conn in both:
            conn.close()  # only now may either call return
        assert await calls == [1, 1]
    finally:
        server.close()
        await pool.close()


@pytest.mark.asyncio
async def test_python_waiting_for_a_free_worker_counts_against_timeout() -> None:
    server, port = listener()
    pool = PythonPool(size=1)
    code = (
        "import socket, time\ndef main(port):\n"
        "    socket.create_connection(('127.0.0.1', port)).close()\n    time.sleep(30)\n"
    )
    try:
        busy = asyncio.create_task(pool.run(code, {"port": port}, timeout=None))
        await asyncio.wait_for(accept_one(server), 10)
        f = await failure(pool.run("def main():\n    return 1\n", {}, timeout=0.2))
        assert f.type == "Timeout"
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        assert await pool.run("def main():\n    return 1\n", {}, timeout=10) == 1
    finally:
        server.close()
        await pool.close()


@pytest.mark.asyncio
async def test_python_cancel_while_waiting_for_a_free_worker() -> None:
    server, port = listener()
    pool = PythonPool(size=1)
    code = (
        "import socket, time\ndef main(port):\n"
        "    socket.create_connection(('127.0.0.1', port)).close()\n    time.sleep(30)\n"
    )
    try:
        busy = asyncio.create_task(pool.run(code, {"port": port}, timeout=None))
        await asyncio.wait_for(accept_one(server), 10)
        cancel = CancelSignal()
        waiting = asyncio.create_task(pool.run("def main():\n    return 1\n", {}, timeout=None, cancel=cancel))
        await asyncio.sleep(0.05)
        cancel.set()
        f = await failure(waiting)
        assert f.type == "Cancelled"
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        assert await pool.run("def main():\n    return 1\n", {}, timeout=10) == 1  # no stale waiter left
    finally:
        server.close()
        await pool.close()


@pytest.mark.asyncio
async def test_python_worker_dying_while_idle_is_replaced() -> None:
    pool = PythonPool(size=1)
    try:
        assert await pool.run("def main():\n    return 1\n", {}, timeout=10) == 1
        [pid] = pool.pids()
        os.kill(pid, signal.SIGKILL)  # idle: no call is waiting on it

        async def replaced() -> bool:  # its pidfd tells the pool at once, which replaces it
            return pid not in pool.pids()

        await wait_for(replaced)

        async def gone() -> bool:  # reaped by the pool: no zombie left (its socket may close first)
            return not _proc_exists(pid)

        await wait_for(gone)
        assert await pool.run("def main():\n    return 2\n", {}, timeout=10) == 2
        assert len(pool.pids()) == 1 and pid not in pool.pids()
    finally:
        await pool.close()


def test_pool_size_follows_the_cpus_this_process_may_use() -> None:
    n = available_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    assert PythonPool().size == n


def test_python_workers_sizes_the_actors_pool() -> None:
    """`ToolActor(python_workers=...)` (from ACTORS_PYTHON_WORKERS) sizes the pool it owns."""
    from nats.aio.client import Client

    from actors.tools.actor import ToolActor
    from streams.layout import Layout

    assert ToolActor(Client(), layout=Layout(), python_workers=3).resources.python_pool().size == 3
    assert ToolActor(Client(), layout=Layout()).resources.python_pool().size == available_cpus()


@pytest.mark.asyncio
async def test_python_pool_close_leaves_no_zombies() -> None:
    pool = PythonPool(size=2)
    await pool.start()
    pids = pool.pids()
    assert len(pids) == 2
    await pool.close()
    assert pool.pids() == []
    assert all(reaped(pid) for pid in pids)
    f = await failure(pool.run("def main():\n    return 1\n", {}, timeout=1))
    assert f.type == "Cancelled"


@pytest.mark.asyncio
async def test_python_pool_close_stops_a_running_call() -> None:
    server, port = listener()
    pool = PythonPool(size=1)
    code = (
        "import socket, time\ndef main(port):\n"
        "    socket.create_connection(('127.0.0.1', port)).close()\n    time.sleep(30)\n"
    )
    try:
        task = asyncio.create_task(pool.run(code, {"port": port}, timeout=None))
        await asyncio.wait_for(accept_one(server), 10)
        (pid,) = pool.pids()
        await pool.close()
        f = await failure(task)
        assert f.type == "Cancelled"
        assert reaped(pid)
    finally:
        server.close()


@pytest.mark.asyncio
async def test_resources_close_leaves_no_zombies(resources: ToolResources) -> None:
    assert await py("def main():\n    return 1\n") == 1
    pids = resources.python_pool().pids()
    assert pids
    await resources.close()
    assert all(reaped(pid) for pid in pids)


# --- shell ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_shell_success(resources: ToolResources) -> None:
    r = await run_tool("shell", {"kind": "shell", "command": "echo hello; echo warn >&2"}, {}, timeout=10)
    assert r == {"stdout": "hello\n", "stderr": "warn\n", "exit_code": 0}


@pytest.mark.asyncio
async def test_shell_non_zero_exit(resources: ToolResources) -> None:
    f = await failure(run_tool("shell", {"command": "echo out; echo 'it broke' >&2; exit 3"}, {}, timeout=10))
    assert f.type == "ShellError" and not f.retryable
    assert "3" in f.message and "it broke" in f.message
    assert f.data == {"stdout": "out\n", "stderr": "it broke\n", "exit_code": 3}


@pytest.mark.asyncio
async def test_shell_env_args_and_cwd(tmp_path: Path, resources: ToolResources) -> None:
    tool = {
        "command": 'printf "%s|%s|%s|%s|%s" "$GREETING" "$NUM" "$ARG_NAME" "$ARG_ITEMS" "$(pwd)"',
        "env": {"GREETING": "hi", "NUM": 5},
        "cwd": str(tmp_path),
    }
    r = await run_tool("shell", tool, {"name": "bob", "items": [1, 2]}, timeout=10)
    assert r["stdout"] == f"hi|5|bob|[1,2]|{tmp_path}"
    # PATH is kept from the pod's environment (actors/tools/environment.py)
    r = await run_tool("shell", {"command": 'printf "%s" "$PATH"'}, {}, timeout=10)
    assert r["stdout"] == os.environ["PATH"]


@pytest.mark.asyncio
async def test_shell_timeout_kills_the_process_group(tmp_path: Path, resources: ToolResources) -> None:
    pidfile = tmp_path / "sleep.pid"
    f = await failure(run_tool("shell", {"command": f"sleep 30 & echo $! > {pidfile}; wait"}, {}, timeout=0.5))
    assert f.type == "Timeout" and f.retryable
    assert gone(int(pidfile.read_text()))  # the background child died with its group


@pytest.mark.asyncio
async def test_shell_cancel(tmp_path: Path, resources: ToolResources) -> None:
    server, port = listener()
    cancel = asyncio.Event()
    pidfile = tmp_path / "sh.pid"
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port})).close()"
    cmd = f'echo $$ > {pidfile}; {sys.executable} -c "{connect}"; sleep 30'
    try:
        task = asyncio.create_task(run_tool("shell", {"command": cmd}, {}, timeout=None, cancel=cancel))
        await asyncio.wait_for(accept_one(server), 10)
        cancel.set()
        f = await failure(task)
        assert f.type == "Cancelled"
        assert gone(int(pidfile.read_text()))
    finally:
        server.close()


@pytest.mark.asyncio
async def test_shell_bad_cwd(resources: ToolResources) -> None:
    f = await failure(run_tool("shell", {"command": "true", "cwd": "/no/such/dir"}, {}, timeout=5))
    assert f.type == "ToolConfigError"


# --- http -----------------------------------------------------------------------------


class HttpServer:
    def __init__(self) -> None:
        self.base = ""
        self.arrived = asyncio.Event()  # a /slow request reached the handler
        self.disconnected = asyncio.Event()  # a /slow request was dropped by the client


@pytest_asyncio.fixture
async def http_server(resources: ToolResources) -> AsyncIterator[HttpServer]:
    srv = HttpServer()

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "query": dict(request.query),
                "json": await request.json() if body else None,
                "header": request.headers.get("X-Test"),
            }
        )

    async def status(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"status {code} body")

    async def text(request: web.Request) -> web.Response:
        return web.Response(text="plain text", headers={"X-Reply": "yes"})

    async def slow(request: web.Request) -> web.Response:
        srv.arrived.set()
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            srv.disconnected.set()
            raise
        return web.Response(text="late")

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/text", text)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    srv.base = f"http://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        await resources.close()
        await runner.cleanup()


async def http(tool: dict[str, Any], args: dict[str, Any] | None = None, limit: float | None = 10) -> Any:
    return await run_tool("http", {"kind": "http", **tool}, args or {}, timeout=limit)


@pytest.mark.asyncio
async def test_http_json_200(http_server: HttpServer) -> None:
    r = await http({"url": f"{http_server.base}/echo", "params": {"a": 1, "b": True}, "headers": {"X-Test": "t"}})
    assert r["status"] == 200
    assert r["headers"]["Content-Type"].startswith("application/json")
    assert r["data"] == {"method": "GET", "query": {"a": "1", "b": "true"}, "json": None, "header": "t"}


@pytest.mark.asyncio
async def test_http_text_response(http_server: HttpServer) -> None:
    r = await http({"url": f"{http_server.base}/text"})
    assert r["status"] == 200 and r["data"] == "plain text" and r["headers"]["X-Reply"] == "yes"


@pytest.mark.asyncio
async def test_http_json_body_and_args(http_server: HttpServer) -> None:
    r = await http({"url": f"{http_server.base}/echo", "method": "post", "json": {"k": [1, 2]}})
    assert r["data"]["method"] == "POST" and r["data"]["json"] == {"k": [1, 2]}
    # args: the JSON body of a POST ...
    r = await http({"url": f"{http_server.base}/echo", "method": "POST"}, {"x": 1})
    assert r["data"]["json"] == {"x": 1}
    # ... query params of a GET, under the tool's params
    r = await http({"url": f"{http_server.base}/echo", "params": {"x": "tool"}}, {"x": "arg", "y": 2})
    assert r["data"]["query"] == {"x": "tool", "y": "2"}
    # an explicit body wins over args
    r = await http(
        {
            "url": f"{http_server.base}/echo",
            "method": "PUT",
            "body": '{"raw": true}',
            "headers": {"Content-Type": "application/json"},
        },
        {"x": 1},
    )
    assert r["data"]["json"] == {"raw": True}


@pytest.mark.asyncio
async def test_http_404_not_retryable(http_server: HttpServer) -> None:
    f = await failure(http({"url": f"{http_server.base}/status/404"}))
    assert f.type == "HTTPError" and f.status == 404 and not f.retryable
    assert "404" in f.message and "status 404 body" in f.message
    assert f.data["status"] == 404 and f.data["data"] == "status 404 body"
    assert f.to_error()["status"] == 404


@pytest.mark.asyncio
async def test_http_retryable_statuses(http_server: HttpServer) -> None:
    for code in (503, 500, 429, 408):
        f = await failure(http({"url": f"{http_server.base}/status/{code}"}))
        assert f.type == "HTTPError" and f.status == code and f.retryable, code


@pytest.mark.asyncio
async def test_http_raise_for_status_false(http_server: HttpServer) -> None:
    r = await http({"url": f"{http_server.base}/status/404", "raise_for_status": False})
    assert r["status"] == 404 and r["data"] == "status 404 body"
    r = await http({"url": f"{http_server.base}/status/503", "raise_for_status": "false"})
    assert r["status"] == 503


@pytest.mark.asyncio
async def test_http_timeout(http_server: HttpServer) -> None:
    f = await failure(http({"url": f"{http_server.base}/slow"}, limit=0.3))
    assert f.type == "Timeout" and f.retryable
    await asyncio.wait_for(http_server.disconnected.wait(), 5)  # the request really was dropped
    http_server.disconnected.clear()
    # the tool's own timeout field, the smaller one wins
    # a limit past the test's own timeout: ignoring the field would hang the test, not pass it
    f = await failure(http({"url": f"{http_server.base}/slow", "timeout": 0.3}, limit=600))
    assert f.type == "Timeout"
    # the session still works after cancelled requests
    assert (await http({"url": f"{http_server.base}/text"}))["status"] == 200


@pytest.mark.asyncio
async def test_http_cancel(http_server: HttpServer) -> None:
    cancel = asyncio.Event()
    task = asyncio.create_task(run_tool("http", {"url": f"{http_server.base}/slow"}, {}, timeout=None, cancel=cancel))
    await asyncio.wait_for(http_server.arrived.wait(), 5)
    cancel.set()
    f = await failure(task)
    assert f.type == "Cancelled"
    await asyncio.wait_for(http_server.disconnected.wait(), 5)


@pytest.mark.asyncio
async def test_http_connection_refused(resources: ToolResources) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    f = await failure(http({"url": f"http://127.0.0.1:{port}/x"}))
    assert f.type == "ConnectionError" and f.retryable


@pytest.mark.asyncio
async def test_http_bad_fields(resources: ToolResources) -> None:
    f = await failure(http({"url": ""}))
    assert f.type == "ToolConfigError"
    f = await failure(http({"url": "not a url"}))
    assert isinstance(f, ToolFailure)
    f = await failure(http({"url": "http://127.0.0.1:1/", "headers": "nope"}))
    assert f.type == "ToolConfigError"


@pytest.mark.asyncio
async def test_http_one_session_per_resources(http_server: HttpServer, resources: ToolResources) -> None:
    await http({"url": f"{http_server.base}/text"})
    s1 = resources.http_session()
    await http({"url": f"{http_server.base}/text"})
    assert resources.http_session() is s1
    assert isinstance(s1, aiohttp.ClientSession)


def test_python_pool_outlives_event_loops() -> None:
    """A pool keeps no loop-bound state between calls: one process-wide pool serves
    successive event loops (each test, each `asyncio.run`)."""
    pool = PythonPool(size=1)
    code = "import os\ndef main():\n    return os.getpid()\n"
    first = asyncio.run(pool.run(code, {}, timeout=10))
    second = asyncio.run(pool.run(code, {}, timeout=10))
    assert first == second == pool.pids()[0]
    asyncio.run(pool.close())
    assert reaped(first)


@pytest.mark.asyncio
async def test_integers_beyond_64_bits_pass_exactly_through_python_and_http(
    resources: ToolResources, http_server: HttpServer
) -> None:
    # orjson refuses them on encode and reads them as floats: they must not be changed
    assert await py("def main(n):\n    return {'n': n, 'up': n + 1}\n", {"n": 2**70}) == {"n": 2**70, "up": 2**70 + 1}
    r = await http({"url": f"{http_server.base}/echo", "method": "post", "json": {"n": 2**70}})
    assert r["data"]["json"] == {"n": 2**70} and isinstance(r["data"]["json"]["n"], int)
    f = await failure(py("def main():\n    return [2**70, {1, 2}]\n"))  # a set is still not JSON data
    assert f.type == "ResultNotSerialisable"


@pytest.mark.asyncio
async def test_a_python_step_past_its_memory_bound_fails_and_the_next_one_runs() -> None:
    """`ACTORS_STEP_MEMORY_MB`: the kernel bounds a step worker's address space, so a step
    that allocates without end fails (MemoryError) instead of taking the pod's memory."""
    resources = ToolResources(python_workers=1, step_memory=512 << 20)
    try:
        grab = "def main():\n    hoard = [bytearray(64 << 20) for _ in range(64)]\n    return len(hoard)\n"
        f = await failure(
            executors.run_tool("python", {"kind": "python", "code": grab}, {}, timeout=20, resources=resources)
        )
        assert f.type in ("MemoryError", "WorkerCrashed"), f
        ok = "def main():\n    return len(bytearray(16 << 20))\n"
        assert await executors.run_tool(
            "python", {"kind": "python", "code": ok}, {}, timeout=20, resources=resources
        ) == (str(16 << 20).encode())
    finally:
        await resources.close()
