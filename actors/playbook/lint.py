"""What `actors-cli validate` checks beyond what loading a playbook does: python code
that cannot run (a syntax error, no `main`) and steps that no route reaches.

Kept out of the loader on purpose: the engine loads every execution's playbook with the
loader, live and on replay, and a log written before a check existed must replay the
same. These checks only ever speak to the author of a file. Pure code, no I/O.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from actors.playbook.errors import PlaybookError
from actors.playbook.model import END, Playbook, PythonTool, Step
from actors.playbook.yaml_lines import KeyPath, compose


class Findings:
    """The errors (the playbook cannot run as written) and warnings of one file."""

    def __init__(self) -> None:
        self.errors: list[PlaybookError] = []
        self.warnings: list[PlaybookError] = []


def lint(pb: Playbook, text: str, *, file: str) -> Findings:
    """Check `pb`, loaded from `text`, for python code that cannot run and unreachable steps."""
    lines = compose(text).lines
    found = Findings()

    def line_of(path: KeyPath) -> int | None:
        for n in range(len(path), -1, -1):
            if (line := lines.get(path[:n])) is not None:
                return line
        return None

    for index, step, where, code in _python_code(pb):
        problem = python_problem(code)
        if problem is not None:
            path = ("workflow", index, *where)
            found.errors.append(PlaybookError(file, line_of(path), step.step, ".".join(where), problem))
    orphans = unreachable(pb)
    for index, step in enumerate(pb.workflow):
        if step.step in orphans:
            found.warnings.append(
                PlaybookError(
                    file,
                    line_of(("workflow", index, "step")),
                    step.step,
                    "",
                    f"warning: no route reaches this step from the first step {pb.entry!r} (by next or on_failure)",
                )
            )
    return found


def unloaded_python_errors(text: str, *, file: str) -> list[PlaybookError]:
    """The python code errors of a playbook that did not load (PlaybookInvalid): found
    on its YAML as written, so that `validate` reports them with the loader's errors in
    one pass instead of after those are fixed. Only code that is plainly a python tool's
    (`tool: {kind: python, code: ...}`, the same under `sink`) is checked; the loader
    reports every other shape."""
    composed = compose(text)
    workflow = composed.data.get("workflow") if isinstance(composed.data, dict) else None
    if composed.fatal or not isinstance(workflow, list):
        return []
    found: list[PlaybookError] = []
    for index, step in enumerate(workflow):
        if not isinstance(step, dict):
            continue
        name = step.get("step") if isinstance(step.get("step"), str) else None
        sink = step.get("sink")
        for where, tool in (
            (("tool",), step.get("tool")),
            (("sink", "tool"), sink.get("tool") if isinstance(sink, dict) else None),
        ):
            if not (isinstance(tool, dict) and tool.get("kind") == "python" and isinstance(tool.get("code"), str)):
                continue
            problem = python_problem(tool["code"])
            if problem is not None:
                field = (*where, "code")
                line = composed.lines.get(("workflow", index, *field))
                found.append(PlaybookError(file, line, name, ".".join(field), problem))
    return found


def _python_code(pb: Playbook) -> Iterator[tuple[int, Step, tuple[str, ...], str]]:
    for index, step in enumerate(pb.workflow):
        if isinstance(step.tool, PythonTool):
            yield index, step, ("tool", "code"), step.tool.code
        if step.sink is not None and isinstance(step.sink.tool, PythonTool):
            yield index, step, ("sink", "tool", "code"), step.sink.tool.code


def python_problem(code: str) -> str | None:
    """Why this python tool's code cannot run, or None: it must compile and bind `main`
    at its top level (the worker calls `main(**args)`)."""
    try:
        tree = ast.parse(code, "<code>")
    except SyntaxError as e:
        at = f" at line {e.lineno} of the code" if e.lineno else ""
        return f"python syntax error{at}: {e.msg}"
    if not any(_binds_main(node) for node in tree.body):
        return "python code defines no main(): the tool calls main(**args)"
    return None


def _binds_main(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "main"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name) == "main" for alias in node.names)
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(n, ast.Name) and n.id == "main" for t in targets for n in ast.walk(t))
    if isinstance(node, (ast.If, ast.Try, ast.With, ast.AsyncWith, ast.For, ast.While)):
        # main defined under a condition (`if sys.version_info ...`): may bind it, do not refuse
        return any(_binds_main(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return False


def unreachable(pb: Playbook) -> set[str]:
    """Steps no route leads to from the first step: no `next` or `on_failure` names them
    on a path from the entry. `end` is always reached (every branch ends there)."""
    seen = {pb.entry}
    todo = [pb.entry]
    while todo:
        step = pb.step(todo.pop())
        for name in [*step.targets(), *(edge.step for edge in step.on_failure or [])]:
            if name not in seen and name in pb.steps:
                seen.add(name)
                todo.append(name)
    return {s.step for s in pb.workflow if s.step not in seen and s.step != END}
