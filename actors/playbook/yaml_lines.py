"""YAML with line numbers: a playbook's text composed into plain Python values, with
the 1-based line of each value's path (`("workflow", 2, "next", 0, "then")`).

Safe tags only; a duplicate key, a recursive alias, a `<<` merge of a non-mapping and
aliases that expand the document past `MAX_ALIAS_NODES` are problems reported at their
line, like a YAML syntax error (which ends the reading: nothing else can be checked).
"""

from __future__ import annotations

from typing import Any

import yaml

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


class Composed:
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


def compose(text: str) -> Composed:
    out = Composed()
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
                raise _AliasesTooLarge(
                    line,
                    (
                        f"YAML aliases expand the document by more than {self.limit:,} nodes (an anchor used here "
                        f"holds {size:,}); write the values out or nest fewer aliases"
                    ),
                )
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

    def __init__(self, loader: Any, out: Composed) -> None:
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
