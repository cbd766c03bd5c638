"""The render process's side: a fresh interpreter that renders templates it is sent,
under OS limits, and answers in JSON.

It is started by actors/runtime/render_process.py with a clean environment and bounds itself
before reading anything: its address space (`RLIMIT_AS`), no files written
(`RLIMIT_FSIZE`), no core dumps, lowest CPU priority, and not dumpable (a step of the
same user cannot read its memory through /proc). What it renders is bounded as an
inline render is (the operation budget and output bound of the execution's `Limits`);
what the OS bounds (its memory, the pod's deadline) is reported or seen by the pod.

Frames both ways: a 4-byte big-endian length, then msgspec JSON. JSON, not pickle: the
pod decodes nothing from this process that could run code, and a value made of shared
parts cannot come back smaller than it prints.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from typing import Any

import msgspec

from actors.wire.messages import Limits

__all__ = ["RenderReply", "RenderRequest", "main"]

MEMORY_EXIT = 3  # the exit status of a worker that ran out of memory and could not say so


class RenderRequest(msgspec.Struct, array_like=True):
    value: Any
    scope: dict[str, Any]
    where: str
    limits: Limits
    step: str = ""
    # set instead of a value: load this playbook source (YAML parsed, templates compiled)
    playbook: str | None = None
    file: str = ""


class RenderReply(msgspec.Struct, array_like=True, omit_defaults=True):
    ok: bool
    value: Any = None  # the rendered value; a loaded playbook; a PlaybookInvalid's errors
    kind: str = ""  # TemplateError, TemplateLimit or PlaybookInvalid, when not ok
    message: str = ""
    where: str = ""
    limit: str = ""


_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_SIGKILL = 9


def _bound_self(memory: int, parent: int) -> None:
    """Limits set by the process on itself, before it reads any template. It dies with
    its pod: a render left running by a pod killed with SIGKILL would spin with nobody
    to enforce its deadline (the CPU limit the pod sets per render stops it too)."""
    with contextlib.suppress(OSError):
        os.nice(19)  # a runaway template gets what the pod's other work leaves
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
            prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
            prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if parent and os.getppid() != parent:
        os._exit(0)  # the pod died before the line above: nobody to render for


def _read_exactly(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def main(memory: int, parent: int = 0) -> None:
    _bound_self(memory, parent)
    # imported after the limits: the template machinery is what they bound
    from actors.playbook.errors import PlaybookInvalid
    from actors.playbook.loader import load_playbook
    from actors.playbook.templates import TemplateError, TemplateLimit, render_value, template_limits

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    decoder = msgspec.json.Decoder(RenderRequest)
    encoder = msgspec.json.Encoder()
    # made before any render, so a worker out of memory can still answer
    out_of_memory = encoder.encode(
        RenderReply(ok=False, kind="MemoryError", message="the render ran out of memory", limit="template_memory")
    )
    while True:
        head = _read_exactly(stdin, 4)
        if head is None:
            return
        body = _read_exactly(stdin, int.from_bytes(head, "big"))
        if body is None:
            return
        try:
            req = decoder.decode(body)
            if req.playbook is not None:
                pb = load_playbook(req.playbook, file=req.file, max_attempts=req.limits.max_attempts)
                reply = encoder.encode(RenderReply(ok=True, value=msgspec.Raw(encoder.encode(pb))))
            else:
                with template_limits(req.limits):
                    value = render_value(req.value, req.scope, where=req.where)
                reply = encoder.encode(RenderReply(ok=True, value=value))
        except PlaybookInvalid as e:
            reply = encoder.encode(RenderReply(ok=False, kind="PlaybookInvalid", value=e.errors))
        except TemplateLimit as e:
            reply = encoder.encode(RenderReply(ok=False, kind=e.kind, message=e.message, where=e.where, limit=e.limit))
        except TemplateError as e:
            reply = encoder.encode(RenderReply(ok=False, kind=e.kind, message=e.message, where=e.where))
        except MemoryError:
            reply = out_of_memory
        except Exception as e:  # a value that cannot be encoded, a structure too deep to: the template's
            reply = encoder.encode(RenderReply(ok=False, kind="TemplateError", message=f"{type(e).__name__}: {e}"))
        try:
            stdout.write(len(reply).to_bytes(4, "big") + reply)
            stdout.flush()
        except MemoryError:
            os._exit(MEMORY_EXIT)
        if reply is out_of_memory:
            os._exit(0)  # a heap that ran out is not one to render the next template in
