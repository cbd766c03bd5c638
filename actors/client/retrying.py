"""`Client.retry`: start a new execution that retries a terminal one from a step.

The old execution's log is folded here with the engine's own pure fold (its blobs
read back as the engine would), which gives exactly the state the engine ended it in:
its status, the steps it entered, its root failure and the results `{{ step }}` had at
its end. actors/core/rerun.py decides from that state what the retry starts from; the
start message carries it (`RetryOf`), the starter copies it into the new start record
and links the old log to the new execution. The new execution's id is derived from
the old id, the step and the payload given (streams/ids.py `retry_execution_id`), so
the same retry asked twice starts one execution."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from actors.client.checks import check_execution_id, check_size
from actors.client.items import FailedItems
from actors.client.writing import Writer
from actors.core.rerun import RetryPlan, RetryRefused
from actors.errors import UserError
from actors.store.blobs import start_payload
from actors.wire.events import ActivationStatus, answer_decoder, decision_decoder, event_decoder, extras_decoder
from actors.wire.messages import EngineFault, Redrive, StartMessage, StartRecord, encode, input_decoder
from actors.wire.nesting import check_value_depth
from streams.ids import retry_execution_id, start_id
from streams.layout import OWNERS_BUCKET, START_SUBJECT
from streams.subjects import EV, IN, LC, ExecSubjects, class_of, is_answer_record

if TYPE_CHECKING:
    from actors.core.replay import Replay
    from actors.core.state import Execution

_fault = msgspec.json.Decoder(EngineFault)


class UnknownExecution(UserError, ValueError):
    """No execution has this id (no start record in its log)."""


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    """What `Client.retry` started. `existing`: this very retry (same execution, step and
    payload) had been started before, so nothing new was started."""

    execution_id: str
    retry_of: str
    from_step: str
    kept_steps: tuple[str, ...]
    existing: bool = False
    redriven: dict[str, int] = dataclasses.field(default_factory=dict)  # a redrive: items run again, by loop step


class Retrier(Writer, FailedItems):
    """Retry a terminal execution from a step, or redrive its loops' failed items."""

    async def retry(
        self, execution_id: str, *, from_step: str | None = None, payload: dict[str, Any] | None = None
    ) -> RetryOutcome:
        """Start a new execution of the same playbook version that keeps the results of
        the steps `execution_id` completed and runs again from `from_step` (default: the
        step of its root failure), with `payload` merged over its start payload.

        Raises UnknownExecution for an id never started, RetryRefused (one line) for an
        execution that is not terminal, that never reached a step, or a `from_step` it
        never entered. Idempotent: the same retry (same execution, step, payload) returns
        the same new execution id, with `existing=True` once it was started."""
        from actors.core.rerun import plan_retry  # the engine's fold: imported by retry alone

        check_execution_id(execution_id)
        check_value_depth("the payload", payload)  # merged recursively below (TooDeep, a ValueError)
        replay = await self._ride(f"reading execution {execution_id}", lambda: self._replay_log(execution_id))
        old, record = replay.state, replay.start
        if replay.mismatch is not None:  # its state here is not the one the engine reached
            raise RetryRefused(f"execution {execution_id} cannot be retried by this code: {replay.mismatch.describe()}")
        if record is None:
            if await self._ride(f"reading the archive of {execution_id}", lambda: self._archived(execution_id)):
                # its records are gone from the streams: a retry's link to it would be the
                # one message left of it, for ever
                raise RetryRefused(
                    f"execution {execution_id} was retired after its retention (it is read from the archive): "
                    "it can no longer be retried; start its playbook again"
                )
            raise UnknownExecution(f"no execution {execution_id!r}")
        plan = plan_retry(old, record, from_step=from_step, payload=payload)
        given = msgspec.json.encode(payload or {}, order="sorted")
        eid = retry_execution_id(execution_id, plan.retry_of.from_step, given)
        return await self._start_retry(execution_id, eid, plan)

    async def redrive(self, execution_id: str, *, step: str | None = None) -> RetryOutcome:
        """Start a new execution that runs again only the failed items of the loops of
        `execution_id` (of `step`'s loop when named) and keeps every other iteration's
        result: a retry from the first such loop step (`retry`), whose start record
        names, for each loop step, the iterations to run again and the results kept
        (`RetryOf.redrive`). A loop redriven is the step's last loop that completed
        with tolerated failures; a loop that failed as a whole is retried with `retry`.

        Raises RetryRefused (one line) when there is no failed item to redrive, and as
        `retry` does, for a loop step that ran more than once (a cycle: `retry --from`
        it), and while an engine or counter pod runs code older than redrives (it would
        run every item again, or not read the start). Idempotent: the same redrive returns the same execution id, with
        `existing=True` once started."""
        from actors.core.rerun import plan_retry  # the engine's fold: imported by retry alone

        check_execution_id(execution_id)
        replay = await self._ride(f"reading execution {execution_id}", lambda: self._replay_log(execution_id))
        old, record = replay.state, replay.start
        if replay.mismatch is not None:
            raise RetryRefused(
                f"execution {execution_id} cannot be redriven by this code: {replay.mismatch.describe()}"
            )
        if record is None:
            raise UnknownExecution(f"no execution {execution_id!r}")
        if old.playbook is not None and step is not None and step not in old.playbook.steps:
            raise RetryRefused(
                f"playbook {old.playbook_path} has no step '{step}' (steps: {', '.join(old.playbook.steps)})"
            )
        # each loop step's last loop that completed: the one whose results are in scope
        loops: dict[str, tuple[int, str]] = {}
        visits: dict[str, set[int]] = {}
        for act in sorted(old.activations.values(), key=lambda a: a.id):
            if act.kind != "loop" or (step is not None and act.step != step):
                continue
            visits.setdefault(act.step, set()).add(act.id)
            if act.status == ActivationStatus.COMPLETED and act.command_id is not None:
                loops[act.step] = (act.id, act.command_id)
        keys = await self._ride(
            f"reading the failed items of execution {execution_id}",
            lambda: self.failed_keys(execution_id, [loop_id for _, loop_id in loops.values()]),
        )
        redrive: dict[str, Redrive] = {}
        for name, (_, loop_id) in loops.items():
            results = old.results.get(name)
            indices = keys.get(loop_id, [])
            if indices and isinstance(results, list):
                redrive[name] = Redrive(indices=indices, total=len(results), results=results)
        if not redrive:
            where = f"step '{step}' of execution {execution_id}" if step else f"execution {execution_id}"
            raise RetryRefused(f"{where} has no failed loop items to redrive (retry it with --from STEP instead)")
        # a step visited again (a loop in a cycle): the new execution would apply the last
        # visit's failed items to its first visit, so it is not redriven item by item
        again = sorted(name for name in redrive if len(visits.get(name, ())) > 1)
        if again:
            name = again[0]
            raise RetryRefused(
                f"loop step '{name}' ran {len(visits[name])} times in execution {execution_id} (a cycle): "
                f"its failed items cannot be redriven alone; retry it with --from {name}"
            )
        older = await self._ride("reading which pods run", lambda: self._pods_lacking("redrive"))
        if older:
            shown = ", ".join(older[:5]) + (f" and {len(older) - 5} more" if len(older) > 5 else "")
            raise RetryRefused(
                f"a redrive needs every engine and counter pod to know it; these run older code: {shown} "
                "(finish the upgrade first, docs/upgrades.md)"
            )
        first = min(redrive, key=lambda name: loops[name][0])
        plan = plan_retry(old, record, from_step=first)
        plan.retry_of.redrive = redrive
        eid = retry_execution_id(execution_id, "failed-items:" + ",".join(sorted(redrive)), b"{}")
        return await self._start_retry(execution_id, eid, plan)

    async def _pods_lacking(self, feature: str) -> list[str]:
        """The live engine and counter pods whose member entry does not name `feature`
        (actors/runtime/ownership.py `lacking`); none when there is no owners bucket."""
        from nats.js.errors import BucketNotFoundError

        from actors.runtime.ownership import lacking

        try:
            kv = await self.js.key_value(OWNERS_BUCKET)
        except BucketNotFoundError:
            return []
        return await lacking(self.nc, kv, feature)

    async def _start_retry(self, execution_id: str, eid: str, plan: RetryPlan) -> RetryOutcome:
        """Start `plan` as execution `eid`, unless it was started before (`existing`)."""
        outcome = RetryOutcome(
            execution_id=eid,
            retry_of=execution_id,
            from_step=plan.retry_of.from_step,
            kept_steps=tuple(sorted(plan.retry_of.results)),
            redriven={name: len(r.indices) for name, r in plan.retry_of.redrive.items()},
        )
        what = f"the start of execution {eid} (retry of {execution_id})"
        if await self._ride(what, lambda: self._start_record(eid)) is not None:
            return dataclasses.replace(outcome, existing=True)
        msg = StartMessage(
            playbook=plan.playbook_path,
            version=plan.playbook_version,
            payload=plan.payload,
            execution_id=eid,
            retry_of=plan.retry_of,
        )
        # the kept results travel in the start message; the payload goes as a blob when too large
        limit = self.value_limit()
        check_size(f"the results kept by the retry of {execution_id}", len(encode(plan.retry_of)), limit)
        msg = await self._ride(
            what, lambda: start_payload(self.js, msg, eid, limit=limit, cap=self.layout.max_value_bytes)
        )
        await self._publish(what, START_SUBJECT, self.codec.encode(msg), start_id(eid))
        return outcome

    async def fold_log(self, execution_id: str) -> tuple[Execution, StartRecord | None]:
        """The execution's state at the end of its log, as the engine's fold leaves it
        (each activation's failure, with the envelope a remediation step was handed), and
        its start record (None when its log holds none)."""
        check_execution_id(execution_id)
        return await self._ride(f"reading execution {execution_id}", lambda: self._fold_log(execution_id))

    async def _fold_log(self, execution_id: str) -> tuple[Execution, StartRecord | None]:
        """The execution's state at the end of its log, folded as the engine folds it
        (failure decisions read back from its records, inputs given up on skipped); up
        to the first decision this code does not reproduce, if any (`_replay_log`)."""
        replay = await self._replay_log(execution_id)
        return replay.state, replay.start

    async def _replay_log(self, execution_id: str) -> Replay:
        """The execution's log replayed by the engine's Replayer (actors/core/replay.py):
        its inputs with their blobs read back, each decision held against its record."""
        from actors.core.replay import LogRecord, answer_records, lifecycle_records, replay_execution
        from actors.engine.readback import read_back

        subjects = ExecSubjects.of(execution_id, self.layout.partitions)
        entries: list[tuple[str, bytes, int, float]] = await self._read_all(
            self.layout.exec_stream_of(execution_id),
            subjects.log,
            lambda subject, data, seq, at: [(subject, data, seq, at)],
        )
        log: list[LogRecord] = []
        for subject, data, seq, at in entries:
            cls = class_of(subject)
            value: Any = None
            if cls == EV:
                value = self.codec.decode(decision_decoder, data)
            elif cls == LC:
                ev, extras = self.codec.decode(event_decoder, data), self.codec.decode(extras_decoder, data)
                log += lifecycle_records(seq, subject, at, ev, extras)
                continue
            elif cls == IN and is_answer_record(subject):  # a result (6: or the start) with its decision (5)
                held = self.codec.decode(answer_decoder, data)  # `in.answer.lc.<type>`: with its lifecycle events
                record = held.record
                try:
                    answer = self.codec.decode(input_decoder, bytes(record.answer)) if record.answer else None
                except msgspec.DecodeError:
                    answer = None
                if answer is not None:
                    answer = await read_back(self.js, answer)  # a start's payload blob (semantics 6)
                log += answer_records(seq, subject, record, answer, held.lifecycle)
                continue
            elif cls == IN:
                try:
                    value = await read_back(self.js, self.codec.decode(input_decoder, data))
                except msgspec.DecodeError:
                    value = None  # the engine dead-lettered it: it never folded it either
            log.append(LogRecord(seq, subject, at, cls, value))
        # templates render again: off the event loop
        return await asyncio.to_thread(replay_execution, execution_id, log, subjects=subjects)


__all__ = ["Retrier", "RetryOutcome", "RetryRefused", "UnknownExecution"]
