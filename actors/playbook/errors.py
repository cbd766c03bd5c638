"""Error translation: every problem found in a playbook becomes a `PlaybookError`
naming the file, line, step and field as the user wrote them.

msgspec's validation messages ("Expected `int`, got `str` - at `$.a[0].b`") become a
path and a plain message; unknown keys are all reported (with a close match) before
msgspec sees a value; a path inside a step's normalised form is mapped back to the
shorthand the user wrote (`StepCtx.remap`) and to its line (`Reporter`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import msgspec
import msgspec.inspect as mi

from actors.errors import UserError
from actors.playbook.yaml_lines import KeyPath


class PlaybookError(msgspec.Struct, frozen=True):
    """One problem in a playbook: where it is and what is wrong."""

    file: str
    line: int | None
    step: str | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        subject = " ".join(
            part
            for part in (
                f"step {self.step!r}" if self.step is not None else "",
                f"field {self.field!r}" if self.field else "",
            )
            if part
        )
        return f"{where}: {subject}: {self.message}" if subject else f"{where}: {self.message}"


class PlaybookInvalid(UserError):
    """A playbook that cannot be loaded. `errors` holds every problem found."""

    def __init__(self, errors: list[PlaybookError]) -> None:
        super().__init__(list(errors))
        self.errors: list[PlaybookError] = list(errors)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def field_path(path: KeyPath) -> str:
    """("next", 0, "then") -> "next[0].then"."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def suggest(word: Any, choices: Any) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_AT = re.compile(r"^(?P<msg>.*?) - at `(?:(?P<key>key)` in `)?\$(?P<path>[^`]*)`$", re.DOTALL)
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\.\.\.\]")
_REQUIRED = re.compile(r"^Object missing required field `(?P<f>[^`]+)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<f>[^`]+)`$")


_ENUM = re.compile(r"^Invalid enum value (?P<v>.*)$", re.DOTALL)


def msgspec_error(e: msgspec.ValidationError, converted_to: Any = None) -> tuple[KeyPath, str]:
    """msgspec's "Expected `int`, got `str` - at `$.a[0].b`" -> (("a", 0, "b"), message).
    With `converted_to` (the type the value was converted to) an invalid enum value
    lists the valid ones."""
    text = str(e)
    m = _AT.match(text)
    path: list[Any] = []
    for seg in _SEGMENT.finditer(m.group("path") if m else ""):
        if seg.group(1) is not None:
            path.append(seg.group(1))
        elif seg.group(2) is not None:
            path.append(int(seg.group(2)))
        else:
            break  # a mapping value: msgspec does not say which key
    message = m.group("msg") if m else text
    if r := _REQUIRED.match(message):
        message = f"missing required key {r.group('f')!r}"
    elif u := _UNKNOWN.match(message):
        path.append(u.group("f"))
        message = f"unknown key {u.group('f')!r}"
    elif m and m.group("key"):
        message = f"mapping key: {message}"
    elif (bad := _ENUM.match(message)) and converted_to is not None:
        allowed = choices_at(mi.type_info(converted_to), path)
        if allowed:
            value = bad.group("v").strip("'")
            message = (
                f"invalid value {bad.group('v')} (one of: {', '.join(map(str, allowed))}){suggest(value, allowed)}"
            )
    return tuple(path), message


def choices_at(t: mi.Type, path: list[Any]) -> list[Any]:
    """The values the enum or Literal at `path` inside type `t` allows ([] if none is there)."""
    t = _unwrap(t)
    if not path:
        if isinstance(t, mi.UnionType):
            return [v for m in t.types for v in choices_at(m, [])]
        if isinstance(t, mi.EnumType):
            return [m.value for m in t.cls]
        return literal_values(t)
    head, rest = path[0], path[1:]
    if isinstance(t, mi.UnionType):
        return next((found for m in t.types if (found := choices_at(m, path))), [])
    if isinstance(t, mi.StructType) and isinstance(head, str):
        field = next((f for f in t.fields if f.encode_name == head), None)
        return [] if field is None else choices_at(field.type, rest)
    if isinstance(t, (mi.ListType, mi.TupleType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)) and isinstance(
        head, int
    ):
        item = getattr(t, "item_type", None)
        return [] if item is None else choices_at(item, rest)
    if isinstance(t, mi.DictType):
        return choices_at(t.value_type, rest)
    return []


def _unwrap(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def strip_unknown(value: Any, t: mi.Type, path: KeyPath, found: list[tuple[KeyPath, str]]) -> Any:
    """Report every key of `value` that its Struct type does not know; drop them so
    msgspec can go on to report the next real problem."""
    t = _unwrap(t)
    if isinstance(t, mi.UnionType):
        members = [_unwrap(m) for m in t.types]
        chosen: mi.Type | None = None
        if isinstance(value, dict):
            structs = [m for m in members if isinstance(m, mi.StructType)]
            tagged = [s for s in structs if s.tag_field is not None and value.get(s.tag_field) == s.tag]
            if tagged:
                chosen = tagged[0]
            elif len(structs) == 1 and structs[0].tag_field is None:
                chosen = structs[0]
            else:
                chosen = next((m for m in members if isinstance(m, mi.DictType)), None)
        elif isinstance(value, list):
            chosen = next((m for m in members if isinstance(m, mi.ListType)), None)
        if chosen is None:
            return value
        t = chosen
    if isinstance(t, mi.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f for f in t.fields}
        known = set(fields) | ({t.tag_field} if t.tag_field else set())
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if k in fields:
                out[k] = strip_unknown(v, fields[k].type, (*path, k), found)
            elif k in known:
                out[k] = v
            else:
                found.append(((*path, k), f"unknown key {k!r}{suggest(k, known)}"))
        return out
    if isinstance(t, mi.ListType) and isinstance(value, list):
        return [strip_unknown(v, t.item_type, (*path, i), found) for i, v in enumerate(value)]
    if isinstance(t, mi.DictType) and isinstance(value, dict):
        return {k: strip_unknown(v, t.value_type, (*path, k), found) for k, v in value.items()}
    return value


def literal_values(t: mi.Type) -> list[Any]:
    """The values a Literal type allows."""
    t = _unwrap(t)
    return list(t.values) if isinstance(t, mi.LiteralType) else []


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "a mapping",
        list: "a list",
    }
    return names.get(type(value), type(value).__name__)


class StepCtx:
    """A step being checked: its index, name, and where rewritten values came from."""

    def __init__(self, index: int, raw: Any) -> None:
        self.index = index
        self.raw = raw
        name = raw.get("step") if isinstance(raw, dict) else None
        self.label: str | None = name if isinstance(name, str) and name else None
        self.remaps: list[tuple[KeyPath, KeyPath]] = []  # (normalised prefix, user's prefix)
        self.norm: dict[str, Any] = {}
        self.converted: dict[str, Any] = {}
        self.ok = True

    def remap(self, norm: KeyPath, user: KeyPath) -> None:
        self.remaps.append((norm, user))

    def user_path(self, norm: KeyPath) -> KeyPath:
        best: tuple[KeyPath, KeyPath] | None = None
        for n, u in self.remaps:
            if norm[: len(n)] == n and (best is None or len(n) > len(best[0])):
                best = (n, u)
        if best is None:
            return norm
        return best[1] + norm[len(best[0]) :]

    @property
    def loop_element(self) -> str | None:
        loop = self.norm.get("loop")
        element = loop.get("element") if isinstance(loop, dict) else None
        return element if isinstance(element, str) else None


class Reporter:
    """The errors of one playbook file, each placed at its line, step and field."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: dict[KeyPath, int] = {}
        self.labels: dict[int, str] = {}
        self.errors: list[PlaybookError] = []

    # -- reporting ----------------------------------------------------------------

    def line(self, path: KeyPath) -> int | None:
        for n in range(len(path), -1, -1):
            line = self.lines.get(path[:n])
            if line is not None:
                return line
        return None

    def error(self, path: KeyPath, message: str, *, line: int | None = None) -> None:
        """An error at `path` from the document root."""
        if line is None:
            line = self.line(path)
        step: str | None = None
        field = field_path(path)
        if len(path) >= 2 and path[0] == "workflow" and isinstance(path[1], int) and path[1] in self.labels:
            step, field = self.labels[path[1]], field_path(path[2:])
        self.errors.append(PlaybookError(file=self.file, line=line, step=step, field=field, message=message))

    def step_error(self, ctx: StepCtx, norm: KeyPath, message: str) -> None:
        """An error at a path inside a step's normalised form."""
        ctx.ok = False
        self.error(("workflow", ctx.index, *ctx.user_path(norm)), message)

    def _sorted(self) -> list[PlaybookError]:
        unique = list(dict.fromkeys(self.errors))
        return sorted(unique, key=lambda e: (e.line is None, e.line or 0))
