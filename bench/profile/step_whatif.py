"""What-if runs for bench/step_latency.py: take one engine cost away, in this process only
(monkeypatching; nothing on disk changes), and measure again with the same harness.

    python -m bench.profile.step_whatif VARIANT[,VARIANT...] [step_latency options]

Variants (none of them is a valid engine; they bound what a change could gain):

* ``base``: nothing changed.
* ``cache_playbook``: the start fold's ``load_playbook`` memoised by source text (what a
  parse cache keyed by the source's hash would do).
* ``one_publish``: a decision's commands, record and lifecycle events published together
  in one concurrent batch instead of commands first (breaks "commands go first").
* ``request_publish``: the engine's one-message batches (one command, one record) sent
  with ``js.publish`` (request/reply, the PubAck resolved in the read loop) instead of
  ``publish_async`` + ``gather`` (PubAck via the async-reply subscription's task).
* ``tools_subprocess``: the tool actor in its own process (``python -m actors.cli serve
  --role tools``), the engine, starter and projector in this one: what a deployment with
  separate engine and tool pods does, on the same machine.
* ``no_decision_record``: decisions that issue commands publish no decision record
  (a lower bound on what the per-step record costs).

Prints step_latency's JSON line, with the variant added as "variant".
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import actors.core.decide as decide
import actors.engine.actor as engine_mod
import actors.runtime.outbox as outbox_mod
from actors.natsio import MSG_ID, publish_all
from actors.wire.events import DecisionRecord
from actors.wire.messages import encode
from bench import step_latency as sl
from streams import ids
from streams.layout import cmd_subject


def cache_playbook() -> None:
    parse = getattr(decide, "load_playbook")  # noqa: B009
    setattr(decide, "load_playbook", functools.lru_cache(maxsize=64)(parse))  # noqa: B010


def one_publish() -> None:
    orig = engine_mod.ExecutionActor.publish

    async def publish(self: Any, out: Any) -> None:
        if not self.hydrated or out.timers or out.starts or out.loops or out.reply or out.cancels:
            return await orig(self, out)  # replays and anything unusual: unchanged
        eid, subjects = self.execution_id, self.subjects
        items = [
            (cmd_subject(c.kind, eid, c.command_id), encode(c), ids.command_msg_id(eid, c.command_id))
            for c in out.commands
        ]
        if out.events:
            record = encode(DecisionRecord(cause=out.cause, events=out.events))
            items.append((subjects.decision, record, ids.decision_id(eid, out.cause)))
        items += [(subjects.lifecycle(ev.type), encode(ev), ids.lifecycle_id(eid, ev.type)) for ev in out.lifecycle]
        await publish_all(self.engine.js, items)

    engine_mod.ExecutionActor.publish = publish  # type: ignore[method-assign,assignment]


def no_decision_record() -> None:
    orig = engine_mod.ExecutionActor.publish

    async def publish(self: Any, out: Any) -> None:
        if out.commands and not out.lifecycle:
            out.events = []
        await orig(self, out)

    engine_mod.ExecutionActor.publish = publish  # type: ignore[method-assign,assignment]


def request_publish() -> None:
    orig = getattr(outbox_mod, "publish_all")  # noqa: B009

    async def publish_all_(js: Any, items: list[tuple[str, bytes, str]], **kw: Any) -> Any:
        if len(items) == 1 and not kw:
            subject, payload, msg_id = items[0]
            return [await js.publish(subject, payload, headers={MSG_ID: msg_id})]
        return await orig(js, items, **kw)

    setattr(outbox_mod, "publish_all", publish_all_)  # noqa: B010


def tools_subprocess() -> None:
    orig = getattr(sl, "start_roles")  # noqa: B009

    async def start_roles(nc: Any, *, layout: Any, **kw: Any) -> Any:
        import asyncio
        import signal
        import subprocess

        from actors.pod.roles import Runtime

        rt = await orig(nc, layout=layout, roles=("engine", "projector"))
        url = f"nats://{nc.connected_url.netloc}"
        proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "serve", "--role", "tools", "--nats", url])  # noqa: ASYNC220
        # wait until its pull consumer has a waiting request: the tool actor is up
        jsm = nc.jsm()
        for _ in range(500):
            if (await jsm.consumer_info("CMD", "tools-python")).num_waiting:
                break
            await asyncio.sleep(0.02)

        class Stopper:
            async def start(self) -> None: ...

            async def stop(self) -> None:
                proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(proc.wait, 15)

        return Runtime(nc, [Stopper(), *rt.actors])

    setattr(sl, "start_roles", start_roles)  # noqa: B010


VARIANTS = {
    "base": lambda: None,
    "cache_playbook": cache_playbook,
    "one_publish": one_publish,
    "request_publish": request_publish,
    "tools_subprocess": tools_subprocess,
    "no_decision_record": no_decision_record,
}


def main() -> int:
    if len(sys.argv) < 2 or any(v not in VARIANTS for v in sys.argv[1].split(",")):
        print(f"usage: step_whatif.py {{{'|'.join(VARIANTS)}}}[,...] [step_latency options]", file=sys.stderr)
        return 3
    for name in sys.argv[1].split(","):
        VARIANTS[name]()
    orig_print = print

    def tagged(*args: Any, **kw: Any) -> None:  # add the variant to step_latency's JSON line
        if len(args) == 1 and isinstance(args[0], str) and args[0].startswith('{"tool"'):
            args = (args[0][:-1] + f', "variant": "{sys.argv[1]}"}}',)
        orig_print(*args, **kw)

    sl.print = tagged  # type: ignore[attr-defined]
    return sl.main(["--json-only", *sys.argv[2:]])


if __name__ == "__main__":
    sys.exit(main())
