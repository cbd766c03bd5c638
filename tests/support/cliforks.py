"""A fork server for the tests' `actors-cli` runs: one process per test worker that has
imported the CLI once, and forks a fresh process for each run.

Why: a run of `python -m actors.cli` spends about 0.6 s of CPU importing (nats-py,
aiohttp through it, msgspec, jinja2, the playbook loader) before it does anything, and
the suite runs the CLI a few hundred times on a 2-core CI machine. A forked child is
still a process of its own, as a user's command is: its own pid, stdout, stderr, exit
code, environment and working directory, killed whole on a timeout. What it skips is
only the imports, which every run shares. Nothing in actors/ reads the environment at
import time except the tool failpoints (actors/tools/failpoints.py), and a run that sets
those (ACTORS_TEST_FAILPOINTS) is started the plain way (tests/support/cli.py).

Protocol, over a Unix socket: the client sends one JSON line {args, env, cwd} with three
file descriptors attached (stdin, stdout, stderr); the server forks; the child answers
`pid <n>\\n`, runs the CLI's `main`, then writes `exit <code>\\n` and exits. A child
killed before it answers leaves the connection closed with no exit line.

Run as `python -m tests.support.cliforks SOCKET_PATH`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any


def _serve(path: str) -> None:
    from actors.cli.main import entrypoint  # the imports every run shares, done once here

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    os.kill(os.getppid(), 0)  # (only checks the parent is there)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        conn, _ = server.accept()
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(msg.decode())
        except (OSError, ValueError):
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            _child(conn, fds, request, entrypoint)  # never returns
        for fd in fds:
            os.close(fd)
        conn.close()


def _child(conn: socket.socket, fds: list[int], request: dict[str, Any], entrypoint: Callable[[], None]) -> None:
    code = 70
    try:
        os.setsid()  # a group of its own: a kill on timeout takes its children (embedded servers) too
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # the process's own, for its life
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()  # the run's TZ, not the server's (the C library read it once)
        os.chdir(request["cwd"])
        sys.argv = ["actors-cli", *request["args"]]
        conn.sendall(f"pid {os.getpid()}\n".encode())
        try:
            entrypoint()  # as the console script runs it: exits with the command's code
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # a closed pipe: the exit code still goes back
            pass
        try:
            conn.sendall(f"exit {code}\n".encode())
        except OSError:
            pass
        os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    _serve(sys.argv[1])
