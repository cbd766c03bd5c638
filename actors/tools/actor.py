"""Tool actors: competing consumers of `cmd.<kind>` (stream CMD) and of decision
records holding a command of their kind (`exec.*.*.ev.cmd.<kind>`, stream EXEC,
semantics 2), two pull consumers per kind sharing its slots.

A tool actor knows commands and results, nothing of the engine: it runs the command,
publishes `call.done` or `call.error` to the subject the command names (the
execution's input subject) with a deterministic message id, and acks the command
once the server has stored the result (its PubAck). Results of concurrent commands are
published pipelined, not one round trip at a time. Long tools keep their command alive
with `in_progress`. This module is the actor's life: start, stop, taking delivered
commands, keeping them alive; `pull` asks for commands, `running` runs one, `batching`
gathers loop results, `cancels` stops them, `resources` holds the python pool and the
HTTP session the actor owns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from actors.config.settings import Settings, SettingsInvalid
from actors.runtime.children import STEP_USER_SETTING, StepUserInvalid, steps_run_as
from actors.runtime.render_process import OffLoop, RenderBounds
from actors.runtime.stopping import cancel_and_wait
from actors.tools.batching import RESULT_BATCH_MAX, RESULT_BATCH_WINDOW
from actors.tools.cancels import Cancels
from actors.tools.credentials import CredentialSource
from actors.tools.held import HOLD_MARGIN, HeldCommands
from actors.tools.kinds.duckdb import duckdb_dirs
from actors.tools.pgpool import PoolBounds
from actors.tools.podguard import guard_pod
from actors.tools.pull import KindPull, wake_now_and_then
from actors.tools.redact import install_log_redaction
from actors.tools.resources import ToolResources
from actors.tools.running import CommandRunner
from actors.wire.messages import Limits
from streams.layout import TOOL_KINDS, Layout, tool_log_consumer
from streams.subjects import CANCEL_FILTER

__all__ = ["DEFAULT_CONCURRENCY", "KIND_CONCURRENCY", "ToolActor", "concurrency_of"]

log = logging.getLogger("actors.tools")


# commands run at once per kind and pod when not given, whichever stream they come from
# (the kind's two pulls, CMD's and EXEC's, may fetch up to twice as many when both have
# commands; the extra ones wait here, kept alive, for a slot: actors/tools/pull.py). A
# sleep holds its slot doing nothing, so many can wait at once; the others are bounded by
# what they use (python: the worker pool; shell: processes; http: sockets). A noop is
# done at once: 256 asks for commands in larger pulls, so loop results gather into
# larger batches (measured on bench/loop_fanout.py: 256 beats 64, which beat 256 before
# results were gathered).
DEFAULT_CONCURRENCY = 64
KIND_CONCURRENCY = {"sleep": 512, "noop": 256}


def concurrency_of(kind: str, concurrency: int | Mapping[str, int] | None) -> int:
    if isinstance(concurrency, int):
        return concurrency
    if concurrency is not None and kind in concurrency:
        return concurrency[kind]
    return KIND_CONCURRENCY.get(kind, DEFAULT_CONCURRENCY)


class ToolActor:
    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        kinds: tuple[str, ...] = TOOL_KINDS,
        concurrency: int | Mapping[str, int] | None = None,
        name: str | None = None,
        result_batch_max: int = RESULT_BATCH_MAX,
        result_batch_window: float = RESULT_BATCH_WINDOW,
        python_workers: int | None = None,
        limits: Limits | None = None,
        credentials: CredentialSource | None = None,
        settings: Settings | None = None,
        hold_margin: float = HOLD_MARGIN,
        step_user_fallback: bool = False,
    ) -> None:
        """`concurrency`: commands in flight per kind, one number for every kind or a
        mapping by kind (kinds it leaves out get `KIND_CONCURRENCY`/`DEFAULT_CONCURRENCY`).
        `result_batch_max`/`result_batch_window`: how loop iteration results are gathered
        into one message (1 sends each alone). `python_workers`: size of the actor's python
        worker pool (None: the CPUs this process may use). `limits`: the pod's (`Settings.limits`;
        None: `settings.limits`). `credentials`: where steps' credentials are found
        (None: `Settings.credentials_dir` and `Settings.credentials` read from the environment).
        `settings`: the pod's (None: read from the environment), whose NATS password and token
        and payload keys are masked like credentials. `hold_margin`: seconds a command may
        be held past its step's timeout before it is let go (actors/tools/held.py). Every
        log record of this process is masked from now on (actors/tools/redact.py), and the
        process is made undumpable, so steps cannot read its environment through /proc
        (actors/tools/podguard.py). Python and shell steps run as `settings.step_user`
        (actors/runtime/children.py): one that cannot be used raises `SettingsInvalid`, here or,
        when its python workers cannot start, in `start`. `step_user_fallback` (`run` and
        `dev`): when the step user was left to its default and cannot start the workers,
        steps run as this process's user, with a warning, instead."""
        install_log_redaction()
        if settings is None:
            settings = Settings.from_env()
        guard_pod(settings)
        try:
            run_as = steps_run_as(settings.step_user)
        except StepUserInvalid as e:
            raise SettingsInvalid(str(e)) from None
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.kinds = kinds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        # bounds the sinks' templates of commands that carry none
        self.limits = limits if limits is not None else settings.limits
        # the pool and the session are made on first use and closed by `stop`
        if credentials is None:
            credentials = CredentialSource(settings.credentials_dir, settings.credentials)
        try:
            dirs = duckdb_dirs(settings.duckdb_dirs)
        except ValueError as e:
            raise SettingsInvalid(str(e)) from None
        try:
            self.resources = ToolResources(
                python_workers=python_workers,
                step_memory=settings.step_memory_mb << 20,
                credentials=credentials,
                run_as=run_as,
                duckdb_dirs=dirs,
                postgres_pool=PoolBounds.of(settings),
            )
        except StepUserInvalid as e:
            raise SettingsInvalid(str(e)) from None
        self._step_user_fallback = step_user_fallback and not (settings.step_user or "").strip()
        # sinks' templates that are not cheap by construction render in render processes
        self._off_loop = OffLoop(threads=2, name="sink-render", bounds=RenderBounds.of(settings))
        self._pulls: dict[str, KindPull] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        for kind in kinds:
            n = max(1, concurrency_of(kind, concurrency))
            self._slots[kind] = asyncio.Semaphore(n)  # what runs at once, from either stream
            own = KindPull(nc, kind, n, self._deliver)
            # commands held by their decision record in the execution's log (semantics 2)
            # one pull per stream of logs (EXEC, or EXEC_<k> when there are several)
            held = [
                KindPull(nc, kind, n, self._deliver, stream=log, consumer=tool_log_consumer(kind))
                for log in layout.exec_stream_names
            ]
            group = [own, *held]
            for k in group:
                k.group = group
            self._pulls[kind] = own
            for k in held:
                self._pulls[f"{kind} (log)" if layout.exec_streams == 1 else f"{kind} (log {k.stream})"] = k
        self._loops: list[asyncio.Task[None]] = []
        self._cancels = Cancels()
        self._held = HeldCommands(margin=hold_margin)  # commands not acked yet (kept alive)
        self._inflight: set[asyncio.Task[None]] = set()
        self._naks: set[asyncio.Future[None]] = set()  # commands given back while stopping
        self._cancel_sub: Subscription | None = None
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat: asyncio.Task[None] | None = None
        self._active = 0  # commands taken and not yet answered or handed to a batch
        self._runner = CommandRunner(
            nc,
            self.js,
            layout=layout,
            name=self.name,
            limits=self.limits,
            off_loop=self._off_loop,
            resources=self.resources,
            cancels=self._cancels,
            held=self._held,
            batch_max=result_batch_max,
            batch_window=result_batch_window,
            slots=self._slots,
        )
        self._batcher = self._runner.batcher

    async def start(self) -> None:
        self._loop = self._batcher.loop = asyncio.get_running_loop()
        if "python" in self.kinds:
            try:
                await self.resources.warm_python()  # workers now, not on the first step
            except StepUserInvalid as e:
                await self.resources.close()
                if not self._step_user_fallback:
                    raise SettingsInvalid(str(e)) from None
                # `run` and `dev` on a developer's machine: their own steps, their own
                # secrets; a root shell whose python `nobody` cannot read must still work
                log.warning(
                    "%s; steps run as this process's own user instead, and can read its environment "
                    "(set %s to choose; `serve` refuses to start in this case)",
                    e,
                    STEP_USER_SETTING,
                )
                self.resources = ToolResources(
                    python_workers=self.resources.python_workers,
                    step_memory=self.resources.step_memory,
                    credentials=self.resources.credentials,
                    duckdb_dirs=self.resources.duckdb_dirs,
                    postgres_pool=self.resources.postgres.bounds,
                )
                self._runner.resources = self.resources
                await self.resources.warm_python()
        # when each consumer on a stream of logs was made (CommandRunner._answered_already)
        for kind, stream in ((k, s) for k in self.kinds for s in self.layout.exec_stream_names):
            name = tool_log_consumer(kind)
            try:
                info = await self.js.consumer_info(stream, name)
            except NotFoundError:
                continue  # not made yet (an engine pod of semantics 1): none of its records exists either
            except Exception as e:  # unknown: a command made before it is then run, as a redelivery always was
                log.warning("tool consumer %s: when it was made is not known: %s", name, e)
                continue
            if info.created is not None:
                self._runner.consumers_made[(stream, name)] = info.created.timestamp()
        self._cancel_sub = await self.nc.subscribe(CANCEL_FILTER, cb=self._on_cancel)
        for k in self._pulls.values():
            await k.subscribe()
            self._loops.append(asyncio.create_task(k.run(self._stopping), name=f"tools:{k.kind}"))
        self._loops.append(asyncio.create_task(wake_now_and_then(self._pulls.values()), name="tools:watch"))
        # each held command gets a beat within `ack_wait / 3` of being fetched, then every `ack_wait / 3`
        period = max(self.layout.ack_wait / 3, 0.5)
        self._beat = asyncio.create_task(self._held.keep_alive(period), name="tools:keep-alive")

    async def stop(self, *, drain_timeout: float = 5.0) -> None:
        """Stop pulling; give running commands `drain_timeout` to finish (still kept
        alive). What is still running then is left unacked and will be redelivered to
        another pod."""
        self._stopping.set()
        await cancel_and_wait(self._loops)
        for k in self._pulls.values():
            await k.unsubscribe()
        deadline = asyncio.get_running_loop().time() + drain_timeout
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=drain_timeout)
        await cancel_and_wait(list(self._inflight))
        await self._batcher.drain(max(0.1, deadline - asyncio.get_running_loop().time()))
        await cancel_and_wait([self._beat])
        if self._cancel_sub is not None:
            await self._cancel_sub.unsubscribe()
        await self.resources.close()
        self._off_loop.close()  # a sink render still running ends at once

    async def _on_cancel(self, msg: Msg) -> None:
        self._cancels.on_cancel(msg.subject)

    def _deliver(self, msg: Msg) -> asyncio.Task[None] | None:
        """A command the server delivered: run it (a task), or give it back when
        stopping. Called as the message is read (actors/natsio/dispatch.py): no waiting."""
        if self._stopping.is_set():
            nak = asyncio.ensure_future(msg.nak())  # back to the stream at once, for another pod
            self._naks.add(nak)
            nak.add_done_callback(self._nak_sent)
            return None
        loop = self._loop
        assert loop is not None
        self._active += 1
        task = loop.create_task(self._handle(msg))  # not asyncio.create_task: no loop lookup per command
        self._inflight.add(task)
        task.add_done_callback(self._done)
        return task

    def _nak_sent(self, nak: asyncio.Future[None]) -> None:
        self._naks.discard(nak)
        if not nak.cancelled() and nak.exception() is not None:
            log.debug("nak of a command while stopping: %r", nak.exception())  # it comes back after ack_wait

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # unacked: the command comes back after ack_wait (here or on another pod)
            log.warning("tool command failed before its ack: %r", task.exception())

    async def _handle(self, msg: Msg) -> None:
        try:
            await self._runner.command(msg)
        finally:
            self._active -= 1
            if not self._active and self._batcher.waiting:
                self._batcher.flush_all()  # nothing running here could join them
