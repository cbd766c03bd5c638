"""The environment python and shell steps start from: `KEPT` copied from the pod, nothing
else (never `NATS_URL`, an `ACTORS_*` setting, a credential variable, or whatever else
the pod was given; the rule every child of a pod follows, actors/runtime/children.py). A step
adds its own `env` and, for shell, its credential.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from actors.runtime.children import KEPT, base_environment
from actors.tools import fields

__all__ = ["KEPT", "base_environment", "credential_environment", "step_environment"]

_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")


def step_environment(value: Any, what: str) -> dict[str, str]:
    """A rendered `env` field: names to text (null as "")."""
    given = fields.mapping(value, what) or {}
    return {str(k): "" if v is None else str(v) for k, v in given.items()}


def credential_environment(credential: Mapping[str, str]) -> dict[str, str]:
    """A credential as variables: each key upper-cased, other characters than
    ``[A-Za-z0-9_]`` as ``_`` (``header.X-Api-Key`` -> ``HEADER_X_API_KEY``)."""
    return {_ENV_NAME.sub("_", k).upper(): v for k, v in credential.items()}
