"""Credentials, resolved by name where the tool runs: `tool: {kind: http, credential: api}`.

Two sources, looked up in this order on every call (a rotated Kubernetes Secret is used
at once, without a restart):

1. ``ACTORS_CREDENTIALS_DIR/<name>``: a folder of files is one key per file (a Secret
   volume mount: `username`, `password`, ...; names starting with ``.``, Kubernetes'
   ``..data`` links, are skipped); a file is either a mapping (JSON or YAML) or, when
   its text is no mapping, a plain token, ``{"token": <text>}``.
2. ``ACTORS_CREDENTIAL_<NAME>`` (name upper-cased, ``-`` and ``.`` as ``_``): the same
   rule as a file, read once at start-up with the other settings.

Text is stripped of surrounding whitespace. A credential is a flat mapping of string
keys to string values, each the text it was written as in a JSON/YAML file (YAML is read
without type resolution: ``0777123`` stays that, never an octal 261715). Each value is
handed to the redactor as it is resolved (actors/tools/redact.py), numbers too (a PIN),
except an unquoted boolean (a flag) and a ``port``.

A credential that is in neither source fails the step with ``CredentialNotFound``; one
that cannot be read or is not a flat mapping with ``CredentialInvalid``. Messages name
the credential, the key and the source, never a value (nor a parser's message, which
quotes the text).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from actors.tools.failures import ToolFailure
from actors.tools.redact import MIN_SECRET, REDACTOR, Redactor

__all__ = ["CREDENTIAL_ENV_PREFIX", "CredentialSource", "credential_env_name"]

log = logging.getLogger("actors.tools.credentials")

CREDENTIAL_ENV_PREFIX = "ACTORS_CREDENTIAL_"
# a file name in the directory and a variable name once upper-cased: no '/', no leading '.'
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_MAX_FILE = 1 << 20  # a credential is small; a bigger file is a mistake (a mounted volume's blob)


def credential_env_name(name: str) -> str:
    """The variable that holds credential `name`: ``ACTORS_CREDENTIAL_MY_API`` for ``my-api``."""
    return CREDENTIAL_ENV_PREFIX + re.sub(r"[-.]", "_", name).upper()


class CredentialSource:
    """Where a tool actor finds credentials: `directory` (None: none) and `variables`,
    the ``ACTORS_CREDENTIAL_*`` variables by the part of the name after the prefix."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        variables: Mapping[str, str] | None = None,
        *,
        redactor: Redactor = REDACTOR,
    ) -> None:
        self.directory = Path(directory) if directory else None
        self.variables = dict(variables or {})
        self.redactor = redactor
        self._warned: set[tuple[str, str]] = set()
        # known from the start: masked in every log line, even before a step uses them
        for suffix, raw in self.variables.items():
            try:
                redactor.add(_maskable(*_from_text(suffix, raw, "variable")))
            except ToolFailure:
                redactor.add([raw.strip()])

    def resolve(self, name: Any) -> dict[str, str]:
        """Credential `name`'s keys and values, read now; ToolFailure if it cannot be."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolFailure(
                "ToolConfigError",
                f"credential name {str(name)[:80]!r} is not valid: letters, digits, '_', '-' and '.', "
                "not starting with '.' or '-'",
            )
        found = self._from_directory(name)
        if found is None:
            raw = self.variables.get(credential_env_name(name)[len(CREDENTIAL_ENV_PREFIX) :])
            if raw is not None:
                found = _from_text(name, raw, f"variable {credential_env_name(name)}")
        if found is None:
            where = (
                f"no file or folder {name!r} in {self.directory}"
                if self.directory is not None
                else "no ACTORS_CREDENTIALS_DIR"
            )
            raise ToolFailure(
                "CredentialNotFound",
                f"credential {name!r} not found: {where} and no {credential_env_name(name)} variable",
            )
        values, typed = found
        self._register(name, values, typed)
        return values

    def _from_directory(self, name: str) -> tuple[dict[str, str], frozenset[str]] | None:
        if self.directory is None:
            return None
        path = self.directory / name
        try:
            if path.is_dir():
                return _from_folder(name, path), frozenset()
            if path.is_file():
                return _from_text(name, _read(name, path), f"file {path}")
        except OSError as exc:
            raise _invalid(name, f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
        return None

    def _register(self, name: str, values: dict[str, str], typed: frozenset[str]) -> None:
        self.redactor.add(_maskable(values, typed))
        for key, value in values.items():
            if 0 < len(value) < MIN_SECRET and key not in typed and (name, key) not in self._warned:
                self._warned.add((name, key))
                log.warning(
                    "credential %r key %r is shorter than %d characters: it is not masked in errors and logs",
                    name,
                    key,
                    MIN_SECRET,
                )


def _invalid(name: str, why: str) -> ToolFailure:
    return ToolFailure("CredentialInvalid", f"credential {name!r}: {why}")


def _read(name: str, path: Path | str) -> str:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > _MAX_FILE:
            raise _invalid(name, f"{path} is over {_MAX_FILE} bytes")
        data = f.read()  # read(n) would allocate n bytes first: sized by fstat instead
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid(name, f"{path} is not UTF-8 text") from None


def _from_folder(name: str, folder: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    with os.scandir(folder) as entries:  # scandir, not pathlib: this runs at every step that names it
        for entry in entries:
            # ..data, ..2026_11_24...: the mount's own links; a key is a file (or a link to one)
            if not entry.name.startswith(".") and entry.is_file():
                values[entry.name] = _read(name, entry.path).strip()
    if not values:
        raise _invalid(name, f"folder {folder} has no keys (one file per key)")
    return dict(sorted(values.items()))


def _maskable(values: dict[str, str], typed: frozenset[str]) -> list[str]:
    """The values to mask: all but the booleans a JSON/YAML file gave unquoted (masking
    ``true`` would garble every JSON log line) and a connection's ``port`` (no secret;
    masked, ``5432`` would become ``***`` in every step's output for the pod's life).
    Other numbers are masked: a PIN is a secret."""
    return [v for k, v in values.items() if k not in typed and k.lower() not in NOT_SECRET]


NOT_SECRET = frozenset({"port"})  # credential keys whose values are never masked


# unquoted YAML words read as a boolean or as nothing (YAML 1.1 and 1.2): kept as their text
_YAML_BOOLS = frozenset({"true", "false", "yes", "no", "on", "off", "y", "n"})
_YAML_NULLS = frozenset({"", "~", "null"})


def _from_text(name: str, text: str, where: str) -> tuple[dict[str, str], frozenset[str]]:
    """A mapping (JSON or YAML) or a plain token, ``{"token": text}``; and the keys whose
    values were unquoted booleans (not masked)."""
    s = text.strip()
    if not s:
        raise _invalid(name, f"{where} is empty")
    found: tuple[dict[str, str], frozenset[str]] | None = None
    if s.startswith("{"):
        found = _json(name, s, where)
    if found is None:
        found = _yaml(name, s, where)
    if found is not None:
        if not found[0]:
            raise _invalid(name, f"{where} is an empty mapping")
        return found
    if s.startswith("{"):
        raise _invalid(name, f"{where} starts with '{{' but is not a JSON or YAML mapping")
    return {"token": s}, frozenset()


def _json(name: str, s: str, where: str) -> tuple[dict[str, str], frozenset[str]] | None:
    # numbers kept as written (`1e5`, `007`), not as float or int would print them
    try:
        data = json.loads(s, parse_int=str, parse_float=str)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    values: dict[str, str] = {}
    typed: set[str] = set()
    for key, value in data.items():
        if isinstance(value, bool):
            values[key] = "true" if value else "false"
            typed.add(key)
        elif isinstance(value, str):
            values[key] = value.strip()
        elif value is None:
            values[key] = ""
        else:
            raise _invalid(name, f"{where}: key {key[:80]!r} must be a string or a number, not {type(value).__name__}")
    return values, frozenset(typed)


def _yaml(name: str, s: str, where: str) -> tuple[dict[str, str], frozenset[str]] | None:
    """A YAML mapping read with the base loader, every scalar as the text it was written as:
    YAML 1.1's resolvers would turn ``0777123`` into 261715 (octal), ``12:30:45`` into 45045
    (sexagesimal) and ``yes`` into true, and the value the step gets, or the one masked,
    would not be the secret."""
    try:
        node = yaml.compose(s, Loader=yaml.BaseLoader)
    except yaml.YAMLError:
        return None
    if not isinstance(node, yaml.MappingNode):
        return None
    values: dict[str, str] = {}
    typed: set[str] = set()
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise _invalid(name, f"{where}: a key must be text")
        key = str(key_node.value)
        if not isinstance(value_node, yaml.ScalarNode):
            kind = "mapping" if isinstance(value_node, yaml.MappingNode) else "list"
            raise _invalid(name, f"{where}: key {key[:80]!r} must be a string or a number, not a {kind}")
        value = str(value_node.value)
        plain = value_node.style is None  # unquoted: a word YAML reads as a boolean or null
        if plain and value.lower() in _YAML_NULLS:
            value = ""
        elif plain and value.lower() in _YAML_BOOLS:
            typed.add(key)
        values[key] = value.strip()
    return values, frozenset(typed)
