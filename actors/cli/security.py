"""The flags of every command that connects to NATS for credentials and TLS (their
`Settings` fields are in actors/config/settings.py, the object they build in
actors/natsio/connopts.py). Secrets themselves have no flag, only files do: a command line
is visible to every user of the host (`ps`), the environment and a file are not."""

from __future__ import annotations

import argparse

NATS_HELP = (
    "NATS server URL(s), comma-separated; tls:// for TLS (default: $NATS_URL). A password in it "
    "(nats://user:pass@host) works but is visible in `ps`: prefer NATS_PASSWORD or --nats-password-file"
)


def add_connection_flags(sp: argparse.ArgumentParser, *, url: bool = True) -> argparse.ArgumentParser:
    """--nats (unless not `url`: `dev` runs its own server) and the credential and TLS
    flags, in a group of their own in --help."""
    if url:
        sp.add_argument("--nats", help=NATS_HELP)
    group = sp.add_argument_group(
        "NATS credentials and TLS",
        "each flag also reads from its variable; secrets only from the environment or a file "
        "(NATS_PASSWORD, NATS_TOKEN), never from argv, which `ps` shows",
    )
    group.add_argument("--nats-user", metavar="USER", help="user name (default $NATS_USER)")
    group.add_argument(
        "--nats-password-file", metavar="FILE", help="file holding the user's password (default $NATS_PASSWORD_FILE)"
    )
    group.add_argument("--nats-token-file", metavar="FILE", help="file holding a token (default $NATS_TOKEN_FILE)")
    group.add_argument("--nats-creds", metavar="FILE", help="credentials file: user JWT and NKEY seed ($NATS_CREDS)")
    group.add_argument("--nats-nkey", metavar="FILE", help="file holding an NKEY user seed ($NATS_NKEY)")
    group.add_argument(
        "--nats-inbox-prefix",
        metavar="PREFIX",
        help="first token of the subjects replies arrive on: _INBOX_<user> with deploy/nats's permissions "
        "($NATS_INBOX_PREFIX, default _INBOX)",
    )
    group.add_argument("--tls-ca", metavar="FILE", help="CA the server's certificate must chain to ($NATS_TLS_CA)")
    group.add_argument("--tls-cert", metavar="FILE", help="client certificate, PEM ($NATS_TLS_CERT)")
    group.add_argument("--tls-key", metavar="FILE", help="client certificate's private key, PEM ($NATS_TLS_KEY)")
    return sp
