"""Least privilege: one NATS user per role, each allowed only the subjects it needs.

This module is the one description of what every role publishes and subscribes to. It
renders it as the nats-server account configuration (`deploy/nats/permissions.conf`)
and as values for the NATS Helm chart (`deploy/nats/values-permissions.yaml`);
`python -m actors.pod.permissions` writes both, and tests/system/test_permissions.py checks that
the committed files are what it renders and runs a playbook through a server started
with exactly that file, one user per role.

Users (account ACTORS):

* ``engine``: execution actors, the starter (start messages, schedule fires) and the
  partition leases. It is also the one user that declares the streams, consumers and
  buckets (`streams.layout.ensure`), at every engine pod's start: a new deployment needs
  no separate setup step, and no other user may create, update or delete a stream.
* ``counter``: loop actors on LOOP; iteration commands; a loop's verdict into the
  execution's inputs.
* ``tools``: takes commands from its pull consumers (`cmd.<kind>`) and answers into
  the inputs the command names (``exec.*.*.in.result``, or ``exec.*.*.in.result.>`` in
  an execution before semantics 4; ``loop.*.*.*.in.res.>``), with
  what the step printed beside it. It cannot write a lifecycle event, a decision, a
  start or a KV bucket.
* ``projector``: reads the lifecycle subjects, writes KV ``status`` and the INDEX and
  ENDED streams.
* ``retention``: takes finished executions from stream ENDED (pull consumer
  ``retention``), reads their records, writes their archives (bucket ``archive``) and
  purges their records from EXEC, LOOP, INDEX, ENDED, KV ``status`` and the blob
  buckets; the one user that may delete messages of those streams. `actors-cli
  archive` runs with its credential.
* ``trigger``: reads the triggers' specs (KV ``triggers``), makes and deletes their
  consumers on the users' streams, reads their deliveries (``_trigger.<name>``) and acks
  them; publishes start messages and its dead letters. Denied (``deny``) any consumer
  on the system's streams: it may neither make nor delete one there. A core
  trigger's subject is the deployment's own choice: add it to this user's subscribe
  list (none is allowed by default).
* ``cli``: the operator (`actors-cli` and `actors.client.Client`): register, start,
  retry, cancel, signal, schedule, triggers and hooks (their specs; it makes and
  deletes no consumer); reads statuses, logs, outputs, dead letters and the catalog.
  It may neither write a decision, a result nor a lifecycle event, nor KV ``status``;
  of the object stores it writes only ``payloads`` (its starts' large payloads), never
  ``blobs`` (results, commands, step output).

Every user may look a stream or consumer up (``$JS.API.STREAM.INFO.*``,
``$JS.API.CONSUMER.INFO.*.*``: metadata, no message), which is how a role that may not
declare the streams finds that they exist. Each user reads only its own replies
(``_INBOX_<user>.>``): its connections set that inbox prefix (`NATS_INBOX_PREFIX`,
which the Deployments in deploy/k8s set per role). Passwords are not here: the rendered
configuration reads each from an environment variable of the server
(`password_variable`), which the Helm values fill from a Kubernetes Secret.

No NATS and no I/O, but in `deployed_layout` and `main` (which read and write deploy/).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from actors.wire.triggers import DELIVER_PREFIX as TRIGGER_DELIVER
from streams.layout import (
    ARCHIVE_BUCKET,
    BLOB_BUCKET,
    CATALOG_BUCKET,
    CMD_STREAM,
    DLQ_STREAM,
    ENDED_STREAM,
    HOOKS_BUCKET,
    INDEX_STREAM,
    LOOP_STREAM,
    OWNERS_BUCKET,
    PAYLOAD_BUCKET,
    PROJECTOR_CONSUMER,
    RETENTION_CONSUMER,
    SCHEDULE_FIRES_CONSUMER,
    SCHEDULE_STREAM,
    SCHEDULES_BUCKET,
    START_STREAM,
    STARTER_CONSUMER,
    STATUS_BUCKET,
    TOOL_KINDS,
    TRIGGERS_BUCKET,
    Layout,
    counter_consumer,
    deliver_subject,
    engine_consumer,
    obj_stream,
    stream_configs,
    tool_consumer,
    tool_log_consumer,
)
from streams.subjects import (
    ANSWER_REQUEST_PREFIX,
    CANCEL_FILTER,
    CANCEL_REQUEST_SUBJECT,
    ENDED_FILTER,
    INDEX_FILTER,
    REGISTER_REQUEST_SUBJECT,
    RESULT_REQUEST_SUBJECT,
    SIGNAL_REQUEST_SUBJECT,
    START_ASK_PREFIX,
    START_REQUEST_SUBJECT,
    START_SUBJECT,
    STATUS_REPUBLISH_DEST,
    kv_stream,
)

ACCOUNT = "ACTORS"
USERS = ("engine", "counter", "tools", "projector", "retention", "trigger", "cli")
JS_API = "$JS.API"
# nats-server sends max-deliveries advisories here (actors/tools/undeliverable.py)
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"


def inbox_prefix(user: str) -> str:
    """The inbox prefix a connection of `user` must set (`NATS_INBOX_PREFIX`): where its
    PubAcks, request replies, ordered consumers' and KV watches' messages arrive."""
    return f"_INBOX_{user}"


def inbox(user: str) -> str:
    """What `user` may subscribe to for its replies: its own inboxes only. A shared
    `_INBOX.>` would let any role read every other's replies (the engine's and the
    cli's reads of EXEC, KV status and the catalog, PubAcks)."""
    return f"{inbox_prefix(user)}.>"


@dataclass(frozen=True, slots=True)
class User:
    """One NATS user: what it may publish and subscribe to. `responds`: it answers
    requests (the starter answers `start.request`), so it may publish to the reply
    subject of a request it received, once (nats-server's `allow_responses`), and to no
    other inbox."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responds: bool = False
    doc: str = ""
    # publishes refused even where `publish` allows them (nats-server's `deny` wins): what a
    # wildcard allow must not reach
    deny_publish: tuple[str, ...] = ()

    @property
    def password_variable(self) -> str:
        """The server's environment variable that holds this user's password."""
        return f"ACTORS_NATS_{self.name.upper()}_PASSWORD"


# --- JetStream API subjects ---------------------------------------------------------


def _api(*parts: str) -> str:
    return ".".join((JS_API, *parts))


def lookups() -> list[str]:
    """Every user: account, stream and consumer lookups (metadata only, no message),
    which `ensure`, the pods' metrics and readiness checks use."""
    # STREAM.NAMES: which stream holds a subject (nats-py asks it to read an object)
    return [_api("INFO"), _api("STREAM", "NAMES"), _api("STREAM", "INFO", "*"), _api("CONSUMER", "INFO", "*", "*")]


def reads(*streams: str) -> list[str]:
    """Read a stream's messages: direct and stored gets, and ordered consumers (an
    ephemeral consumer delivering to the reader's inbox, which the server removes once
    idle; the reader answers its flow-control messages)."""
    found: list[str] = []
    for s in streams:
        found += [
            _api("DIRECT", "GET", s),
            _api("DIRECT", "GET", s, ">"),
            _api("STREAM", "MSG", "GET", s),
            _api("CONSUMER", "CREATE", s),
            f"$JS.FC.{s}.>",  # flow control: a long read stalls at ~2 MB without the answer
        ]
    return found


def consumes(stream: str, consumer: str, *, pull: bool = False) -> tuple[list[str], list[str]]:
    """(publish, subscribe) to take messages from one durable consumer and ack them: a
    push consumer delivers to `_deliver.<consumer>` (actors subscribe with a queue
    group), a pull consumer is asked on `CONSUMER.MSG.NEXT`."""
    publish = [f"$JS.ACK.{stream}.{consumer}.>"]
    if pull:
        return [*publish, _api("CONSUMER", "MSG", "NEXT", stream, consumer)], []
    return publish, [deliver_subject(consumer)]


def consuming(consumers: Iterable[tuple[str, str]], *, pull: bool = False) -> tuple[list[str], list[str]]:
    """`consumes` for several (stream, consumer)."""
    publish: list[str] = []
    subscribe: list[str] = []
    for stream, consumer in consumers:
        pub, sub = consumes(stream, consumer, pull=pull)
        publish += pub
        subscribe += sub
    return publish, subscribe


def kv_writes(bucket: str) -> list[str]:
    """Put, create, update and delete keys of a KV bucket (a publish to `$KV.<b>.<key>`)."""
    return [f"$KV.{bucket}.>"]


def kv_reads(bucket: str) -> list[str]:
    return reads(kv_stream(bucket))


def blobs(bucket: str = BLOB_BUCKET) -> list[str]:
    """Read and write an object store of large values (actors/store/blobs.py): `blobs`, or
    `payloads` (start payloads). nats-py's put purges the chunks a key had before (a
    replay storing a value again) and those of a put that failed half way: a writer may
    purge the bucket's stream. A bucket is the finest grain: an object's chunks go to a
    random subject and its name is one base64 token, so no key prefix can be allowed."""
    stream = obj_stream(bucket)
    return [f"$O.{bucket}.>", _api("STREAM", "PURGE", stream), *reads(stream)]


def declared_streams(layout: Layout) -> list[str]:
    """Every stream `ensure` declares, the buckets' included."""
    buckets = (OWNERS_BUCKET, STATUS_BUCKET, CATALOG_BUCKET, SCHEDULES_BUCKET, HOOKS_BUCKET, TRIGGERS_BUCKET)
    return [
        *(c.name for c in stream_configs(layout) if c.name),
        *(kv_stream(b) for b in buckets),
        obj_stream(BLOB_BUCKET),
        obj_stream(PAYLOAD_BUCKET),
        obj_stream(ARCHIVE_BUCKET),
    ]


def declares(layout: Layout) -> list[str]:
    """Create and update the streams, buckets and durable consumers (never delete
    them)."""
    found: list[str] = []
    for s in declared_streams(layout):
        found += [_api("STREAM", "CREATE", s), _api("STREAM", "UPDATE", s)]
    return [*found, _api("CONSUMER", "DURABLE", "CREATE", "*", "*")]


# --- the log subjects each role writes -------------------------------------------------

EXEC_IN = "exec.*.*.in"
LOOP_IN = "loop.*.*.*.in"


# the server's republish of one execution's status (`status.<id>`), which a wait watches
# (actors/client/watch.py); `status.<playbook>.<id>`, the projector's feed, has a token more
STATUS_WATCH = "status.*"
# the projector's feed of every status it writes (streams/subjects.py status_feed_subject)
STATUS_FEED_FILTER = "status.*.*"


def _dlq(source: str) -> str:
    return f"dlq.{source}.>"


def system_consumers_denied(layout: Layout) -> list[str]:
    """What the trigger user may not do on the system's streams, though it makes and
    deletes consumers (`trigger-<name>`) on users' streams of any name: make or delete
    a consumer there (deleting the starter's or an engine's stops the system; one of
    its own on EXEC would read every execution's log), or ack their messages. Looking
    one up stays allowed (`lookups`: metadata, no message; every pod's metrics read
    the system's consumers)."""
    found: list[str] = []
    for s in declared_streams(layout):
        found += [
            _api("CONSUMER", "DURABLE", "CREATE", s, "*"),
            _api("CONSUMER", "CREATE", s, ">"),
            _api("CONSUMER", "DELETE", s, "*"),
            f"$JS.ACK.{s}.>",
        ]
    return found


def users(layout: Layout, tool_kinds: Iterable[str] = TOOL_KINDS) -> list[User]:
    """One user per role, for a deployment of `layout` (its partition count names the
    engine's and counter's consumers, its `exec_streams` the streams of logs: EXEC, or
    EXEC_0 ..)."""
    logs = layout.exec_stream_names
    engine_pub, engine_sub = consuming(
        [(layout.exec_stream(p), engine_consumer(p)) for p in range(layout.partitions)]
        + [(START_STREAM, STARTER_CONSUMER), (SCHEDULE_STREAM, SCHEDULE_FIRES_CONSUMER)]
    )
    counter_pub, counter_sub = consuming([(LOOP_STREAM, counter_consumer(p)) for p in range(layout.partitions)])
    tools_pub, _ = consuming(
        [(CMD_STREAM, tool_consumer(kind)) for kind in tool_kinds]
        # commands held by decision records, on each stream of logs
        + [(log, tool_log_consumer(kind)) for kind in tool_kinds for log in logs],
        pull=True,
    )
    # one projector consumer per stream of logs, every one delivering to `_deliver.projector`
    projector_pub, projector_sub = consuming([(log, PROJECTOR_CONSUMER) for log in logs])
    projector_sub = list(dict.fromkeys(projector_sub))
    retention_pub, _ = consumes(ENDED_STREAM, RETENTION_CONSUMER, pull=True)
    # what a retired execution leaves: read (to archive it), then purged (actors/store/retire.py)
    retired = (*logs, LOOP_STREAM, INDEX_STREAM, ENDED_STREAM, kv_stream(STATUS_BUCKET))
    # what a tool's answer and a max-deliveries dead letter write (actors/tools/running.py,
    # actors/tools/outputs.py, actors/tools/undeliverable.py)
    # (an execution's results: one subject from semantics 4 on, one per command before)
    answers = [f"{EXEC_IN}.result", f"{EXEC_IN}.result.>", "exec.*.*.out.>", f"{LOOP_IN}.res.>", "loop.*.*.*.out.>"]
    return [
        User(
            "engine",
            doc="execution actors, starter, leases; declares the streams",
            publish=(
                *lookups(),
                *declares(layout),
                *engine_pub,
                # inputs: start records, child results and cancels, due timers, retry links;
                # then decisions, lifecycle events and durable timers
                f"{EXEC_IN}.>",
                "exec.*.*.ev.>",
                "exec.*.*.lc.>",
                "exec.*.*.sch.>",
                f"{LOOP_IN}.spec",
                f"{LOOP_IN}.cancel",
                f"{LOOP_IN}.signal",  # signals forwarded to a loop of waits (`tool: wait`)
                "cmd.>",
                START_SUBJECT,  # child playbooks
                # the starter asks the partition's engine pod to store a start record with
                # the first decision (semantics 6): a core request on a subject of its own,
                # which no other user may publish (a tool's ask, `answer.<p>`, takes no start)
                f"{START_ASK_PREFIX}.*",
                CANCEL_FILTER,
                "dlq.>",  # its own, the starter's, and max-deliveries dead letters of any consumer
                *answers,  # a command the server gave up on is answered with an error
                *kv_writes(OWNERS_BUCKET),
                *kv_reads(OWNERS_BUCKET),
                *kv_writes(CATALOG_BUCKET),  # `catalog.register` (actors/gateway/answers.py)
                *kv_reads(CATALOG_BUCKET),
                # LOOP: a replay asks whether a loop's spec was handed over (actors/engine/actor.py)
                *reads(*logs, CMD_STREAM, LOOP_STREAM),
                *blobs(),
                *blobs(PAYLOAD_BUCKET),  # payloads of starts and child starts, read back
                # `result.request`: the status, waited for, and an archived execution's end
                *kv_reads(STATUS_BUCKET),
                *reads(obj_stream(ARCHIVE_BUCKET)),
            ),
            subscribe=(
                *engine_sub,
                START_REQUEST_SUBJECT,
                RESULT_REQUEST_SUBJECT,
                REGISTER_REQUEST_SUBJECT,
                CANCEL_REQUEST_SUBJECT,
                SIGNAL_REQUEST_SUBJECT,  # signals for waiting steps (actors/gateway/answers.py)
                # a tool asks to store its result with the next decision (semantics 5), a
                # starter its start record with the first decision (semantics 6)
                f"{ANSWER_REQUEST_PREFIX}.*",
                f"{START_ASK_PREFIX}.*",
                STATUS_WATCH,
                MAX_DELIVERIES_ADVISORY,
                inbox("engine"),
            ),
            responds=True,
        ),
        User(
            "counter",
            doc="loop actors",
            publish=(
                *lookups(),
                *counter_pub,
                f"{LOOP_IN}.>",  # timers fired now, a loop's own inputs on replay
                "loop.*.*.*.ev.>",
                "loop.*.*.*.sch.>",
                f"{EXEC_IN}.iterator.>",
                f"{EXEC_IN}.iterator",  # every loop's verdict on one subject (semantics 4)
                "cmd.>",
                START_SUBJECT,  # a loop over a playbook tool starts children
                f"{EXEC_IN}.cancel",  # cancels them
                CANCEL_FILTER,
                "progress.>",
                _dlq("counter"),
                *kv_writes(OWNERS_BUCKET),
                *kv_reads(OWNERS_BUCKET),
                *reads(LOOP_STREAM, CMD_STREAM, *logs),
                *blobs(),
                *blobs(PAYLOAD_BUCKET),  # children's large payloads
            ),
            subscribe=tuple([*counter_sub, inbox("counter")]),
        ),
        User(
            "tools",
            doc="tool actors: commands in, results and outputs out",
            publish=(
                *lookups(),
                *tools_pub,
                *answers,
                # asks the partition's engine pod to store a result with its next
                # decision (semantics 5, `Command.ask_on`): a core request
                f"{ANSWER_REQUEST_PREFIX}.*",
                _dlq("tools"),
                *blobs(),
                _api("STREAM", "MSG", "GET", CMD_STREAM),  # the command a max-deliveries advisory names
                # the decision record holding it (EXEC), and whether a command delivered again
                # is answered in the log already (actors/tools/running.py): gets of one
                # message, or (an execution's shared results subject, semantics 4) a
                # batched get of that subject's messages; not a consumer over every log
                *(_api("DIRECT", "GET", log, ">") for log in logs),
                *(_api("DIRECT", "GET", log) for log in logs),
                *(_api("STREAM", "MSG", "GET", log) for log in logs),
            ),
            subscribe=(CANCEL_FILTER, MAX_DELIVERIES_ADVISORY, inbox("tools")),
        ),
        User(
            "projector",
            doc="lifecycle events -> KV status, INDEX, ENDED",
            publish=(
                *lookups(),
                *projector_pub,
                *kv_writes(STATUS_BUCKET),
                *kv_reads(STATUS_BUCKET),
                INDEX_FILTER,
                ENDED_FILTER,
                _dlq("projector"),
                *reads(obj_stream(BLOB_BUCKET)),
                STATUS_FEED_FILTER,  # every status written, announced under its playbook
            ),
            subscribe=(*projector_sub, inbox("projector")),
        ),
        User(
            "retention",
            doc="finished executions archived, then removed from every stream and bucket; `actors-cli archive`",
            publish=(
                *lookups(),
                *retention_pub,
                *reads(*retired, DLQ_STREAM),
                # message by message (actors/natsio/purge.py): its dead letters go with it;
                # its status by a purge of its key (a bucket refuses deletes by sequence)
                *(_api("STREAM", "MSG", "DELETE", s) for s in (*retired, DLQ_STREAM)),
                _api("STREAM", "PURGE", kv_stream(STATUS_BUCKET)),
                *blobs(),  # read (archived with it) and purged
                *blobs(PAYLOAD_BUCKET),
                *blobs(ARCHIVE_BUCKET),  # archives written (ACTORS_ARCHIVE=objects)
                _dlq("retention"),
            ),
            subscribe=(inbox("retention"),),
        ),
        User(
            "trigger",
            doc="triggers: messages on users' subjects -> start messages",
            publish=(
                *lookups(),
                # acks of its consumers' messages (`trigger-<name>` on the users' streams): it
                # receives no other consumer's, so it can ack no other's
                "$JS.ACK.*.*.>",
                # the triggers' consumers, made from a trigger's start and deleted with it, on
                # the users' streams (any name: a subject token cannot be matched by prefix);
                # denied on the system's below
                _api("CONSUMER", "DURABLE", "CREATE", "*", "*"),
                _api("CONSUMER", "DELETE", "*", "*"),
                START_SUBJECT,
                _dlq("trigger"),
                *kv_writes(TRIGGERS_BUCKET),  # the pods' counts (`<name>.stats`)
                *kv_reads(TRIGGERS_BUCKET),  # the specs, watched
            ),
            # a stream trigger's deliveries; a core trigger's subjects are the deployment's own:
            # add them here (docs/triggers.md), none is allowed by default
            subscribe=(f"{TRIGGER_DELIVER}.*", inbox("trigger")),
            deny_publish=tuple(system_consumers_denied(layout)),
        ),
        User(
            "cli",
            doc="actors-cli and actors.client.Client: start, cancel, retry, register, schedule; read everything",
            publish=(
                *lookups(),
                START_SUBJECT,
                START_REQUEST_SUBJECT,
                RESULT_REQUEST_SUBJECT,
                REGISTER_REQUEST_SUBJECT,
                CANCEL_REQUEST_SUBJECT,
                f"{EXEC_IN}.cancel",
                SIGNAL_REQUEST_SUBJECT,  # a signal, answered by the engine pods' gateway
                f"{EXEC_IN}.signal",  # or written by the client itself (Client.signal), as a cancel is
                *kv_writes(CATALOG_BUCKET),
                *kv_writes(SCHEDULES_BUCKET),
                *kv_writes(HOOKS_BUCKET),  # hook add, rotate, delete (the UI server's hooks read it)
                # trigger add, pause, resume, delete: the spec only; the trigger pods make and
                # delete its consumer (this user makes none: it could delete the system's, or
                # make one delivering the starter's or an engine's messages to itself)
                *kv_writes(TRIGGERS_BUCKET),
                "schedules.def.>",
                "schedules.fire.>",  # "run now": a schedule's fire sent by hand (actors/client/schedules.py)
                _api("STREAM", "PURGE", SCHEDULE_STREAM),  # deleting a schedule's definition
                *blobs(PAYLOAD_BUCKET),  # a large start payload (a retry's read back)
                *reads(obj_stream(BLOB_BUCKET)),  # a large result, step output: read, never written
                *reads(obj_stream(ARCHIVE_BUCKET)),  # executions retired, read back from their archive
                *reads(
                    *logs,
                    LOOP_STREAM,
                    DLQ_STREAM,
                    INDEX_STREAM,
                    ENDED_STREAM,
                    START_STREAM,
                    SCHEDULE_STREAM,
                    kv_stream(STATUS_BUCKET),
                    kv_stream(CATALOG_BUCKET),
                    kv_stream(SCHEDULES_BUCKET),
                    kv_stream(HOOKS_BUCKET),
                    kv_stream(TRIGGERS_BUCKET),
                    kv_stream(OWNERS_BUCKET),  # a redrive asks whether every pod knows it (member entries)
                ),
            ),
            subscribe=("progress.>", STATUS_REPUBLISH_DEST, inbox("cli")),
        ),
    ]


# --- rendering ------------------------------------------------------------------------

HEADER = """\
# GENERATED by `python -m actors.pod.permissions` from actors/pod/permissions.py: do not edit.
# tests/system/test_permissions.py checks it is up to date and runs a playbook through it.
"""


def _list(subjects: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(subjects))  # once each, first place kept


def permissions_of(user: User) -> dict[str, object]:
    publish: dict[str, list[str]] = {"allow": _list(user.publish)}
    if user.deny_publish:
        publish["deny"] = _list(user.deny_publish)
    perms: dict[str, object] = {"publish": publish, "subscribe": {"allow": _list(user.subscribe)}}
    if user.responds:
        perms["allow_responses"] = True
    return perms


def server_config(layout: Layout) -> str:
    """The nats-server configuration: account ACTORS (JetStream enabled) with one user
    per role; each password is the server's environment variable `$<password_variable>`
    (nats-server resolves a `$NAME` it does not define from its environment)."""
    lines = [
        HEADER + "# Include it from nats-server.conf (`include permissions.conf`) and set the",
        "# ACTORS_NATS_<USER>_PASSWORD variables in the server's environment.",
        "accounts {",
        f"  {ACCOUNT} {{",
        "    jetstream: enabled",
        "    users: [",
    ]
    for u in users(layout):
        lines.append(f"      # {u.name}: {u.doc}")
        lines.append(f"      {{user: {u.name}, password: ${u.password_variable}, permissions: {{")
        for key, value in permissions_of(u).items():
            if isinstance(value, dict):
                lines.append(f"        {key}: {{")
                for kind, subjects in value.items():
                    lines.append(f"          {kind}: [")
                    lines += [f"            {json.dumps(s)}," for s in subjects]
                    lines.append("          ]")
                lines.append("        }")
            else:
                lines.append(f"        {key}: {json.dumps(value)}")
        lines.append("      }}")
    lines += ["    ]", "  }", "}", ""]
    return "\n".join(lines)


SECRET = "actors-nats-users"  # a key per user: its password (deploy/README.md)


def helm_values(layout: Layout) -> str:
    """Values for the NATS Helm chart (`-f deploy/nats/values-permissions.yaml`): the
    same account merged into the chart's config (`<< $VAR >>` is the chart's raw value,
    here the server's environment variable) and each password variable taken from the
    Secret `actors-nats-users` (key: the user's name)."""
    out = [
        HEADER + "#",
        "#   helm upgrade --install nats nats/nats -n nats \\",
        "#     -f deploy/nats/values.yaml -f deploy/nats/values-permissions.yaml",
        "#",
        f"# after creating the Secret {SECRET} in namespace nats (deploy/README.md).",
        "config:",
        "  merge:",
        "    accounts:",
        f"      {ACCOUNT}:",
        "        jetstream: enabled",
        "        users:",
    ]
    for u in users(layout):
        out += [f"          # {u.name}: {u.doc}", f"          - user: {u.name}"]
        out.append(f"            password: << ${u.password_variable} >>")
        out.append("            permissions:")
        for key, value in permissions_of(u).items():
            if isinstance(value, dict):
                out.append(f"              {key}:")
                for kind, subjects in value.items():
                    out.append(f"                {kind}:")
                    out += [f"                  - {json.dumps(s)}" for s in subjects]
            else:
                out.append(f"              {key}: {json.dumps(value)}")
    out += ["container:", "  env:"]
    for u in users(layout):
        out += [
            f"    {u.password_variable}:",
            "      valueFrom:",
            "        secretKeyRef:",
            f"          name: {SECRET}",
            f"          key: {u.name}",
        ]
    return "\n".join(out) + "\n"


ROOT = Path(__file__).resolve().parents[2]  # the repository: actors/pod/permissions.py
CONF_FILE = ROOT / "deploy" / "nats" / "permissions.conf"
VALUES_FILE = ROOT / "deploy" / "nats" / "values-permissions.yaml"


def deployed_layout() -> Layout:
    """The layout of deploy/k8s/config.yaml (its partition count names consumers, its
    ACTORS_EXEC_STREAMS the streams of logs)."""
    import yaml

    config = ROOT / "deploy" / "k8s" / "config.yaml"
    data = yaml.safe_load(config.read_text())["data"]
    return Layout(partitions=int(data["ACTORS_PARTITIONS"]), exec_streams=int(data.get("ACTORS_EXEC_STREAMS", 1)))


def main() -> None:
    layout = deployed_layout()
    CONF_FILE.write_text(server_config(layout))
    VALUES_FILE.write_text(helm_values(layout))
    print(f"wrote {CONF_FILE.relative_to(ROOT)} and {VALUES_FILE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
