"""What a retry of a terminal execution starts from: a pure function of the old
execution's folded state (actors/core/state.py) and its start record.

A retry is a new execution of the same playbook version. It enters `from_step` first
(by default the step of the old execution's root failure) and has in scope, from its
start, the value `{{ step }}` had when the old execution ended, for every step that
completed there at least once (a loop step's whole list, a step visited more than once
its last completed visit). `from_step`'s own result is dropped:
it runs again. Steps the retry visits again replace their kept result; parallel
branches that are not downstream of `from_step` are not run again (their results stay
in scope). The retry's payload is the old start payload with the given one merged over
it (mappings merge, the rest replaces), and the playbook's workload under both, as for
any start. Everything is copied into the retry's start record (`RetryOf`), so the
retry's fold never reads the old log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.errors import UserError
from actors.playbook.model import END
from actors.wire.messages import RetryOf, StartRecord

if TYPE_CHECKING:
    from actors.core.state import Execution


class RetryRefused(UserError, ValueError):
    """The execution cannot be retried as asked; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """The start of a retry: the same playbook version, the merged payload, and what
    its start record carries over (`retry_of`)."""

    playbook_path: str
    playbook_version: int | None
    payload: dict[str, Any]
    retry_of: RetryOf


def plan_retry(
    old: Execution, record: StartRecord, *, from_step: str | None = None, payload: dict[str, Any] | None = None
) -> RetryPlan:
    """The retry of `old` (its state at the end of its log, `record` its start record)
    from `from_step`, or from the step of its root failure. Raises RetryRefused when
    `old` is not terminal, never reached a step, or `from_step` is not a step it entered."""
    # imported here: work.py brings the template engine, and every CLI command imports
    # RetryRefused from this module (through actors.client) before it does anything
    from actors.core.work import deep_merge

    eid = old.execution_id
    if not old.terminal:
        raise RetryRefused(
            f"execution {eid} is {old.status}: only a terminal execution (COMPLETED, FAILED, CANCELLED) "
            "can be retried; wait for it or cancel it first"
        )
    if old.playbook is None:
        raise RetryRefused(
            f"execution {eid} failed before its first step (its playbook or start record was unusable): "
            "start it again instead"
        )
    entered = list(dict.fromkeys(a.step for a in old.activations.values() if a.step != END))
    if from_step is None:
        failed = old.root_failure[0] if old.root_failure is not None else None
        if failed is None or failed == END or failed not in entered:
            raise RetryRefused(
                f"execution {eid} is {old.status} with no failed step to retry from: name one with --from "
                f"(steps it entered: {', '.join(entered)})"
            )
        from_step = failed
    elif from_step == END:
        raise RetryRefused(f"a retry cannot start from '{END}': name a step of execution {eid} with --from")
    elif from_step not in old.playbook.steps:
        raise RetryRefused(
            f"playbook {old.playbook_path} has no step '{from_step}' (steps: {', '.join(old.playbook.steps)})"
        )
    elif from_step not in entered:
        raise RetryRefused(
            f"step '{from_step}' never ran in execution {eid}: --from takes a step it entered ({', '.join(entered)})"
        )
    kept = {step: result for step, result in old.results.items() if step not in (from_step, END)}
    return RetryPlan(
        playbook_path=record.playbook_path,
        playbook_version=record.playbook_version,
        payload=deep_merge(record.payload, payload or {}),
        retry_of=RetryOf(execution_id=eid, from_step=from_step, results=kept),
    )
