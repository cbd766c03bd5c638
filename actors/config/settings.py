"""Every setting of a pod, in one object read once at start-up.

`Settings.from_env(environ)` reads the environment; `with_flags` lays the CLI's flags
over it (a flag given wins). `Runtime` owns the result and hands each part to what
needs it: the stream layout (`streams.layout.Layout`, which stays free of `actors/`),
the limits the starter fixes in each new execution's start record (`wire.Limits`), the
cap on values (`actors/store/blobs.py`), the tool actors' pool and concurrency, the pod's
name and its HTTP port. No other module reads the environment.

Limits that feed an engine decision are not pod settings at run time: the starter
copies them into the start record, and every pod replays a log by its record, whatever
its own environment says. A value that cannot be used is refused at start-up in one
line naming the variable, never silently replaced by a default.

`python -m actors.config.settings` prints the settings table of docs/settings.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.errors import UserError
from actors.wire.codec import CLEAR, PayloadCodec, PayloadKeyInvalid, PayloadKeys
from actors.wire.messages import Limits
from streams.layout import Layout
from streams.server import SYNC_DEFAULT, SYNC_MODES

_LIMITS, _LAYOUT = Limits(), Layout()  # their defaults are these settings' defaults
# a pod's name is a key in the `owners` bucket: no `.`, `*`, `>` or spaces
# where finished executions may be archived, besides a directory (actors/store/archive.py)
ARCHIVE_PLACES = ("off", "objects")
_KEY_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class SettingsInvalid(UserError, ValueError):
    """A setting that cannot be used: the message is one line naming the variable."""


def _setting(
    default: Any,
    env: str,
    meaning: str,
    *,
    flag: str | None = None,
    minimum: float | None = 1,
    secret: bool = False,
) -> Any:
    """A field of `Settings`: its default, its environment variable, its CLI flag
    (if any), the smallest value allowed (None: any) and what it bounds. A `secret`
    (a password, a token) is left out of the settings' repr, so a log line or a
    traceback that shows them does not show it."""
    return dataclasses.field(
        default=default, repr=not secret, metadata={"env": env, "flag": flag, "meaning": meaning, "minimum": minimum}
    )


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A pod's settings. Each field below names its environment variable, its flag
    (where `actors-cli` has one), its default and what it bounds; the same text makes
    the table in docs/settings.md (`markdown_table`). Built once (`from_env`, then `with_flags`)
    and passed down from `Runtime`: nothing reads the environment later.

    Fields (environment variable, flag, default, what it bounds):
    """

    # --- where NATS is ---
    nats_url: str | None = _setting(
        None,
        "NATS_URL",
        "NATS server(s), comma-separated; `tls://` for TLS. Unset: `run` starts its own server, other commands "
        "refuse to start. A password in the URL works but shows in `ps` when given as `--nats`",
        flag="--nats",
        minimum=None,
    )
    # --- how a connection proves who it is and encrypts (actors/natsio/connopts.py; docs/security.md
    # "Connecting securely"). Secrets come from the environment or a file, never a flag: argv shows in `ps` ---
    nats_user: str | None = _setting(
        None,
        "NATS_USER",
        "user name for NATS (with NATS_PASSWORD or NATS_PASSWORD_FILE)",
        flag="--nats-user",
        minimum=None,
    )
    nats_password: str | None = _setting(
        None,
        "NATS_PASSWORD",
        "password of NATS_USER (no flag: a command line shows in `ps`)",
        minimum=None,
        secret=True,
    )
    nats_password_file: str | None = _setting(
        None,
        "NATS_PASSWORD_FILE",
        "file holding the password of NATS_USER (a mounted Secret); trailing newline ignored",
        flag="--nats-password-file",
        minimum=None,
    )
    nats_token: str | None = _setting(
        None, "NATS_TOKEN", "token for NATS (no flag: a command line shows in `ps`)", minimum=None, secret=True
    )
    nats_token_file: str | None = _setting(
        None,
        "NATS_TOKEN_FILE",
        "file holding the NATS token; trailing newline ignored",
        flag="--nats-token-file",
        minimum=None,
    )
    nats_creds: str | None = _setting(
        None, "NATS_CREDS", "credentials file (user JWT and NKEY seed) for NATS", flag="--nats-creds", minimum=None
    )
    nats_nkey: str | None = _setting(
        None, "NATS_NKEY", "file holding an NKEY user seed (`SU...`) for NATS", flag="--nats-nkey", minimum=None
    )
    tls_ca: str | None = _setting(
        None,
        "NATS_TLS_CA",
        "CA certificate(s) (PEM) that NATS's server certificate must chain to; given: TLS is required",
        flag="--tls-ca",
        minimum=None,
    )
    tls_cert: str | None = _setting(
        None,
        "NATS_TLS_CERT",
        "client certificate (PEM) for a server that verifies clients; given: TLS is required",
        flag="--tls-cert",
        minimum=None,
    )
    tls_key: str | None = _setting(
        None, "NATS_TLS_KEY", "private key (PEM) of NATS_TLS_CERT", flag="--tls-key", minimum=None
    )
    nats_inbox_prefix: str = _setting(
        "_INBOX",
        "NATS_INBOX_PREFIX",
        "first token of every reply subject this connection makes (requests, PubAcks, ordered consumers, KV "
        "watches); with deploy/nats's permissions each user may read only `_INBOX_<user>.>`, so set "
        '`_INBOX_<user>` (docs/security.md "Least privilege")',
        flag="--nats-inbox-prefix",
        minimum=None,
    )
    nats_sync: str = _setting(
        SYNC_DEFAULT,
        "ACTORS_NATS_SYNC",
        "when the nats-server that `dev` and `run` start fsyncs JetStream writes: `default`, every 2 minutes; "
        "`always`, before each PubAck (see Durability)",
        minimum=None,
    )
    nats_fastpath: bool = _setting(
        True,
        "ACTORS_NATS_FASTPATH",
        "`0`: every NATS call through nats-py's public API alone (publish, ack, request, subscribe; nats-py's "
        "own protocol parser), slower; for a nats-py whose internals changed (actors/natsio/private.py)",
        minimum=None,
    )
    # --- how the deployment is laid out (every pod of it must agree) ---
    partitions: int = _setting(
        _LAYOUT.partitions,
        "ACTORS_PARTITIONS",
        "partitions of the EXEC and LOOP subjects; fixed for the life of a deployment (part of every execution's "
        "subject)",
    )
    exec_streams: int = _setting(
        _LAYOUT.exec_streams,
        "ACTORS_EXEC_STREAMS",
        "streams the executions' logs are spread over, 1 to `ACTORS_PARTITIONS`: 1, stream EXEC; more, partition "
        "p's logs in EXEC_<p mod it>, whose fsyncs run side by side (see Sizing in docs/operating.md); fixed for "
        "the life of a deployment",
    )
    replicas: int = _setting(
        _LAYOUT.replicas, "ACTORS_REPLICAS", "replicas of every stream and bucket (3 on a 3-node cluster)"
    )
    duplicate_window: float = _setting(
        _LAYOUT.duplicate_window,
        "ACTORS_DUPLICATE_WINDOW",
        "seconds the streams drop a message whose `Nats-Msg-Id` they saw; how long a publish without a PubAck may "
        "be re-sent as is",
        minimum=0.001,
    )
    ack_wait: float = _setting(
        _LAYOUT.ack_wait,
        "ACTORS_ACK_WAIT",
        "seconds before an unacknowledged message is delivered again",
        minimum=0.001,
    )
    lease_ttl: float = _setting(
        _LAYOUT.lease_ttl,
        "ACTORS_LEASE_TTL",
        "seconds after a dead pod's last renewal before others take its partitions",
        minimum=0.001,
    )
    engine_max_resident: int = _setting(
        _LAYOUT.engine_max_resident,
        "ACTORS_ENGINE_MAX_RESIDENT",
        "execution actors an engine pod keeps in memory; idle ones beyond are evicted and rebuilt by replay",
    )
    fast_answers: bool = _setting(
        True,
        "ACTORS_FAST_ANSWERS",
        "`0`: this engine pod does not store a step's result with its decision as one answer record (semantics 5), "
        "nor an execution's start with its first decision (semantics 6); tools and starters asking publish their "
        "results and start records themselves. Set it on every engine pod, and let the tool consumers drain, "
        "before rolling back to a release before semantics 5 or 6; to 5, then run `actors-cli prepare-rollback` "
        '(docs/upgrades.md "From 5 to 6")',
        minimum=None,
    )
    counter_max_resident: int = _setting(
        _LAYOUT.counter_max_resident,
        "ACTORS_COUNTER_MAX_RESIDENT",
        "loop actors a counter pod keeps in memory (as above)",
    )
    max_value_bytes: int = _setting(
        _LAYOUT.max_value_bytes,
        "ACTORS_MAX_VALUE_BYTES",
        "bytes of one value (result, args, payload) stored as a blob; past it the step fails `ValueTooLarge`, the "
        "CLI exits 3",
    )
    step_output_max_bytes: int = _setting(
        _LAYOUT.step_output_max_bytes,
        "ACTORS_STEP_OUTPUT_MAX_BYTES",
        "bytes of what one step attempt prints (python stdout and stderr, shell output) kept in the object store; "
        "past it the rest is counted, not kept (`actors-cli logs` still shows the last 4 KiB)",
    )

    # --- how long finished executions are kept, and where they go then ---
    finished_retention: float = _setting(
        _LAYOUT.finished_retention,
        "ACTORS_RETAIN_FINISHED",
        "seconds a finished execution (its log, loops, index entries, status, blobs) is kept after it ended; then "
        "it is archived (ACTORS_ARCHIVE) and removed. 0: kept for ever. A running execution is never removed",
        minimum=0,
    )
    dead_letter_retention: float = _setting(
        _LAYOUT.dead_letter_retention,
        "ACTORS_RETAIN_DEAD_LETTERS",
        "seconds stream DLQ keeps a dead letter (0: for ever); keep it longer than ACTORS_RETAIN_FINISHED: an "
        "execution's dead letters are archived and removed with it",
        minimum=0,
    )
    archive: str = _setting(
        "off",
        "ACTORS_ARCHIVE",
        "where a finished execution is archived before it is removed: `off`, `objects` (the `archive` bucket, "
        "read back by `status`, `result`, `events`, `list` and the UI) or an absolute directory path (one "
        "gzip-compressed JSON Lines file per execution)",
        minimum=None,
    )
    archive_retention: float = _setting(
        _LAYOUT.archive_retention,
        "ACTORS_RETAIN_ARCHIVE",
        "seconds the `archive` bucket keeps an archived execution (0: for ever)",
        minimum=0,
    )

    # --- limits the starter fixes in each new execution's start record ---
    template_ops: int = _setting(
        _LIMITS.template_ops,
        "ACTORS_TEMPLATE_OPS",
        "operations one template render may take (step fails `TemplateLimit`)",
    )
    template_output: int = _setting(
        _LIMITS.template_output,
        "ACTORS_TEMPLATE_OUTPUT",
        "characters of any string, list or mapping a template builds (step fails `TemplateLimit`)",
    )
    max_steps: int = _setting(
        _LIMITS.max_activations,
        "ACTORS_MAX_STEPS",
        "steps (activations) one execution may enter; a playbook may set less (execution fails `StepBudgetExceeded`)",
    )
    max_attempts_ceiling: int = _setting(
        _LIMITS.max_attempts,
        "ACTORS_MAX_ATTEMPTS_CEILING",
        "attempts of one step, whatever its retry rules ask (`retry.exhausted`)",
    )

    # --- this pod ---
    template_seconds: float = _setting(
        10.0,
        "ACTORS_TEMPLATE_SECONDS",
        "CPU seconds a template render in a render process may use (and 6 times that of wall-clock time) "
        "before the pod kills it (recorded in the log; the execution fails `TemplateLimit`, template_seconds)",
        minimum=0.1,
    )
    template_memory_mb: int = _setting(
        1024,
        "ACTORS_TEMPLATE_MEMORY_MB",
        "address space of a render process, in MiB (RLIMIT_AS); a render past it fails its execution "
        "`TemplateLimit` (template_memory)",
        minimum=256,
    )
    step_memory_mb: int = _setting(
        4096,
        "ACTORS_STEP_MEMORY_MB",
        "address space of a python step's worker process, in MiB (RLIMIT_AS); a step past it fails with "
        "`MemoryError` (or `WorkerCrashed`), its worker replaced. 0: no bound",
        minimum=0,
    )
    python_workers: int | None = _setting(
        None,
        "ACTORS_PYTHON_WORKERS",
        "worker processes of the python tool. Unset: the CPUs this pod may use (affinity and cgroup quota)",
    )
    tool_concurrency: int | None = _setting(
        None,
        "ACTORS_TOOL_CONCURRENCY",
        "commands of one tool kind a pod runs at once. Unset: per-kind defaults (64; sleep 512, noop 256)",
    )
    pod_name: str | None = _setting(
        None,
        "ACTORS_POD_NAME",
        "this pod's member name in the `owners` bucket. Unset: host, process id and a sequence number",
        minimum=None,
    )
    http_host: str = _setting(
        "0.0.0.0",
        "ACTORS_HTTP_HOST",
        "address `serve` binds for /healthz, /readyz and /metrics",
        flag="--http-host",
        minimum=None,
    )
    http_port: int = _setting(
        8080,
        "ACTORS_HTTP_PORT",
        "port of `serve`'s /healthz, /readyz and /metrics; 0: no HTTP server",
        flag="--http-port",
        minimum=0,
    )
    # --- payload encryption (actors/wire/codec.py); every pod of a deployment and its clients share the keys ---
    payload_key: str | None = _setting(
        None,
        "ACTORS_PAYLOAD_KEY",
        "key that encrypts payloads, args, results, error messages and outputs written to NATS: `ID:BASE64` or "
        "`BASE64` of 32 bytes (AES-256-GCM). Unset: values are written in clear",
        minimum=None,
        secret=True,
    )
    payload_key_file: str | None = _setting(
        None,
        "ACTORS_PAYLOAD_KEY_FILE",
        "file of payload keys, one a line: the first encrypts, the others only decrypt (old keys); wins over "
        "`ACTORS_PAYLOAD_KEY`",
        flag="--payload-key-file",
        minimum=None,
    )
    payload_old_keys: str | None = _setting(
        None,
        "ACTORS_PAYLOAD_OLD_KEYS",
        "comma-separated keys that only decrypt: values written before the key was rotated",
        minimum=None,
        secret=True,
    )
    drain_timeout: float = _setting(
        10.0,
        "ACTORS_DRAIN_TIMEOUT",
        "seconds running tool commands get to finish after SIGTERM; the rest is redelivered elsewhere",
        flag="--drain-timeout",
        minimum=0,
    )

    # --- credentials of the steps (actors/tools/credentials.py): the tool role reads them ---
    credentials_dir: str | None = _setting(
        None,
        "ACTORS_CREDENTIALS_DIR",
        "folder of credentials a step names (`credential: api`): a file `api` (a JSON or YAML mapping, or a plain "
        "token) or a folder `api/` of one file per key, as a Kubernetes Secret volume gives; read at each step",
        minimum=None,
    )
    credentials: Mapping[str, str] = dataclasses.field(
        default_factory=dict,
        repr=False,  # values are secrets: never in a repr or a traceback's locals
        metadata={
            "env": "ACTORS_CREDENTIAL_<NAME>",
            "prefix": "ACTORS_CREDENTIAL_",
            "flag": None,
            "meaning": "credential NAME (upper-cased, `-` and `.` as `_`) when the folder has none: a JSON or YAML "
            "mapping, or a plain token. Steps never see these variables",
            "minimum": None,
        },
    )
    # --- who python and shell steps run as (actors/runtime/children.py): the tool role reads it ---
    step_user: str | None = _setting(
        None,
        "ACTORS_STEP_USER",
        "user (`NAME`, `UID`, `USER:GROUP`) python and shell steps run as, so they cannot read the pod's "
        "environment or files. Unset: `nobody` when the pod runs as root, else the pod's own user. One the pod "
        "cannot switch to, or who cannot run the pod's python, stops a `serve` pod at start (`run` and `dev`: "
        "left unset, steps then run as the process's own user, with a warning)",
        minimum=None,
    )
    # --- what duckdb steps may open (actors/tools/kinds/duckdb.py): the tool role reads it ---
    duckdb_dirs: str | None = _setting(
        None,
        "ACTORS_DUCKDB_DIRS",
        "directories (absolute, `:`-separated) whose files duckdb steps may read and write (CSV, Parquet, JSON, "
        "a `database` file); besides them only the steps' own directory when steps run as another user. "
        "Unset: no other",
        minimum=None,
    )

    # --- postgres steps' connections (actors/tools/pgpool.py): one pool per credential in each tools pod ---
    postgres_pool_max: int = _setting(
        4,
        "ACTORS_POSTGRES_POOL_MAX",
        "connections a tools pod keeps open to one postgres credential's database at most (steps beyond wait "
        "for one); pods x this must stay under the server's max_connections",
    )
    postgres_pool_idle: float = _setting(
        300.0,
        "ACTORS_POSTGRES_POOL_IDLE",
        "seconds an unused postgres connection stays open before the pool closes it",
        minimum=1.0,
    )
    postgres_pool_wait: float = _setting(
        30.0,
        "ACTORS_POSTGRES_POOL_WAIT",
        "seconds a postgres step waits for a free connection (or a new one to be made) before failing "
        "`PoolTimeout` (retryable); the step's own timeout still bounds it",
        minimum=0.1,
    )
    postgres_connect_timeout: float = _setting(
        10.0,
        "ACTORS_POSTGRES_CONNECT_TIMEOUT",
        "seconds a new postgres connection may take to open (libpq's connect_timeout)",
        minimum=1.0,
    )

    # --- the web UI (`actors-cli ui`, `dev`, `serve --role ui`) ---
    ui_host: str = _setting(
        "127.0.0.1",
        "ACTORS_UI_HOST",
        "address the web UI binds (loopback: only this machine; `0.0.0.0` in a pod, behind a Service)",
        flag="ui --host",
        minimum=None,
    )
    ui_port: int = _setting(
        8233, "ACTORS_UI_PORT", "port of the web UI; 0 with `dev`: no UI", flag="ui --port, dev --ui-port", minimum=0
    )
    ui_token: str | None = _setting(
        None,
        "ACTORS_UI_TOKEN",
        "a secret every action of the web UI (start, cancel, retry) must carry. Unset: actions need none "
        "(no flag: a command line shows in `ps`; see ACTORS_UI_TOKEN_FILE)",
        minimum=None,
        secret=True,
    )
    ui_token_file: str | None = _setting(
        None,
        "ACTORS_UI_TOKEN_FILE",
        "file holding ACTORS_UI_TOKEN (a mounted Secret); trailing newline ignored; wins over ACTORS_UI_TOKEN",
        flag="ui --token-file",
        minimum=None,
    )
    ui_allowed_hosts: str | None = _setting(
        None,
        "ACTORS_UI_ALLOWED_HOSTS",
        "host names (comma-separated) a request's `Host` may carry besides localhost, 127.0.0.1 and [::1] "
        "(a proxy's name). A UI bound to a loopback address refuses any other (DNS rebinding); one bound "
        "elsewhere checks the names only when this is set",
        flag="ui --allow-host",
        minimum=None,
    )
    ui_max_streams: int = _setting(
        100,
        "ACTORS_UI_MAX_STREAMS",
        "live feeds (server-sent events) one UI process keeps open at once; more are refused with 503 "
        "(each holds NATS consumers)",
    )
    ui_user_header: str | None = _setting(
        None,
        "ACTORS_UI_USER_HEADER",
        "a header an authenticating proxy sets (say `X-Forwarded-User`): an action carrying it needs no token. "
        "Set it only when the proxy strips the header from what clients send",
        minimum=None,
    )
    ui_read_only: bool = _setting(
        False,
        "ACTORS_UI_READ_ONLY",
        "`1`: the web UI refuses every action (403) and hides its buttons",
        flag="ui --read-only",
        minimum=None,
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from `environ` (default: this process's environment). An unset or
        empty variable keeps the default; one that cannot be used raises
        `SettingsInvalid` naming it."""
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            prefix = f.metadata.get("prefix")
            if prefix:  # a family of variables, by the rest of their name (values kept as given)
                given[f.name] = {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix) and v.strip()}
                continue
            raw = env.get(f.metadata["env"], "").strip()
            if raw:
                given[f.name] = _parse(f, raw, f.metadata["env"])
        return cls(**given)

    def with_flags(self, **flags: Any) -> Settings:
        """These settings with the flags that were given (not None) laid over them."""
        return dataclasses.replace(self, **{name: value for name, value in flags.items() if value is not None})

    @property
    def layout(self) -> Layout:
        """The streams' layout these settings describe (the rest of `Layout` keeps its defaults)."""
        if self.exec_streams > self.partitions:
            raise SettingsInvalid(
                f"ACTORS_EXEC_STREAMS={self.exec_streams}: at most ACTORS_PARTITIONS ({self.partitions})"
            )
        return Layout(
            partitions=self.partitions,
            exec_streams=self.exec_streams,
            replicas=self.replicas,
            duplicate_window=self.duplicate_window,
            ack_wait=self.ack_wait,
            lease_ttl=self.lease_ttl,
            engine_max_resident=self.engine_max_resident,
            counter_max_resident=self.counter_max_resident,
            max_value_bytes=self.max_value_bytes,
            step_output_max_bytes=self.step_output_max_bytes,
            finished_retention=self.finished_retention,
            dead_letter_retention=self.dead_letter_retention,
            archive_retention=self.archive_retention,
        )

    @property
    def payload_codec(self) -> PayloadCodec:
        """The codec of values written to and read from NATS (`CLEAR` without a key).
        Raises `SettingsInvalid` for a key that cannot be used."""
        try:
            keys = PayloadKeys.from_settings(self.payload_key, self.payload_key_file, self.payload_old_keys)
        except PayloadKeyInvalid as e:
            raise SettingsInvalid(str(e)) from None
        return CLEAR if keys is None else PayloadCodec(keys)

    @property
    def limits(self) -> Limits:
        """What the starter fixes in every start record it writes."""
        return Limits(
            template_ops=self.template_ops,
            template_output=self.template_output,
            max_activations=self.max_steps,
            max_attempts=self.max_attempts_ceiling,
        )


def archive_place_problem(place: str) -> str | None:
    """Why `place` is not where finished executions may be archived (None: it is)."""
    if place in ARCHIVE_PLACES or place.startswith("/"):
        return None
    return "must be `off`, `objects` or an absolute directory path"


def _parse(f: dataclasses.Field[Any], raw: str, var: str) -> Any:
    kind = str(f.type)
    if f.name == "pod_name" and not _KEY_SAFE.match(raw):
        raise SettingsInvalid(f"{var}={raw!r}: only letters, digits, '_' and '-' (it is a key in the owners bucket)")
    if f.name == "archive" and (problem := archive_place_problem(raw)):
        raise SettingsInvalid(f"{var}={raw!r}: {problem}")
    if f.name == "nats_sync" and raw not in SYNC_MODES:
        raise SettingsInvalid(f"{var}={raw!r}: must be one of {', '.join(SYNC_MODES)}")
    if kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsInvalid(f"{var}={raw!r}: not a boolean (1 or 0)")
    if "str" in kind:
        return raw
    number: int | float
    try:
        number = float(raw) if kind == "float" else int(raw)
    except ValueError:
        raise SettingsInvalid(f"{var}={raw!r}: not {'a number' if kind == 'float' else 'a whole number'}") from None
    minimum = f.metadata["minimum"]
    if minimum is not None and not number >= minimum:  # `not >=`: NaN is refused too
        raise SettingsInvalid(f"{var}={raw!r}: must be at least {minimum:g}")
    return number


def _default(f: dataclasses.Field[Any]) -> str:
    value = f.default
    if value is None or value is dataclasses.MISSING:
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}" if isinstance(value, int) and value >= 10_000 else str(value)


def markdown_table() -> str:
    """The settings table of docs/settings.md: variable, flag, default, meaning."""
    rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        flag = f"`{f.metadata['flag']}`" if f.metadata["flag"] else ""
        rows.append(f"| `{f.metadata['env']}` | {flag} | {_default(f)} | {f.metadata['meaning']} |")
    return "\n".join(rows)


def _field_docs() -> str:
    lines = []
    for f in dataclasses.fields(Settings):
        flag = f", {f.metadata['flag']}" if f.metadata["flag"] else ""
        lines.append(f"    {f.name} ({f.metadata['env']}{flag}; default {_default(f)}): {f.metadata['meaning']}")
    return "\n".join(lines) + "\n"


# the per-field list in `help(Settings)` is written from the fields themselves, so the
# docstring, the table in docs/settings.md and the parser cannot disagree
Settings.__doc__ = (Settings.__doc__ or "") + _field_docs()


if __name__ == "__main__":
    print(markdown_table())
