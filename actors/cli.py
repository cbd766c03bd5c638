"""actors-cli: run, watch and operate playbook executions.

Exit codes:
  0  COMPLETED (or the command did what it was asked)
  1  FAILED
  2  CANCELLED
  3  invalid input or usage: a bad playbook, payload or execution id, a value over the
     message limit, an unknown execution, a port already in use
  4  timeout: the execution (run, status --watch) did not end within --timeout
  5  NATS unavailable: unreachable, credentials refused, or it stopped answering;
     also an embedded nats-server that could not start
  130 interrupted (Ctrl-C)
A user error is one line on stderr, never a traceback.

Every command that talks to NATS takes --nats URL (or NATS_URL; credentials go in the
URL: nats://user:password@host:4222); `run` without one starts an embedded
nats-server and every actor in this process. Client commands reach NATS within
--timeout seconds (default 30) or exit 5; each request they make rides out a stream
leader election or a reconnect (sent again, a start with the same execution id and
Nats-Msg-Id) for up to --timeout, then exits 5. `serve` instead waits for its server
as long as it takes (a pod starts before its server is up). Any node of a cluster
listed in the URL will do: one that is down is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from actors.dial import CLIENT_TIMEOUT
from actors.events import ActivationStatus, EventType, ExecState
from actors.settings import Settings, SettingsInvalid

EXIT_OK, EXIT_FAILED, EXIT_CANCELLED, EXIT_INVALID, EXIT_TIMEOUT, EXIT_NATS = 0, 1, 2, 3, 4, 5
STATE_EXIT = {ExecState.COMPLETED: EXIT_OK, ExecState.FAILED: EXIT_FAILED, ExecState.CANCELLED: EXIT_CANCELLED}


class UsageError(Exception):
    pass


def _json(obj: Any, *, indent: bool = False) -> str:
    from actors.jsonvalues import dumps  # integers beyond 64 bits too

    return dumps(obj, indent=indent, any_keys=True).decode()


def _out(obj: Any) -> None:
    sys.stdout.write(_json(obj) + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def _payload(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    from actors.jsonvalues import loads  # integers beyond 64 bits too

    text = Path(raw[1:]).read_bytes() if raw.startswith("@") else raw
    try:
        value = loads(text)
    except msgspec.DecodeError as e:
        raise UsageError(f"--payload: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise UsageError("--payload: must be a JSON object")
    return value


def _settings(args: argparse.Namespace) -> Settings:
    """The settings of this command: the environment, with the flags it was given over it."""
    return Settings.from_env(os.environ).with_flags(
        nats_url=getattr(args, "nats", None) or None,
        http_host=getattr(args, "http_host", None),
        http_port=getattr(args, "http_port", None),
        drain_timeout=getattr(args, "drain_timeout", None),
    )


def _timeout(args: argparse.Namespace) -> float:
    """Seconds the command may take to reach NATS: its --timeout, else CLIENT_TIMEOUT."""
    given = getattr(args, "timeout", None)
    return CLIENT_TIMEOUT if given is None else float(given)


def _execution_id(raw: str | None) -> str | None:
    """A user's execution id, checked before it gets near a subject or a key."""
    from actors.client import check_execution_id

    return None if raw is None else check_execution_id(raw)


@contextlib.asynccontextmanager
async def _connection(args: argparse.Namespace, *, embedded: bool = False) -> AsyncIterator[Any]:
    """Yield (client, layout). With no URL and embedded=True: a private server and all
    actors in-process, stopped on exit."""
    from actors.client import Client
    from actors.dial import NatsUnavailable, connect_within, redact
    from actors.natsio import ride_out
    from actors.runtime import connect, start_roles, tune_gc
    from streams.layout import ensure
    from streams.server import NatsServer

    settings = _settings(args)
    layout = settings.layout
    url = settings.nats_url
    server = None
    runtime = None
    if url is None:
        if not embedded:
            raise UsageError("no NATS server: pass --nats URL or set NATS_URL (or use `actors-cli dev`)")
        server = await NatsServer.start()
        url = server.url
    budget = _timeout(args)
    started = time.monotonic()
    # a server of our own is local and up; anyone else's is given the command's --timeout
    nc = await connect(url, name="actors-cli") if server is not None else await connect_within(url, timeout=budget)
    try:
        if server is not None:
            runtime = await start_roles(nc, settings=settings)
            tune_gc()
        else:
            left = max(0.1, budget - (time.monotonic() - started))
            try:
                async with asyncio.timeout(left):
                    # idempotent: works before any pod has started; asked again through an election
                    await ride_out(lambda: ensure(nc.jetstream(), layout), budget=left)
            except TimeoutError:
                raise NatsUnavailable(f"NATS at {redact(url)} did not answer within {budget:g}s") from None
        yield Client(nc, layout=layout, timeout=budget)
    finally:
        if runtime is not None:
            await runtime.stop()
        await nc.close()
        if server is not None:
            await server.stop()


# --- commands ------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from actors.playbook.loader import PlaybookInvalid, load_playbook_file

    ceiling = _settings(args).max_attempts_ceiling
    bad = 0
    for f in args.files:
        try:
            pb = load_playbook_file(f, max_attempts=ceiling)
            if not args.json:
                print(f"{f}: ok ({pb.metadata.catalog_path}, {len(pb.workflow)} steps)")
            else:
                _out({"file": f, "ok": True, "errors": []})
        except PlaybookInvalid as e:
            bad += 1
            if args.json:
                _out({"file": f, "ok": False, "errors": [msgspec.to_builtins(x) for x in e.errors]})
            else:
                for x in e.errors:
                    _err(str(x))
        except OSError as e:
            bad += 1
            _err(f"{f}: {e.strerror}")
    return EXIT_INVALID if bad else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from actors.playbook.schema import playbook_schema

    print(_json(playbook_schema(), indent=True))
    return EXIT_OK


async def cmd_register(args: argparse.Namespace) -> int:
    async with _connection(args) as client:
        for f in args.files:
            entry = await client.register(f)
            if args.json:
                _out({"file": f, "path": entry.path, "version": entry.version})
            else:
                print(f"{f}: registered {entry.path} v{entry.version}")
    return EXIT_OK


async def cmd_start(args: argparse.Namespace) -> int:
    eid, payload = _execution_id(args.execution_id), _payload(args.payload)
    async with _connection(args) as client:
        outcome = await client.start_execution(
            args.path, payload=payload, version=args.version, execution_id=eid, record_wait=_timeout(args)
        )
    _warn_if_existing(outcome)
    if args.json:
        _out(
            {
                "execution_id": outcome.execution_id,
                "existing": outcome.existing,
                "differs": None if outcome.differs is None else list(outcome.differs),
            }
        )
    else:
        print(outcome.execution_id)
    return EXIT_OK


def _warn_if_existing(outcome: Any) -> None:
    """Starts are idempotent by id: a second start changes nothing, which its caller
    must hear about when it asked for something else."""
    if not outcome.existing:
        return
    running = outcome.running
    what = f" (playbook {running.playbook_path} v{running.playbook_version})" if running is not None else ""
    if outcome.differs is None:
        how = "its start record could not be read yet, so whether this start differs is unknown"
    elif outcome.differs:
        how = (
            f"{' and '.join(outcome.differs)} {'differ' if len(outcome.differs) > 1 else 'differs'} from this "
            "start's; the first start is what runs"
        )
    else:
        how = "this start asked for the same"
    _err(
        f"actors-cli: warning: execution {outcome.execution_id} already exists{what}; this start changed nothing: {how}"
    )


def _status_row(st: Any) -> dict[str, Any]:
    row: dict[str, Any] = msgspec.to_builtins(st)
    return row


def _print_status(st: Any) -> None:
    d = _status_row(st)
    for k in ("execution_id", "state", "playbook", "started_at", "ended_at", "terminal_event"):
        v = d.get(k)
        print(f"{k:15} {_ts(v) if k.endswith('_at') else (v if v is not None else '-')}")
    if d.get("error"):
        print(f"{'error':15} {_error_line(d['error'])}")


def _error_line(error: dict[str, Any]) -> str:
    """A failed execution's error on one line: the root cause first, then the failed
    steps (`Timeout: ... (step 'a'; failed steps: a, end)`)."""
    where = [f"step '{error['step']}'"] if error.get("step") else []
    if error.get("failed_steps"):
        where.append("failed steps: " + ", ".join(map(str, error["failed_steps"])))
    return f"{error.get('type')}: {error.get('message')}" + (f" ({'; '.join(where)})" if where else "")


async def cmd_status(args: argparse.Namespace) -> int:
    from actors.events import TERMINAL_STATES

    _execution_id(args.execution_id)
    started = time.monotonic()
    async with _connection(args) as client:
        st = await client.status(args.execution_id)
        if st is None and not args.watch:
            _err(f"no execution {args.execution_id!r} (not started, or not projected yet)")
            return EXIT_INVALID
        if args.watch and (st is None or st.state not in TERMINAL_STATES):
            if st is not None:
                (_out(_status_row(st)) if args.json else print(f"{st.state}"))
            left = None if args.timeout is None else max(0.0, args.timeout - (time.monotonic() - started))
            try:
                st = await client.wait(args.execution_id, timeout=left)
            except TimeoutError:
                _err(f"execution {args.execution_id}: not finished after {args.timeout:g}s")
                return EXIT_TIMEOUT
        assert st is not None
        (_out(_status_row(st)) if args.json else _print_status(st))
        return STATE_EXIT.get(st.state, EXIT_OK)


async def cmd_events(args: argparse.Namespace) -> int:
    _execution_id(args.execution_id)
    async with _connection(args) as client:
        items = await client.events(args.execution_id)
        if not items:
            _err(f"no events for execution {args.execution_id!r}")
            return EXIT_INVALID
        if args.json:
            for it in items:
                _out(it.to_dict())
        else:
            t0 = items[0].at
            print(f"{'seq':>6}  {'+ms':>9}  {'class':5}  {'type':24}  {'step':16}  detail")
            for it in items:
                detail = _detail(it.type, it.data)
                print(
                    f"{it.seq:>6}  {(it.at - t0) * 1000:>9.1f}  {it.cls:5} "
                    f" {it.type:24}  {(it.step or ''):16}  {detail}"
                )
    return EXIT_OK


def _detail(type_: str, data: dict[str, Any], width: int = 100) -> str:
    keep = {k: v for k, v in data.items() if k not in ("at", "cause")}
    if type_ == "call.error" and "error" in keep:
        e = keep["error"]
        return f"{e.get('type')}: {str(e.get('message'))[:width]}"
    text = _json(keep)
    return text if len(text) <= width else text[: width - 1] + "…"


async def cmd_cancel(args: argparse.Namespace) -> int:
    from actors.events import TERMINAL_STATES

    eid = _execution_id(args.execution_id)
    async with _connection(args) as client:
        # a cancel is an input in the execution's log: never write one for an execution
        # that does not exist (it would sit there, and start one if the id came later)
        found = await client.exists(args.execution_id, timeout=_timeout(args))
        if found is None:
            _err(
                f"actors-cli: cannot tell yet whether execution {eid} exists: start messages queued before it were "
                f"still waiting after {_timeout(args):g}s (is an engine running?); nothing cancelled"
            )
            return EXIT_TIMEOUT
        if not found:
            _err(f"actors-cli: no execution {eid}: nothing to cancel")
            return EXIT_INVALID
        st = await client.status(args.execution_id)
        if st is not None and st.state in TERMINAL_STATES:
            print(f"execution {args.execution_id} is already {st.state}; nothing to cancel")
            return EXIT_OK
        await client.cancel(args.execution_id, args.reason or "cancelled by user")
        print(f"cancel requested for {args.execution_id}")
    return EXIT_OK


async def cmd_run(args: argparse.Namespace) -> int:
    from actors.playbook.loader import PlaybookInvalid, load_playbook_file

    ceiling = _settings(args).max_attempts_ceiling
    try:
        pb = load_playbook_file(args.file, max_attempts=ceiling)
        for extra in args.register or []:
            load_playbook_file(extra, max_attempts=ceiling)
    except PlaybookInvalid as e:
        for x in e.errors:
            _err(str(x))
        return EXIT_INVALID
    except OSError as e:
        _err(f"{e.filename}: {e.strerror}")
        return EXIT_INVALID
    payload = _payload(args.payload)
    eid = _execution_id(args.execution_id)
    async with _connection(args, embedded=True) as client:
        for extra in args.register or []:
            await client.register(extra)
        entry = await client.register(args.file)
        eid = eid or client.new_id()
        bar = None if args.json else asyncio.create_task(_progress(client, eid))
        try:
            outcome = await client.start_execution(entry.path, version=entry.version, payload=payload, execution_id=eid)
        except BaseException:
            await _stop_task(bar)  # or it dies with the connection and logs a traceback
            raise
        _warn_if_existing(outcome)
        if not args.json:
            print(f"execution {eid}: {pb.metadata.catalog_path} v{entry.version}")
        try:
            terminal = await asyncio.wait_for(_follow(client, eid, quiet=args.json), args.timeout)
            st = await client.wait(eid, timeout=10)
        except TimeoutError:
            if args.json:
                _out(
                    {
                        "execution_id": eid,
                        "state": "TIMEOUT",
                        "result": None,
                        "error": {"type": "Timeout", "message": f"not finished after {args.timeout}s"},
                        "started_at": None,
                        "ended_at": None,
                        "existing": outcome.existing,
                    }
                )
            else:
                _err(f"execution {eid}: not finished after {args.timeout}s")
            return EXIT_TIMEOUT
        finally:
            await _stop_task(bar)
        data = terminal.data
        out = {
            "execution_id": eid,
            "state": st.state,
            "result": await client.result(terminal),
            "error": data.get("error"),
            "started_at": st.started_at,
            "ended_at": st.ended_at,
            "existing": outcome.existing,
        }
        if args.json:
            _out(out)
        else:
            took = (st.ended_at or 0) - (st.started_at or 0)
            print(f"{st.state} in {took * 1000:.1f} ms")
            if out["error"]:
                print("error: " + _error_line(out["error"]))
            print("result: " + _json(out["result"], indent=True))
        return STATE_EXIT.get(st.state, EXIT_FAILED)


async def _stop_task(task: asyncio.Task[Any] | None) -> None:
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _progress(client: Any, eid: str) -> None:
    """A progress bar per running loop on stderr: redrawn in place on a terminal, a
    line a second (and the last one) otherwise."""
    tty = sys.stderr.isatty()
    shown: dict[str, float] = {}
    first: dict[str, tuple[float, int]] = {}
    async for p in client.progress(eid):
        t0, d0 = first.setdefault(p.loop_id, (p.at, p.done))
        finished = p.done >= p.total
        if not tty and not finished and p.at - shown.get(p.loop_id, 0.0) < 1.0:
            continue
        shown[p.loop_id] = p.at
        rate = (p.done - d0) / (p.at - t0) if p.at > t0 else 0.0
        width = 30
        filled = int(width * p.done / p.total) if p.total else width
        line = (
            f"  {p.step:20} [{'#' * filled}{'.' * (width - filled)}] {p.done}/{p.total}"
            f"  {rate:,.0f} it/s  {p.in_flight} in flight" + (f"  {p.failed} failed" if p.failed else "")
        )
        if tty:
            sys.stderr.write("\r" + line + ("\n" if finished else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


async def _follow(client: Any, eid: str, *, quiet: bool) -> Any:
    """Print a line per finished step while the execution runs; return its terminal
    lifecycle event."""
    from actors.events import TERMINAL_EVENTS

    entered: dict[int, float] = {}
    t0: float | None = None
    async for item in client.follow(eid):
        t0 = item.at if t0 is None else t0
        if item.type == EventType.STEP_ENTER:
            entered[item.data.get("activation", -1)] = item.at
        elif item.type == EventType.STEP_EXIT and not quiet:
            began = entered.get(item.data.get("activation", -1), item.at)
            status = item.data.get("status", "")
            mark = "ok " if status == ActivationStatus.COMPLETED else "ERR"
            why = ""
            if item.data.get("error"):
                why = f"  {item.data['error'].get('type')}: {str(item.data['error'].get('message'))[:120]}"
            nxt = item.data.get("next")
            route = f" -> {', '.join(nxt)}" if nxt else ""
            print(
                f"  [{(item.at - t0) * 1000:8.1f} ms] {mark} {item.step:20} "
                f"{(item.at - began) * 1000:7.1f} ms{route}{why}",
                flush=True,
            )
        elif item.type in TERMINAL_EVENTS:
            return item
    raise RuntimeError("log ended without a terminal event")


async def cmd_dev(args: argparse.Namespace) -> int:
    from actors.runtime import connect, start_roles, tune_gc
    from streams.server import NatsServer

    settings = _settings(args)
    server = await NatsServer.start(port=args.port, store_dir=args.store)
    nc = await connect(server.url, name="actors-dev")
    rt = await start_roles(nc, settings=settings)
    tune_gc()
    print(f"NATS at {server.url} (store {server.store}); all actors running. Ctrl-C to stop.", flush=True)
    print(f"  export NATS_URL={server.url}", flush=True)
    try:
        await _until_signal()
    finally:
        await rt.stop()
        await nc.close()
        await server.stop()
    return EXIT_OK


async def cmd_serve(args: argparse.Namespace) -> int:
    from actors.metrics import log_lifecycle_as_json
    from actors.runtime import ROLES, serve

    # first of all: a SIGTERM that comes while the pod is still starting must not be
    # lost (as PID 1 in a container, an unhandled SIGTERM is ignored, not fatal)
    stop = _stop_on_signal()
    settings = _settings(args)
    if settings.nats_url is None:
        raise UsageError("serve needs --nats URL or NATS_URL")
    if settings.http_port < 0 or settings.drain_timeout < 0:
        raise UsageError("--http-port and --drain-timeout must not be negative")
    roles = ROLES if args.role == "all" else (args.role,)
    log_lifecycle_as_json(sys.stderr)
    clean = await serve(settings, stop=stop, roles=roles)
    return EXIT_OK if clean else EXIT_FAILED


def _stop_on_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, handlers installed now."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _until_signal() -> None:
    await _stop_on_signal().wait()


# --- parser --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    exit_codes = doc[doc.index("Exit codes:") : doc.index("A user error")] if "Exit codes:" in doc else None
    p = argparse.ArgumentParser(
        prog="actors-cli",
        description="Run YAML playbooks on NATS JetStream.",
        epilog=exit_codes,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log actor activity to stderr")
    sub = p.add_subparsers(dest="command", required=True)

    def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--nats", help="NATS server URL (default: $NATS_URL)")
        return sp

    sp = with_nats(sub.add_parser("run", help="register, start and follow a playbook to its end"))
    sp.add_argument("file")
    sp.add_argument("--payload", help="JSON object, or @file")
    sp.add_argument("--execution-id")
    sp.add_argument("--register", action="append", help="also register this playbook (sub-playbooks)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds the execution may take (exit 4 past it); with --nats also the bound on reaching "
        f"NATS (default {CLIENT_TIMEOUT:g}; exit 5)",
    )

    sp = sub.add_parser("dev", help="embedded NATS plus every actor, in the foreground")
    sp.add_argument("--port", type=int, default=4222)
    sp.add_argument("--store", help="JetStream store dir (default: a temporary one)")

    sp = with_nats(sub.add_parser("serve", help="run one actor role (a pod)"))
    sp.add_argument("--role", choices=["engine", "counter", "tools", "projector", "all"], default="all")
    # defaults None: unset flags leave the environment's settings (actors/settings.py) as they are
    sp.add_argument(
        "--http-port",
        type=int,
        help="port for /healthz, /readyz and /metrics; 0: no HTTP server (default $ACTORS_HTTP_PORT, else 8080)",
    )
    sp.add_argument("--http-host", help="address the HTTP server binds (default $ACTORS_HTTP_HOST, else 0.0.0.0)")
    sp.add_argument(
        "--drain-timeout",
        type=float,
        help="seconds running tool commands get to finish after SIGTERM (default $ACTORS_DRAIN_TIMEOUT, else 10)",
    )

    def with_timeout(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--timeout",
            type=float,
            default=None,
            help=f"seconds to reach NATS (default {CLIENT_TIMEOUT:g}); exit 5 past it",
        )
        return sp

    sp = with_timeout(with_nats(sub.add_parser("register", help="register playbooks in the catalog")))
    sp.add_argument("files", nargs="+")
    sp.add_argument("--json", action="store_true")

    sp = with_timeout(with_nats(sub.add_parser("start", help="start an execution; prints its id")))
    sp.add_argument("path", help="catalog path of a registered playbook")
    sp.add_argument("--payload")
    sp.add_argument("--version", type=int)
    sp.add_argument("--execution-id")
    sp.add_argument(
        "--json",
        action="store_true",
        help='{"execution_id", "existing", "differs"}: existing is true when the id was started before',
    )

    sp = with_nats(sub.add_parser("status", help="an execution's status"))
    sp.add_argument("execution_id")
    sp.add_argument("--watch", action="store_true", help="wait until it is terminal")
    sp.add_argument(
        "--timeout",
        type=float,
        help=f"seconds to reach NATS (default {CLIENT_TIMEOUT:g}; exit 5) and, with --watch, to wait "
        "for the end (default: for ever; exit 4)",
    )
    sp.add_argument("--json", action="store_true")

    sp = with_timeout(with_nats(sub.add_parser("events", help="an execution's whole log, in order")))
    sp.add_argument("execution_id")
    sp.add_argument("--json", action="store_true", help="one JSON object per line")

    sp = with_timeout(with_nats(sub.add_parser("cancel", help="cancel an execution")))
    sp.add_argument("execution_id")
    sp.add_argument("--reason")

    sp = sub.add_parser("validate", help="check playbooks; report every error")
    sp.add_argument("files", nargs="+")
    sp.add_argument("--json", action="store_true")

    sub.add_parser("schema", help="print the playbook JSON Schema")
    return p


ASYNC = {
    "run": cmd_run,
    "dev": cmd_dev,
    "serve": cmd_serve,
    "register": cmd_register,
    "start": cmd_start,
    "status": cmd_status,
    "events": cmd_events,
    "cancel": cmd_cancel,
}
SYNC = {"validate": cmd_validate, "schema": cmd_schema}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_INVALID if e.code else EXIT_OK
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command in SYNC:
            return SYNC[args.command](args)
        return int(_run(ASYNC[args.command](args)))
    except UsageError as e:
        _err(f"actors-cli: {e}")
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        code = _exit_code_for(e)
        if code is None:
            raise
        _err(f"actors-cli: {e if code == EXIT_INVALID else _nats_reason(e)}")
        return code


def _exit_code_for(e: Exception) -> int | None:
    """The exit code of an error that is the user's or NATS's, not a bug of ours."""
    import nats.errors

    from actors.blobs import ValueTooLarge
    from actors.catalog import CatalogError
    from actors.client import InvalidExecutionId, TooLarge
    from actors.dial import NatsUnavailable
    from actors.health import HttpPortUnavailable
    from actors.natsio import PublishOutcomeUnknown
    from actors.playbook.loader import PlaybookInvalid
    from streams.server import ServerError

    if isinstance(
        e,
        (
            CatalogError,
            PlaybookInvalid,
            FileNotFoundError,
            InvalidExecutionId,
            TooLarge,
            HttpPortUnavailable,
            ValueTooLarge,
            SettingsInvalid,
        ),
    ):
        return EXIT_INVALID
    # a bare TimeoutError here is a NATS request or PubAck that never came (the commands
    # that time out waiting for an execution catch theirs and exit 4)
    if isinstance(e, (NatsUnavailable, ServerError, nats.errors.Error, PublishOutcomeUnknown, TimeoutError)):
        return EXIT_NATS
    return None


def _nats_reason(e: Exception) -> str:
    """One line for a NATS failure: what our own errors say, else what went wrong."""
    import nats.errors
    import nats.js.errors

    from streams.server import ServerError

    if isinstance(e, ServerError):
        return e.summary
    if isinstance(e, (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError)):
        return (
            "NATS answered but JetStream did not: is JetStream enabled on the server (-js), "
            "or is a stream electing a leader?"
        )
    if isinstance(e, (nats.errors.Error, TimeoutError)):  # after connecting: a request timed out, the connection closed
        text = " ".join(str(e).split()) or type(e).__name__
        return f"NATS stopped answering: {text}"
    return " ".join(str(e).split())


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        return asyncio.run(coro)
    return uvloop.run(coro)


def entrypoint() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`actors-cli events ID | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    sys.exit(code)


if __name__ == "__main__":
    entrypoint()
