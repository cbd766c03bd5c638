"""Typed model of a playbook (docs/language.md), as msgspec Structs.

The model is the contract between the loader (YAML -> Structs, with errors that name
file, line, step and field) and the engine's pure core. Every Struct forbids unknown
fields: a misspelt key is an error, never silently ignored.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

StepName = Annotated[str, Meta(pattern=r"^[a-z0-9_]+$", min_length=1, max_length=128)]
# A year: a delay or timeout must be a finite time a timer can be set to (`.inf` or 1e300
# overflow the clock; 1e11 would keep an execution RUNNING for millennia)
MAX_SECONDS = 365 * 24 * 3600.0
Seconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
Delay = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
END = "end"
SIGNAL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a signal's name (`tool: wait`, `actors-cli signal`)


class _Strict(Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


# --- tools ---------------------------------------------------------------------------


class _Tool(_Strict, tag_field="kind"):
    credential: str | None = None


class PythonTool(_Tool, tag="python"):
    code: str = ""
    env: dict[str, Any] | str | None = None


class HttpTool(_Tool, tag="http"):
    url: str = ""
    method: str = "GET"
    params: dict[str, Any] | str | None = None
    headers: dict[str, Any] | str | None = None
    json: Any = None
    body: str | None = None
    timeout: Seconds | None = None
    raise_for_status: bool | str = True


class ShellTool(_Tool, tag="shell"):
    command: str = ""
    env: dict[str, Any] | str | None = None
    cwd: str | None = None


class PlaybookTool(_Tool, tag="playbook"):
    path: str = ""
    version: int | str | None = None


class NoopTool(_Tool, tag="noop"):
    pass


class SleepTool(_Tool, tag="sleep"):
    seconds: float | str = 0.0


class WaitTool(_Tool, tag="wait"):
    """A step that waits for something outside the execution (docs/language.md, Waiting):
    a signal named `signal` (sent to this execution, with `key` when the step names one;
    in a loop, each iteration its own key), whose `when` holds over it; or a date
    (`until`, ISO 8601, UTC unless it carries an offset or `zone` names one). With both,
    `until` is the deadline. The step's `timeout` (seconds from when it starts waiting)
    bounds a signal wait too; past it, or past `until`, a signal wait fails with
    `WaitTimeout`, an ordinary failure. Decided by the engine (and, in a loop, the
    counter): no tool actor runs it. `approval`: the UI offers approve / reject; the
    signal's data is `{approved, comment, by}`, and a rejection fails the step with
    `Rejected`."""

    signal: str | None = None
    key: str = ""  # a template
    when: str | None = None  # a condition; `signal` in scope: {name, key, data, by, sent_at}
    until: str | None = None  # a template rendering to an ISO 8601 time (or epoch seconds)
    zone: str | None = None  # an IANA zone for an `until` without an offset (default UTC)
    approval: bool = False

    def __post_init__(self) -> None:
        if self.signal is None and self.until is None:
            raise ValueError("a wait step waits for a `signal`, or `until` a time, or both")
        if self.approval and self.signal is None:
            raise ValueError("`approval` waits for a signal: name it (`signal`)")
        if self.signal is not None and not SIGNAL_NAME.match(self.signal):
            raise ValueError("`signal` is a name: letters, digits, `_`, `-`, at most 64 characters")
        if self.credential is not None:
            raise ValueError("a wait step takes no credential")


class DuckdbTool(_Tool, tag="duckdb"):
    query: str = ""  # never rendered: values reach it as bound parameters ($name) from the args
    max_rows: int | str = 10_000
    database: str | None = None
    inputs: dict[str, Any] | str | None = None
    memory: int | str = 1024
    threads: int | str = 1


class PostgresAuth(_Strict):
    """The design documents' spelling of a postgres credential: `auth: {type: postgres, credential: NAME}`."""

    credential: str
    type: Literal["postgres"] = "postgres"


class PostgresTool(_Tool, tag="postgres"):
    query: str | list[str] = ""  # never rendered: values reach it as bound parameters (%(name)s) from the args
    auth: PostgresAuth | None = None
    max_rows: int | str = 10_000
    # a table write instead of a query (actors/tools/pgwrite.py): rows from the args' `rows`
    table: str | None = None
    mode: Literal["append", "upsert", "replace"] = "append"
    key: list[str] | None = None
    columns: list[str] | None = None
    ledger: str | None = None  # the exactly-once ledger's table (default actors_ledger)
    once: bool = False  # a query recorded in the ledger: run once per command

    def __post_init__(self) -> None:
        if self.table is not None and self.query:
            raise ValueError("a postgres tool has `query` or `table`, not both")
        if self.table is None and (self.key is not None or self.columns is not None or self.mode != "append"):
            raise ValueError("`mode`, `key` and `columns` are for a table write (`table`)")
        if self.mode == "upsert" and not self.key:
            raise ValueError("mode upsert needs `key`: the columns of a unique index")
        if self.mode != "upsert" and self.key is not None:
            raise ValueError(f"`key` is for mode upsert, not {self.mode}")


Tool = PythonTool | HttpTool | ShellTool | PlaybookTool | NoopTool | SleepTool | WaitTool | DuckdbTool | PostgresTool
TOOL_KINDS = ("python", "http", "shell", "playbook", "noop", "sleep", "wait", "duckdb", "postgres")
# Tool fields that are code or identity, never rendered as templates.
UNRENDERED_TOOL_FIELDS = frozenset({"kind", "code", "credential", "query", "auth"})


# --- routing -------------------------------------------------------------------------


class NextRule(_Strict):
    """One routing rule. `when` absent means always (an `else`)."""

    then: list[StepName] = field(default_factory=list)
    when: str | None = None


class Sink(_Strict):
    tool: Tool
    args: dict[str, Any] = field(default_factory=dict)


# --- loops ---------------------------------------------------------------------------


class Loop(_Strict):
    collection: Any
    element: StepName
    mode: Literal["sequential", "async", "chunked"] = "async"
    concurrency: Annotated[int, Meta(ge=1)] = 50
    chunk_size: Annotated[int, Meta(ge=1)] = 100
    # a count ("3" or 3) or a percentage ("5%")
    tolerated_failures: Annotated[int, Meta(ge=0)] | Annotated[str, Meta(pattern=r"^\d+(\.\d+)?%$")] = 0


# --- retry ---------------------------------------------------------------------------


class NextCall(_Strict):
    args: dict[str, Any] = field(default_factory=dict)


class Collect(_Strict):
    strategy: Literal["append", "replace", "merge"] = "append"
    path: str | None = None


class RetryPolicy(_Strict):
    max_attempts: Annotated[int, Meta(ge=1)] = 3
    backoff: Literal["fixed", "linear", "exponential"] = "exponential"
    # None: 0.5 s after an error, no delay before a success continuation (pagination)
    initial_delay: Delay | None = None
    factor: Annotated[float, Meta(ge=1, le=1000)] = 2.0
    max_delay: Delay = 60.0
    jitter: Literal["none", "full", "equal"] = "none"
    next_call: NextCall | None = None
    collect: Collect | None = None


class RetryRule(_Strict):
    then: RetryPolicy
    when: str | None = None


# --- failure -------------------------------------------------------------------------

Decision = Literal["none", "abort", "ignore", "cancel", "retry", "retry_later", "handled"]


class OnErrorRule(_Strict):
    decision: Decision = "none"
    when: str | None = None
    result: Any = None
    delay: Delay | None = None
    args: dict[str, Any] | None = None


class FailureEdge(_Strict):
    step: StepName
    when: str | None = None


# --- steps and playbook --------------------------------------------------------------


class Step(_Strict):
    step: StepName
    desc: str | None = None
    tool: Tool = field(default_factory=NoopTool)
    args: dict[str, Any] = field(default_factory=dict)
    next: list[NextRule] | None = None  # None: implicit `end`
    loop: Loop | None = None
    retry: list[RetryRule] | None = None
    sink: Sink | None = None
    on_error: list[OnErrorRule] | None = None
    on_failure: list[FailureEdge] | None = None
    timeout: Seconds | None = None

    def targets(self) -> list[str]:
        """Every step this step may route to on success (implicit `end` included)."""
        if self.next is None:
            return [] if self.step == END else [END]
        return [t for rule in self.next for t in rule.then]


class Metadata(_Strict):
    name: Annotated[str, Meta(min_length=1)]
    path: str | None = None
    version: Annotated[int, Meta(ge=1)] | None = None
    description: str | None = None

    @property
    def catalog_path(self) -> str:
        return self.path or self.name


class PlaybookLimits(_Strict):
    """Bounds a playbook sets on its own executions. The pod's bounds (wire.Limits, fixed
    in each start record) still hold: where both set one, the smaller wins."""

    # steps (activations) one execution may enter; bounds a cycle of any steps
    max_steps: Annotated[int, Meta(ge=1)] | None = None


class Playbook(_Strict, dict=True):  # dict=True: room for the cached step index
    apiVersion: Literal["actors/v1", "noetl.io/v2"]
    kind: Literal["Playbook"]
    metadata: Metadata
    workflow: Annotated[list[Step], Meta(min_length=1)]
    workload: dict[str, Any] = field(default_factory=dict)
    limits: PlaybookLimits | None = None
    # filled in by the loader, never written by the user (LOADER_FIELDS): the 1-based
    # line of the playbook where each python step's code starts, so a traceback names
    # the YAML's line (the command's `code_at`). A field, not an attribute: a playbook
    # loaded in a render process comes back encoded, and must come back the same.
    code_lines: dict[str, int] = field(default_factory=dict)

    def step(self, name: str) -> Step:
        return self.steps[name]

    @cached_property
    def steps(self) -> dict[str, Step]:
        """By name, built once: the engine looks a step up on every visit, and a scan of
        a long workflow on each would make a long chain quadratic. Nothing mutates a
        Playbook, so the index never goes stale."""
        return {s.step: s for s in self.workflow}

    @property
    def entry(self) -> str:
        return self.workflow[0].step


LOADER_FIELDS = frozenset({"code_lines"})


def playbook_json_schema() -> dict[str, Any]:
    """JSON Schema of the *normalised* playbook form (what editors check against): what
    a user writes, so not the fields the loader fills in."""
    schema = msgspec.json.schema(Playbook)
    for definition in schema.get("$defs", {}).values():
        if definition.get("title") == "Playbook":
            for name in LOADER_FIELDS:
                definition.get("properties", {}).pop(name, None)
    return schema
