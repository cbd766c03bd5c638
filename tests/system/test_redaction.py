"""A credential's value never leaves a tool actor except in a value the step returned
itself: errors, tracebacks, what a step printed (event and object store), a shell step's
stdout and stderr, loop iterations' errors and every log line are masked (`***`), and so
is the userinfo of a URL. Checked by planting credentials, running playbooks that push
them into each of those, then reading every message the server carried and every stream,
bucket and object store it keeps, and the process's log output."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.config.settings import Settings
from actors.pod.roles import connect, start_roles
from actors.tools.capture import Captured
from actors.tools.credentials import CredentialSource
from actors.tools.redact import MASK, Redactor
from streams.server import NatsServer
from tests.conftest import System, make_layout, of_type

pytestmark = [pytest.mark.timeout(120)]

PASSWORD = "pw-Zq9xK2-planted"  # credential `db` (a folder), key `password`
TOKEN = "tok-Lm4pR7-planted"  # credential `api` (ACTORS_CREDENTIAL_API)
URL_KEY = "urlkey-Hn3-planted"  # only ever in a URL's userinfo
CAP = 20_000  # bytes of a step's output kept


@pytest_asyncio.fixture
async def pod(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[tuple[System, list[Msg]]]:
    """A pod with the planted credentials, and every message the server carries from
    before the pod starts (a `>` subscription of its own)."""
    db = tmp_path / "creds" / "db"
    db.mkdir(parents=True)
    (db / "username").write_text("dbadmin\n")
    (db / "password").write_text(PASSWORD + "\n")
    settings = Settings(python_workers=1, credentials_dir=str(db.parent), credentials={"API": TOKEN})
    spy = await connect(nats_server.url, name="spy")
    seen: list[Msg] = []

    async def keep(msg: Msg) -> None:
        seen.append(msg)

    await spy.subscribe(">", cb=keep, pending_msgs_limit=-1, pending_bytes_limit=-1)
    layout = make_layout(step_output_max_bytes=CAP)
    nc = await connect(nats_server.url, name="test")
    runtime = await start_roles(nc, layout=layout, settings=settings)
    try:
        yield System(nats_server, nc, Client(nc, layout=layout), runtime, layout, tmp_path), seen
    finally:
        await runtime.stop()
        await nc.close()
        await spy.close()


def playbook(name: str, steps: str) -> str:
    return f"apiVersion: actors/v1\nkind: Playbook\nmetadata: {{name: {name}}}\nworkflow:\n{steps}"


RAISES = playbook(
    "raises",
    """
  - step: login
    tool:
      kind: python
      credential: db
      code: |
        def main(credential):
            raise PermissionError(f"login refused for {credential['username']}:{credential['password']}")
""",
)

# printed: the cap falls inside one copy of the password, the tail starts inside another
PRINTS = playbook(
    "prints",
    f"""
  - step: chatty
    tool:
      kind: python
      credential: db
      code: |
        import sys
        def main(credential):
            pw = credential["password"]
            print("connecting with", pw)
            print("warning:", pw, file=sys.stderr)
            sys.stdout.write("a" * ({CAP} - 80 - 5) + pw + "b" * 10000 + pw + "c" * (4096 - 5))
            return "done"
""",
)

SHELL = playbook(
    "shell",
    """
  - step: fine
    tool: {kind: shell, credential: api, command: 'echo "token is $TOKEN"; echo "debug $TOKEN" >&2'}
    next: fails
  - step: fails
    tool: {kind: shell, credential: db, command: 'echo "as $USERNAME/$PASSWORD"; echo "denied: $PASSWORD" >&2; exit 2'}
""",
)

LOOP = playbook(
    "looped",
    """
  - step: each
    loop: {collection: [1, 2, 3], element: n, tolerated_failures: 3}
    tool:
      kind: python
      credential: db
      code: |
        def main(n, credential):
            if n != 2:
                raise ValueError(f"item {n}: bad password {credential['password']!r}")
            return n
    args: {n: "{{ n }}"}
""",
)

USERINFO = playbook(
    "userinfo",
    f"""
  - step: call
    tool: {{kind: http, url: "http://someone:{URL_KEY}@127.0.0.1:1/x", timeout: 5}}
""",
)


async def everything_stored(system: System) -> list[bytes]:
    """Every message every stream holds (KV buckets and object stores are streams too),
    headers and data."""
    jsm = system.nc.jsm()
    stored: list[bytes] = []
    for info in await jsm.streams_info():
        if not info.state.messages:
            continue
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                m = await jsm.get_msg(info.config.name or "", seq)
            except NotFoundError:
                continue
            stored.append(repr(m.headers).encode() + b"\n" + (m.data or b""))
    return stored


@pytest.mark.asyncio
async def test_no_credential_value_reaches_a_stream_a_bucket_the_object_store_or_a_log(
    pod: tuple[System, list[Msg]], caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    system, carried = pod
    caplog.set_level(logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)  # what `-v` adds: a handler made after the pod started
    logging.getLogger().addHandler(handler)
    try:
        states = {}
        for text in (RAISES, PRINTS, SHELL, LOOP):
            eid, status = await system.run_yaml(text)
            states[eid] = status.state
        # the secrets did get where they were sent: each step failed or printed as planned
        assert list(states.values()) == ["FAILED", "COMPLETED", "FAILED", "COMPLETED"], states
        # a log line of the actor process, with a traceback, written after the pod started
        log = logging.getLogger("actors.tools")
        log.warning("reconnecting as dbadmin with %s (token %s)", PASSWORD, TOKEN)
        try:
            raise ConnectionError(f"refused {PASSWORD}")
        except ConnectionError:
            log.exception("call failed for nats://ops:%s@nats:4222", URL_KEY)
    finally:
        logging.getLogger().removeHandler(handler)

    secrets = [PASSWORD.encode(), TOKEN.encode(), URL_KEY.encode()]
    stored = await everything_stored(system)
    for where, blobs in (("stored", stored), ("carried", [repr(m.headers).encode() + m.data for m in carried])):
        for blob in blobs:
            for secret in secrets:
                assert secret not in blob, f"{secret!r} {where}: {blob[:600]!r}"
    # it read the logs, masks and all: every execution's records (how many messages a loop's
    # results take depends on how its batches fill, so no count is asserted)
    assert all(any(eid.encode() in m for m in stored) for eid in states)
    assert any(MASK.encode() in m for m in stored)
    out, err = capfd.readouterr()
    # every value of a credential is masked, the user name too
    assert "reconnecting as *** with *** (token ***)" in err and "ConnectionError: refused ***" in err
    assert "nats://***@nats:4222" in err
    for text in (caplog.text, out, err):
        for secret in secrets:
            assert secret.decode() not in text

    # what the errors and outputs say instead
    raised = next(e for e in states if states[e] == "FAILED")
    status = await system.client.status(raised)
    assert status is not None and status.error is not None
    assert status.error["message"] == "login refused for ***:***"


@pytest.mark.asyncio
async def test_what_steps_print_and_shell_results_are_masked(pod: tuple[System, list[Msg]]) -> None:
    system, _ = pod
    eid, _ = await system.run_yaml(PRINTS)
    [out] = await system.client.outputs(eid)
    text = await system.client.output_text(out)
    assert text.startswith(f"connecting with {MASK}\nwarning: {MASK}\naaa")
    # cut by the cap inside a copy, and the tail starting inside another: the parts are masked too
    assert PASSWORD[:5] not in text and PASSWORD[-5:] not in out.tail and out.tail.startswith(MASK)

    eid, status = await system.run_yaml(SHELL)
    assert status.state == "FAILED"
    [fine] = of_type(await system.events(eid), "call.done", "fine")
    assert fine.data["result"]["stdout"] == f"token is {MASK}\n" and fine.data["result"]["stderr"] == f"debug {MASK}\n"
    [fails] = of_type(await system.events(eid), "call.error", "fails")
    assert fails.data["error"]["message"] == f"shell command exited with code 2: denied: {MASK}"


@pytest.mark.asyncio
async def test_url_userinfo_is_masked_in_errors(pod: tuple[System, list[Msg]]) -> None:
    system, _ = pod
    eid, status = await system.run_yaml(USERINFO)
    assert status.state == "FAILED"
    [error] = of_type(await system.events(eid), "call.error", "call")
    message = error.data["error"]["message"]
    # the host may be masked too: the redactor is the process's, and another test's
    # credential may have named 127.0.0.1 (every value of a credential is masked)
    assert message.startswith(f"http GET http://{MASK}@") and URL_KEY not in message


# a python step names its error by its exception's class, which its code may build from anything
NAMED = playbook(
    "named",
    """
  - step: login
    tool:
      kind: python
      credential: db
      code: |
        def main(credential):
            raise type(credential["password"], (Exception,), {})("x")
""",
)

# a sink's error quotes what its templates read: here the step's result, the password
SUNK = playbook(
    "sunk",
    """
  - step: fetch
    tool:
      kind: python
      credential: db
      code: |
        def main(credential):
            return credential["password"]
    sink: {tool: noop, args: {x: "{{ {}[result] }}"}}
""",
)


@pytest.mark.asyncio
async def test_an_error_type_or_a_sinks_error_made_of_a_credential_is_masked(pod: tuple[System, list[Msg]]) -> None:
    system, carried = pod
    eid, status = await system.run_yaml(NAMED)
    assert status.state == "FAILED" and status.error is not None
    assert (status.error["type"], status.error["message"]) == (MASK, "x")  # what `status`, `list` and the UI show
    [error] = of_type(await system.events(eid), "call.error", "login")
    assert error.data["error"]["type"] == MASK and PASSWORD not in error.data["error"]["traceback"]

    eid, status = await system.run_yaml(SUNK)
    assert status.state == "FAILED" and status.error is not None
    assert status.error["message"].endswith(f"'dict object' has no attribute '{MASK}'"), status.error

    stored = await everything_stored(system)
    for blob in stored + [repr(m.headers).encode() + m.data for m in carried]:
        assert PASSWORD.encode() not in blob, blob[:600]


def test_short_values_are_not_masked_and_escaped_forms_are() -> None:
    r = Redactor()
    r.add(["abc", 'q"ote\\slash-4'])
    # a value under 4 characters would mask every "abc" in every message: it is left alone
    assert r.text("abcdef") == "abcdef"
    # as JSON text and as a repr show it (an exception's message quoting it)
    assert r.text('{"k": "q\\"ote\\\\slash-4"}') == '{"k": "***"}'
    assert r.text(repr('q"ote\\slash-4')) == "'***'"
    cut = Captured(size=100, kept=b"x" * 10 + b'q"ote', tail=b"slash-4 end")
    masked = r.captured(cut)
    assert masked.kept == b"x" * 10 + b"***" and masked.tail == b"*** end"


def test_numbers_of_a_mapping_are_masked_booleans_and_a_port_are_not(tmp_path: Path) -> None:
    (tmp_path / "db").write_text(
        '{"password": "pw-typed-1234", "pin": 4711, "port": 5432, "tls": true, "host": "db.internal"}'
    )
    r = Redactor()
    CredentialSource(tmp_path, redactor=r).resolve("db")
    # a number may be a PIN; masking `true` would garble every JSON log line, and masking
    # a port every number like it in every step's output
    line = '{"host": "db.internal", "pin": 4711, "port": 5432, "tls": true, "password": "pw-typed-1234"}'
    assert r.text(line) == '{"host": "***", "pin": ***, "port": 5432, "tls": true, "password": "***"}'


@pytest.mark.asyncio
async def test_actors_cli_run_shows_masks_never_the_value(tmp_path: Path) -> None:
    """A whole process: `actors-cli -v run` (every actor, its log lines on stderr) with the
    credential in ACTORS_CREDENTIAL_API; the steps print it and fail with it."""
    pb = tmp_path / "leaky.yaml"
    pb.write_text(
        playbook(
            "leaky",
            """
  - step: show
    tool:
      kind: shell
      credential: api
      command: 'env | cut -d= -f1 | sort; echo "token $TOKEN"; echo "on stderr $TOKEN" >&2'
    next: fail
  - step: fail
    tool:
      kind: python
      credential: api
      code: |
        def main(credential):
            raise RuntimeError("rejected " + credential["token"])
""",
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "-v",
        "run",
        str(pb),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NATS_URL": "", "ACTORS_CREDENTIAL_API": TOKEN},
    )
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 90)
    out, err = out_b.decode(), err_b.decode()
    assert proc.returncode == 1, err
    assert TOKEN not in out + err
    assert f"token {MASK}" in out and f"on stderr {MASK}" in out and f"RuntimeError: rejected {MASK}" in out + err
    assert "TOKEN" in out and "ACTORS_CREDENTIAL_API" not in out and "NATS_URL" not in out  # the step's variables
