"""Which retry rule matches an attempt, and what it asks for: shared by the engine (a
step's attempts) and the counter (each loop iteration's attempts). Pure: the caller
supplies the scope and the random unit, and records what it decides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.core.backoff import DEFAULT_ERROR_DELAY, retry_delay
from actors.playbook.model import RetryPolicy, RetryRule
from actors.playbook.templates import render_condition, render_value


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    rule: str  # "retry[i]", for events and error messages
    policy: RetryPolicy
    last: bool  # the attempt reached max_attempts: no further attempt
    delay: float = 0.0  # before the next attempt
    next_args: dict[str, Any] | None = None  # next_call args for the next attempt


def match_retry(rules: list[RetryRule], scope: dict[str, Any], *, ok: bool, attempt: int, unit: float) -> RetryVerdict | None:
    """The first rule whose `when` holds after `attempt`, or None. `scope` must hold
    `result`, `error` and `attempt`. Raises TemplateError (naming the rule) when a
    `when` or `next_call` cannot be rendered."""
    for i, rule in enumerate(rules):
        where = f"retry[{i}]"
        if not render_condition(rule.when, scope, where=f"{where}.when"):
            continue
        policy = rule.then
        if attempt >= policy.max_attempts:
            return RetryVerdict(rule=where, policy=policy, last=True)
        next_args = None
        if ok and policy.next_call is not None:
            next_args = render_value(policy.next_call.args, scope, where=f"{where}.then.next_call.args")
        initial = policy.initial_delay
        if initial is None:
            initial = DEFAULT_ERROR_DELAY if not ok else 0.0
        delay = retry_delay(backoff=policy.backoff, jitter=policy.jitter, attempt=attempt, initial=initial,
                            factor=policy.factor, max_delay=policy.max_delay, unit=unit)
        return RetryVerdict(rule=where, policy=policy, last=False, delay=delay, next_args=next_args)
    return None
