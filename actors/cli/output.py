"""What the CLI prints: JSON lines on stdout, one-line messages on stderr, a status,
a log as a table, an error on one line, the warning for a start that changed nothing."""

from __future__ import annotations

import sys
import time
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


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


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
        print(f"{k:15} {_ts(v) if k.endswith('_at') else (v if v is not None else '-')}")
    if running:
        print(f"{'running':15} {', '.join(running)}")
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
