"""YAML with line numbers: a playbook's text composed into plain Python values, with
the 1-based line of each value's path (`("workflow", 2, "next", 0, "then")`).

Safe tags only; a duplicate key, a recursive alias, a `<<` merge of a non-mapping are
problems reported at their line, like a YAML syntax error (which ends the reading:
nothing else can be checked).

A playbook's YAML is user input that the engine parses too (from the start record), so
what parsing it may cost is bounded before anything is built (`_Shape`, one pass over
the parser's events, no recursion): at most `MAX_SOURCE_BYTES` of text, lists and
mappings nested at most `MAX_DEPTH` deep (aliases included: building, checking and
rendering the values all recurse once a level), and aliases that add at most
`MAX_ALIAS_NODES` nodes when expanded. Past one of them the document is refused at the
line where it went over, as a YAML error.
"""

from __future__ import annotations

from typing import Any

import yaml

from actors.wire.nesting import MAX_DEPTH

KeyPath = tuple[Any, ...]

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
# A playbook travels whole in one NATS message (the catalog entry, the start record):
# the streams' max_msg_size. Nothing larger can be registered, so nothing larger is read.
MAX_SOURCE_BYTES = 1024 * 1024


class Composed:
    def __init__(self) -> None:
        self.data: Any = None
        self.lines: dict[KeyPath, int] = {}
        # the 1-based line of the first line of text of each `code` value whose lines
        # are the file's lines (a `|` block, or one line): a python step's traceback
        # names the playbook's line (actors/tools/pyworker.py)
        self.code_lines: dict[KeyPath, int] = {}
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


def compose(text: str) -> Composed:
    out = Composed()
    refused = _too_large(text) or _Shape.refusal(text)
    if refused is not None:
        out.problems.append(((), *refused))
        out.fatal = True
        return out
    loader = _YamlLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            out.data = _Builder(loader, out).build(root, ())
    except yaml.YAMLError as e:
        line, message = _yaml_message(e)
        out.problems.append(((), line, message))
        out.fatal = True
    finally:
        loader.dispose()
    return out


def _too_large(text: str) -> tuple[int | None, str] | None:
    # characters first: more characters than the limit are more bytes too, and a huge
    # text is not copied to be measured
    if len(text) <= MAX_SOURCE_BYTES and len(text.encode("utf-8", "surrogatepass")) <= MAX_SOURCE_BYTES:
        return None
    return None, (
        f"the playbook is larger than {MAX_SOURCE_BYTES:,} bytes, the most a playbook may be "
        "(it travels in one NATS message)"
    )


class _Refused(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Frame:
    """A list or mapping being read: its nodes so far (aliases expanded), the depth of
    lists and mappings below and including it, and its anchor."""

    __slots__ = ("anchor", "height", "nodes")

    def __init__(self, anchor: str | None) -> None:
        self.anchor = anchor
        self.nodes = 1
        self.height = 1


class _Shape:
    """The size and depth of a document as its expansion would have them, from the
    parser's events alone: nothing is composed or built, and nothing recurses, so a
    document nested 100,000 deep or made of nested aliases costs one pass over its
    text. Each anchor's node count and height are remembered when its value ends; each
    alias adds its anchor's count (the whole value again, as every later walk of the
    built value sees it) and nests its anchor's height below where it is used."""

    def __init__(self) -> None:
        self.open: list[_Frame] = []  # the lists and mappings being read, outermost first
        self.anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, height) of its value
        self.added = 0  # nodes the aliases so far add

    @classmethod
    def refusal(cls, text: str) -> tuple[int, str] | None:
        """(line, why) for a document past a bound; None for one within them, and for
        one the parser cannot read (composing it reports that error, at its line)."""
        shape = cls()
        loader = _YamlLoader(text)
        try:
            while loader.check_event():
                shape.event(loader.get_event())
        except yaml.YAMLError:
            return None
        except _Refused as e:
            return e.line, e.message
        finally:
            loader.dispose()
        return None

    def event(self, ev: yaml.Event) -> None:
        if isinstance(ev, yaml.ScalarEvent):
            self._ended(ev.anchor, 1, 0)
        elif isinstance(ev, yaml.CollectionStartEvent):
            if len(self.open) >= MAX_DEPTH:
                raise _Refused(_line(ev), _NESTED_TOO_DEEP)
            self.open.append(_Frame(ev.anchor))
        elif isinstance(ev, yaml.CollectionEndEvent):
            frame = self.open.pop()
            self._ended(frame.anchor, frame.nodes, frame.height)
        elif isinstance(ev, yaml.AliasEvent):
            self._alias(ev)

    def _ended(self, anchor: str | None, nodes: int, height: int) -> None:
        """A value is read whole: remember it under its anchor, count it in its parent."""
        if anchor is not None:
            self.anchors[anchor] = (nodes, height)
        if self.open:
            parent = self.open[-1]
            parent.nodes += nodes
            parent.height = max(parent.height, height + 1)

    def _alias(self, ev: yaml.AliasEvent) -> None:
        line = _line(ev)
        if any(frame.anchor == ev.anchor for frame in self.open):
            raise _Refused(line, "YAML syntax error: recursive alias (an anchor used inside itself)")
        if ev.anchor not in self.anchors:
            return  # an undefined alias: composing reports it
        nodes, height = self.anchors[ev.anchor]
        self.added += nodes
        if self.added > MAX_ALIAS_NODES:
            raise _Refused(
                line,
                f"YAML aliases expand the document by more than {MAX_ALIAS_NODES:,} nodes (an anchor used here "
                f"holds {nodes:,}); write the values out or nest fewer aliases",
            )
        if len(self.open) + height > MAX_DEPTH:
            raise _Refused(
                line,
                f"the alias *{ev.anchor} nests its value here deeper than {MAX_DEPTH} levels of lists and "
                "mappings, the most allowed",
            )
        self._ended(None, nodes, height)


_NESTED_TOO_DEEP = f"YAML nested deeper than {MAX_DEPTH} levels of lists and mappings, the most allowed"


def _line(ev: yaml.Event) -> int:
    return ev.start_mark.line + 1 if ev.start_mark is not None else 1


class _Builder:
    """Plain Python objects from a node tree, recording each value's line."""

    def __init__(self, loader: Any, out: Composed) -> None:
        self.loader = loader
        self.out = out
        self.built: dict[int, Any] = {}  # an alias yields the same node: build it once
        self.active: set[int] = set()

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.out.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            if path and path[-1] == "code":
                self._code_line(node, path)
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

    def _code_line(self, node: yaml.ScalarNode, path: KeyPath) -> None:
        # a literal block's text starts on the line after its `|`; a folded or
        # multi-line flow scalar's lines are not the file's, nor are those of a one-line
        # quoted value with escaped newlines (`"x = 1\ndef main(): ..."`): they get none
        if node.style == "|":
            self.out.code_lines[path] = node.start_mark.line + 2
        elif node.start_mark.line == node.end_mark.line and "\n" not in str(node.value):
            self.out.code_lines[path] = node.start_mark.line + 1

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
