"""The `python` kind: ``code`` defining ``def main(**args)``, run in a worker process of the
actor's pool (`ToolResources.python_pool`), outside the event loop."""

from __future__ import annotations

from collections.abc import Awaitable

from actors.tools.call import ToolCall
from actors.tools.environment import step_environment
from actors.tools.failures import ToolFailure

__all__ = ["run_python"]


def run_python(call: ToolCall) -> Awaitable[bytes]:
    """The JSON text the worker wrote (checked there: passed on as is, never encoded again).
    Not a coroutine itself: the caller awaits the pool's, one frame less each time a call
    resumes."""
    code = call.tool.get("code")
    if not isinstance(code, str) or not code.strip():
        raise ToolFailure("ToolConfigError", "python tool needs `code` defining def main(**args)")
    env = step_environment(call.tool.get("env"), "python env")
    filename = None
    if call.code_at is not None and call.code_at.line >= 1:
        # compiled under the playbook's name with the code on its own lines: a traceback
        # (or a syntax error) reads `File "flow.yaml", line 42`, the YAML's line
        code = "\n" * (call.code_at.line - 1) + code
        filename = call.code_at.file
    return call.resources.python_pool().run_json(
        code,
        call.args,
        timeout=call.limit,
        cancel=call.cancel,
        output=call.output,
        credential=call.credential,
        env=env or None,
        filename=filename,
    )
