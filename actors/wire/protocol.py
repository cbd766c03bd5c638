"""The wire protocol's public messages and their JSON Schemas (docs/protocol/).

Every message a client of any language sends or reads is listed here (`MESSAGES`), as
the msgspec Struct the actors encode and decode it with, so the schemas are generated
from the code that writes the bytes and cannot drift from it: `--check` (and
tests/pure/test_protocol_document.py) fails when a Struct changes and the committed
schemas were not written again. docs/protocol/asyncapi.yaml names every one of them by
`$ref` and says the rest (subjects, headers, ids, encodings, the sealed form).

    python -m actors.wire.protocol --write   # write docs/protocol/schemas/*.json
    python -m actors.wire.protocol --check   # exit 1 naming each file that differs

Two rules are applied on top of `msgspec.json.schema_components`:

* `required`: a Struct with `omit_defaults` leaves a field at its default off the wire,
  so only the fields without a default are required (msgspec's rule). A Struct without
  it (the replies: `StartReply`, `ResultReply`, `RegisterReply`, `CancelReply`,
  `SignalReply`) writes every field, so every field is required there: a client may
  rely on reading each one. An event's
  `data` keys typed `... | UnsetType` are written only when set, so never required.
* `x-sealed` (an annotation, ignored by validators) marks each field that holds a user's
  value (actors/wire/secrecy.py markers, which the payload codec reads): `value`, sealed
  whole under a payload key; `error`, a mapping whose `type`, `message` and `traceback`
  are sealed.
* a lifecycle event is published with its carrier keys (`decision`, `before`, `after`:
  `LifecycleExtras`, semantics 2) when it is the one message of its decision, so its
  schema is the event's with those keys added (`<Event>Message` below).

Pure: imports no NATS, does no I/O but writing and reading the schema files.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import msgspec
from msgspec import UNSET, Struct, field

from actors.wire import events
from actors.wire.events import Event
from actors.wire.messages import (
    CancelAsk,
    CancelReply,
    CancelRequest,
    CatalogEntry,
    DeadLetter,
    ErrorInfo,
    ExecutionStatus,
    RegisterReply,
    RegisterRequest,
    RequestError,
    ResultReply,
    ResultRequest,
    SignalAsk,
    SignalReply,
    SignalSent,
    StartMessage,
    StartReply,
)
from actors.wire.secrecy import SEAL

PROTOCOL_VERSION = 1
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol"
SCHEMA_DIR = DOCS / "schemas"
ASYNCAPI = DOCS / "asyncapi.yaml"


# the lifecycle events a client reads (class `lc`): they alone decide an execution's status
LIFECYCLE_EVENTS: tuple[type[Event], ...] = (
    events.PlaybookInitializedEvent,
    events.WorkflowInitializedEvent,
    events.WorkflowCompletedEvent,
    events.WorkflowFailedEvent,
    events.PlaybookCompletedEvent,
    events.PlaybookFailedEvent,
    events.ExecutionCancelledEvent,
    events.ExecutionHaltedEvent,
    events.ExecutionResumedEvent,
    events.ExecutionWaitingEvent,
)
# one of them, told apart by `type`: what a carrier's `before` and `after` hold
LifecycleEvent = Union[LIFECYCLE_EVENTS]  # type: ignore[valid-type]  # noqa: UP007


def _carrier(event: type[Event]) -> type[Struct]:
    """`event` as published: its own keys, and the carrier keys when it carries its
    decision (`LifecycleExtras`: absent when empty, as `splice` writes them)."""
    name = event.__name__.removesuffix("Event") + "Message"
    doc = (
        f"A `{event.__struct_config__.tag}` lifecycle event as published on its `lc` subject. When it is the "
        "one message of its decision (semantics 2) it carries extra keys: `decision` (the engine's record: "
        "internal, its format not part of the protocol), `before` and `after` (the decision's other "
        "lifecycle events, in decided order, each a lifecycle event without carrier keys). Absent when it "
        "carries nothing."
    )
    return msgspec.defstruct(
        name,
        [
            # the engine's own record of the decision: internal (its format may change in
            # any release, docs/upgrades.md), so the protocol promises only that it is an object
            ("decision", dict[str, Any] | None, None),
            ("before", list[LifecycleEvent], field(default_factory=list)),
            ("after", list[LifecycleEvent], field(default_factory=list)),
        ],
        bases=(event,),
        kw_only=True,
        module=__name__,
        namespace={"__doc__": doc},
    )


LIFECYCLE_MESSAGES: dict[str, type[Struct]] = {str(ev.__struct_config__.tag): _carrier(ev) for ev in LIFECYCLE_EVENTS}


@dataclass(frozen=True)
class PublicMessage:
    """One message of the protocol: its name (the schema file `<name>.json` and the
    message `<name>` in asyncapi.yaml) and the Struct it is encoded from."""

    name: str
    type: type[Struct]


_PUBLIC: tuple[type[Struct], ...] = (
    StartMessage,
    StartReply,
    ResultRequest,
    ResultReply,
    RegisterRequest,
    RegisterReply,
    CancelAsk,
    CancelReply,
    CancelRequest,
    SignalAsk,
    SignalReply,
    SignalSent,
    ExecutionStatus,
    *LIFECYCLE_MESSAGES.values(),
    DeadLetter,
    CatalogEntry,
    ErrorInfo,
    RequestError,
)
MESSAGES: tuple[PublicMessage, ...] = tuple(PublicMessage(t.__name__, t) for t in _PUBLIC)


def _structs(types: list[type[Struct]]) -> Iterator[type[Struct]]:
    """Every Struct class reachable from `types` (the components msgspec names)."""
    seen: set[type] = set()
    stack = list(msgspec.inspect.multi_type_info(types))
    while stack:
        t = stack.pop()
        if isinstance(t, msgspec.inspect.StructType):
            if t.cls in seen:
                continue
            seen.add(t.cls)
            yield t.cls
            stack.extend(f.type for f in t.fields)
        elif isinstance(t, msgspec.inspect.Metadata):
            stack.append(t.type)
        elif isinstance(t, msgspec.inspect.UnionType):
            stack.extend(t.types)
        elif isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType, msgspec.inspect.SetType)):
            stack.append(t.item_type)
        elif isinstance(t, msgspec.inspect.DictType):
            stack.extend((t.key_type, t.value_type))


def _sealed(t: Any) -> str | None:
    """The secrecy marker of an inspected field type (`value`, `error`), if any."""
    if isinstance(t, msgspec.inspect.Metadata):
        return (t.extra or {}).get(SEAL) or _sealed(t.type)
    if isinstance(t, msgspec.inspect.UnionType):
        return next((m for m in map(_sealed, t.types) if m), None)
    return None


def _markers(cls: type[Struct]) -> dict[str, str]:
    """Each field of `cls` that holds a user's value, by its name on the wire: its marker."""
    fields = msgspec.inspect.type_info(cls).fields  # type: ignore[attr-defined]
    return {f.encode_name: m for f in fields if (m := _sealed(f.type))}


def _always_written(cls: type[Struct]) -> list[str] | None:
    """The fields a Struct without `omit_defaults` always writes (all but those
    defaulting to UNSET, which it omits while unset); None for one with `omit_defaults`."""
    config = cls.__struct_config__
    if config.omit_defaults:
        return None
    names = [f.encode_name for f in msgspec.structs.fields(cls) if f.default is not UNSET]
    tag = config.tag_field
    return [tag, *names] if tag is not None and config.tag is not None else names


def schema_of(message: PublicMessage) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one message: its own definition at the top
    (`$ref`) and every Struct it holds under `$defs`."""
    (top,), components = msgspec.json.schema_components([message.type], ref_template="#/$defs/{name}")
    classes = {c.__name__: c for c in _structs([message.type])}
    for name, component in components.items():
        if "description" in component:
            component["description"] = inspect.cleandoc(component["description"])
        cls = classes.get(name)
        if cls is None or "properties" not in component:
            continue
        written = _always_written(cls)
        if written is not None:
            component["required"] = [n for n in written if n in component["properties"]]
        for field_name, marker in _markers(cls).items():
            component["properties"][field_name]["x-sealed"] = marker
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"{message.name}.json",
        "title": message.name,
        **top,
        "$defs": dict(sorted(components.items())),
    }


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def generated() -> dict[str, str]:
    """Every schema file's text, by file name."""
    return {f"{m.name}.json": render(schema_of(m)) for m in MESSAGES}


def differing(directory: Path = SCHEMA_DIR) -> list[str]:
    """The schema files in `directory` that are not as generated: missing, changed, or
    not a message's any more."""
    want = generated()
    have = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    bad = [n for n, text in want.items() if n not in have or (directory / n).read_text() != text]
    return sorted(bad + [n for n in have if n not in want])


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Write every schema file (and remove those of messages that are gone); returns the
    names of the files changed."""
    changed = differing(directory)
    directory.mkdir(parents=True, exist_ok=True)
    want = generated()
    for name in changed:
        path = directory / name
        if name in want:
            path.write_text(want[name])
        else:
            path.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.wire.protocol", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help=f"write the schemas to {SCHEMA_DIR}")
    what.add_argument("--check", action="store_true", help="exit 1 naming each schema file that differs")
    args = parser.parse_args(argv)
    if args.write:
        for name in write():
            print(f"wrote {SCHEMA_DIR / name}")
        return 0
    bad = differing()
    for name in bad:
        print(f"{SCHEMA_DIR / name}: not as generated from the Structs (python -m actors.wire.protocol --write)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
