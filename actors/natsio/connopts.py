"""How a connection to NATS proves who it is and encrypts: one typed object, built from
`Settings`, that both places that connect take (`actors.pod.roles.connect` for pods,
`actors.natsio.dial.connect_within` for the CLI and `Client.connect`), so no path can leave
the credentials or the TLS settings out.

What it carries (each a `Settings` field, docs/security.md "Connecting securely"):
* user and password, or a token: from the environment or from a file (a mounted
  Kubernetes Secret), never only from argv, which any user of the host sees in `ps`;
* a credentials file (user JWT and NKEY seed) or an NKEY seed file: nats-py signs the
  server's nonce with the seed (the `nkeys` package);
* the inbox prefix (`NATS_INBOX_PREFIX`): the first token of the subjects replies come
  back on, which the deployed permissions allow each user for its own only;
* TLS: a CA file the server's certificate must chain to, and a client certificate and
  key for a server that verifies clients. Any of them makes TLS required (a `tls://`
  URL does too, with the system's CAs when none is given).

Files are read and checked here, once, at start-up: a missing or unreadable one is a
`SettingsInvalid` naming its variable, not an error deep inside a connect loop.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.config.settings import Settings, SettingsInvalid

DEFAULT_INBOX_PREFIX = "_INBOX"  # nats-py's
_INBOX_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, kw_only=True)
class ConnectOptions:
    """Credentials and TLS for a NATS connection. `ConnectOptions()`: none (a server of
    our own, or one that asks for nothing). Secrets are kept out of the repr."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # where replies to this connection arrive: nats-py makes every reply subject (request
    # replies, PubAcks, ordered consumers' and KV watches' deliveries) `<prefix>.<random>`,
    # so a server can let each user read its own replies and no one else's
    inbox_prefix: str = DEFAULT_INBOX_PREFIX

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectOptions:
        """The options `settings` describe, their files read and checked now.
        SettingsInvalid (one line naming the variable) when one cannot be used."""
        password = settings.nats_password
        if settings.nats_password_file:
            password = _secret_file(settings.nats_password_file, "NATS_PASSWORD_FILE")
        token = settings.nats_token
        if settings.nats_token_file:
            token = _secret_file(settings.nats_token_file, "NATS_TOKEN_FILE")
        if token and settings.nats_user:
            raise SettingsInvalid("NATS_USER and NATS_TOKEN: give a user and password, or a token, not both")
        if password and not settings.nats_user:
            raise SettingsInvalid("NATS_PASSWORD (or NATS_PASSWORD_FILE) is set but NATS_USER is not")
        if settings.nats_creds and settings.nats_nkey:
            raise SettingsInvalid("NATS_CREDS and NATS_NKEY: give one (a creds file holds its own seed)")
        if not _INBOX_PREFIX.match(settings.nats_inbox_prefix):
            # one subject token: the server allows a user `<prefix>.>`, which a dot or a
            # wildcard in the prefix would make replies miss (or ask for more than that)
            raise SettingsInvalid(
                f"NATS_INBOX_PREFIX={settings.nats_inbox_prefix!r}: one subject token (letters, digits, '_' and '-'), "
                "like _INBOX_cli"
            )
        if settings.tls_key and not settings.tls_cert:
            raise SettingsInvalid("NATS_TLS_KEY is set but NATS_TLS_CERT is not")
        for path, var in (
            (settings.nats_creds, "NATS_CREDS"),
            (settings.nats_nkey, "NATS_NKEY"),
            (settings.tls_ca, "NATS_TLS_CA"),
            (settings.tls_cert, "NATS_TLS_CERT"),
            (settings.tls_key, "NATS_TLS_KEY"),
        ):
            if path:
                _readable(path, var)
        options = cls(
            user=settings.nats_user,
            password=password,
            token=token,
            creds_file=settings.nats_creds,
            nkey_seed_file=settings.nats_nkey,
            tls_ca=settings.tls_ca,
            tls_cert=settings.tls_cert,
            tls_key=settings.tls_key,
            inbox_prefix=settings.nats_inbox_prefix,
        )
        options.tls_context()  # a bad certificate or key is refused now, in one line
        return options

    @classmethod
    def from_environment(cls) -> ConnectOptions:
        """The options of this process's environment (`Settings.from_env()`): what a
        connect given none uses, so a caller that passes nothing still authenticates."""
        return cls.from_settings(Settings.from_env())

    @property
    def tls_required(self) -> bool:
        return bool(self.tls_ca or self.tls_cert)

    def tls_context(self) -> ssl.SSLContext | None:
        """The context nats-py's `tls=` takes: the server verified against `tls_ca` (the
        system's CAs when unset) and, given a certificate, this client's certificate
        and key offered. None when no TLS file is set (a `tls://` URL then uses the
        system's CAs, as nats-py does by default)."""
        if not self.tls_required:
            return None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        except (ssl.SSLError, OSError) as e:
            raise SettingsInvalid(f"NATS_TLS_CA={self.tls_ca!r}: not a usable CA file ({_reason(e)})") from None
        if self.tls_cert:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, OSError) as e:
                raise SettingsInvalid(
                    f"NATS_TLS_CERT={self.tls_cert!r}, NATS_TLS_KEY={self.tls_key!r}: not a usable certificate and "
                    f"key ({_reason(e)})"
                ) from None
        return context

    def nats_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for nats-py's `connect` (only those that are set, so a
        password in the URL still counts when no option overrides it)."""
        kwargs: dict[str, Any] = {"inbox_prefix": self.inbox_prefix}
        if self.user:
            kwargs["user"] = self.user
        if self.password:
            kwargs["password"] = self.password
        if self.token:
            kwargs["token"] = self.token
        if self.creds_file:
            kwargs["user_credentials"] = self.creds_file
        if self.nkey_seed_file:
            kwargs["nkeys_seed"] = self.nkey_seed_file
        context = self.tls_context()
        if context is not None:
            kwargs["tls"] = context
        return kwargs

    def credentials(self) -> str:
        """What this connection presents, for an error message: names and file paths,
        never a secret ("the credentials in the URL" when none is set here)."""
        if self.creds_file:
            return f"the creds file {self.creds_file} (NATS_CREDS, --nats-creds)"
        if self.nkey_seed_file:
            return f"the NKEY seed in {self.nkey_seed_file} (NATS_NKEY, --nats-nkey)"
        if self.token:
            return "the token (NATS_TOKEN or NATS_TOKEN_FILE)"
        if self.user:
            return f"user {self.user!r} and its password (NATS_USER, NATS_PASSWORD or NATS_PASSWORD_FILE)"
        return "the user and password in the URL, or set NATS_USER, NATS_TOKEN, NATS_CREDS or NATS_NKEY"

    def trust(self) -> str:
        """Where the server's certificate must chain to, for an error message."""
        if self.tls_ca:
            return f"the CA in {self.tls_ca} (NATS_TLS_CA, --tls-ca)"
        return "the system's CAs (set NATS_TLS_CA or --tls-ca to the server's CA)"


def _readable(path: str, var: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise SettingsInvalid(f"{var}={path!r}: cannot read it ({_reason(e)})") from None


def _secret_file(path: str, var: str) -> str:
    """The secret a file holds, without its trailing newline (as `echo` or a Kubernetes
    Secret leaves it). The error names the file, never its content."""
    try:
        text = Path(path).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsInvalid(f"{var}={path!r}: cannot read it ({_reason(e)})") from None
    if not text:
        raise SettingsInvalid(f"{var}={path!r}: the file is empty")
    return text


def _reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or " ".join(str(e).split()) or type(e).__name__
