"""JSON Schema of the playbook *as users write it* (docs/language.md), for editors.

It starts from the schema of the normalised model (`msgspec.json.schema(Playbook)`)
and widens the fields the loader accepts in shorthand:

- `tool`: a kind name (`tool: python`) or the tool mapping;
- `next`: a step name, a list of step names, or a list of rules (`{when?, then}` with
  `then` a name or a list of names, or `{else}`), or one such rule;
- `retry`: a count, a policy mapping, one rule, or a list of rules;
- `on_error`: one rule or a list of rules;
- `on_failure`: a step name, one edge, or a list of names and `{when?, step}` edges;
- `loop.tolerated_failures`: a count, a digit string, or a percentage.

The schema describes shapes only; the loader also checks what a schema cannot (step
references, template names, duplicate step names).
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from actors.playbook.model import LOADER_FIELDS, TOOL_KINDS, Playbook

__all__ = ["playbook_schema"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{name}"}


def _nullable(*alternatives: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*alternatives, {"type": "null"}], "default": None}


def playbook_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) editors use to check a playbook's YAML form."""
    schema: dict[str, Any] = copy.deepcopy(msgspec.json.schema(Playbook))
    defs: dict[str, Any] = schema["$defs"]
    for name in LOADER_FIELDS:  # filled in by the loader: not the user's to write
        defs["Playbook"]["properties"].pop(name, None)
    step = defs["Step"]["properties"]

    defs["StepName"] = dict(step["step"])
    step["step"] = _ref("StepName")
    targets = {"anyOf": [_ref("StepName"), {"type": "array", "items": _ref("StepName"), "minItems": 1}]}

    # tool: a bare kind name or the mapping
    defs["ToolKind"] = {"type": "string", "enum": list(TOOL_KINDS)}
    defs["AnyTool"] = step["tool"]
    defs["ToolSpec"] = {"anyOf": [_ref("ToolKind"), _ref("AnyTool")]}
    step["tool"] = _ref("ToolSpec")
    defs["Sink"]["properties"]["tool"] = _ref("ToolSpec")
    # sink: also the design documents' flat shape, the tool's fields beside `tool: <kind>`
    defs["FlatSink"] = {
        "title": "FlatSink",
        "type": "object",
        "properties": {"tool": _ref("ToolKind"), "args": {"type": "object"}},
        "required": ["tool"],
        "additionalProperties": True,
    }
    step["sink"] = _nullable(_ref("Sink"), _ref("FlatSink"))

    # next
    defs["NextWhenRule"] = {
        "title": "NextWhenRule",
        "type": "object",
        "properties": {"when": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "then": targets},
        "required": ["then"],
        "additionalProperties": False,
    }
    defs["NextElseRule"] = {
        "title": "NextElseRule",
        "type": "object",
        "properties": {"else": targets},
        "required": ["else"],
        "additionalProperties": False,
    }
    rule = {"anyOf": [_ref("NextWhenRule"), _ref("NextElseRule")]}
    step["next"] = _nullable(
        _ref("StepName"),
        {"type": "array", "items": _ref("StepName"), "minItems": 1},
        {"type": "array", "items": rule, "minItems": 1},
        rule,
    )

    # retry
    step["retry"] = _nullable(
        {"type": "integer", "minimum": 1},
        _ref("RetryPolicy"),
        _ref("RetryRule"),
        {"type": "array", "items": _ref("RetryRule")},
    )

    # on_error
    step["on_error"] = _nullable(_ref("OnErrorRule"), {"type": "array", "items": _ref("OnErrorRule")})

    # on_failure
    step["on_failure"] = _nullable(
        _ref("StepName"),
        _ref("FailureEdge"),
        {"type": "array", "items": {"anyOf": [_ref("StepName"), _ref("FailureEdge")]}},
    )
    defs["FailureEdge"]["properties"]["step"] = _ref("StepName")
    defs.pop("NextRule", None)  # the model's form of a rule; users write the two above

    # loop.tolerated_failures: also a digit string
    tolerated = defs["Loop"]["properties"]["tolerated_failures"]
    tolerated["anyOf"] = [*tolerated["anyOf"], {"type": "string", "pattern": r"^\s*\d+\s*$"}]

    _describe(defs)
    return {"$schema": _DIALECT, "title": "Playbook", **schema}


def _describe(defs: dict[str, Any]) -> None:
    """A description on every property (editors show it on hover); docs/language.md says more."""
    for name, props in FIELD_DOCS.items():
        for prop, text in props.items():
            defs[name]["properties"][prop]["description"] = text


_TOOL_COMMON = {
    "kind": "the tool kind",
    "credential": "a credential's name (never rendered, never a secret), resolved by the tool actor "
    "(http: headers; python: main's `credential` argument; shell: variables); noop and sleep ignore it",
}
_STEP_NAMES = "a step name, or a list of them (parallel branches)"
_WHEN = 'a condition, as a template ("{{ result.ok }}"); absent: always'
# every property of every object in the schema, by definition:
# tests/integration/test_cli_help_and_validate.py checks none is missing
FIELD_DOCS: dict[str, dict[str, str]] = {
    "Playbook": {
        "apiVersion": "actors/v1 (noetl.io/v2 is read as the same language)",
        "kind": "always Playbook",
        "metadata": "name, catalog path, version, description",
        "workflow": "the steps, in order; an execution begins at the first",
        "workload": "defaults for templates (`workload`); the start payload is deep-merged over them",
        "limits": "bounds this playbook sets on its executions (the pod's own bounds still hold)",
    },
    "Metadata": {
        "name": "the playbook's name (required)",
        "path": "the catalog key `register` stores it under and `start PATH` names; default: name",
        "version": "informational; the catalog numbers registered versions itself",
        "description": "free text",
    },
    "PlaybookLimits": {
        "max_steps": "the most steps (visits) one execution may enter; the smaller of this and ACTORS_MAX_STEPS",
    },
    "Step": {
        "step": "unique name, [a-z0-9_]+; templates read the step's result by it",
        "desc": "free text",
        "tool": "what the step runs: a kind name (`python`) or {kind, ...}; none: a router whose result is its args",
        "args": "a mapping rendered as templates and handed to the tool",
        "next": "where to go on success: a step, a list (parallel branches) or rules (first match wins); none: end",
        "loop": "run the tool once per element of a collection; the result is the list of results",
        "retry": "rules looked at after every attempt: a count, a policy, a rule or a list of rules",
        "sink": "a second tool run after each successful attempt, in the same command; its failure fails the attempt",
        "on_error": "rules deciding what a failure means (first match): none, abort, ignore, cancel, retry, ...",
        "on_failure": "remediation steps taken when the step is still failed: a step, an edge or a list",
        "timeout": "seconds one attempt may take (> 0); past it the attempt fails with Timeout",
    },
    "PythonTool": {
        **_TOOL_COMMON,
        "code": "Python source defining main(**args); its return value is the result",
        "env": "environment variables for this call, over the clean environment (PATH, HOME, LANG, TMPDIR)",
    },
    "HttpTool": {
        **_TOOL_COMMON,
        "url": "the URL (required)",
        "method": "HTTP method (default GET)",
        "params": "query parameters",
        "headers": "request headers",
        "json": "a JSON body; without json or body, args go in the query (GET, DELETE, HEAD, OPTIONS) or body",
        "body": "a text body",
        "timeout": "seconds for the request; the step's timeout also holds, the smaller wins",
        "raise_for_status": "a status >= 400 fails the attempt with HTTPError (default true)",
    },
    "ShellTool": {
        **_TOOL_COMMON,
        "command": "run by /bin/sh -c; args are exported as ARG_<NAME>; a non-zero exit is ShellError",
        "env": "environment variables over the clean environment (PATH, HOME, LANG, TMPDIR)",
        "cwd": "the working directory",
    },
    "PlaybookTool": {
        **_TOOL_COMMON,
        "path": "catalog path of the child playbook; the step's args are its payload",
        "version": "catalog version of the child (default: the latest)",
    },
    "NoopTool": dict(_TOOL_COMMON),
    "SleepTool": {**_TOOL_COMMON, "seconds": "how long to wait (an arg `seconds` wins)"},
    "WaitTool": {
        **_TOOL_COMMON,
        "signal": "the name of the signal the step waits for (actors-cli signal ID NAME)",
        "key": "a template: only a signal sent with this key (in a loop, each iteration its own)",
        "when": "a condition over `signal` ({name, key, data, by, sent_at}): only a signal for which it holds",
        "until": "a template rendering to an ISO 8601 time: a timer to that date, or the signal wait's deadline",
        "zone": "an IANA time zone for an `until` without an offset (default UTC)",
        "approval": "the UI offers approve / reject; a rejection fails the step with Rejected",
    },
    "DuckdbTool": {
        **_TOOL_COMMON,
        "query": "SQL run by DuckDB (statements in order, the last one's rows the result); $name parameters "
        "bound from the args; never rendered",
        "max_rows": "the most rows a result may hold (default 10000); more fail the step TooManyRows",
        "database": "a DuckDB file in an allowed directory (ACTORS_DUCKDB_DIRS); default: in-memory",
        "inputs": "name -> a list of mappings (or values): each a temporary table the SQL reads",
        "memory": "MiB DuckDB may use (default 1024); past it OutOfMemoryException",
        "threads": "DuckDB threads for the query (default 1)",
    },
    "PostgresTool": {
        **_TOOL_COMMON,
        "query": "SQL (or a list of statements), one transaction; %(name)s parameters bound from the args; "
        "never rendered",
        "auth": "{type: postgres, credential: NAME}: the credential, as the design documents write it",
        "max_rows": "the most rows a result may hold (default 10000); more fail the step TooManyRows",
        "table": "write rows (the arg `rows`; a sink without args: the result) into this table (or schema.table), "
        "instead of a query",
        "mode": "a table write: append (COPY), upsert (ON CONFLICT on `key`) or replace (delete, then COPY)",
        "key": "upsert: the columns of a unique index",
        "columns": "the columns written (default: the union of the rows' keys)",
        "ledger": "the table recording each command's write, so a redelivery writes nothing twice "
        "(default actors_ledger)",
        "once": "a query recorded in the ledger: a redelivered command does not run it again",
    },
    "PostgresAuth": {
        "type": "always postgres",
        "credential": "the credential's name (host, port, database, user, password, sslmode, or dsn)",
    },
    "Loop": {
        "collection": "a list, or a template rendering to one; rendered once, before any iteration",
        "element": "the name each element takes in the step's templates",
        "mode": "sequential (one at a time), async (up to concurrency), chunked (chunk_size per command)",
        "concurrency": "iterations in flight at once (default 50)",
        "chunk_size": "iterations per command in chunked mode (default 100)",
        "tolerated_failures": 'failed iterations accepted: a count or a percentage ("5%"); one more fails the loop',
    },
    "RetryRule": {"then": "the retry policy this rule applies", "when": _WHEN},
    "RetryPolicy": {
        "max_attempts": "attempts in all, the first included (default 3)",
        "backoff": "fixed, linear or exponential (default) growth of the delay",
        "initial_delay": "seconds; default 0.5 after an error, 0 after a success (pagination)",
        "factor": "base of exponential backoff (default 2)",
        "max_delay": "the longest delay, seconds (default 60)",
        "jitter": "none, full or equal; deterministic, so a replay takes the same delays",
        "next_call": "the next attempt's args, rendered with this attempt's result (pagination)",
        "collect": "accumulate results over the attempts",
    },
    "NextCall": {"args": "the next attempt's args (templates; `result` is this attempt's)"},
    "Collect": {
        "strategy": "append (lists concatenated), merge (mappings, later wins) or replace (the last)",
        "path": "dotted path of the value to accumulate; none: whole results",
    },
    "Sink": {"tool": "the sink's tool", "args": "its args (templates; `result` is the attempt's result)"},
    "FlatSink": {
        "tool": "the sink tool's kind; its fields beside it (`sink: {tool: postgres, table: t, mode: append}`)",
        "args": "its args (templates; `result` is the attempt's result)",
    },
    "OnErrorRule": {
        "decision": "none, abort, ignore, cancel, retry, retry_later or handled",
        "when": _WHEN,
        "result": "ignore: the step's result instead (default null)",
        "delay": "retry_later: seconds to wait (default 60)",
        "args": "retry: the new attempt's args",
    },
    "FailureEdge": {"step": "the remediation step", "when": _WHEN},
    "NextWhenRule": {"when": _WHEN, "then": _STEP_NAMES},
    "NextElseRule": {"else": _STEP_NAMES + ", when no rule before matched"},
}
