"""Credentials named by a tool (`credential: api`) are resolved by the tool actor from
ACTORS_CREDENTIALS_DIR (a file or a folder per name) or ACTORS_CREDENTIAL_<NAME>, at each
call; http gets headers, python a `credential` argument, shell variables; a missing one
fails the step with CredentialNotFound. Python and shell steps see a clean environment
(PATH, HOME, LANG, TMPDIR, the step's `env`, its credential), never the pod's."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from actors.client import Client
from actors.config.settings import Settings
from actors.pod.roles import connect, start_roles
from actors.tools.credentials import CredentialSource, credential_env_name
from actors.tools.executors import run_tool
from actors.tools.failures import ToolFailure
from actors.tools.pypool import PythonPool
from actors.tools.resources import ToolResources
from streams.server import NatsServer
from tests.conftest import System, make_layout, of_type

pytestmark = [pytest.mark.timeout(120)]

# the pod's own variables: a step must see none of them
CANARY = {"ACTORS_TEST_CANARY": "pod-only-1", "SOME_POD_SECRET": "pod-only-2", "NATS_URL": "nats://u:pw@example:4222"}


@pytest.fixture
def creds(tmp_path: Path) -> Path:
    d = tmp_path / "creds"
    d.mkdir()
    (d / "api").write_text("tok-api-4711\n")  # a plain token
    (d / "db.json").write_text("{}")  # not `db`: names are exact
    (d / "db").write_text('{"username": "dbuser", "password": "db-pass-0042", "port": 5432}')
    # a Kubernetes Secret volume: keys are links into a timestamped folder through ..data
    deploy = d / "deploy"
    stamp = deploy / "..2026_11_24_00_00_00.000000001"
    stamp.mkdir(parents=True)
    (stamp / "token").write_text("deploy-tok-9\n")
    (stamp / "region").write_text("eu-west-1")
    (deploy / "..data").symlink_to(stamp.name)
    for key in ("token", "region"):
        (deploy / key).symlink_to(f"..data/{key}")
    (d / "basic.yaml").write_text("username: alice\npassword: wonder-land-7\n")
    (d / "basic").write_text("username: alice\npassword: wonder-land-7\n")  # YAML
    (d / "headers").write_text('{"header.X-Api-Key": "key-in-a-header-1", "header.X-Team": "ops"}')
    return d


@pytest_asyncio.fixture
async def pod(
    nats_server: NatsServer, tmp_path: Path, creds: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[System]:
    """A pod with every role, one python worker (so consecutive steps share it), the
    credentials above, and variables of its own set before it starts."""
    for k, v in CANARY.items():
        monkeypatch.setenv(k, v)
    settings = Settings(
        python_workers=1, credentials_dir=str(creds), credentials={"FROM_ENV": '{"token": "env-tok-31337"}'}
    )
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    runtime = await start_roles(nc, layout=layout, settings=settings)
    try:
        yield System(nats_server, nc, Client(nc, layout=layout), runtime, layout, tmp_path)
    finally:
        await runtime.stop()
        await nc.close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def playbook(name: str, steps: str) -> str:
    return f"apiVersion: actors/v1\nkind: Playbook\nmetadata: {{name: {name}}}\nworkflow:\n{steps}"


async def results(system: System, eid: str) -> dict[str, Any]:
    """Each step's result (its last `call.done`)."""
    return {i.step: i.data.get("result") for i in of_type(await system.events(eid), "call.done") if i.step}


# --- the sources -------------------------------------------------------------------------


def test_a_file_is_a_token_or_a_mapping_a_folder_one_key_per_file(creds: Path) -> None:
    source = CredentialSource(creds)
    assert source.resolve("api") == {"token": "tok-api-4711"}
    assert source.resolve("db") == {"username": "dbuser", "password": "db-pass-0042", "port": "5432"}
    assert source.resolve("basic") == {"username": "alice", "password": "wonder-land-7"}
    # the Secret volume's own `..data` entries are not keys
    assert source.resolve("deploy") == {"region": "eu-west-1", "token": "deploy-tok-9"}


def test_variables_are_the_fallback_and_the_folder_wins(creds: Path) -> None:
    env = Settings.from_env(
        {
            "ACTORS_CREDENTIALS_DIR": str(creds),
            credential_env_name("my-api"): "plain-token-1",
            credential_env_name("api"): "loses-to-the-file",
            "ACTORS_CREDENTIAL_DB_RO": '{"username": "ro", "password": "ro-pass-77"}',
        }
    )
    assert credential_env_name("my-api") == "ACTORS_CREDENTIAL_MY_API"
    assert env.credentials_dir == str(creds)
    source = CredentialSource(env.credentials_dir, env.credentials)
    assert source.resolve("my-api") == {"token": "plain-token-1"}
    assert source.resolve("db.ro") == {"username": "ro", "password": "ro-pass-77"}
    assert source.resolve("api") == {"token": "tok-api-4711"}
    assert "loses-to-the-file" not in repr(env)  # a Settings repr never shows a credential


def test_a_rotated_file_is_read_at_the_next_call(creds: Path) -> None:
    source = CredentialSource(creds)
    assert source.resolve("api") == {"token": "tok-api-4711"}
    (creds / "api").write_text("tok-rotated-4712")
    assert source.resolve("api") == {"token": "tok-rotated-4712"}


@pytest.mark.parametrize(
    ("name", "kind", "says"),
    [
        ("nope", "CredentialNotFound", "credential 'nope' not found: no file or folder 'nope' in"),
        ("../creds/api", "ToolConfigError", "is not valid"),
        (".hidden", "ToolConfigError", "is not valid"),
        ("broken", "CredentialInvalid", "starts with '{' but is not a JSON or YAML mapping"),
        ("nested", "CredentialInvalid", "key 'inner' must be a string or a number"),
    ],
)
def test_a_credential_that_cannot_be_used_names_itself_never_a_value(
    creds: Path, name: str, kind: str, says: str
) -> None:
    (creds / "broken").write_text('{"password": "half-a-secret-1"')
    (creds / "nested").write_text('{"inner": {"password": "nested-secret-2"}}')
    with pytest.raises(ToolFailure) as caught:
        CredentialSource(creds).resolve(name)
    assert caught.value.type == kind and says in caught.value.message, caught.value.message
    assert "secret" not in caught.value.message and "\n" not in caught.value.message


# --- the tools ---------------------------------------------------------------------------


class Echo:
    """An HTTP server that answers with the request's headers."""

    url = ""

    async def headers(self, request: web.Request) -> web.Response:
        return web.json_response({k: v for k, v in request.headers.items()})


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[Echo]:
    e = Echo()
    app = web.Application()
    app.router.add_get("/headers", e.headers)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    e.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/headers"  # type: ignore[union-attr]
    try:
        yield e
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_http_gets_a_bearer_token_basic_auth_or_named_headers(pod: System, echo: Echo) -> None:
    eid, status = await pod.run_yaml(
        playbook(
            "httpcreds",
            f"""
  - step: bearer
    tool: {{kind: http, url: "{echo.url}", credential: api}}
    next: basic
  - step: basic
    tool: {{kind: http, url: "{echo.url}", credential: basic}}
    next: named
  - step: named
    tool: {{kind: http, url: "{echo.url}", credential: headers, headers: {{X-Api-Key: from-the-tool}}}}
    next: env
  - step: env
    tool: {{kind: http, url: "{echo.url}", credential: from_env}}
""",
        )
    )
    assert status.state == "COMPLETED", status
    seen = {step: r["data"] for step, r in (await results(pod, eid)).items()}
    assert seen["bearer"]["Authorization"] == "Bearer tok-api-4711"
    assert seen["basic"]["Authorization"] == "Basic " + base64.b64encode(b"alice:wonder-land-7").decode()
    assert seen["named"]["X-Api-Key"] == "key-in-a-header-1" and seen["named"]["X-Team"] == "ops"  # credential wins
    assert seen["env"]["Authorization"] == "Bearer env-tok-31337"


@pytest.mark.asyncio
async def test_python_gets_a_credential_argument_and_shell_variables(pod: System) -> None:
    eid, status = await pod.run_yaml(
        playbook(
            "pycreds",
            """
  - step: py
    tool:
      kind: python
      credential: db
      code: |
        def main(table, credential):
            return {"table": table, "user": credential["username"], "pw_len": len(credential["password"])}
    args: {table: users}
    next: undeclared
  - step: undeclared
    tool:
      kind: python
      credential: db
      code: |
        def main(**args):
            return sorted(args)
    args: {a: 1}
    next: sh
  - step: sh
    tool:
      kind: shell
      credential: deploy
      command: 'printf "%s %s" "$TOKEN" "$REGION" | sha256sum; printf "%s" "$ARG_X"'
    args: {x: 1}
""",
        )
    )
    assert status.state == "COMPLETED", status
    got = await results(pod, eid)
    assert got["py"] == {"table": "users", "user": "dbuser", "pw_len": 12}
    assert got["undeclared"] == ["a"]  # a main without a `credential` parameter is not given one
    # a shell step's stdout is masked (test_redaction.py): its digest shows what it saw
    assert got["sh"]["stdout"] == f"{sha256(b'deploy-tok-9 eu-west-1')}  -\n1"


@pytest.mark.asyncio
async def test_a_missing_credential_is_a_step_failure_the_rules_see(pod: System) -> None:
    eid, status = await pod.run_yaml(
        playbook(
            "missing",
            """
  - step: call
    tool: {kind: shell, command: "echo hi", credential: nowhere}
    on_error:
      - when: "{{ error.type == 'CredentialNotFound' }}"
        decision: ignore
        result: {seen: "{{ error.message }}"}
    next: unhandled
  - step: unhandled
    tool: {kind: python, code: "def main(): return 1", credential: nowhere-either}
""",
        )
    )
    assert status.state == "FAILED", status
    [decided] = of_type(await pod.events(eid), "step.failure_decided", "call")
    assert decided.data["decision"] == "ignore" and decided.data["error"]["type"] == "CredentialNotFound"
    assert decided.data["result"]["seen"].startswith("credential 'nowhere' not found")
    assert status.error is not None and status.error["type"] == "CredentialNotFound"
    assert "credential 'nowhere-either' not found" in status.error["message"]
    assert "ACTORS_CREDENTIAL_NOWHERE_EITHER" in status.error["message"]


@pytest.mark.asyncio
async def test_a_rotated_secret_is_used_by_the_running_pod(pod: System, creds: Path) -> None:
    step = """
  - step: read
    tool: {kind: shell, command: 'printf "%s" "$TOKEN" | sha256sum', credential: api}
"""
    eid, _ = await pod.run_yaml(playbook("rot", step))
    (creds / "api").write_text("tok-api-4712-rotated")
    eid2, _ = await pod.run_yaml(playbook("rot", step))
    assert (await results(pod, eid))["read"]["stdout"] == f"{sha256(b'tok-api-4711')}  -\n"
    assert (await results(pod, eid2))["read"]["stdout"] == f"{sha256(b'tok-api-4712-rotated')}  -\n"


# --- the clean environment ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_steps_see_a_clean_environment_never_the_pods(pod: System) -> None:
    assert os.environ["ACTORS_TEST_CANARY"] == "pod-only-1"  # the pod has it
    eid, status = await pod.run_yaml(
        playbook(
            "cleanenv",
            """
  - step: first
    tool:
      kind: python
      env: {STEP_VAR: "declared", N: 3}
      credential: db
      code: |
        import os
        def main(credential):
            os.environ["LEFT_BEHIND"] = "by the first step"
            return dict(os.environ)
    next: second
  - step: second
    tool:
      kind: python
      code: |
        import os
        def main():
            return dict(os.environ)
    next: sh
  - step: sh
    tool: {kind: shell, command: env, env: {STEP_VAR: "declared"}, credential: api}
""",
        )
    )
    assert status.state == "COMPLETED", status
    got = await results(pod, eid)
    kept = {"PATH", "HOME", "LANG", "TMPDIR"}
    first, second = got["first"], got["second"]
    assert set(first) - kept == {"STEP_VAR", "N", "LEFT_BEHIND"} and first["STEP_VAR"] == "declared"
    assert first["PATH"] == os.environ["PATH"]
    # the same worker ran the second step: neither the first's env nor what its code set is left
    assert set(second) <= kept and "PATH" in second
    shell = dict(line.split("=", 1) for line in got["sh"]["stdout"].splitlines() if "=" in line)
    # sh itself adds PWD, SHLVL and `_`
    assert set(shell) - kept - {"PWD", "SHLVL", "_"} == {"STEP_VAR", "TOKEN"}
    for env in (first, second, shell):
        assert not set(env) & set(CANARY) and not any(k.startswith("ACTORS_") for k in env)


@pytest.mark.asyncio
async def test_a_python_worker_gives_each_call_its_env_and_credential_alone() -> None:
    pool = PythonPool(size=1, environment={"PATH": os.defpath})
    code = "import os\ndef main(credential=None, **args):\n    return [credential, os.environ.get('V')]\n"
    try:
        first = await pool.run(code, {}, credential={"token": "t-1"}, env={"V": "1"}, timeout=30)
        second = await pool.run(code, {}, timeout=30)
        assert (first, second) == ([{"token": "t-1"}, "1"], [None, None])  # same worker, nothing left over
        with pytest.raises(ToolFailure, match="args name `credential`"):
            await pool.run(code, {"credential": "mine"}, credential={"token": "t-1"}, timeout=30)
        assert await pool.run(code, {"credential": "mine"}, timeout=30) == ["mine", None]  # none given: args as ever
        with pytest.raises(ToolFailure, match="python env: ") as caught:
            await pool.run(code, {}, env={"V": "1", "A=B": "x"}, timeout=30)
        assert caught.value.type == "ToolConfigError"
        assert await pool.run(code, {}, timeout=30) == [None, None]  # the same worker, still clean
    finally:
        await pool.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "url", "kind", "says"),
    [
        ("api", "http://someone:pw@127.0.0.1:1/x", "ToolConfigError", "sets Authorization and the url carries a user"),
        ("deploy", "http://127.0.0.1:1/x", "CredentialInvalid", "`token`, `username`/`password` or `header.<Name>`"),
    ],
)
async def test_an_http_credential_it_cannot_use_fails_before_the_request(
    creds: Path, name: str, url: str, kind: str, says: str
) -> None:
    (creds / "deploy" / "token").unlink()  # left: `region`, nothing http can send
    resources = ToolResources(credentials=CredentialSource(creds))
    try:
        with pytest.raises(ToolFailure) as caught:
            await run_tool("http", {"url": url, "credential": name}, {}, timeout=10, resources=resources)
    finally:
        await resources.close()
    assert caught.value.type == kind and says in caught.value.message, caught.value.message
