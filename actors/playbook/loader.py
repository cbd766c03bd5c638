"""Playbook loader: YAML text -> a validated, normalised `Playbook`, or every error.

Pure code: no NATS, no network. The loader

1. composes the YAML node tree (safe tags only) and keeps a map from each value's path
   (`("workflow", 2, "next", 0, "then")`) to its 1-based line; duplicate keys are errors;
2. rewrites the shorthands of the user's form (shared/DSL.md) into the model's form
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
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, get_type_hints

import jinja2
import msgspec
import msgspec.inspect as mi
import yaml

from actors.playbook import templates
from actors.playbook.model import (
    END,
    TOOL_KINDS,
    UNRENDERED_TOOL_FIELDS,
    Playbook,
    RetryRule,
    Step,
)

__all__ = [
    "DEFAULT_RETRY_WHEN",
    "IMPLICIT_END_DESC",
    "MAX_ATTEMPTS_CEILING",
    "RESERVED_NAMES",
    "PlaybookError",
    "PlaybookInvalid",
    "load_playbook",
    "load_playbook_file",
    "max_attempts_ceiling",
]

MAX_ATTEMPTS_CEILING = 1000
MAX_ATTEMPTS_CEILING_ENV = "ACTORS_MAX_ATTEMPTS_CEILING"
DEFAULT_RETRY_WHEN = "{{ error is not none }}"
IMPLICIT_END_DESC = "Implicit workflow aggregator (auto-injected)"
# names a template may read in next/retry/on_error/on_failure conditions and in sinks
OUTCOME_NAMES = frozenset({"result", "response", "error", "attempt"})
# names a loop element must not take
RESERVED_NAMES = frozenset({"workload", "execution_id", "iteration", "failure"}) | OUTCOME_NAMES

_STEP_NAME = re.compile(r"^[a-z0-9_]+$")
_STEP_NAME_MAX = 128
_DIGITS = re.compile(r"^\s*\d+\s*$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")

KeyPath = tuple[Any, ...]


# --- errors --------------------------------------------------------------------------


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


class PlaybookInvalid(Exception):
    """A playbook that cannot be loaded. `errors` holds every problem found."""

    def __init__(self, errors: list[PlaybookError]) -> None:
        super().__init__(list(errors))
        self.errors: list[PlaybookError] = list(errors)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def max_attempts_ceiling() -> int:
    """The largest `max_attempts` a retry policy may ask for (env overrides)."""
    raw = os.environ.get(MAX_ATTEMPTS_CEILING_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            return MAX_ATTEMPTS_CEILING
        if value >= 1:
            return value
    return MAX_ATTEMPTS_CEILING


# --- public API ----------------------------------------------------------------------


def load_playbook(text: str, *, file: str = "<string>") -> Playbook:
    """Parse, normalise and validate a playbook. Raises `PlaybookInvalid` with every error."""
    return _Loader(file).load(text)


@lru_cache(maxsize=256)
def parsed_playbook(source: str, file: str) -> Playbook:
    """`load_playbook`, once per source: every execution of a playbook (every replay, every
    loop's counter) shares one read-only model. Nothing mutates a Playbook."""
    return load_playbook(source, file=file)


def load_playbook_file(path: str | Path) -> Playbook:
    """`load_playbook` on a file; errors name the path as given."""
    p = Path(path)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PlaybookInvalid(
            [PlaybookError(file=str(path), line=None, step=None, field="", message=f"not UTF-8 text: {e}")]
        ) from None
    return load_playbook(text, file=str(path))


# --- YAML with line numbers ----------------------------------------------------------

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # same semantics, faster

# Nodes that YAML aliases may add to a document when expanded (each use of an anchor
# counts the whole anchored value again). The composed tree shares an anchored value
# between its uses, but everything downstream (templates, encoding, the engine's
# render of `args`) walks the expanded value: a 643-byte "billion laughs" (9 uses a
# level, 8 levels) expands to 43 million nodes and held the engine for about 50 s.
# 100,000 is far beyond what `<<: *defaults` and shared fragments need and costs
# milliseconds to walk; a document's own nodes (written out) never count against it.
MAX_ALIAS_NODES = 100_000


class _Composed:
    def __init__(self) -> None:
        self.data: Any = None
        self.lines: dict[KeyPath, int] = {}
        self.problems: list[tuple[KeyPath, int | None, str]] = []
        self.fatal = False  # the YAML cannot be read at all: nothing else can be checked


def _yaml_message(e: yaml.YAMLError) -> tuple[int | None, str]:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        problem = e.problem or "invalid YAML"
        message = f"YAML syntax error: {problem}"
        if e.context:
            cmark = e.context_mark
            started = f" started at line {cmark.line + 1}" if cmark is not None and cmark is not mark else ""
            message += f" ({e.context}{started})"
        return (mark.line + 1 if mark is not None else None), message
    mark = getattr(e, "position", None)
    return None, f"YAML error: {e}" if mark is None else f"YAML error at character {mark}: {e}"


def _compose(text: str) -> _Composed:
    out = _Composed()
    loader = _YamlLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            _AliasBudget(MAX_ALIAS_NODES).count(root, root.start_mark.line + 1)
            out.data = _Builder(loader, out).build(root, ())
    except yaml.YAMLError as e:
        line, message = _yaml_message(e)
        out.problems.append(((), line, message))
        out.fatal = True
    except _AliasesTooLarge as e:
        out.problems.append(((), e.line, e.message))
        out.fatal = True
    finally:
        loader.dispose()
    return out


class _AliasBudget:
    """Counts the nodes that alias uses add to a composed document, in document order,
    and refuses it (a YAML error at the line of the use that goes over) past `limit`.
    Linear in the document's own nodes: each node's expanded size is computed once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.added = 0
        self.sizes: dict[int, int] = {}  # id(node) -> its expanded size, once walked
        self.active: set[int] = set()  # nodes being walked (a recursive alias is the builder's error)

    def count(self, node: yaml.Node, line: int) -> int:
        key = id(node)
        size = self.sizes.get(key)
        if size is not None:  # met again: an alias use, which copies the whole value
            self.added += size
            if self.added > self.limit:
                raise _AliasesTooLarge(line, (
                    f"YAML aliases expand the document by more than {self.limit:,} nodes (an anchor used here "
                    f"holds {size:,}); write the values out or nest fewer aliases"))
            return size
        if key in self.active or isinstance(node, yaml.ScalarNode):
            return 1
        self.active.add(key)
        size = 1
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                size += self.count(item, line if item.start_mark.line + 1 < line else item.start_mark.line + 1)
        elif isinstance(node, yaml.MappingNode):
            for knode, vnode in node.value:
                kline = knode.start_mark.line + 1
                size += self.count(knode, kline) + self.count(vnode, kline)
        self.active.discard(key)
        self.sizes[key] = size
        return size


class _AliasesTooLarge(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Builder:
    """Plain Python objects from a node tree, recording each value's line."""

    def __init__(self, loader: Any, out: _Composed) -> None:
        self.loader = loader
        self.out = out
        self.built: dict[int, Any] = {}  # an alias yields the same node: build it once
        self.active: set[int] = set()

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.out.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            return self.loader.construct_object(node, deep=True)
        key = id(node)
        if key in self.active:
            raise yaml.constructor.ConstructorError(
                None, None, "recursive alias (an anchor used inside itself)", node.start_mark
            )
        if key in self.built:
            return self.built[key]
        self.active.add(key)
        try:
            if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ_TAG:
                value: Any = [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            elif isinstance(node, yaml.MappingNode) and node.tag == _MAP_TAG:
                value = self._mapping(node, path)
            else:  # !!set, !!omap, ...: the safe constructor knows them
                value = self.loader.construct_object(node, deep=True)
        finally:
            self.active.discard(key)
        self.built[key] = value
        return value

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        first: dict[Any, int] = {}
        merges: list[yaml.Node] = []
        for knode, vnode in node.value:
            kline = knode.start_mark.line + 1
            if knode.tag == _MERGE_TAG:
                merges.append(vnode)
                continue
            if not isinstance(knode, yaml.ScalarNode):
                self.out.problems.append((path, kline, "a mapping key must be a plain scalar"))
                continue
            k = self.loader.construct_object(knode, deep=True)
            if k in first:
                self.out.problems.append(((*path, k), kline, f"duplicate key {k!r} (first at line {first[k]})"))
                continue
            first[k] = kline
            self.out.lines[(*path, k)] = kline
            out[k] = self.build(vnode, (*path, k))
        for mnode in merges:  # `<<: *defaults`: explicit keys win, earlier merges win
            sources = mnode.value if isinstance(mnode, yaml.SequenceNode) else [mnode]
            for src in sources:
                if not isinstance(src, yaml.MappingNode):
                    self.out.problems.append(
                        (path, mnode.start_mark.line + 1, "'<<' needs a mapping or a list of mappings")
                    )
                    continue
                merged = self.build(src, (*path, "<<"))
                if isinstance(merged, dict):
                    for k, v in merged.items():
                        if k not in out:
                            out[k] = v
                            self.out.lines.setdefault((*path, k), mnode.start_mark.line + 1)
        return out


# --- helpers -------------------------------------------------------------------------


def _fmt(path: KeyPath) -> str:
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


def _suggest(word: Any, choices: Any) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_AT = re.compile(r"^(?P<msg>.*?) - at `(?:(?P<key>key)` in `)?\$(?P<path>[^`]*)`$", re.DOTALL)
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\.\.\.\]")
_REQUIRED = re.compile(r"^Object missing required field `(?P<f>[^`]+)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<f>[^`]+)`$")


def _msgspec_error(e: msgspec.ValidationError) -> tuple[KeyPath, str]:
    """msgspec's "Expected `int`, got `str` - at `$.a[0].b`" -> (("a", 0, "b"), message)."""
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
    return tuple(path), message


def _unwrap(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _strip_unknown(value: Any, t: mi.Type, path: KeyPath, found: list[tuple[KeyPath, str]]) -> Any:
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
                out[k] = _strip_unknown(v, fields[k].type, (*path, k), found)
            elif k in known:
                out[k] = v
            else:
                found.append(((*path, k), f"unknown key {k!r}{_suggest(k, known)}"))
        return out
    if isinstance(t, mi.ListType) and isinstance(value, list):
        return [_strip_unknown(v, t.item_type, (*path, i), found) for i, v in enumerate(value)]
    if isinstance(t, mi.DictType) and isinstance(value, dict):
        return {k: _strip_unknown(v, t.value_type, (*path, k), found) for k, v in value.items()}
    return value


def _strings(value: Any, path: KeyPath, seen: set[int] | None = None) -> Iterator[tuple[KeyPath, str]]:
    """Every string inside `value` (mappings and lists, recursively) with its path."""
    if isinstance(value, str):
        yield path, value
        return
    if isinstance(value, (dict, list)):
        seen = set() if seen is None else seen
        if id(value) in seen:  # a YAML alias shared many times: check it once
            return
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            yield from _strings(v, (*path, k), seen)


@lru_cache(maxsize=4096)
def _template_names(source: str) -> frozenset[str]:
    try:
        return frozenset(templates.check(source))
    except jinja2.TemplateError as e:  # e.g. an unknown filter, found while collecting names
        raise templates.TemplateError(f"template syntax error: {e.message or e}") from None


_STEP_INFO = mi.type_info(Step)
_PLAYBOOK_INFO = mi.type_info(Playbook)
assert isinstance(_STEP_INFO, mi.StructType) and isinstance(_PLAYBOOK_INFO, mi.StructType)
_STEP_FIELD_INFO = {f.encode_name: f for f in _STEP_INFO.fields}
_PLAYBOOK_FIELD_INFO = {f.encode_name: f for f in _PLAYBOOK_INFO.fields}
_STEP_HINTS = get_type_hints(Step, include_extras=True)
_PLAYBOOK_HINTS = get_type_hints(Playbook, include_extras=True)
_BAD = object()  # a field whose normalisation already reported an error


class _Names:
    """The names in scope where a template is rendered: those every step sees (each
    step's name, ...) and this step's own few. Kept apart so that checking a long
    workflow does not copy every step name for every step."""

    def __init__(self, everywhere: frozenset[str], own: frozenset[str]) -> None:
        self.everywhere = everywhere
        self.own = own

    def __contains__(self, name: object) -> bool:
        return name in self.own or name in self.everywhere

    def __iter__(self) -> Iterator[str]:
        yield from self.own
        yield from self.everywhere

    def missing(self, used: frozenset[str]) -> list[str]:
        return sorted(name for name in used if name not in self)


class _Partial:
    """A field normalised as far as it goes, with errors already reported: checked
    for targets and templates, never converted."""

    def __init__(self, value: Any) -> None:
        self.value = value


# --- one step ------------------------------------------------------------------------


class _StepCtx:
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


def _names_list(ctx: _StepCtx, value: Any, norm: KeyPath, user: KeyPath) -> Any:
    """A `then`/`else` target: a step name or a list of them."""
    if isinstance(value, str):
        ctx.remap((*norm, 0), user)
        return [value]
    return value


def _kind_of(value: Any) -> str:
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


def _items(value: Any) -> Iterator[tuple[int, dict[Any, Any]]]:
    """(index, rule) for each mapping in a normalised rule list."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict):
                yield i, item


_KINDS_TEXT = ", ".join(TOOL_KINDS)
_OUTCOME_HINT = " ('result', 'response', 'error' and 'attempt' are in scope only in next, retry, on_error and on_failure rules and in sink)"


class _Loader:
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
        field = _fmt(path)
        if len(path) >= 2 and path[0] == "workflow" and isinstance(path[1], int) and path[1] in self.labels:
            step, field = self.labels[path[1]], _fmt(path[2:])
        self.errors.append(PlaybookError(file=self.file, line=line, step=step, field=field, message=message))

    def step_error(self, ctx: _StepCtx, norm: KeyPath, message: str) -> None:
        """An error at a path inside a step's normalised form."""
        ctx.ok = False
        self.error(("workflow", ctx.index, *ctx.user_path(norm)), message)

    def _sorted(self) -> list[PlaybookError]:
        unique = list(dict.fromkeys(self.errors))
        return sorted(unique, key=lambda e: (e.line is None, e.line or 0))

    # -- driver -------------------------------------------------------------------

    def load(self, text: str) -> Playbook:
        composed = _compose(text)
        self.lines = composed.lines
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
            self.error((), f"a playbook must be a mapping, not {_kind_of(data)}")
            return None
        for k in data:
            if k not in _PLAYBOOK_FIELD_INFO:
                self.error((k,), f"unknown key {k!r}{_suggest(k, _PLAYBOOK_FIELD_INFO)}")
        top: dict[str, Any] = {}
        for name, info in _PLAYBOOK_FIELD_INFO.items():
            if name not in data:
                if info.required:
                    self.error((), f"missing required key {name!r}")
                continue
            if name != "workflow":
                top[name] = self._top_field(name, info, data[name])
        steps = self._workflow(data["workflow"]) if "workflow" in data else None
        if self.errors or steps is None or any(v is _BAD for v in top.values()):
            return None
        return Playbook(workflow=steps, **top)

    def _top_field(self, name: str, info: mi.Field, value: Any) -> Any:
        if name in ("apiVersion", "kind"):
            allowed = _literal_values(info.type)
            if value not in allowed:
                expected = " or ".join(repr(a) for a in allowed)
                self.error((name,), f"unsupported {name} {value!r} (expected {expected})")
                return _BAD
            return value
        found: list[tuple[KeyPath, str]] = []
        cleaned = _strip_unknown(value, info.type, (name,), found)
        for path, message in found:
            self.error(path, message)
        try:
            converted = msgspec.convert(cleaned, _PLAYBOOK_HINTS[name])
        except msgspec.ValidationError as e:
            path, message = _msgspec_error(e)
            self.error((name, *path), message)
            return _BAD
        return _BAD if found else converted

    # -- steps --------------------------------------------------------------------

    def _workflow(self, value: Any) -> list[Step] | None:
        if not isinstance(value, list):
            self.error(("workflow",), f"workflow must be a list of steps, not {_kind_of(value)}")
            return None
        if not value:
            self.error(("workflow",), "workflow must have at least one step")
            return None
        ctxs = [_StepCtx(i, raw) for i, raw in enumerate(value)]
        for ctx in ctxs:
            self._step(ctx)
        self._cross_checks(ctxs)
        self._templates(ctxs)
        if not all(ctx.ok for ctx in ctxs):
            return None
        steps = [Step(**ctx.converted) for ctx in ctxs]
        if not any(s.step == END for s in steps):
            steps.append(Step(step=END, desc=IMPLICIT_END_DESC))
        return steps

    def _step(self, ctx: _StepCtx) -> None:
        raw = ctx.raw
        if not isinstance(raw, dict):
            self.step_error(ctx, (), f"a step must be a mapping with a 'step' key, not {_kind_of(raw)}")
            return
        name = raw.get("step")
        if "step" not in raw:
            self.step_error(ctx, (), "missing required key 'step'")
        elif not isinstance(name, str):
            self.step_error(ctx, ("step",), f"a step name must be a string, not {_kind_of(name)}")
        elif not _STEP_NAME.match(name) or len(name) > _STEP_NAME_MAX:
            self.step_error(
                ctx,
                ("step",),
                f"step name {name!r} must match [a-z0-9_]+ (lowercase letters, digits, underscores; at most {_STEP_NAME_MAX})",
            )
        else:
            ctx.converted["step"] = name
        for k in raw:
            if k not in _STEP_FIELD_INFO:
                self.step_error(ctx, (k,), f"unknown key {k!r}{_suggest(k, _STEP_FIELD_INFO)}")
        for field, info in _STEP_FIELD_INFO.items():
            if field == "step" or field not in raw:
                continue
            value = self._normalise(ctx, field, raw[field])
            if value is _BAD:
                continue
            if isinstance(value, _Partial):  # errors reported; later checks still look at it
                ctx.norm[field] = value.value
                continue
            found: list[tuple[KeyPath, str]] = []
            value = _strip_unknown(value, info.type, (field,), found)
            ctx.norm[field] = value
            for path, message in found:
                self.step_error(ctx, path, message)
            try:
                converted = msgspec.convert(value, _STEP_HINTS[field])
            except msgspec.ValidationError as e:
                path, message = _msgspec_error(e)
                self.step_error(ctx, (field, *path), message)
                continue
            ctx.converted[field] = converted
        self._after_convert(ctx)

    def _after_convert(self, ctx: _StepCtx) -> None:
        ceiling = max_attempts_ceiling()
        retry = ctx.converted.get("retry")
        for i, rule in enumerate(retry or []):
            if isinstance(rule, RetryRule) and rule.then.max_attempts > ceiling:
                self.step_error(
                    ctx,
                    ("retry", i, "then", "max_attempts"),
                    f"max_attempts {rule.then.max_attempts} is above the ceiling {ceiling} (env {MAX_ATTEMPTS_CEILING_ENV})",
                )

    # -- shorthands -> model form -------------------------------------------------

    def _normalise(self, ctx: _StepCtx, field: str, value: Any) -> Any:
        if field == "tool":
            return self._tool(ctx, value, ("tool",))
        if field == "next":
            return self._next(ctx, value)
        if field == "retry":
            return self._retry(ctx, value)
        if field == "on_failure":
            return self._on_failure(ctx, value)
        if field == "on_error" and isinstance(value, dict):
            ctx.remap(("on_error", 0), ("on_error",))
            return [value]
        if field == "loop":
            return self._loop(ctx, value)
        if field == "sink" and isinstance(value, dict) and "tool" in value:
            tool = self._tool(ctx, value["tool"], ("sink", "tool"))
            return _BAD if tool is _BAD else {**value, "tool": tool}
        return value

    def _tool(self, ctx: _StepCtx, value: Any, at: KeyPath) -> Any:
        if isinstance(value, str):
            if value not in TOOL_KINDS:
                self.step_error(
                    ctx, at, f"unknown tool kind {value!r} (one of: {_KINDS_TEXT}){_suggest(value, TOOL_KINDS)}"
                )
                return _BAD
            return {"kind": value}
        if isinstance(value, dict):
            if "kind" not in value:
                self.step_error(ctx, at, f"a tool needs a 'kind' (one of: {_KINDS_TEXT})")
                return _BAD
            kind = value["kind"]
            if not isinstance(kind, str) or kind not in TOOL_KINDS:
                self.step_error(
                    ctx,
                    (*at, "kind"),
                    f"unknown tool kind {kind!r} (one of: {_KINDS_TEXT}){_suggest(kind, TOOL_KINDS)}",
                )
                return _BAD
        return value

    def _next(self, ctx: _StepCtx, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):  # next: b
            ctx.remap(("next", 0), ("next",))
            ctx.remap(("next", 0, "then", 0), ("next",))
            return [{"then": [value]}]
        if isinstance(value, dict):  # next: {when: ..., then: b}
            ctx.remap(("next", 0), ("next",))
            rules: list[Any] = [value]
        elif isinstance(value, list):
            if not value:
                self.step_error(ctx, ("next",), "an empty next routes nowhere; omit next to route to end")
                return _BAD
            if all(isinstance(v, str) for v in value):  # next: [b, c]
                ctx.remap(("next", 0), ("next",))
                for k in range(len(value)):
                    ctx.remap(("next", 0, "then", k), ("next", k))
                return [{"then": list(value)}]
            if any(isinstance(v, str) for v in value):
                self.step_error(
                    ctx,
                    ("next",),
                    "next mixes step names and rules: use a list of step names (parallel branches) "
                    "or a list of rules ({when, then} or {else})",
                )
                return _BAD
            rules = value
        else:
            self.step_error(
                ctx,
                ("next",),
                f"next must be a step name, a list of step names or a list of rules, not {_kind_of(value)}",
            )
            return _BAD
        out: list[Any] = []
        bad = False
        for i, rule in enumerate(rules):
            if not isinstance(rule, dict):
                out.append(rule)  # msgspec names the type
                continue
            for k in rule:
                if k not in ("when", "then", "else"):
                    self.step_error(ctx, ("next", i, k), f"unknown key {k!r}{_suggest(k, ('when', 'then', 'else'))}")
                    bad = True
            r = {k: v for k, v in rule.items() if k in ("when", "then")}
            if "else" in rule:
                if "when" in rule:
                    self.step_error(ctx, ("next", i), "a rule has both 'when' and 'else'")
                    bad = True
                if "then" in rule:
                    self.step_error(ctx, ("next", i), "a rule has both 'then' and 'else'")
                    bad = True
                ctx.remap(("next", i, "then"), ("next", i, "else"))
                r["then"] = _names_list(ctx, rule["else"], ("next", i, "then"), ("next", i, "else"))
                if i != len(rules) - 1:
                    self.step_error(ctx, ("next", i + 1), "unreachable: an 'else' rule must be the last rule")
                    bad = True
            elif "then" not in rule:
                self.step_error(ctx, ("next", i), "a rule needs 'then' (or 'else')")
                bad = True
            else:
                r["then"] = _names_list(ctx, rule["then"], ("next", i, "then"), ("next", i, "then"))
            if r.get("then") == []:
                self.step_error(ctx, ("next", i, "then"), "an empty target list routes nowhere")
                bad = True
            out.append(r)
        return _Partial(out) if bad else out

    def _retry(self, ctx: _StepCtx, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool):
            self.step_error(
                ctx, ("retry",), "retry must be a count, a policy mapping or a list of rules, not a boolean"
            )
            return _BAD
        if isinstance(value, int):  # retry: 3
            ctx.remap(("retry", 0), ("retry",))
            ctx.remap(("retry", 0, "then", "max_attempts"), ("retry",))
            return [{"when": DEFAULT_RETRY_WHEN, "then": {"max_attempts": value}}]
        if isinstance(value, dict):
            ctx.remap(("retry", 0), ("retry",))
            if "then" in value or "when" in value:  # one rule
                return [value]
            ctx.remap(("retry", 0, "then"), ("retry",))  # retry: {max_attempts: 3, ...}
            return [{"when": DEFAULT_RETRY_WHEN, "then": value}]
        return value

    def _on_failure(self, ctx: _StepCtx, value: Any) -> Any:
        if isinstance(value, str):  # on_failure: cleanup
            ctx.remap(("on_failure", 0), ("on_failure",))
            return [{"step": value}]
        if isinstance(value, dict):
            ctx.remap(("on_failure", 0), ("on_failure",))
            return [value]
        if isinstance(value, list):
            out: list[Any] = []
            for k, item in enumerate(value):
                if isinstance(item, str):
                    ctx.remap(("on_failure", k, "step"), ("on_failure", k))
                    out.append({"step": item})
                else:
                    out.append(item)
            return out
        return value

    def _loop(self, ctx: _StepCtx, value: Any) -> Any:
        if not isinstance(value, dict) or "tolerated_failures" not in value:
            return value
        out = dict(value)
        tf = out["tolerated_failures"]
        if isinstance(tf, str):
            if _DIGITS.match(tf):
                out["tolerated_failures"] = int(tf)
            elif (m := _PERCENT.match(tf.strip())) is None:
                self.step_error(
                    ctx,
                    ("loop", "tolerated_failures"),
                    f"tolerated_failures must be a count (3) or a percentage ('5%'), not {tf!r}",
                )
                out["tolerated_failures"] = 0
            elif float(m.group(1)) > 100:
                self.step_error(ctx, ("loop", "tolerated_failures"), f"tolerated_failures {tf!r} is above 100%")
                out["tolerated_failures"] = 0
            else:
                out["tolerated_failures"] = tf.strip()
        return out

    # -- across steps -------------------------------------------------------------

    def _cross_checks(self, ctxs: list[_StepCtx]) -> None:
        names = {ctx.label for ctx in ctxs if ctx.label}
        known = names | {END}
        first: dict[str, int | None] = {}
        for ctx in ctxs:
            if ctx.label is None:
                continue
            if ctx.label in first:
                at = first[ctx.label]
                where = f" (first at line {at})" if at is not None else ""
                self.step_error(ctx, ("step",), f"duplicate step name {ctx.label!r}{where}")
            else:
                first[ctx.label] = self.line(("workflow", ctx.index, "step"))

        def target(ctx: _StepCtx, name: Any, at: KeyPath) -> None:
            if isinstance(name, str) and _STEP_NAME.match(name) and name not in known:
                self.step_error(ctx, at, f"unknown step {name!r}{_suggest(name, known)}")

        for ctx in ctxs:
            if not isinstance(ctx.raw, dict):
                continue
            if ctx.label == END and ctx.raw.get("next") is not None:
                self.step_error(ctx, ("next",), "the 'end' step must not have 'next': every branch converges there")
            for i, rule in _items(ctx.norm.get("next")):
                then = rule.get("then")
                for k, name in enumerate(then if isinstance(then, list) else []):
                    target(ctx, name, ("next", i, "then", k))
            for i, edge in _items(ctx.norm.get("on_failure")):
                target(ctx, edge.get("step"), ("on_failure", i, "step"))
            element = ctx.loop_element
            if element in RESERVED_NAMES:
                self.step_error(
                    ctx, ("loop", "element"), f"loop element {element!r} shadows the template name {element!r}"
                )
            elif element in names:
                self.step_error(
                    ctx, ("loop", "element"), f"loop element {element!r} shadows the result of step {element!r}"
                )

    # -- templates ----------------------------------------------------------------

    def _templates(self, ctxs: list[_StepCtx]) -> None:
        names = frozenset(ctx.label for ctx in ctxs if ctx.label)
        remediation = {
            edge["step"]
            for ctx in ctxs
            for _, edge in _items(ctx.norm.get("on_failure"))
            if isinstance(edge.get("step"), str)
        }
        everywhere = names | {"workload", "execution_id"}
        for ctx in ctxs:
            n = ctx.norm
            if not n:
                continue
            own = {"failure"} if ctx.label in remediation else set()
            outer = _Names(everywhere, frozenset(own))
            if isinstance(n.get("loop"), dict):
                own.add("iteration")
                if ctx.loop_element:
                    own.add(ctx.loop_element)
            base = _Names(everywhere, frozenset(own))
            outcome = _Names(everywhere, frozenset(own | OUTCOME_NAMES))

            self._walk(ctx, n.get("args"), ("args",), base)
            tool = n.get("tool")
            if isinstance(tool, dict):
                for k, v in tool.items():
                    if k not in UNRENDERED_TOOL_FIELDS:
                        self._walk(ctx, v, ("tool", k), base)
            loop = n.get("loop")
            if isinstance(loop, dict) and "collection" in loop:
                # rendered once, before any iteration: no element, no `iteration`
                self._walk(ctx, loop["collection"], ("loop", "collection"), outer)
            for i, rule in _items(n.get("next")):
                self._condition(ctx, rule.get("when"), ("next", i, "when"), outcome)
            for i, rule in _items(n.get("retry")):
                self._condition(ctx, rule.get("when"), ("retry", i, "when"), outcome)
                then = rule.get("then")
                if isinstance(then, dict):
                    for key in ("next_call", "collect"):
                        self._walk(ctx, then.get(key), ("retry", i, "then", key), outcome)
            for i, rule in _items(n.get("on_error")):
                self._condition(ctx, rule.get("when"), ("on_error", i, "when"), outcome)
                for key in ("result", "args"):
                    self._walk(ctx, rule.get(key), ("on_error", i, key), outcome)
            for i, edge in _items(n.get("on_failure")):
                self._condition(ctx, edge.get("when"), ("on_failure", i, "when"), outcome)
            sink = n.get("sink")
            if isinstance(sink, dict):
                stool = sink.get("tool")
                if isinstance(stool, dict):
                    for k, v in stool.items():
                        if k not in UNRENDERED_TOOL_FIELDS:
                            self._walk(ctx, v, ("sink", "tool", k), outcome)
                self._walk(ctx, sink.get("args"), ("sink", "args"), outcome)

    def _walk(self, ctx: _StepCtx, value: Any, at: KeyPath, scope: _Names) -> None:
        for path, source in _strings(value, at):
            if templates.is_template(source):
                self._template(ctx, path, source, scope)

    def _condition(self, ctx: _StepCtx, value: Any, at: KeyPath, scope: _Names) -> None:
        if not isinstance(value, str):
            return  # absent, or msgspec already named the type
        if templates.is_template(value):
            self._template(ctx, at, value, scope)
        elif value.strip().lower() not in ("true", "false"):
            self.step_error(
                ctx,
                at,
                f'a condition must be a template such as "{{{{ {value.strip()} }}}}" (a plain string is always true)',
            )

    def _template(self, ctx: _StepCtx, at: KeyPath, source: str, scope: _Names) -> None:
        try:
            used = _template_names(source)
        except templates.TemplateError as e:
            self.step_error(ctx, at, e.message)
            return
        for name in scope.missing(used):
            self.step_error(ctx, at, f"undefined name {name!r} in template{self._hint(ctx, at, name, scope)}")

    @staticmethod
    def _hint(ctx: _StepCtx, at: KeyPath, name: str, scope: _Names) -> str:
        if name in OUTCOME_NAMES:
            return _OUTCOME_HINT
        if name == "failure":
            return " ('failure' is in scope only in a step that some step's on_failure names)"
        if at[:2] == ("loop", "collection") and (name == "iteration" or name == ctx.loop_element):
            return " (the collection is rendered once, before any iteration)"
        if name == "iteration":
            return " ('iteration' is in scope only in a step with a loop)"
        return _suggest(name, scope)


def _literal_values(t: mi.Type) -> list[Any]:
    """The values a Literal type allows."""
    t = _unwrap(t)
    return list(t.values) if isinstance(t, mi.LiteralType) else []
