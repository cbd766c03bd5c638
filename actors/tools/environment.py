"""The environment python and shell steps start from: `KEPT` copied from the pod, nothing
else (never `NATS_URL`, an `ACTORS_*` setting, a credential variable, or whatever else
the pod was given). A step adds its own `env` and, for shell, its credential.

Why these four: `PATH` to find programs, `HOME` and `TMPDIR` for the files programs keep,
`LANG` so text is decoded as the pod's locale says. A python worker needs nothing more:
it is started with the pod's interpreter by its full path and gets `sys.path` on its
command line, not from `PYTHONPATH`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from actors.tools import fields

__all__ = ["KEPT", "base_environment", "credential_environment", "step_environment"]

KEPT = ("PATH", "HOME", "LANG", "TMPDIR")
_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")


def base_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`KEPT` from `environ` (default: this process's); `PATH` is never missing."""
    env = os.environ if environ is None else environ
    base = {k: env[k] for k in KEPT if env.get(k)}
    base.setdefault("PATH", os.defpath)
    return base


def step_environment(value: Any, what: str) -> dict[str, str]:
    """A rendered `env` field: names to text (null as "")."""
    given = fields.mapping(value, what) or {}
    return {str(k): "" if v is None else str(v) for k, v in given.items()}


def credential_environment(credential: Mapping[str, str]) -> dict[str, str]:
    """A credential as variables: each key upper-cased, other characters than
    ``[A-Za-z0-9_]`` as ``_`` (``header.X-Api-Key`` -> ``HEADER_X_API_KEY``)."""
    return {_ENV_NAME.sub("_", k).upper(): v for k, v in credential.items()}
