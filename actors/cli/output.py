"""What the CLI prints: JSON lines on stdout, one-line messages on stderr, a status,
a log as a table, an error on one line, the warning for a start that changed nothing;
times with their zone (UTC unless `--local`) and durations."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec


def json_text(obj: Any, *, indent: bool = False) -> str:
    from actors.wire.jsonvalues import dumps  # integers beyond 64 bits too

    return dumps(obj, indent=indent, any_keys=True).decode()


def print_json(obj: Any) -> None:
    sys.stdout.write(json_text(obj) + "\n")
    sys.stdout.flush()


def print_error(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


PROGRESS_EVERY = 100  # executions between two progress lines of a command that goes through many


def executions_done(*, quiet: bool) -> Callable[..., None]:
    """A progress callback for a command that goes through many executions (`archive`,
    `prepare-rollback`): a line on stderr every PROGRESS_EVERY calls, none when `quiet`
    (--json)."""
    seen = 0

    def progress(*_: object) -> None:
        nonlocal seen
        seen += 1
        if seen % PROGRESS_EVERY == 0 and not quiet:
            print_error(f"actors-cli: {seen} executions done")

    return progress


# `--local` (main.py sets it for the command's run): times in this machine's zone
# instead of UTC. Every printed time goes through `when`, so one flag covers them all.
_local = False


def use_local_time(local: bool) -> None:
    global _local
    _local = bool(local)


def when(t: float | str | None, *, ms: bool = False) -> str:
    """A moment as the tables print it, always with its zone: `2026-11-26 21:04:05Z`
    (UTC), or with `--local` `2026-11-26 22:04:05+01:00`; `ms` adds milliseconds. An
    RFC 3339 string (a schedule's next fire, in its own zone) is shown the same way;
    "-" for none."""
    if t is None or t == "":
        return "-"
    if isinstance(t, str):
        try:
            moment = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            return t  # not a time we can read: shown as it came
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
    else:
        moment = dt.datetime.fromtimestamp(t, dt.UTC)
    moment = moment.astimezone() if _local else moment.astimezone(dt.UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S") + (f".{moment.microsecond // 1000:03d}" if ms else "")
    if not _local:
        return text + "Z"
    offset = moment.strftime("%z")  # +0100
    return text + (f"{offset[:3]}:{offset[3:]}" if offset else "")


def duration(seconds: float | None) -> str:
    """`850ms`, `12.3s`, `4m05s`, `2h13m`, `3d04h`; "-" for none."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def run_time(started: float | None, ended: float | None, now: float | None = None) -> float | None:
    """How long an execution ran, or has been running (to `now`) when it has not ended."""
    if started is None:
        return None
    return (ended if ended is not None else (time.time() if now is None else now)) - started


def no_execution(execution_id: str) -> str:
    """The one line of every command asked about an execution that does not exist."""
    return f"actors-cli: no execution {execution_id!r}"


async def why_missing(client: Any, execution_id: str, timeout: float) -> tuple[str, int]:
    """What a command says of an execution it found nothing of (no status, no log), and
    its exit code: 3 when no such execution exists; 4 when it cannot be told yet (its
    start may still be queued) or it has started and its status is not recorded yet (the
    projector's lag): the same id may work a moment later."""
    from actors.cli.exits import EXIT_INVALID, EXIT_TIMEOUT

    found = await client.exists(execution_id, timeout=timeout)
    if found is None:
        return (
            f"actors-cli: cannot tell yet whether execution {execution_id!r} exists: start messages queued before "
            f"it were still waiting after {timeout:g}s (is an engine running?)",
            EXIT_TIMEOUT,
        )
    if found:
        return f"actors-cli: execution {execution_id!r} has started; its status is not recorded yet", EXIT_TIMEOUT
    return no_execution(execution_id), EXIT_INVALID


def warn_if_existing(outcome: Any) -> None:
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
    print_error(
        f"actors-cli: warning: execution {outcome.execution_id} already exists{what}; this start changed nothing: {how}"
    )


def status_row(st: Any) -> dict[str, Any]:
    row: dict[str, Any] = msgspec.to_builtins(st)
    return row


def print_status(st: Any, running: list[str] | None = None) -> None:
    """The status, the steps running now (when there are), and a failure's root cause."""
    d = status_row(st)
    for k in ("execution_id", "state", "playbook", "version", "started_at", "ended_at", "terminal_event"):
        v = d.get(k)
        print(f"{k:15} {when(v, ms=True) if k.endswith('_at') else (v if v is not None else '-')}")
        if k == "ended_at":
            took = run_time(d.get("started_at"), v)
            print(f"{'duration':15} {duration(took)}{'' if v is not None or took is None else ' so far'}")
    if running:
        print(f"{'running':15} {', '.join(running)}")
    from actors.cli.waits import wait_text  # a RUNNING execution's waits (`tool: wait`)

    for w in d.get("waiting") or []:
        print(f"{'waiting':15} {wait_text(w).removeprefix('waiting ')}")
    if d.get("error"):
        print(f"{'error':15} {error_line(d['error'])}")


def error_line(error: dict[str, Any]) -> str:
    """A failed execution's error on one line: the root cause first, then the failed
    steps (`Timeout: ... (step 'a'; failed steps: a, end)`)."""
    where = [f"step '{error['step']}'"] if error.get("step") else []
    if error.get("failed_steps"):
        where.append("failed steps: " + ", ".join(map(str, error["failed_steps"])))
    return f"{error.get('type')}: {error.get('message')}" + (f" ({'; '.join(where)})" if where else "")


def print_events_table(items: list[Any]) -> None:
    """An execution's log as a table, a line per item numbered from 1, times from its first item."""
    t0 = items[0].at
    # numbered from 1 per execution: the stream sequence is shared by every execution
    print(f"{'#':>5}  {'+ms':>9}  {'class':5}  {'type':24}  {'step':16}  detail")
    for n, it in enumerate(items, 1):
        detail = _detail(it.type, it.data)
        print(f"{n:>5}  {(it.at - t0) * 1000:>9.1f}  {it.cls:5}  {it.type:24}  {(it.step or ''):16}  {detail}")


def _detail(type_: str, data: dict[str, Any], width: int = 100) -> str:
    keep = {k: v for k, v in data.items() if k not in ("at", "cause")}
    if type_ == "call.error" and "error" in keep:
        e = keep["error"]
        return f"{e.get('type')}: {str(e.get('message'))[:width]}"
    text = json_text(keep)
    return text if len(text) <= width else text[: width - 1] + "…"
