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
from actors.client.reading import Reader
from actors.client.writing import Writer
from actors.core.rerun import RetryRefused
from actors.store.blobs import start_payload
from actors.wire.events import FailureDecidedData, FailureDecidedEvent, decision_decoder
from actors.wire.messages import EngineFault, Input, StartMessage, StartRecord, encode, input_decoder
from actors.wire.nesting import check_value_depth
from streams.ids import retry_execution_id, start_id
from streams.layout import EXEC_STREAM, START_SUBJECT
from streams.subjects import EV, IN, ExecSubjects, class_of

if TYPE_CHECKING:
    from actors.core.state import Execution

_fault = msgspec.json.Decoder(EngineFault)


class UnknownExecution(ValueError):
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


class Retrier(Writer, Reader):
    """Retry a terminal execution from a step."""

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
        old, record = await self._ride(f"reading execution {execution_id}", lambda: self._fold_log(execution_id))
        if record is None:
            raise UnknownExecution(f"no execution {execution_id!r}")
        plan = plan_retry(old, record, from_step=from_step, payload=payload)
        given = msgspec.json.encode(payload or {}, order="sorted")
        eid = retry_execution_id(execution_id, plan.retry_of.from_step, given)
        outcome = RetryOutcome(
            execution_id=eid,
            retry_of=execution_id,
            from_step=plan.retry_of.from_step,
            kept_steps=tuple(sorted(plan.retry_of.results)),
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

    async def _fold_log(self, execution_id: str) -> tuple[Execution, StartRecord | None]:
        """The execution's state at the end of its log, folded as the engine folds it
        (failure decisions read back from its records, inputs given up on skipped)."""
        from actors.core.decide import fold
        from actors.core.state import Execution
        from actors.engine.readback import read_back

        subjects = ExecSubjects.of(execution_id, self.layout.partitions)
        entries: list[tuple[str, bytes, int, float]] = await self._read_all(
            EXEC_STREAM, subjects.log, lambda subject, data, seq, at: [(subject, data, seq, at)]
        )
        recorded: dict[tuple[int, int], FailureDecidedData] = {}
        skip: set[int] = set()
        inputs: list[tuple[Input, int, float]] = []
        record: StartRecord | None = None
        for subject, data, seq, at in entries:
            cls = class_of(subject)
            if cls == EV:
                for ev in self.codec.decode(decision_decoder, data).events:
                    if isinstance(ev, FailureDecidedEvent):
                        recorded[(ev.data.activation, ev.data.attempt_number)] = ev.data
            elif cls == IN:
                try:
                    inp = self.codec.decode(input_decoder, data)
                except msgspec.DecodeError:
                    continue  # the engine dead-lettered it: it never folded it either
                if isinstance(inp, EngineFault):
                    skip.add(inp.input_seq)
                if isinstance(inp, StartRecord):
                    if inp.execution_id != execution_id:
                        continue
                    record = record or inp
                inputs.append((await read_back(self.js, inp), seq, at))
        state = Execution(execution_id=execution_id, recorded=recorded)

        def fold_all() -> None:
            for inp, seq, at in inputs:
                if seq not in skip:
                    fold(state, inp, seq=seq, at=at, subjects=subjects)

        await asyncio.to_thread(fold_all)  # templates render again: off the event loop
        return state, record


__all__ = ["Retrier", "RetryOutcome", "RetryRefused", "UnknownExecution"]
