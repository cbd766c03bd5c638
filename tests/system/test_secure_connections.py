"""Authenticated, encrypted connections (issue 12, item 5): a playbook runs through a
real nats-server that requires TLS (server verified; client certificates required),
NKEY users, user and password, or a token, with every role in-process on the
authenticated connection and the CLI given its credentials by environment or file;
and a wrong credential fails every command within its timeout in one line, exit 5.
Certificates and seeds are made in the test (trustme, nkeys)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nkeys
import pytest
import pytest_asyncio
import trustme
import yaml

from actors.client import Client
from actors.config.settings import Settings, SettingsInvalid
from actors.natsio.connopts import ConnectOptions
from actors.natsio.dial import NatsUnavailable
from actors.pod.roles import connect, start_roles
from actors.wire.events import ExecState
from streams.server import NatsServer
from tests.conftest import EXAMPLES, make_layout, wait_for
from tests.support.cli import CLI, EXIT_INVALID, EXIT_NATS, cli, one_line
from tests.support.pods import ROOT, PodProcess, free_port, get

pytestmark = [pytest.mark.timeout(120)]
PASSWORD, TOKEN = "pa55-word-never-shown", "t0ken-never-shown"


@dataclass
class Pki:
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a CA nobody trusts."""

    dir: Path
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@actors.test")
    paths = {
        "ca": ca.cert_pem,
        "server_cert": server.cert_chain_pems[0],
        "server_key": server.private_key_pem,
        "client_cert": client.cert_chain_pems[0],
        "client_key": client.private_key_pem,
        "other_ca": other.cert_pem,
    }
    for name, blob in paths.items():
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
    return Pki(tmp_path, **{name: str(tmp_path / f"{name}.pem") for name in paths})


@dataclass
class Secured:
    """A server that requires something, and what a client must present: as options
    (in-process) and as environment variables (the CLI)."""

    kind: str
    config: str
    options: ConnectOptions
    env: dict[str, str]
    wrong: ConnectOptions  # a credential the server refuses
    wrong_env: dict[str, str] = field(default_factory=dict)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def secured(kind: str, pki: Pki) -> Secured:
    d = pki.dir
    if kind == "tls":  # the server's certificate verified against our CA
        config = f'tls {{ cert_file: "{pki.server_cert}", key_file: "{pki.server_key}" }}\n'
        return Secured(
            kind,
            config,
            ConnectOptions(tls_ca=pki.ca),
            {"NATS_TLS_CA": pki.ca},
            wrong=ConnectOptions(tls_ca=pki.other_ca),
            wrong_env={"NATS_TLS_CA": pki.other_ca},
        )
    if kind == "mtls":  # and the server verifies ours
        config = (
            f'tls {{ cert_file: "{pki.server_cert}", key_file: "{pki.server_key}", ca_file: "{pki.ca}", '
            "verify: true }\n"
        )
        return Secured(
            kind,
            config,
            ConnectOptions(tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key),
            {"NATS_TLS_CA": pki.ca, "NATS_TLS_CERT": pki.client_cert, "NATS_TLS_KEY": pki.client_key},
            wrong=ConnectOptions(tls_ca=pki.ca),  # no client certificate
            wrong_env={"NATS_TLS_CA": pki.ca},
        )
    if kind == "nkey":
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        public = nkeys.from_seed(bytearray(seed)).public_key.decode()
        stranger = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)  # a user the server does not know
        seed_file = _write(d / "user.nk", seed.decode() + "\n")
        stranger_file = _write(d / "stranger.nk", stranger.decode() + "\n")
        return Secured(
            kind,
            f'authorization {{ users: [ {{ nkey: "{public}" }} ] }}\n',
            ConnectOptions(nkey_seed_file=seed_file),
            {"NATS_NKEY": seed_file},
            wrong=ConnectOptions(nkey_seed_file=stranger_file),
            wrong_env={"NATS_NKEY": stranger_file},
        )
    if kind == "password":  # the CLI reads the password from a file (a mounted Secret)
        password_file = _write(d / "password", PASSWORD + "\n")
        return Secured(
            kind,
            f'authorization {{ user: "ops", password: "{PASSWORD}" }}\n',
            ConnectOptions(user="ops", password=PASSWORD),
            {"NATS_USER": "ops", "NATS_PASSWORD_FILE": password_file},
            wrong=ConnectOptions(user="ops", password="not-" + PASSWORD),
            wrong_env={"NATS_USER": "ops", "NATS_PASSWORD": "not-" + PASSWORD},
        )
    if kind == "creds":  # operator mode: a user JWT signed by an account the operator vouches for
        config, creds = _operator_mode()
        _, stranger_creds = _operator_mode()  # a user of another operator's account
        creds_file, stranger_file = _write(d / "user.creds", creds), _write(d / "stranger.creds", stranger_creds)
        return Secured(
            kind,
            config,
            ConnectOptions(creds_file=creds_file),
            {"NATS_CREDS": creds_file},
            wrong=ConnectOptions(creds_file=stranger_file),
            wrong_env={"NATS_CREDS": stranger_file},
        )
    assert kind == "token"
    return Secured(
        kind,
        f'authorization {{ token: "{TOKEN}" }}\n',
        ConnectOptions(token=TOKEN),
        {"NATS_TOKEN": TOKEN},
        wrong=ConnectOptions(token="not-" + TOKEN),
        wrong_env={"NATS_TOKEN_FILE": _write(d / "token", "not-" + TOKEN)},
    )


KINDS = ["tls", "mtls", "nkey", "creds", "password", "token"]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _keypair(prefix: int) -> tuple[bytes, nkeys.KeyPair, str]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    pair = nkeys.from_seed(bytearray(seed))
    return seed, pair, pair.public_key.decode()


def _jwt(signer: nkeys.KeyPair, claims: dict[str, Any]) -> str:
    """A NATS JWT (ed25519-nkey): header and claims, signed by `signer`."""
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims = {"iat": int(time.time()), **claims}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode().rstrip("=")
    body = _b64(json.dumps(claims).encode())
    return f"{header}.{body}.{_b64(signer.sign(f'{header}.{body}'.encode()))}"


def _operator_mode() -> tuple[str, str]:
    """(nats-server config, creds file): an operator, its system account, an account
    with JetStream, and a user of that account (JWT and seed, as `nsc` writes them)."""
    _, operator, operator_pub = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    _, _, system_pub = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    _, account, account_pub = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, _, user_pub = _keypair(nkeys.PREFIX_BYTE_USER)
    unlimited = {"subs": -1, "data": -1, "payload": -1, "conn": -1, "imports": -1, "exports": -1, "wildcards": True}
    op = _jwt(
        operator,
        {
            "iss": operator_pub,
            "sub": operator_pub,
            "name": "op",
            "nats": {"type": "operator", "version": 2, "system_account": system_pub},
        },
    )
    sys_jwt = _jwt(
        operator,
        {
            "iss": operator_pub,
            "sub": system_pub,
            "name": "SYS",
            "nats": {"limits": unlimited, "type": "account", "version": 2},
        },
    )
    js = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    acc = _jwt(
        operator,
        {
            "iss": operator_pub,
            "sub": account_pub,
            "name": "actors",
            "nats": {"limits": {**unlimited, **js}, "type": "account", "version": 2},
        },
    )
    user = _jwt(
        account,
        {
            "iss": account_pub,
            "sub": user_pub,
            "name": "pod",
            "nats": {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2},
        },
    )
    config = (
        f'operator: "{op}"\nsystem_account: {system_pub}\nresolver: MEMORY\n'
        f'resolver_preload: {{ {account_pub}: "{acc}", {system_pub}: "{sys_jwt}" }}\n'
    )
    creds = (
        f"-----BEGIN NATS USER JWT-----\n{user}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed.decode()}\n------END USER NKEY SEED------\n"
    )
    return config, creds


@pytest_asyncio.fixture(params=KINDS)
async def server(request: pytest.FixtureRequest, pki: Pki) -> AsyncIterator[tuple[NatsServer, Secured]]:
    sec = secured(request.param, pki)
    srv = await NatsServer.start(config=sec.config)
    try:
        yield srv, sec
    finally:
        await srv.discard()


def _no_secret(text: str) -> None:
    assert PASSWORD not in text and TOKEN not in text, text
    assert "Traceback" not in text, text


@pytest.mark.asyncio
async def test_a_playbook_runs_through_a_server_that_requires_it(server: tuple[NatsServer, Secured]) -> None:
    srv, sec = server
    if sec.kind in ("tls", "mtls"):
        assert srv.url.startswith("tls://")
    layout = make_layout()
    nc = await connect(srv.url, name="test-pod", options=sec.options)
    runtime = await start_roles(nc, layout=layout)
    try:
        async with Client.connect(srv.url, layout=layout, options=sec.options, timeout=10) as client:
            entry = await client.register(EXAMPLES / "hello.yaml")
            eid = await client.start(entry.path, payload={"name": "tls"})
            status = await client.wait(eid, timeout=30)
            assert status.state == ExecState.COMPLETED
        # the CLI, its credentials from the environment (or a file it names)
        code, out, err, _ = await cli(
            "run", "examples/hello.yaml", "--json", "--timeout", "30", url=srv.url, env=sec.env
        )
        assert code == 0, err
        ran = json.loads(out.strip().splitlines()[-1])
        assert ran["state"] == "COMPLETED"
        code, out, err, _ = await cli("status", ran["execution_id"], "--json", url=srv.url, env=sec.env)
        assert code == 0 and json.loads(out)["state"] == "COMPLETED", err
        _no_secret(out + err)
        # and without them the server will not have us
        code, out, err, _ = await cli("status", ran["execution_id"], "--timeout", "10", url=srv.url)
        assert code == EXIT_NATS, err
        one_line(err)
    finally:
        await runtime.stop()
        await nc.close()


@pytest.mark.asyncio
async def test_a_wrong_credential_fails_every_command_at_once_in_one_line(server: tuple[NatsServer, Secured]) -> None:
    srv, sec = server
    # the client: NatsUnavailable naming what to check, well before its timeout
    with pytest.raises(NatsUnavailable) as caught:
        async with asyncio.timeout(8):
            await Client.connect(srv.url, options=sec.wrong, timeout=30)
    said = str(caught.value)
    assert ("TLS" in said) if sec.kind in ("tls", "mtls") else ("refused the credentials" in said), said
    _no_secret(said)
    # the CLI: every command exits 5 in one line, within its --timeout (not after it: a
    # refusal is final, retrying the same credential cannot help)
    commands = [
        ("run", "examples/hello.yaml", "--nats", srv.url),
        ("register", "examples/hello.yaml"),
        ("status", "some-id"),
        ("list",),
    ]
    # with --timeout 600 a command that retried would outlast `cli`'s own 40 s and fail the test
    runs = [cli(*args, "--timeout", "600", url=srv.url, env=sec.wrong_env) for args in commands]
    for code, out, err, _took in await asyncio.gather(*runs):
        line = one_line(err)
        assert code == EXIT_NATS, err
        assert ("TLS with NATS" in line) if sec.kind in ("tls", "mtls") else ("refused the credentials" in line)
        _no_secret(line + out)


def test_secrets_come_from_files_and_never_show_in_a_repr(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    settings = Settings.from_env({"NATS_USER": "ops", "NATS_PASSWORD_FILE": str(tmp_path / "pw")})
    options = ConnectOptions.from_settings(settings)
    assert (options.user, options.password) == ("ops", PASSWORD)  # the trailing newline is not part of it
    settings = Settings.from_env({"NATS_USER": "ops", "NATS_PASSWORD": PASSWORD, "NATS_TOKEN": TOKEN})
    assert PASSWORD not in repr(settings) and TOKEN not in repr(settings)
    assert PASSWORD not in repr(ConnectOptions(user="ops", password=PASSWORD))


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"NATS_PASSWORD_FILE": "/nonexistent/pw", "NATS_USER": "ops"}, "NATS_PASSWORD_FILE='/nonexistent/pw'"),
        ({"NATS_NKEY": "/nonexistent/user.nk"}, "NATS_NKEY='/nonexistent/user.nk'"),
        ({"NATS_TLS_CA": "/nonexistent/ca.pem"}, "NATS_TLS_CA='/nonexistent/ca.pem'"),
        ({"NATS_TOKEN": TOKEN, "NATS_USER": "ops"}, "not both"),
        ({"NATS_PASSWORD": PASSWORD}, "NATS_USER is not"),
    ],
)
def test_an_unusable_credential_setting_is_refused_naming_it(env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsInvalid) as caught:
        ConnectOptions.from_settings(Settings.from_env(env))
    assert says in str(caught.value) and "\n" not in str(caught.value)
    _no_secret(str(caught.value))


@pytest.mark.asyncio
async def test_the_cli_refuses_an_unreadable_credential_file_with_exit_3(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate")
    code, _, err, _ = await cli("status", "x", "--tls-ca", str(tmp_path / "bad.pem"), url="tls://127.0.0.1:1")
    assert code == EXIT_INVALID and "NATS_TLS_CA" in one_line(err), err
    code, _, err, _ = await cli("status", "x", "--nats-password-file", str(tmp_path / "none"), url="nats://127.0.0.1:1")
    assert code == EXIT_INVALID and "NATS_PASSWORD_FILE" in one_line(err), err


def _jetstream_values() -> dict[str, str]:
    """The `config.jetstream.merge` block of the NATS chart values."""
    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy/nats/values.yaml").read_text())
    merge: dict[str, str] = values["config"]["jetstream"]["merge"]
    return merge


def _stored_files_containing(store: Path, needle: bytes) -> list[str]:
    return [str(p) for p in store.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.asyncio
@pytest.mark.parametrize("encrypted", [True, False])
async def test_the_deploy_values_encrypt_jetstream_at_rest(encrypted: bool, tmp_path: Path) -> None:
    """deploy/nats/values.yaml's JetStream block, as nats-server config (its key from the
    Secret filled in), keeps a payload out of every file of the store; without it
    (the control) the payload is there in clear."""
    merge = _jetstream_values()
    key = os.urandom(16).hex()
    config = f'jetstream {{ cipher: {merge["cipher"]}, key: "{key}" }}\n' if encrypted else ""
    marker = "at-rest-" + os.urandom(8).hex()
    srv = await NatsServer.start(config=config, store_dir=tmp_path / "store")
    try:
        layout = make_layout()
        nc = await connect(srv.url, name="test-pod", options=ConnectOptions())
        runtime = await start_roles(nc, layout=layout)
        try:
            client = Client(nc, layout=layout)
            entry = await client.register(EXAMPLES / "hello.yaml")
            eid = await client.start(entry.path, payload={"name": marker})
            assert (await client.wait(eid, timeout=30)).state == ExecState.COMPLETED
        finally:
            await runtime.stop()
            await nc.close()
    finally:
        await srv.discard()  # flushed and closed: what is on disk is all there is
    found = _stored_files_containing(tmp_path / "store" / "jetstream", marker.encode())
    assert (found == []) if encrypted else found, found


@pytest.mark.asyncio
async def test_serve_and_dev_connect_with_nkeys_and_client_certificates(pki: Pki, tmp_path: Path) -> None:
    """A pod (`serve`) on a server that wants an NKEY user and a client certificate, and
    `dev` on an embedded server of that configuration: a playbook runs through each. A
    pod with an unknown seed says why in its log and never becomes ready."""
    nkey, mtls = secured("nkey", pki), secured("mtls", pki)
    config = mtls.config + nkey.config
    env = {**nkey.env, **mtls.env}
    layout = make_layout()
    srv = await NatsServer.start(config=config)
    good = await PodProcess.start("all", url=srv.url, layout=layout, logs=tmp_path, name="good", env=env)
    bad = await PodProcess.start(
        "all", url=srv.url, layout=layout, logs=tmp_path, name="bad", env={**env, **nkey.wrong_env}
    )
    try:
        await good.ready()
        code, out, err, _ = await cli("run", "examples/hello.yaml", "--json", url=srv.url, env=env)
        assert code == 0 and json.loads(out)["state"] == "COMPLETED", err
        await wait_for(lambda: _log_says(bad.log, "refused the credentials"), timeout=30)
        assert "stranger.nk" in bad.log.read_text()
        async with aiohttp.ClientSession() as http:
            assert (await get(http, f"http://127.0.0.1:{bad.port}/readyz"))[0] == 503
    finally:
        await bad.stop()
        await good.stop()
        await srv.stop()

    (tmp_path / "nats.conf").write_text(config)
    port = free_port()
    dev = await asyncio.create_subprocess_exec(
        *CLI,
        "dev",
        "--port",
        str(port),
        "--server-config",
        str(tmp_path / "nats.conf"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        assert dev.stdout is not None
        first = (await asyncio.wait_for(dev.stdout.readline(), 60)).decode()
        assert first.startswith(f"NATS at tls://127.0.0.1:{port}"), first
        code, out, err, _ = await cli(
            "run", "examples/hello.yaml", "--json", url=f"tls://127.0.0.1:{port}", env={**env, "ACTORS_PARTITIONS": ""}
        )
        assert code == 0 and json.loads(out)["state"] == "COMPLETED", err
    finally:
        dev.send_signal(signal.SIGINT)
        await asyncio.wait_for(dev.communicate(), 30)


async def _log_says(log: Path, text: str) -> bool:
    return text in log.read_text()  # noqa: ASYNC240 - a small local log


def test_a_refused_certificate_is_final_and_a_cut_handshake_is_not() -> None:
    """A node going down mid-handshake is tried again (another node may answer); a
    certificate either side refuses fails the command at once."""
    import ssl

    from actors.natsio.dial import is_tls_error, refusal

    assert is_tls_error(ssl.SSLCertVerificationError(1, "certificate verify failed"))
    assert is_tls_error(ssl.SSLError(1, "tlsv13 alert certificate required"))
    assert not is_tls_error(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    assert not is_tls_error(ConnectionResetError())
    assert refusal(ssl.SSLEOFError(8, "EOF"), "tls://a:4222", ConnectOptions()) is None
