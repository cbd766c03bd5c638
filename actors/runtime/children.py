"""How a pod starts a child process: what the child inherits, and who it runs as.

A pod's environment holds what no child needs and no step may see: the NATS password
or token, the payload keys, the ``ACTORS_CREDENTIAL_*`` variables, the web UI's token.
Linux lets a process read the ``/proc/<pid>/environ`` and memory of any process of its
own user, and root read every process's. So every child of a pod (python and shell step
workers, render processes, the nats-server of ``dev`` and ``run``) is started by three
rules, all said here:

1. **A clean environment** (`child_environment`): `KEPT` copied from the pod, plus what
   the child's job needs; never a setting or a secret of the pod.
2. **Not dumpable** (`make_undumpable`): the kernel then serves a process's ``/proc``
   files as root's and refuses ptrace to its own user. ``exec`` sets the flag again, so
   the pod clears it on itself when it starts a role that starts children
   (`protect_pod`), and a python child clears it on itself first thing (step workers,
   render processes). A program the pod does not control (``/bin/sh``, nats-server)
   keeps it: such a child holds nothing but its clean environment.
3. **Steps as another user when the pod is root** (`steps_run_as`, ``ACTORS_STEP_USER``):
   the dumpable flag does not stop root, which reads every process (CAP_SYS_PTRACE) and
   every root-owned file (a mounted Secret). A root pod runs python and shell steps as
   ``nobody`` unless told otherwise, in a directory of their own (`step_home`: their
   HOME, TMPDIR and working directory). A pod that is not root runs steps as itself
   (rules 1 and 2 protect it), unless ``ACTORS_STEP_USER`` names another user it can
   switch to. A setting that cannot hold is refused when the pod starts
   (`StepUserInvalid`), never quietly replaced by the pod's own user: that would hand
   steps the secrets the setting is there to hide.

Only the standard library is imported here: a python step worker imports this module
before anything else, and every millisecond of its start is a cold step's.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_STEP_USER",
    "KEPT",
    "STEP_USER_SETTING",
    "RunAs",
    "StepUserInvalid",
    "base_environment",
    "cannot_start_steps",
    "child_environment",
    "dumpable",
    "make_undumpable",
    "protect_pod",
    "step_home",
    "steps_run_as",
]

# Why these four: `PATH` to find programs, `HOME` and `TMPDIR` for the files programs
# keep, `LANG` so text is decoded as the pod's locale says. A python child needs nothing
# more: it is started with the pod's interpreter by its full path and gets `sys.path` on
# its command line, not from `PYTHONPATH`.
KEPT = ("PATH", "HOME", "LANG", "TMPDIR")

STEP_USER_SETTING = "ACTORS_STEP_USER"
DEFAULT_STEP_USER = "nobody"  # what steps of a root pod run as when the setting is unset

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_CAP_SETGID, _CAP_SETUID = 6, 7  # bits of /proc/self/status's CapEff


# --- 1. the environment ------------------------------------------------------------------


def base_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`KEPT` from `environ` (default: this process's); `PATH` is never missing."""
    env = os.environ if environ is None else environ
    base = {k: env[k] for k in KEPT if env.get(k)}
    base.setdefault("PATH", os.defpath)
    return base


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment to start a child with: `KEPT` from this process, then `extra`
    (what the child's job needs) over it."""
    env = base_environment()
    env.update(extra or {})
    return env


# --- 2. the dumpable flag ----------------------------------------------------------------


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def dumpable() -> int | None:
    """This process's dumpable flag (0: its /proc files are root's), None off Linux."""
    prctl = _prctl()
    if prctl is None:
        return None
    result: int = prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    return result


def make_undumpable() -> bool:
    """Clear this process's dumpable flag (Linux); True when it is clear afterwards. It
    lasts until the process calls ``exec``: a child must call this itself."""
    prctl = _prctl()
    if prctl is None or prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False
    return dumpable() == 0


_protected = False
_protect_lock = threading.Lock()


def protect_pod() -> None:
    """Make the pod's own process undumpable, once: its environment holds its secrets,
    and it is about to start children (a step of its user could read it otherwise).
    Logs a warning where Linux refuses."""
    global _protected
    with _protect_lock:
        if _protected:
            return
        _protected = True
    if not make_undumpable() and sys.platform.startswith("linux"):
        import logging

        logging.getLogger("actors.runtime.children").warning(
            "prctl(PR_SET_DUMPABLE, 0) failed: a process of the pod's user can read its environment"
        )


# --- 3. who steps run as ------------------------------------------------------------------


class StepUserInvalid(ValueError):
    """Steps cannot run as `ACTORS_STEP_USER` says (or as the default for a root pod):
    the message is one line naming the setting and what to do."""


class RunAs(NamedTuple):
    """A user that steps run as, other than the pod's own."""

    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups: the user's own, never the pod's
    name: str
    why: str  # how it was chosen, for messages ("ACTORS_STEP_USER='x'", or the default)

    def popen_options(self) -> dict[str, Any]:
        """What `subprocess.Popen` takes to start a process as this user (set in the
        child between fork and exec, in C)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def become(self) -> None:
        """Become this user: a ``preexec_fn``, for an event loop whose subprocesses take
        no `user` (uvloop's refuses it; its ``preexec_fn`` runs right after the fork).
        The three calls `subprocess` makes in C, in the order that can succeed."""
        os.setgroups(list(self.groups))
        os.setgid(self.gid)
        os.setuid(self.uid)


def _can_switch_users() -> bool:
    """CAP_SETUID and CAP_SETGID in this process's effective set: root has them, unless
    its container dropped them; a non-root process has them only when granted."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    return bool(caps >> _CAP_SETUID & 1 and caps >> _CAP_SETGID & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _user(text: str, why: str) -> tuple[int, int | None, str]:
    """(uid, primary gid or None, name) of a user name or number."""
    import pwd

    try:
        entry = pwd.getpwuid(int(text)) if text.isdigit() else pwd.getpwnam(text)
    except KeyError:
        if text.isdigit():
            return int(text), None, text  # a number with no passwd entry (a container's uid)
        raise StepUserInvalid(f"{why}: no user {text!r} on this host") from None
    return entry.pw_uid, entry.pw_gid, entry.pw_name


def _group(text: str, why: str) -> int:
    import grp

    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise StepUserInvalid(f"{why}: no group {text!r} on this host") from None


def steps_run_as(setting: str | None) -> RunAs | None:
    """Who python and shell steps run as, from ``ACTORS_STEP_USER`` (``USER`` or
    ``USER:GROUP``, names or numbers): None for the pod's own user. Unset: ``nobody`` when
    the pod runs as root, the pod's own user otherwise. Raises `StepUserInvalid` when the
    user or group does not exist or the pod cannot switch to it."""
    euid = os.geteuid()
    given = (setting or "").strip()
    if given:
        why = f"{STEP_USER_SETTING}={given!r}"
    elif euid == 0:
        given, why = DEFAULT_STEP_USER, f"{STEP_USER_SETTING} unset (steps of a root pod run as {DEFAULT_STEP_USER})"
    else:
        return None
    user, _, group = given.partition(":")
    uid, gid, name = _user(user, why)
    if group:
        gid = _group(group, why)
    elif gid is None:
        raise StepUserInvalid(f"{why}: uid {uid} has no entry in /etc/passwd; give its group too ({uid}:GID)")
    if uid == euid and gid == os.getegid():
        return None  # the pod's own user, chosen on purpose
    if not _can_switch_users():
        fix = (
            f"run the pod as a non-root user, or set {STEP_USER_SETTING}=root to run steps as root "
            "(they can then read the pod's secrets)"
            if euid == 0
            else f"unset {STEP_USER_SETTING} to run steps as the pod's own user"
        )
        raise StepUserInvalid(
            f"{why}: this pod (uid {euid}) cannot start processes as {name} "
            f"(that needs CAP_SETUID and CAP_SETGID): {fix}"
        )
    try:
        groups = tuple(os.getgrouplist(name, gid)) if not name.isdigit() else (gid,)
    except OSError:
        groups = (gid,)
    return RunAs(uid, gid, groups, name, why)


def _can_enter(directory: str, run_as: RunAs) -> bool:
    """Whether `run_as` may reach what is inside `directory`: search permission on it and
    on every directory above it, by their mode bits (an ACL is not read)."""
    import stat

    groups = {run_as.gid, *run_as.groups}
    path = os.path.realpath(directory)
    while True:
        st = os.stat(path)
        if st.st_uid == run_as.uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def step_home(run_as: RunAs) -> str:
    """A new directory in the pod's temporary directory that only `run_as` may use
    (0700, its own): the HOME, TMPDIR and working directory of its steps. The pod's own
    are not theirs to write (nor, for a root pod, to read). The caller removes it.
    Checked here, by path: a process started in it is not (it enters it before it
    becomes `run_as`), but what its steps do with `$HOME` and `$TMPDIR` is."""
    import tempfile

    parent = tempfile.gettempdir()
    if run_as.uid != 0 and not _can_enter(parent, run_as):
        raise StepUserInvalid(
            f"{run_as.why}: steps run as {run_as.name} in a directory made in {parent}, which {run_as.name} "
            "cannot enter: set TMPDIR to a directory it can (unset, the system's: /tmp)"
        )
    path = tempfile.mkdtemp(prefix="actors-steps-")
    try:
        os.chown(path, run_as.uid, run_as.gid)
    except OSError as e:
        os.rmdir(path)
        raise StepUserInvalid(f"{run_as.why}: cannot give {path} to {run_as.name}: {e.strerror or e}") from None
    return path


def cannot_start_steps(run_as: RunAs, why: object) -> StepUserInvalid:
    """The one line a pod stops with when a python worker cannot start as `run_as`."""
    python = sys.executable
    real = os.path.realpath(python)
    if real != python:
        python += f" (that is {real})"  # a venv's python links to one that may sit under /root
    return StepUserInvalid(
        f"{run_as.why}: a python step worker cannot start as {run_as.name} (uid {run_as.uid}): {why}. "
        f"That user must be able to read {python}, its standard library and the installed packages, "
        f"and the pod's temporary directory; or set {STEP_USER_SETTING} to a user who can"
    )
