"""Playbook loader: YAML text -> a validated, normalised `Playbook`, or every error.

Pure code: no NATS, no network. The loader

1. composes the YAML node tree (safe tags only; its size, nesting and alias expansion
   bounded first) and keeps a map from each value's path
   (`("workflow", 2, "next", 0, "then")`) to its 1-based line; duplicate keys are errors;
2. rewrites the shorthands of the user's form (docs/language.md) into the model's form
   (`tool: python`, `next: b`, `retry: 3`, `on_failure: cleanup`, ...), remembering
   where each rewritten value came from so errors point at what the user wrote;
3. validates every step on its own, field by field, with msgspec (strict), so one bad
   step or field does not hide the errors of the others; every unknown key is reported;
4. checks what spans steps: duplicate names, routing targets, `end`, loop element names;
5. compiles every template and checks the root names it reads against the names in
   scope where it is rendered;
6. injects the implicit `end` step when the playbook has none.

`load_playbook` raises `PlaybookInvalid` carrying every `PlaybookError` found, sorted
by line. Each error names the file, line, step and field.

This module drives the stages and converts each step (3, 6); the others have modules of
their own: yaml_lines.py (1), shorthands.py (2), checks.py (4, 5), and errors.py, which
turns every problem found into a `PlaybookError` at the place the user wrote it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, get_type_hints

import msgspec
import msgspec.inspect as mi

from actors.playbook.budget import SliceExhausted, thread_state
from actors.playbook.checks import STEP_NAME, StepChecks
from actors.playbook.errors import (
    PlaybookError,
    PlaybookInvalid,
    Reporter,
    StepCtx,
    kind_of,
    literal_values,
    msgspec_error,
    strip_unknown,
    suggest,
)
from actors.playbook.model import END, LOADER_FIELDS, Playbook, PythonTool, RetryRule, Step, WaitTool
from actors.playbook.shorthands import BAD, Partial, Shorthands
from actors.playbook.templates import is_template
from actors.playbook.until import UntilInvalid, parse_until, zone_of
from actors.playbook.userfiles import read_regular_file
from actors.playbook.yaml_lines import MAX_ALIAS_NODES, MAX_SOURCE_BYTES, KeyPath, compose
from actors.wire.messages import Limits

__all__ = [
    "IMPLICIT_END_DESC",
    "MAX_ALIAS_NODES",  # re-exported: tests/system/test_big_values.py
    "MAX_ATTEMPTS_CEILING",
    "MAX_SOURCE_BYTES",
    "PlaybookInvalid",
    "load_playbook",
    "load_playbook_file",
    "parsed_playbook",
    "read_playbook_text",
]

# the largest `max_attempts` a retry rule may ask for, unless the caller says otherwise:
# the default of an execution's limits (`wire.Limits.max_attempts`)
MAX_ATTEMPTS_CEILING = Limits().max_attempts
MAX_ATTEMPTS_CEILING_ENV = "ACTORS_MAX_ATTEMPTS_CEILING"
IMPLICIT_END_DESC = "Implicit workflow aggregator (auto-injected)"
_STEP_NAME_MAX = 128


# --- public API ----------------------------------------------------------------------


def load_playbook(text: str, *, file: str = "<string>", max_attempts: int = MAX_ATTEMPTS_CEILING) -> Playbook:
    """Parse, normalise and validate a playbook. Raises `PlaybookInvalid` with every error.
    A retry rule may ask for at most `max_attempts` attempts: the caller's ceiling, never
    read here from the process (the engine's fold passes its execution's limit)."""
    return _Loader(file, max_attempts).load(text)


# a pod loads a playbook this small itself (parsed, its templates parsed, not compiled: 25 ms
# at most); a bigger one in a render process
INLINE_PLAYBOOK_CHARS = 8_192
_parsed: OrderedDict[tuple[str, str, int], Playbook] = OrderedDict()
_parsed_lock = threading.Lock()  # the event loop's thread and the fold threads share it
_PARSED_MAX = 256


def cached_playbook(source: str, file: str, max_attempts: int) -> Playbook | None:
    """The playbook `parsed_playbook` gives for these, when it needs no loading."""
    with _parsed_lock:
        return _parsed.get((source, file, max_attempts))


def parsed_playbook(source: str, file: str, max_attempts: int) -> Playbook:
    """`load_playbook`, once per source and ceiling: every execution of a playbook (every
    replay, every loop's counter) shares one read-only model. Nothing mutates a Playbook.

    Loading is user computation (YAML, every template compiled: a second for 500 kB),
    so in a pod a playbook over INLINE_PLAYBOOK_CHARS is never loaded on the event loop:
    the engine and the counter have a render process load it before they fold the input
    that needs it (`PartitionHost.preload_playbook`), under that process's limits; should
    it still be missing, `SliceExhausted` moves the fold to a fold thread, which does."""
    key = (source, file, max_attempts)
    with _parsed_lock:
        hit = _parsed.get(key)
        if hit is not None:
            _parsed.move_to_end(key)
            return hit
    pb = loaded_playbook(source, file, max_attempts)
    with _parsed_lock:
        _parsed[key] = pb
        if len(_parsed) > _PARSED_MAX:
            _parsed.popitem(last=False)
    return pb


def loaded_playbook(source: str, file: str, max_attempts: int) -> Playbook:
    """`parsed_playbook` without its cache: one over INLINE_PLAYBOOK_CHARS by this fold
    thread's render process. For a playbook a request brings (`catalog.register`),
    which no fold will need under that name: cached, a requester naming each copy
    differently would fill the cache the folds share and hold the pod's memory."""
    st = thread_state
    if len(source) > INLINE_PLAYBOOK_CHARS and st.loader is not None:
        pb: Playbook = st.loader(source, file, max_attempts)
        return pb
    if len(source) > INLINE_PLAYBOOK_CHARS and st.slice_left is not None:
        raise SliceExhausted  # on a pod's event loop
    return load_playbook(source, file=file, max_attempts=max_attempts)


def load_playbook_file(path: str | Path, *, max_attempts: int = MAX_ATTEMPTS_CEILING) -> Playbook:
    """`load_playbook` on a file; errors name the path as given. UnreadableFile (an
    OSError) for a path that is not a regular file of at most `MAX_SOURCE_BYTES`."""
    return load_playbook(read_playbook_text(path), file=str(path), max_attempts=max_attempts)


def read_playbook_text(path: str | Path) -> str:
    """The text of a playbook file, read as `userfiles.read_regular_file` reads a file the
    user names (a FIFO, a device, a directory or a file over `MAX_SOURCE_BYTES` is
    refused with UnreadableFile); PlaybookInvalid when it is not UTF-8."""
    data = read_regular_file(
        path,
        limit=MAX_SOURCE_BYTES,
        what="the playbook",
        over=f"the {MAX_SOURCE_BYTES:,} bytes a playbook may be (it travels in one NATS message)",
    )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PlaybookInvalid(
            [PlaybookError(file=str(path), line=None, step=None, field="", message=f"not UTF-8 text: {e}")]
        ) from None


_STEP_INFO = mi.type_info(Step)
_PLAYBOOK_INFO = mi.type_info(Playbook)
assert isinstance(_STEP_INFO, mi.StructType) and isinstance(_PLAYBOOK_INFO, mi.StructType)
_STEP_FIELD_INFO = {f.encode_name: f for f in _STEP_INFO.fields}
# what the user may write: not what the loader itself fills in (`Playbook.code_lines`)
_PLAYBOOK_FIELD_INFO = {f.encode_name: f for f in _PLAYBOOK_INFO.fields if f.encode_name not in LOADER_FIELDS}
_STEP_HINTS = get_type_hints(Step, include_extras=True)
_PLAYBOOK_HINTS = get_type_hints(Playbook, include_extras=True)


class _Loader(Reporter):
    """Reads one playbook: its YAML, then each step (shorthands, conversion), then the
    checks across steps; `load` returns the model or raises with every error."""

    def __init__(self, file: str, max_attempts: int) -> None:
        super().__init__(file)
        self.max_attempts = max_attempts
        self.shorthands = Shorthands(self)
        self.checks = StepChecks(self)

    # -- driver -------------------------------------------------------------------

    def load(self, text: str) -> Playbook:
        composed = compose(text)
        self.lines = composed.lines
        self.code_at = composed.code_lines
        data = composed.data
        if isinstance(data, dict) and isinstance(data.get("workflow"), list):
            for i, raw in enumerate(data["workflow"]):
                name = raw.get("step") if isinstance(raw, dict) else None
                if isinstance(name, str) and name:
                    self.labels[i] = name
        for path, line, message in composed.problems:
            self.error(path, message, line=line)
        playbook = None if composed.fatal else self._playbook(data)
        if self.errors or playbook is None:
            raise PlaybookInvalid(self._sorted())
        return playbook

    # -- top level ----------------------------------------------------------------

    def _playbook(self, data: Any) -> Playbook | None:
        if data is None:
            self.error((), "empty document: a playbook is a mapping with apiVersion, kind, metadata and workflow")
            return None
        if not isinstance(data, dict):
            self.error((), f"a playbook must be a mapping, not {kind_of(data)}")
            return None
        for k in data:
            if k not in _PLAYBOOK_FIELD_INFO:
                self.error((k,), f"unknown key {k!r}{suggest(k, _PLAYBOOK_FIELD_INFO)}")
        top: dict[str, Any] = {}
        for name, info in _PLAYBOOK_FIELD_INFO.items():
            if name not in data:
                if info.required:
                    self.error((), f"missing required key {name!r}")
                continue
            if name != "workflow":
                top[name] = self._top_field(name, info, data[name])
        steps = self._workflow(data["workflow"]) if "workflow" in data else None
        if self.errors or steps is None or any(v is BAD for v in top.values()):
            return None
        return Playbook(workflow=steps, code_lines=self._code_lines(steps), **top)

    def _code_lines(self, steps: list[Step]) -> dict[str, int]:
        """Where each python step's code starts in the file, when its lines are the
        file's (a `|` block or one line): its tracebacks count from there."""
        out: dict[str, int] = {}
        for i, s in enumerate(steps):
            line = self.code_at.get(("workflow", i, "tool", "code"))
            if isinstance(s.tool, PythonTool) and line is not None:
                out[s.step] = line
        return out

    def _top_field(self, name: str, info: mi.Field, value: Any) -> Any:
        if name in ("apiVersion", "kind"):
            allowed = literal_values(info.type)
            if value not in allowed:
                expected = " or ".join(repr(a) for a in allowed)
                self.error((name,), f"unsupported {name} {value!r} (expected {expected})")
                return BAD
            return value
        found: list[tuple[KeyPath, str]] = []
        cleaned = strip_unknown(value, info.type, (name,), found)
        for path, message in found:
            self.error(path, message)
        try:
            converted = msgspec.convert(cleaned, _PLAYBOOK_HINTS[name])
        except msgspec.ValidationError as e:
            path, message = msgspec_error(e, _PLAYBOOK_HINTS[name])
            self.error((name, *path), message)
            return BAD
        return BAD if found else converted

    # -- steps --------------------------------------------------------------------

    def _workflow(self, value: Any) -> list[Step] | None:
        if not isinstance(value, list):
            self.error(("workflow",), f"workflow must be a list of steps, not {kind_of(value)}")
            return None
        if not value:
            self.error(("workflow",), "workflow must have at least one step")
            return None
        ctxs = [StepCtx(i, raw) for i, raw in enumerate(value)]
        for ctx in ctxs:
            self._step(ctx)
        self.checks.across_steps(ctxs)
        self.checks.loop_signals(ctxs)
        self.checks.templates(ctxs)
        if not all(ctx.ok for ctx in ctxs):
            return None
        steps = [Step(**ctx.converted) for ctx in ctxs]
        if not any(s.step == END for s in steps):
            steps.append(Step(step=END, desc=IMPLICIT_END_DESC))
        return steps

    def _step(self, ctx: StepCtx) -> None:
        raw = ctx.raw
        if not isinstance(raw, dict):
            self.step_error(ctx, (), f"a step must be a mapping with a 'step' key, not {kind_of(raw)}")
            return
        name = raw.get("step")
        if "step" not in raw:
            self.step_error(ctx, (), "missing required key 'step'")
        elif not isinstance(name, str):
            self.step_error(ctx, ("step",), f"a step name must be a string, not {kind_of(name)}")
        elif not STEP_NAME.match(name) or len(name) > _STEP_NAME_MAX:
            self.step_error(
                ctx,
                ("step",),
                f"step name {name!r} must match [a-z0-9_]+ (lowercase letters, digits, underscores; "
                f"at most {_STEP_NAME_MAX})",
            )
        else:
            ctx.converted["step"] = name
        for k in raw:
            if k not in _STEP_FIELD_INFO:
                self.step_error(ctx, (k,), f"unknown key {k!r}{suggest(k, _STEP_FIELD_INFO)}")
        for field, info in _STEP_FIELD_INFO.items():
            if field == "step" or field not in raw:
                continue
            value = self.shorthands.normalise(ctx, field, raw[field])
            if value is BAD:
                continue
            if isinstance(value, Partial):  # errors reported; later checks still look at it
                ctx.norm[field] = value.value
                continue
            found: list[tuple[KeyPath, str]] = []
            value = strip_unknown(value, info.type, (field,), found)
            ctx.norm[field] = value
            for path, message in found:
                self.step_error(ctx, path, message)
            try:
                converted = msgspec.convert(value, _STEP_HINTS[field])
            except msgspec.ValidationError as e:
                path, message = msgspec_error(e, _STEP_HINTS[field])
                self.step_error(ctx, (field, *path), message)
                continue
            ctx.converted[field] = converted
        self._after_convert(ctx)

    def _after_convert(self, ctx: StepCtx) -> None:
        tool = ctx.converted.get("tool")
        if isinstance(tool, WaitTool):
            self._wait_step(ctx, tool)
        ceiling = self.max_attempts
        retry = ctx.converted.get("retry")
        for i, rule in enumerate(retry or []):
            if isinstance(rule, RetryRule) and rule.then.max_attempts > ceiling:
                self.step_error(
                    ctx,
                    ("retry", i, "then", "max_attempts"),
                    f"max_attempts {rule.then.max_attempts} is above the ceiling {ceiling} "
                    f"(env {MAX_ATTEMPTS_CEILING_ENV})",
                )

    def _wait_step(self, ctx: StepCtx, tool: WaitTool) -> None:
        """What of a wait step can be known wrong before it runs (the model checks the
        rest: a signal's name, an approval without a signal)."""
        if ctx.label == END:
            self.step_error(ctx, ("tool",), "the 'end' step cannot wait: put the wait step before it")
        if "sink" in ctx.raw:
            self.step_error(ctx, ("sink",), "a wait step has no sink: its result is the signal's data")
        if tool.zone is not None:
            try:
                zone_of(tool.zone)
            except UntilInvalid as e:
                self.step_error(ctx, ("tool", "zone"), str(e))
                return
        if tool.until is not None and not is_template(tool.until):
            try:
                parse_until(tool.until, tool.zone)
            except UntilInvalid as e:
                self.step_error(ctx, ("tool", "until"), str(e))
