"""Every id that de-duplication depends on, built in one place (pure).

Message ids (`Nats-Msg-Id`): every publish carries one derived from what it is, never
from a clock or a counter, so a replay after a crash (or a second actor doing the same
work) sends the same id and the stream keeps one copy within its duplicate window.
Where a message must be recognised beyond the window, the actors look for it in the
log instead (by cause or by subject); the ids here still keep a quick re-send single.

Writers that must agree use the same builder: a tool actor, the dead-letter watcher
and the engine (a child execution answering its parent) all answer a command, and
only one answer may land, so all three call `result_id`.

Command, child execution and timer ids are tokens of subjects: no dots.
"""

from __future__ import annotations

import datetime
import hashlib

# --- message ids ------------------------------------------------------------------------


def start_id(execution_id: str) -> str:
    """A start message on `start`: one execution per id."""
    return execution_id


def start_record_id(execution_id: str) -> str:
    """The starter's start record in the execution's log."""
    return f"{execution_id}:start"


def start_copy_id(execution_id: str) -> str:
    """A plain copy of the start stored with its first decision (semantics 6), written on
    `in.start` before a roll back to an engine of semantics 5 (`Client.prepare_rollback`),
    which then halts the execution instead of misreading it: once per execution."""
    return f"{execution_id}:start:copy"


def retried_id(execution_id: str, retry_execution_id: str) -> str:
    """The link from a retried execution to one retry of it (`in.retried`)."""
    return f"{execution_id}:retried:{retry_execution_id}"


def command_msg_id(execution_id: str, command_id: str) -> str:
    return f"{execution_id}:cmd:{command_id}"


def result_id(execution_id: str, command_id: str) -> str:
    """The one answer to a command (`call.done`/`call.error`/`chunk.done`), whoever sends it."""
    return f"{execution_id}:res:{command_id}"


def result_batch_id(execution_id: str, loop_id: str, digest: str) -> str:
    """Several iteration answers of one loop in one message: `digest` names its entries."""
    return f"{execution_id}:res:{loop_id}:{digest}"


def output_id(execution_id: str, command_id: str, iteration_index: int | None = None) -> str:
    """What one command (or one iteration of a chunk) printed: a redelivered command
    that runs again within the window keeps the first copy."""
    return f"{execution_id}:out:{command_id}" + ("" if iteration_index is None else f":{iteration_index}")


def output_part_id(execution_id: str, command_id: str, iteration_index: int | None, delivery: int, part: int) -> str:
    """Part `part` of what one delivery of a command (or one iteration of a chunk)
    printed while it ran: the same part sent twice is stored once, and a redelivered
    command run again writes its own parts beside the first run's (readers show the
    last delivery's), never over them."""
    return f"{output_id(execution_id, command_id, iteration_index)}:d{delivery}:{part}"


def output_delivery_id(execution_id: str, command_id: str, iteration_index: int | None, delivery: int) -> str:
    """The `step.output` of one delivery: the first delivery's id is `output_id` (as
    before deliveries were counted); a later delivery run again writes its own."""
    base = output_id(execution_id, command_id, iteration_index)
    return base if delivery <= 1 else f"{base}:d{delivery}"


def decision_id(execution_id: str, cause: int) -> str:
    """The decision record of the input at stream sequence `cause`."""
    return f"{execution_id}:ev:{cause}"


def lifecycle_id(execution_id: str, event_type: str) -> str:
    """A lifecycle event happens once per execution."""
    return f"{execution_id}:lc:{event_type}"


def halted_id(execution_id: str, where: str, input_seq: int, round_: int = 0) -> str:
    """A replay of `where` (the engine's log, or a loop's: `counter:<loop_id>`) halted the
    execution at the input at `input_seq`: recorded once however often it is met.
    `round_` is how many times the log shows that halt resumed: a halt at the same input
    after a resume is a new event (the server would drop a repeated id as a duplicate,
    leaving the execution stuck with a RUNNING status)."""
    tail = f":{round_}" if round_ else ""  # round 0 keeps the id earlier releases wrote
    return f"{execution_id}:lc:execution.halted:{where}:{input_seq}{tail}"


def resumed_id(execution_id: str, halted_seq: int, where: str = "engine", round_: int = 0) -> str:
    """A replay that matches again ends the halt of `where` at `halted_seq` (its
    `round_`-th resume: see `halted_id`)."""
    if where == "engine" and not round_:
        return f"{execution_id}:lc:execution.resumed:{halted_seq}"  # the id earlier releases wrote
    return f"{execution_id}:lc:execution.resumed:{where}:{halted_seq}:{round_}"


def fault_id(execution_id: str, input_seq: int) -> str:
    """The engine gave up on the input at `input_seq`."""
    return f"{execution_id}:fault:{input_seq}"


def cancel_id(execution_id: str) -> str:
    """A cancel request: an execution is cancelled once, whoever asks."""
    return f"{execution_id}:cancel"


def signal_msg_id(execution_id: str, signal_id: str) -> str:
    """A signal: sent twice under the same id, it is one signal (the fold also keeps the
    ids it has taken, past the duplicate window)."""
    return f"{execution_id}:signal:{signal_id}"


def signal_forward_id(execution_id: str, loop_id: str, signal_id: str) -> str:
    """A signal the engine hands to a waiting loop's log (LoopSubjects.signal)."""
    return f"{execution_id}:{loop_id}:signal:{signal_id}"


def loop_spec_id(execution_id: str, loop_id: str) -> str:
    return f"{execution_id}:loop:{loop_id}"


def loop_cancel_id(execution_id: str, loop_id: str) -> str:
    return f"{execution_id}:loopcancel:{loop_id}"


def failed_item_id(execution_id: str, loop_id: str, index: int) -> str:
    """A loop iteration's failure record (one per iteration: it is counted once)."""
    return f"{execution_id}:{loop_id}:fail:{index}"


def verdict_id(execution_id: str, loop_id: str) -> str:
    """The counter's verdict on a loop, in the execution's inputs."""
    return f"{execution_id}:iterator:{loop_id}"


def timer_owner(execution_id: str, loop_id: str | None = None) -> str:
    """Whose timers: an execution's (retry delays, routing resumes) or a loop's."""
    return execution_id if loop_id is None else f"{execution_id}:{loop_id}"


def schedule_id(owner: str, timer_id: str) -> str:
    """A durable timer's schedule (`sch`)."""
    return f"{owner}:sch:{timer_id}"


def timer_id_msg(owner: str, timer_id: str) -> str:
    """A timer already due, delivered at once instead of scheduled."""
    return f"{owner}:timer:{timer_id}"


def index_entry_id(execution_id: str) -> str:
    """An execution's entry in stream INDEX: one per execution, whichever projector pod
    (or re-delivery) writes it."""
    return f"{execution_id}:index"


def index_end_id(execution_id: str) -> str:
    """An execution's final status in stream INDEX: one per execution (a terminal state never changes)."""
    return f"{execution_id}:index:end"


def dead_letter_id(source: str, stream: str, seq: int) -> str:
    """The dead letter for message `seq` of `stream`: whoever gives up on it (the actor
    on its last delivery, the max-deliveries watcher after it), and however often, one
    letter is kept."""
    return f"dlq:{source}:{stream}:{seq}"


def schedule_definition_id(name: str, revision: int) -> str:
    """A schedule's cron definition, as of revision `revision` of its entry in KV
    `schedules`: a resume (a new revision) is never dropped as a duplicate of the add."""
    return f"schedule:{name}:{revision}"


# --- ids inside subjects ----------------------------------------------------------------


def step_command_id(activation: int, attempt: int) -> str:
    """The command of one attempt of one step activation."""
    return f"{activation}-{attempt}"


def iteration_command_id(loop_id: str, first_index: int, attempt: int, *, chunk: bool) -> str:
    """The command of one attempt of one loop iteration (or of a chunk starting there)."""
    return f"{loop_id}{'c' if chunk else 'x'}{first_index}-{attempt}"


def attempt_of(command_id: str) -> int:
    """The attempt a command id names (both kinds end in `-<attempt>`)."""
    return int(command_id.rsplit("-", 1)[-1]) if "-" in command_id else 1


def child_execution_id(execution_id: str, command_id: str) -> str:
    """A child execution (`tool: playbook`): deterministic, so a replay or a second
    engine starts the same child, never two."""
    return "c" + hashlib.blake2b(f"{execution_id}/{command_id}".encode(), digest_size=12).hexdigest()


def scheduled_execution_id(schedule: str, fire_epoch: float) -> str:
    """The execution a schedule's fire starts: the schedule's name and the fire time, to
    the second (cron's resolution), in UTC. A fire delivered again, to any starter,
    after any restart, starts the same execution, never a second one."""
    stamp = datetime.datetime.fromtimestamp(int(fire_epoch), datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{schedule}-{stamp}"


def schedule_run_id(schedule: str, request: str) -> str:
    """A fire sent by hand (`run now`), as asked by one request: a request sent twice (a
    double click, a retried POST) is stored once, so it starts one execution."""
    return f"schedule-run:{schedule}:{request}"


def retry_execution_id(execution_id: str, from_step: str, payload_json: bytes) -> str:
    """The execution that retries `execution_id` from `from_step` with the payload given
    for the retry (its JSON with sorted keys; `{}` for none): the same retry asked twice
    is one execution, never two. A subject token and KV key like any execution id."""
    digest = hashlib.blake2b(b"\0".join([execution_id.encode(), from_step.encode(), payload_json]), digest_size=12)
    return "r" + digest.hexdigest()
