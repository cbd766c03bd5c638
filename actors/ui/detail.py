"""What the execution page shows of one execution, built from its status, its log and
its start record: the graph and the timeline (actors/ui/graph.py, timeline.py), the
result, the root cause and the failure envelope, and its relations (parent and
children, the execution it retries and those retrying it).

Never reads stream LOOP: a loop of 100,000 iterations is, in the execution's own log,
the same few events as a loop of 10 (its live counters come from the counter's progress
messages, which the page's stream passes in as `loops`). A playbook is parsed once per
version, and a failure envelope (a fold of the whole log) is rebuilt once per finished
execution (`DetailCache`).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec

from actors.client import Client, LogItem
from actors.playbook.loader import parsed_playbook
from actors.playbook.model import Playbook
from actors.playbook.templates import RenderFault
from actors.runtime.render_process import OffLoop
from actors.ui.graph import execution_graph
from actors.ui.listing import row_of
from actors.ui.timeline import step_timeline
from actors.wire.events import TERMINAL_EVENTS, TERMINAL_STATES
from actors.wire.messages import ExecutionStatus, LoopProgress, StartRecord

RESULT_PREVIEW = 16 * 1024  # bytes of a result sent to the page; a larger one is cut (the CLI has it whole)
KEPT = 256  # parsed playbooks, and finished executions' envelopes, kept in memory


class NotFound(Exception):
    """No status and no start record: the execution does not exist (yet)."""


class DetailCache:
    """Parsed playbooks by (path, version), and finished executions' failure envelopes."""

    def __init__(self) -> None:
        self.playbooks: OrderedDict[tuple[str, int | None, int, int], Playbook | None] = OrderedDict()
        self.envelopes: OrderedDict[str, dict[str, Any] | None] = OrderedDict()
        # loading a playbook is user computation (a second for 500 kB): off the UI's event
        # loop, and a big one in a render process (actors/playbook/loader.py parsed_playbook)
        self._off_loop = OffLoop(threads=1, name="ui-playbook")

    async def playbook(self, record: StartRecord) -> Playbook | None:
        source = record.playbook_source or ""
        # parsed under the record's retry ceiling, as the engine parses it: a pod's higher
        # ACTORS_MAX_ATTEMPTS_CEILING admits a playbook the default would refuse
        ceiling = record.limits.max_attempts
        key = (record.playbook_path, record.playbook_version, hash(source), ceiling)
        if key not in self.playbooks:
            load = functools.partial(parsed_playbook, source, record.playbook_path, ceiling)
            try:
                self.playbooks[key] = await self._off_loop.off_loop(load) if source else None
            except (Exception, RenderFault):  # a playbook that never loaded: the page shows no graph
                self.playbooks[key] = None
            _bound(self.playbooks)
        return self.playbooks[key]

    def close(self) -> None:
        self._off_loop.close()

    def keep_envelope(self, execution_id: str, envelope: dict[str, Any] | None) -> None:
        self.envelopes[execution_id] = envelope
        _bound(self.envelopes)


def _bound(cache: OrderedDict[Any, Any]) -> None:
    while len(cache) > KEPT:
        cache.popitem(last=False)


async def execution_detail(
    client: Client,
    execution_id: str,
    cache: DetailCache,
    *,
    loops: Mapping[str, LoopProgress] | None = None,
    rates: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The execution page's data (the contract's `GET /api/executions/{id}`)."""
    status = await client.status(execution_id)
    record = await client.start_record(execution_id)
    if status is None and record is None:
        raise NotFound(f"no execution {execution_id!r}")
    items = await client.events(execution_id)
    playbook = await cache.playbook(record) if record is not None else None
    graph = execution_graph(playbook, items, loops or {}) if playbook is not None else None
    if graph is not None and rates:
        for node in graph["nodes"]:
            if node.get("loop") and node["loop"].get("rate") is None and node["id"] in rates:
                node["loop"]["rate"] = rates[node["id"]]
    detail = {
        "execution_id": execution_id,
        "status": row_of(status) if status is not None else _pending_row(execution_id, record),
        # named as in its start record (KV `status` names them `playbook` and `version`)
        "playbook_path": None if record is None else record.playbook_path,
        "playbook_version": None if record is None else record.playbook_version or _version(status),
        "graph": graph,
        "timeline": step_timeline(items),
        **_outcome(status, items),
        **_relations(record, items),
    }
    detail["error"] = await _error(client, execution_id, status, items, cache)
    return detail


def _version(status: ExecutionStatus | None) -> int | None:
    return None if status is None else status.version


def _pending_row(execution_id: str, record: StartRecord | None) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "state": "PENDING",
        "playbook": None if record is None else record.playbook_path,
        "version": None if record is None else record.playbook_version,
        "started_at": None,
        "ended_at": None,
        "terminal_event": None,
        "error": None,
    }


def _outcome(status: ExecutionStatus | None, items: list[LogItem]) -> dict[str, Any]:
    """The result of a COMPLETED execution, cut to RESULT_PREVIEW bytes of JSON (then a
    string, and `result_truncated`). A result too large for its event (stored as a blob)
    is not read at all: `result_ref` names its blob, as `result.request`'s reply does,
    and a 100,000-element result costs the page nothing."""
    none: dict[str, Any] = {"result": None, "result_ref": None, "result_truncated": False}
    if status is None or str(status.state) != "COMPLETED":
        return none
    terminal = next((i for i in reversed(items) if i.cls == "lc" and i.type in TERMINAL_EVENTS), None)
    if terminal is None:
        return none
    if terminal.data.get("result_ref"):
        return {"result": None, "result_ref": str(terminal.data["result_ref"]), "result_truncated": True}
    value = terminal.data.get("result")
    text = msgspec.json.encode(value)
    if len(text) <= RESULT_PREVIEW:
        return {"result": value, "result_ref": None, "result_truncated": False}
    return {"result": text[:RESULT_PREVIEW].decode("utf-8", "replace"), "result_ref": None, "result_truncated": True}


def _relations(record: StartRecord | None, items: list[LogItem]) -> dict[str, Any]:
    """Parent and children, the execution this one retries and those that retry it.
    `parent` and `retry_of` are shaped as in the start record (`ParentRef`, `RetryOf`),
    without what a page must not show (the reply subject, the results carried over);
    `children` and `retried_by` are execution ids."""
    children = [str(i.data["child_execution_id"]) for i in items if i.data.get("child_execution_id")]
    retried_by = [str(i.data["retry_execution_id"]) for i in items if i.type == "execution.retried"]
    retry_of = next(
        (
            {"execution_id": str(i.data.get("execution_id")), "from_step": i.data.get("from_step")}
            for i in items
            if i.type == "execution.retry_of"
        ),
        None,
    )
    if retry_of is None and record is not None and record.retry_of is not None:
        retry_of = {"execution_id": record.retry_of.execution_id, "from_step": record.retry_of.from_step}
    parent = None if record is None else record.parent
    return {
        "parent": None if parent is None else {"execution_id": parent.execution_id, "step": parent.step},
        "children": list(dict.fromkeys(children)),
        "retry_of": retry_of,
        "retried_by": list(dict.fromkeys(retried_by)),
    }


async def _error(
    client: Client, execution_id: str, status: ExecutionStatus | None, items: list[LogItem], cache: DetailCache
) -> dict[str, Any] | None:
    """The root cause (the status's error) and, when a remediation step ran, the
    failure envelope it was handed (rebuilt by the engine's own fold of the log)."""
    remediated = any(i.type == "step.enter" and i.data.get("remediates") for i in items)
    root = status.error if status is not None else None
    if root is None and not remediated:
        return None
    envelope = cache.envelopes.get(execution_id)
    if remediated and execution_id not in cache.envelopes:
        state, _ = await client.fold_log(execution_id)
        failures = [a.failure for a in state.activations.values() if a.failure]
        if failures:
            last = failures[-1]
            envelope = {
                "step": last.get("step"),
                "error": last.get("error"),
                "text": last.get("envelope"),
                "truncation": last.get("truncation"),
            }
        if status is not None and status.state in TERMINAL_STATES:
            cache.keep_envelope(execution_id, envelope)
    return {"root_cause": root, "envelope": envelope}
