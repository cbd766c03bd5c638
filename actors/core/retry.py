"""What an attempt's retry rules decide: shared by the engine (a step's attempts) and
the counter (each loop iteration's attempts). Pure: the caller supplies the scope and
the random unit, and records what it decides (events, timers, counts).

`after_attempt` says one of four things: try `again` (after a delay, maybe with new
args), `completed` (a collecting sequence ends with what it gathered), `exhausted`
(an error met max_attempts), or `no_rule` (the caller goes on as without rules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from actors.core.backoff import DEFAULT_ERROR_DELAY, retry_delay
from actors.core.collect import collect, collected_result
from actors.playbook.model import Collect, RetryPolicy, RetryRule
from actors.playbook.templates import render_condition, render_value


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    rule: str  # "retry[i]", for events and error messages
    policy: RetryPolicy
    last: bool  # the attempt reached max_attempts: no further attempt
    delay: float = 0.0  # before the next attempt
    next_args: dict[str, Any] | None = None  # next_call args for the next attempt


def match_retry(
    rules: list[RetryRule], scope: dict[str, Any], *, ok: bool, attempt: int, unit: float
) -> RetryVerdict | None:
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
        delay = retry_delay(
            backoff=policy.backoff,
            jitter=policy.jitter,
            attempt=attempt,
            initial=initial,
            factor=policy.factor,
            max_delay=policy.max_delay,
            unit=unit,
        )
        return RetryVerdict(rule=where, policy=policy, last=False, delay=delay, next_args=next_args)
    return None


@dataclass(slots=True)
class Gathered:
    """What a collecting retry sequence (pagination, polling) has gathered so far."""

    collect: Collect | None = None  # how, once a rule collected
    value: Any = None

    def add(self, result: Any) -> None:
        assert self.collect is not None
        self.value = collect(self.value, result, self.collect.strategy, self.collect.path)

    def final(self, result: Any, *, add: bool) -> Any:
        """The sequence's result: the last attempt's result with the value at the
        collect path replaced by what was gathered (all of it without a path); `add`:
        the last result is not gathered yet."""
        if self.collect is None:
            return result
        if add:
            self.add(result)
        return collected_result(self.value, result, self.collect.path)


@dataclass(frozen=True, slots=True)
class AfterAttempt:
    what: Literal["again", "completed", "exhausted", "no_rule"]
    verdict: RetryVerdict | None = None  # the rule that decided (none for `no_rule`, or a sequence's end)
    result: Any = None  # `completed`: the sequence's result


def after_attempt(
    rules: list[RetryRule],
    scope: dict[str, Any],
    *,
    ok: bool,
    attempt: int,
    unit: float,
    result: Any,
    gathered: Gathered,
) -> AfterAttempt:
    """What the rules decide after `attempt` (`ok`: it returned `result`). A rule that
    collects adds `result` to `gathered`. Raises TemplateError like `match_retry`."""
    verdict = match_retry(rules, scope, ok=ok, attempt=attempt, unit=unit)
    if verdict is not None:
        if ok and verdict.policy.collect is not None:
            gathered.collect = verdict.policy.collect
            gathered.add(result)
        if not verdict.last:
            return AfterAttempt("again", verdict)
        if ok:
            # a continuation that hit its bound: it completes with what it gathered
            return AfterAttempt("completed", verdict, gathered.final(result, add=False))
        return AfterAttempt("exhausted", verdict)
    if ok and gathered.collect is not None:
        return AfterAttempt("completed", None, gathered.final(result, add=True))
    return AfterAttempt("no_rule")
