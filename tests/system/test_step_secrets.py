"""A step cannot read the pod's secrets (actors/runtime/children.py): a pod started as
`actors-cli dev` starts with a NATS user and password, a credential, a payload key and
a web UI token in its environment; a python step and a shell step read the environment
and command line of every process they can see (`/proc/*/environ`, `/proc/*/cmdline`),
after a template has made the engine start a render process, and none of those secrets
is in anything they could read. Nor is any in the environment of any process the pod
started (the test, as root, reads them all). A root pod runs steps as `nobody`, who can
still write files in its own directory.

Steps that run as `nobody` need an interpreter `nobody` can run: where this one sits
in a directory only root may enter (a pyenv under /root), the pod runs from a venv of
the system's python of the same version, readable by all, with this checkout's packages
on its path (`interpreter` below). That is what an operator of a root pod does too.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.client import Client
from actors.config.settings import Settings
from actors.pod.roles import connect
from actors.runtime import children
from actors.runtime.children import StepUserInvalid, child_environment, steps_run_as
from streams.server import NatsServer, find_binary, free_port
from tests.support.cli import cli

pytestmark = [pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]
ROOTED = os.geteuid() == 0
STEP_USER = "nobody"  # what steps of a root pod run as when ACTORS_STEP_USER is unset

LOOKS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: snoop}
workflow:
  - step: render
    tool: noop
    args: {n: "{{ range(3) | list }}"}
    next: look
  - step: look
    tool:
      kind: python
      code: |
        import base64, os, tempfile
        def main():
            read = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                for name in ("environ", "cmdline"):
                    try:
                        with open(f"/proc/{pid}/{name}", "rb") as f:
                            read.append([int(pid), name, base64.b64encode(f.read()).decode()])
                    except OSError:
                        pass
            # a step of another user still has somewhere to write: its directory is HOME, TMPDIR and cwd
            with open("here.txt", "w") as f:
                f.write("cwd")
            with open(os.path.join(os.environ["HOME"], "home.txt"), "w") as f:
                f.write("home")
            with tempfile.NamedTemporaryFile() as f:
                f.write(b"tmp")
            return {"uid": os.getuid(), "pid": os.getpid(), "read": read, "wrote": open("here.txt").read()}
    next: shell_look
  - step: shell_look
    tool:
      kind: shell
      command: |
        id -u
        echo written > here.txt && cat here.txt
        echo $$
        for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
          data=$(base64 -w0 "$f" 2>/dev/null) && echo "$f $data"
        done
"""


def _runs_as(user: str, python: str) -> bool:
    """Whether `user` can start `python` and import the python step worker with it."""
    try:
        done = subprocess.run(
            [python, "-c", "import actors.tools.pyworker"],
            user=user,
            group=pwd.getpwnam(user).pw_gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": os.defpath},
            capture_output=True,
            timeout=30,
        )
    except OSError:
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def interpreter() -> Iterator[str]:
    """A python the pod's steps can run as: this one when they can, else a venv of the
    system's python of this version, readable by all, with this venv's packages."""
    if not ROOTED or _runs_as(STEP_USER, sys.executable):
        yield sys.executable
        return
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(f"python{version}", path="/usr/bin:/usr/local/bin")
    if system is None:
        pytest.skip(f"{STEP_USER} cannot run {sys.executable}, and there is no system python{version}")
    venv = Path(tempfile.mkdtemp(prefix="actors-step-python-"))
    try:
        venv.chmod(0o755)
        subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        site = venv / "lib" / f"python{version}" / "site-packages"
        ours = sysconfig.get_paths()["purelib"]
        (site / "actors-checkout.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        (venv / "bin" / "nats-server").symlink_to(find_binary())
        python = str(venv / "bin" / "python")
        if not _runs_as(STEP_USER, python):
            pytest.skip(f"{STEP_USER} can run neither {sys.executable} nor the system's python{version}")
        yield python
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def _secrets() -> dict[str, str]:
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    return {
        "NATS_USER": f"user-{secrets.token_hex(6)}",
        "NATS_PASSWORD": f"pw-{secrets.token_hex(8)}",
        "ACTORS_CREDENTIAL_DB": json.dumps({"username": "app", "password": f"cred-{secrets.token_hex(8)}"}),
        "ACTORS_PAYLOAD_KEY": f"k1:{key}",
        "ACTORS_UI_TOKEN": f"ui-{secrets.token_hex(8)}",
    }


def _forms(env: dict[str, str]) -> list[bytes]:
    """Every secret as it may appear: each value, the credential's password alone, the
    payload key's base64 alone."""
    found = [v.encode() for v in env.values()]
    found.append(json.loads(env["ACTORS_CREDENTIAL_DB"])["password"].encode())
    found.append(env["ACTORS_PAYLOAD_KEY"].split(":", 1)[1].encode())
    return found


def _descendants(pid: int) -> list[int]:
    """Every process started, directly or not, by `pid` (from /proc/*/stat)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        todo += children
    return found


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


@pytest.mark.asyncio
async def test_python_and_shell_steps_read_no_secret_of_a_dev_pod(interpreter: str, tmp_path: Path) -> None:
    env = _secrets()
    pod_env = {k: v for k, v in os.environ.items() if k != "ACTORS_STEP_USER"}  # the real default
    pod_env.update(env)
    dev = await asyncio.create_subprocess_exec(
        interpreter,
        "-m",
        "actors.cli",
        "dev",
        "--port",
        str(free_port()),
        "--ui-port",
        "0",
        cwd=tmp_path,  # where steps of the pod's own user (a pod not run as root) write
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=pod_env,
    )
    try:
        assert dev.stdout is not None and dev.stderr is not None
        first = (await asyncio.wait_for(dev.stdout.readline(), 60)).decode()
        assert first.startswith("NATS at "), first + (await dev.stderr.read()).decode()
        url = first.split()[2]
        await asyncio.wait_for(dev.stdout.readline(), 30)  # "export NATS_URL=...": every actor runs
        settings = Settings.from_env(pod_env)
        nc = await connect(url, name="test")
        try:
            client = Client(nc, layout=settings.layout, codec=settings.payload_codec)
            (tmp_path / "snoop.yaml").write_text(LOOKS)
            entry = await client.register(tmp_path / "snoop.yaml")
            eid = await client.start(entry.path, version=entry.version)
            status = await client.wait(eid, timeout=60)
            assert status.state == "COMPLETED", status
            looked = {i.step: await client.result(i) for i in await client.events(eid) if i.type == "call.done"}
            python, shell = looked["look"], looked["shell_look"]["stdout"].splitlines()
            # what the pod started, read by this test (root reads every process): no secret in any
            started = {
                pid: _read(f"/proc/{pid}/environ") + _read(f"/proc/{pid}/cmdline") for pid in _descendants(dev.pid)
            }
        finally:
            await nc.close()
    finally:
        dev.send_signal(signal.SIGINT)
        await asyncio.wait_for(dev.communicate(), 30)

    step_uid = pwd.getpwnam(STEP_USER).pw_uid if ROOTED else os.geteuid()
    assert python["uid"] == step_uid and shell[0] == str(step_uid)  # a root pod's steps run as nobody
    assert python["wrote"] == "cwd" and shell[1] == "written"  # in a directory of their own
    read = {(pid, name): base64.b64decode(data) for pid, name, data in python["read"]}
    for line in shell[3:]:  # /proc/PID/NAME BASE64 (nothing after the space for an empty file)
        path, _, data = line.partition(" ")
        _, _, pid, name = path.split("/")
        read[(int(pid), name)] = base64.b64decode(data)
    # it did read: the shell its own environment (a python worker is not dumpable: not even
    # its own /proc/self/environ is open to it), the command lines of the pod and its render process
    assert b"HOME=" in read[(int(shell[2]), "environ")] and (python["pid"], "cmdline") in read
    assert (dev.pid, "cmdline") in read and (dev.pid, "environ") not in read
    assert any(b"render_worker" in text for (_, name), text in read.items() if name == "cmdline")
    assert len(started) >= 3  # nats-server, a python worker, a render process at least
    for secret in _forms(env):
        for (pid, name), text in read.items():
            assert secret not in text, f"a step read {secret!r} in /proc/{pid}/{name}"
        for pid, text in started.items():
            assert secret not in text, f"{secret!r} in the environment or command line of {pid}, a child of the pod"


def test_steps_of_a_root_pod_run_as_nobody_and_a_user_that_cannot_be_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(children, "DEFAULT_STEP_USER", STEP_USER)  # the suite's own is its user (conftest)
    if ROOTED:
        nobody = steps_run_as(None)
        assert nobody is not None and nobody.uid == pwd.getpwnam(STEP_USER).pw_uid
        assert 0 not in nobody.groups  # root's groups are not kept
    else:
        assert steps_run_as(None) is None  # a non-root pod runs steps as itself
    assert steps_run_as(f"{os.geteuid()}:{os.getegid()}") is None  # the pod's own user, chosen on purpose
    with pytest.raises(StepUserInvalid, match=r"^ACTORS_STEP_USER='no-such-user-x': no user 'no-such-user-x'"):
        steps_run_as("no-such-user-x")
    with pytest.raises(StepUserInvalid, match=r"uid 4000123 has no entry in /etc/passwd; give its group too"):
        steps_run_as("4000123")


@pytest.mark.asyncio
async def test_a_pod_whose_step_user_does_not_exist_stops_at_start_exit_3() -> None:
    code, _, err, _ = await cli("run", "examples/hello.yaml", env={"ACTORS_STEP_USER": "no-such-user-x"})
    assert code == 3, err
    assert err.strip() == "actors-cli: ACTORS_STEP_USER='no-such-user-x': no user 'no-such-user-x' on this host"


@pytest.mark.asyncio
@pytest.mark.skipif(not ROOTED, reason="only root can run steps as another user")
async def test_run_as_root_with_the_default_step_user_runs_the_quick_start(tmp_path: Path) -> None:
    """README's first command, as root on a machine whose python `nobody` cannot read (a
    pyenv under /root, as CI's): `run` (and `dev`) still run the playbook, saying steps
    run as this process's user; only `serve` refuses to start then."""
    default = {children.STEP_USER_SETTING: ""}  # empty: unset, the default

    code, _, err, _ = await cli("run", "examples/hello.yaml", "--payload", '{"name": "you"}', env=default)
    assert code == 0, err
    if "cannot start as nobody" not in err:
        pytest.skip("nobody can run this python here: no fallback to see")
    assert "steps run as this process's own user instead" in err and "Traceback" not in err

    server = await NatsServer.start()
    try:
        code, _, served, _ = await cli("serve", "--role", "tools", "--http-port", "0", url=server.url, env=default)
        assert code == 3 and "cannot start as nobody" in served, served
    finally:
        await server.discard()


@pytest.mark.asyncio
@pytest.mark.skipif(not ROOTED, reason="only root can run steps as another user")
async def test_a_pod_whose_steps_user_cannot_enter_its_directory_stops_at_start_exit_3(tmp_path: Path) -> None:
    """The steps' directory is made in the pod's temporary directory: one that `nobody`
    cannot enter leaves its steps no HOME or TMPDIR to write to. Said at start, in one
    line, not at every step (as is an interpreter it cannot read)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    code, _, err, _ = await cli(
        "run", "examples/hello.yaml", env={"ACTORS_STEP_USER": STEP_USER, "TMPDIR": str(private)}
    )
    assert code == 3, err
    lines = err.strip().splitlines()
    assert lines == [
        f"actors-cli: ACTORS_STEP_USER='{STEP_USER}': steps run as {STEP_USER} in a directory made in {private}, "
        f"which {STEP_USER} cannot enter: set TMPDIR to a directory it can (unset, the system's: /tmp)"
    ]


@pytest.mark.asyncio
async def test_the_embedded_server_gets_only_the_variables_its_configuration_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dev --server-config` may name variables (`$NAME`, in an included file too, as
    deploy/nats/permissions.conf does): the server gets those, and nothing else of the
    pod's environment."""
    import nats

    token = f"tok-{secrets.token_hex(8)}"
    monkeypatch.setenv("ACTORS_TEST_NATS_TOKEN", token)
    monkeypatch.setenv("ACTORS_TEST_NOT_FOR_IT", "pod-only")
    store = tmp_path / "store"  # where the server reads its configuration, and includes from
    store.mkdir()
    (store / "auth.conf").write_text("authorization { token: $ACTORS_TEST_NATS_TOKEN }\n")
    server = await NatsServer.start(store_dir=store, config="include auth.conf\n", env=child_environment())
    try:
        environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes().split(b"\0")  # noqa: ASYNC240 - tiny
        assert f"ACTORS_TEST_NATS_TOKEN={token}".encode() in environ
        assert not [v for v in environ if v.startswith(b"ACTORS_TEST_NOT_FOR_IT=")]
        nc = await nats.connect(f"nats://127.0.0.1:{server.port}", token=token)  # the server read it
        await nc.close()
    finally:
        await server.discard()
