"""What a waiting execution waits for, as the CLI prints it (`status`, `status --watch`,
`list`, `describe`): `waiting for signal payment (step pay) since 2026-11-27
12:00:01Z, times out 2026-11-27 13:00:01Z`; an approval step's `waiting for approval:
signal approval (step approve) ...`. Waiting is a RUNNING sub-state: the state
itself stays the status record's; this is its `waiting` (docs/language.md, Waiting)."""

from __future__ import annotations

from typing import Any

from actors.cli.output import when

__all__ = ["shown", "wait_text", "waits_cell", "waits_json"]

KEY_SHOWN = 60  # characters of a wait's key in a line (`--json` has it whole)
SHOWN = 200  # characters of a name, id or sender in a line


def shown(value: Any, limit: int = SHOWN, *, lines: bool = False) -> str:
    """`value` as text safe for one line of a terminal: what is not printable (control
    and format characters: a terminal's escapes, line ends, bidi overrides) shown
    escaped (`\x1b`, `\u202e`), cut at `limit` characters. For what comes from a log
    or a record, which anyone allowed to publish there may have written raw (a signal's
    sender, name or id): the client cleans what it sends, a log holds what was sent.
    `lines`: line ends are kept (an error message of several lines)."""
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():
        text = "".join(
            c if c.isprintable() or (lines and c == "\n") else c.encode("unicode_escape").decode("ascii") for c in text
        )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _get(w: Any, name: str, default: Any = None) -> Any:
    return w.get(name, default) if isinstance(w, dict) else getattr(w, name, default)


def wait_text(w: Any, *, step: bool = True, since: bool = True) -> str:
    """One wait on one line: what it waits for, its step, since when, until when. `w`: a
    `WaitInfo` (a status's), a `StepWait` (a running step's) or either as a dict."""
    signal, key = _get(w, "signal"), str(_get(w, "key") or "")
    deadline = _get(w, "deadline")
    if signal is None:
        text = f"waiting until {when(deadline)}" if deadline is not None else "waiting for a time"
    else:
        signal = shown(signal)
        text = f"waiting for approval: signal {signal}" if _get(w, "approval") else f"waiting for signal {signal}"
        if key:
            cut = key if len(key) <= KEY_SHOWN else key[: KEY_SHOWN - 1] + "…"
            text += f" key {cut!r}"  # repr: quoted, what is not printable escaped
        if _get(w, "loop"):
            text += " (one per item)"
    if step and _get(w, "step"):
        text += f" (step {shown(_get(w, 'step'))})"
    if since and _get(w, "since") is not None:
        text += f" since {when(_get(w, 'since'))}"
    if signal is not None and deadline is not None:
        text += f", times out {when(deadline)}"
    return text


def waits_cell(waiting: list[Any] | None) -> str:
    """The waits of a status in a table's cell: the first, and how many more."""
    if not waiting:
        return ""
    first = wait_text(waiting[0], since=False)
    return first + (f" (+{len(waiting) - 1} more)" if len(waiting) > 1 else "")


def waits_json(waiting: list[Any] | None) -> list[dict[str, Any]] | None:
    """The waits as `--json` prints them (the status record's fields)."""
    if not waiting:
        return None
    import msgspec

    return [w if isinstance(w, dict) else msgspec.to_builtins(w) for w in waiting]
