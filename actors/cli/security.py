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


CONNECT_POINTER = "credentials, TLS and payload keys: `actors-cli help connect`"


def add_connection_flags(
    sp: argparse.ArgumentParser, *, url: bool = True, shown: bool = False
) -> argparse.ArgumentParser:
    """--nats (unless not `url`: `dev` runs its own server), --payload-key-file and the
    credential and TLS flags. In a command's --help (`shown` False) only --nats is
    listed, in a short `connection` group that points to `actors-cli help connect`: the
    same ten flags on every command took most of each --help, above the command's own
    options. `shown`: every flag with its help (`actors-cli help connect`)."""

    def described(text: str) -> str:
        return text if shown else argparse.SUPPRESS

    group = sp.add_argument_group(
        "connection",
        "each flag also reads from its variable; secrets only from the environment or a file "
        "(NATS_PASSWORD, NATS_TOKEN), never from argv, which `ps` shows"
        if shown
        else CONNECT_POINTER,
    )
    if url:
        short = "NATS server URL(s) (default $NATS_URL)"
        group.add_argument("--nats", metavar="URL", help=NATS_HELP if shown else short)
    group.add_argument(
        "--payload-key-file",
        metavar="FILE",
        help=described(
            "file of payload keys, one a line, the first current (default: $ACTORS_PAYLOAD_KEY_FILE, "
            "$ACTORS_PAYLOAD_KEY): decrypts values, encrypts new ones"
        ),
    )
    group.add_argument("--nats-user", metavar="USER", help=described("user name (default $NATS_USER)"))
    group.add_argument(
        "--nats-password-file",
        metavar="FILE",
        help=described("file holding the user's password (default $NATS_PASSWORD_FILE)"),
    )
    group.add_argument(
        "--nats-token-file", metavar="FILE", help=described("file holding a token (default $NATS_TOKEN_FILE)")
    )
    group.add_argument(
        "--nats-creds", metavar="FILE", help=described("credentials file: user JWT and NKEY seed ($NATS_CREDS)")
    )
    group.add_argument("--nats-nkey", metavar="FILE", help=described("file holding an NKEY user seed ($NATS_NKEY)"))
    group.add_argument(
        "--nats-inbox-prefix",
        metavar="PREFIX",
        help=described(
            "first token of the subjects replies arrive on: _INBOX_<user> with deploy/nats's permissions "
            "($NATS_INBOX_PREFIX, default _INBOX)"
        ),
    )
    group.add_argument(
        "--tls-ca", metavar="FILE", help=described("CA the server's certificate must chain to ($NATS_TLS_CA)")
    )
    group.add_argument("--tls-cert", metavar="FILE", help=described("client certificate, PEM ($NATS_TLS_CERT)"))
    group.add_argument(
        "--tls-key", metavar="FILE", help=described("client certificate's private key, PEM ($NATS_TLS_KEY)")
    )
    return sp


def connect_help(formatter: type[argparse.HelpFormatter] = argparse.HelpFormatter) -> str:
    """`actors-cli help connect`: every connection flag, which every command that talks
    to NATS takes (dev: all but --nats)."""
    p = argparse.ArgumentParser(
        prog="actors-cli COMMAND",
        usage=argparse.SUPPRESS,
        add_help=False,
        description="The options every command that talks to NATS takes (`dev` all but --nats, which it serves "
        "itself), after the command's own. Without --nats or NATS_URL, `run` starts a private server "
        "and every actor in its own process; every other client command needs one.",
        epilog="examples:\n"
        "  export NATS_URL=nats://127.0.0.1:4222\n"
        "  actors-cli status ID --nats tls://nats.example:4222 --tls-ca ca.pem --nats-creds me.creds\n"
        "  NATS_PASSWORD=... actors-cli list --nats nats://ops@nats.example:4222",
        formatter_class=formatter,
    )
    add_connection_flags(p, shown=True)
    return p.format_help()
