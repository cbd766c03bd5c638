"""Tool actor hardening after the security review: what a step or a server could make a
tool actor publish, or send where it should not."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from actors.client import Client
from actors.config.settings import Settings
from actors.natsio.dial import redact
from actors.pod.roles import connect, start_roles
from actors.tools.credentials import CredentialSource
from actors.tools.executors import run_tool
from actors.tools.failures import ToolFailure
from actors.tools.podguard import dumpable, pod_secrets
from actors.tools.pypool import PythonPool
from actors.tools.redact import Redactor
from actors.tools.resources import ToolResources
from streams.server import NatsServer
from tests.conftest import System, make_layout, of_type

pytestmark = [pytest.mark.timeout(60)]


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


@pytest_asyncio.fixture
async def runners() -> AsyncIterator[list[web.AppRunner]]:
    made: list[web.AppRunner] = []
    yield made
    for r in made:
        await r.cleanup()


@pytest.mark.asyncio
async def test_an_http_error_masks_an_echoed_credential_before_cutting_the_excerpt(
    runners: list[web.AppRunner],
) -> None:
    token = "tok-SUPERSECRET-0123456789abcdef"

    async def echo(request: web.Request) -> web.Response:
        # a debug 401 page echoing the header, placed so the 200-character excerpt cuts it
        return web.Response(status=401, text="x" * 170 + " got header " + request.headers["Authorization"])

    app = web.Application()
    app.router.add_get("/", echo)
    runner, port = await _serve(app)
    runners.append(runner)
    resources = ToolResources(credentials=CredentialSource(None, {"API": token}))
    try:
        with pytest.raises(ToolFailure) as caught:
            await run_tool(
                "http",
                {"kind": "http", "url": f"http://127.0.0.1:{port}/", "credential": "api"},
                {},
                timeout=10,
                resources=resources,
            )
    finally:
        await resources.close()
    assert caught.value.type == "HTTPError"
    assert "Bearer ***" in caught.value.message
    assert token[:6] not in caught.value.message


@pytest.mark.asyncio
async def test_http_credential_headers_follow_a_redirect_on_the_same_origin_only(
    runners: list[web.AppRunner],
) -> None:
    seen: dict[str, dict[str, str]] = {}

    def record(where: str, request: web.Request) -> None:
        seen[where] = {k.lower(): v for k, v in request.headers.items() if k.lower() in ("x-api-key", "authorization")}

    async def other(request: web.Request) -> web.Response:
        record("other", request)
        return web.json_response({"at": "other"})

    other_app = web.Application()
    other_app.router.add_get("/", other)
    runner, other_port = await _serve(other_app)
    runners.append(runner)

    async def start(request: web.Request) -> web.Response:
        record("start", request)
        raise web.HTTPFound("/same")  # the same origin: the credential goes along

    async def same(request: web.Request) -> web.Response:
        record("same", request)
        # another origin (host and port differ): the credential must not reach it
        raise web.HTTPTemporaryRedirect(f"http://localhost:{other_port}/")

    app = web.Application()
    app.router.add_get("/", start)
    app.router.add_get("/same", same)
    runner, port = await _serve(app)
    runners.append(runner)

    for cred, header in (
        ({"header.X-Api-Key": "key-0123456789secret"}, "x-api-key"),
        ({"token": "tok-0123456789secret"}, "authorization"),
    ):
        seen.clear()
        resources = ToolResources(credentials=CredentialSource(None, {"API": json.dumps(cred)}))
        try:
            out = await run_tool(
                "http",
                {"kind": "http", "url": f"http://127.0.0.1:{port}/", "credential": "api"},
                {},
                timeout=10,
                resources=resources,
            )
        finally:
            await resources.close()
        assert json.loads(out)["data"] == {"at": "other"}
        assert header in seen["start"] and header in seen["same"]
        assert seen["other"] == {}, cred


def test_url_userinfo_is_masked_to_the_last_at_before_the_host() -> None:
    r = Redactor()
    assert r.text("GET http://svc:p@ssw0rd-long@example.com/x failed") == "GET http://***@example.com/x failed"
    assert r.data(b"http://svc:p@ss@h/x@y") == b"http://***@h/x@y"  # a later `@` in the path is not userinfo
    assert r.text("see http://h/p@q and a@b.c") == "see http://h/p@q and a@b.c"


def test_dial_redact_masks_a_password_holding_an_at_whole() -> None:
    assert redact("nats://svc:p@ssw0rd-long@host:4222") == "nats://svc:***@host:4222"
    assert redact("nats://tok@en-long@host") == "nats://***@host"
    assert redact("nats://a:b@h1:4222,nats://c:d@e@h2") == "nats://a:***@h1:4222,nats://c:***@h2"
    assert redact("nats://host:4222") == "nats://host:4222"


def test_a_yaml_credential_file_keeps_every_value_as_written_and_masks_numbers(tmp_path: Path) -> None:
    (tmp_path / "api").write_text(
        "username: svc\npassword: 0777123\ntoken2: 12:30:45\npin: 98765432\nanswer: yes\ntls: true\n"
        "nothing: ~\nfloat: 1e5\n"
    )
    r = Redactor()
    values = CredentialSource(tmp_path, redactor=r).resolve("api")
    # YAML 1.1 would read 261715 (octal), 45045 (sexagesimal), true and 100000.0
    assert values == {
        "username": "svc",
        "password": "0777123",
        "token2": "12:30:45",
        "pin": "98765432",
        "answer": "yes",
        "tls": "true",
        "nothing": "",
        "float": "1e5",
    }
    masked = r.text("pw 0777123 / 12:30:45 / pin 98765432 / tls true / svc")
    assert masked == "pw *** / *** / pin *** / tls true / svc"  # a short value keeps the old rule


def test_a_json_credential_file_keeps_numbers_as_written_and_masks_them(tmp_path: Path) -> None:
    (tmp_path / "api").write_text('{"pin": 1234, "big": 1.50e3, "flag": false}')
    r = Redactor()
    assert CredentialSource(tmp_path, redactor=r).resolve("api") == {"pin": "1234", "big": "1.50e3", "flag": "false"}
    assert r.text("1234 1.50e3 false") == "*** *** false"


@pytest.mark.asyncio
async def test_a_python_step_cannot_leave_c_environment_variables_to_the_next_one() -> None:
    pool = PythonPool(size=1)  # one worker: both steps run in it
    show = (
        "import subprocess\n"
        "def main():\n"
        "    return subprocess.run(['sh', '-c', 'echo \"$LEAKED_TOKEN|$HOME|${PATH:+path}\"'],\n"
        "                          capture_output=True, text=True).stdout.strip()\n"
    )
    # os.putenv and os.unsetenv change what subprocesses inherit, not os.environ
    leak = (
        "import os\n"
        "def main():\n"
        "    os.putenv('LEAKED_TOKEN', 'tok-from-step-A-0123')\n"
        "    os.putenv('HOME', '/leaked')\n"
        "    os.unsetenv('PATH')\n"
        "    return 1\n"
    )
    try:
        before = await pool.run(show, {}, timeout=30)
        assert before.startswith("|") and before.endswith("|path")
        assert await pool.run(leak, {}, timeout=30) == 1
        assert await pool.run(show, {}, timeout=30) == before
    finally:
        await pool.close()


def test_the_pods_secrets_are_masked_in_every_spelling(tmp_path: Path) -> None:
    raw = bytes(range(200, 232))  # base64 with '+' and '/', so the URL-safe spelling differs
    key = base64.b64encode(raw).decode()
    (tmp_path / "password").write_text("np-from-file-0123\n")
    (tmp_path / "keys").write_text(f"# current first\nnew:{key}\n")
    settings = Settings(
        nats_password_file=str(tmp_path / "password"),
        nats_token="nt-token-4567",
        ui_token="ui-token-8901",
        payload_key_file=str(tmp_path / "keys"),
        payload_old_keys="old:" + base64.b64encode(b"o" * 32).decode(),
    )
    r = Redactor()
    r.add(pod_secrets(settings))
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    for secret in (
        "np-from-file-0123",
        "nt-token-4567",
        "ui-token-8901",
        f"new:{key}",
        key,
        urlsafe,
        base64.b64encode(b"o" * 32).decode(),
    ):
        assert r.text(f"[{secret}]") == "[***]", secret


@pytest.mark.asyncio
async def test_a_step_printing_the_pods_nats_password_or_payload_key_shows_masks(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    password = "np-pod-password-0123"
    key = base64.b64encode(bytes(range(32))).decode()
    (tmp_path / "password").write_text(password + "\n")
    # what a step could find: the pod's environment through /proc (as root), a mounted file
    found = tmp_path / "found"
    found.write_text(f"NATS_PASSWORD={password}\nACTORS_PAYLOAD_KEY=k1:{key}\nraw {key}\n")
    settings = Settings(python_workers=1, nats_password_file=str(tmp_path / "password"), payload_key=f"k1:{key}")
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    runtime = await start_roles(nc, layout=layout, settings=settings)
    try:
        # a tool pod's process is undumpable: its /proc files are root's, not the step's user's
        assert dumpable() == 0
        system = System(nats_server, nc, Client(nc, layout=layout), runtime, layout, tmp_path)
        text = (
            "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: snoop}\nworkflow:\n"
            f"  - step: snoop\n    tool: {{kind: shell, command: 'cat {found}'}}\n"
        )
        eid, status = await system.run_yaml(text)
        assert status.state == "COMPLETED"
        [done] = of_type(await system.events(eid), "call.done", "snoop")
        assert done.data["result"]["stdout"] == "NATS_PASSWORD=***\nACTORS_PAYLOAD_KEY=***\nraw ***\n"
    finally:
        await runtime.stop()
        await nc.close()


@pytest.mark.asyncio
async def test_http_redirects_followed_by_hand_keep_aiohttps_rules(runners: list[web.AppRunner]) -> None:
    got: list[tuple[str, bytes]] = []

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def post(request: web.Request) -> web.Response:
        raise web.HTTPSeeOther("/after")  # 303: the next request is a GET, without the body

    async def after(request: web.Request) -> web.Response:
        got.append((request.method, await request.read()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/loop", loop)
    app.router.add_post("/post", post)
    app.router.add_get("/after", after)
    runner, port = await _serve(app)
    runners.append(runner)
    resources = ToolResources(credentials=CredentialSource(None, {"API": "tok-0123456789secret"}))
    try:
        with pytest.raises(ToolFailure) as caught:
            await run_tool(
                "http",
                {"kind": "http", "url": f"http://127.0.0.1:{port}/loop", "credential": "api"},
                {},
                timeout=10,
                resources=resources,
            )
        assert caught.value.type == "TooManyRedirects"
        out = await run_tool(
            "http",
            {"kind": "http", "method": "POST", "url": f"http://127.0.0.1:{port}/post", "credential": "api"},
            {"a": 1},
            timeout=10,
            resources=resources,
        )
    finally:
        await resources.close()
    assert json.loads(out)["data"] == {"ok": True} and got == [("GET", b"")]


_SNOOP = """
import subprocess, sys
from actors.tools.podguard import make_undumpable
assert make_undumpable()
# a step: a child of the pod's process, as its user, reading the pod's environment
r = subprocess.run(["sh", "-c", "cat /proc/$PPID/environ"], capture_output=True)
sys.stdout.write("leaked" if b"NATS_PASSWORD=np-snooped-0123" in r.stdout else "refused")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_step_of_the_pods_user_cannot_read_an_undumpable_pods_environment() -> None:
    # as root, /proc is readable whatever the flag: the pod runs as a non-root user (uid 10001)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root, and no setpriv to run as another user")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NATS_PASSWORD": "np-snooped-0123"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([*prefix, sys.executable, "-c", _SNOOP], env=env, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == b"refused"
