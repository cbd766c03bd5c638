"""How retry sequences accumulate results (`collect`: append, merge, replace at a path)."""

from __future__ import annotations

from typing import Any


def collect(acc: Any, result: Any, strategy: str, path: str | None) -> Any:
    """Accumulate one attempt's value (at `path`) into `acc`."""
    value = get_path(result, path) if path else result
    if strategy == "replace":
        return value
    if strategy == "merge":
        merged = dict(acc) if isinstance(acc, dict) else {}
        if isinstance(value, dict):
            merged.update(value)
        return merged
    items = list(acc) if isinstance(acc, list) else []
    if path is not None and isinstance(value, list):
        items.extend(value)
    else:
        items.append(value)
    return items


def collected_result(acc: Any, result: Any, path: str | None) -> Any:
    """A collecting sequence's result: the last attempt's result with the value at
    `path` replaced by the accumulation (the whole accumulation without a path)."""
    return acc if path is None else set_path(result, path, acc)


def get_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.lstrip("-").isdigit():
            obj = obj[int(part)] if -len(obj) <= int(part) < len(obj) else None
        else:
            return None
    return obj


def set_path(obj: Any, path: str, value: Any) -> Any:
    """A copy of `obj` with `value` at the dotted `path` (mappings created as needed)."""
    head, _, rest = path.partition(".")
    out = dict(obj) if isinstance(obj, dict) else {}
    out[head] = set_path(out.get(head), rest, value) if rest else value
    return out


def size(collected: Any) -> int:
    return len(collected) if isinstance(collected, (list, dict)) else (0 if collected is None else 1)
