"""The entry point of actors-cli: the argument parser, the command each name runs, and
the one-line error and exit code for what a command raises."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from actors.cli import exits
from actors.cli.archiving import add_archive_parser, cmd_archive
from actors.cli.commands import (
    cmd_cancel,
    cmd_events,
    cmd_register,
    cmd_run,
    cmd_schema,
    cmd_start,
    cmd_status,
    cmd_validate,
)
from actors.cli.deadletters import cmd_deadletters
from actors.cli.exits import EXIT_INVALID, EXIT_OK, UsageError, exit_code_for, nats_reason
from actors.cli.inputs import seconds, seconds_or_zero
from actors.cli.interrupt import interruptible, sigint_is_ours
from actors.cli.listing import cmd_list, cmd_playbooks, cmd_result
from actors.cli.logs import cmd_logs
from actors.cli.output import print_error
from actors.cli.retrying import add_retry_parser, cmd_retry
from actors.cli.schedule import add_schedule_parser, cmd_schedule
from actors.cli.security import add_connection_flags
from actors.cli.serving import cmd_dev, cmd_serve
from actors.cli.ui import add_ui_parser, cmd_ui
from actors.natsio.dial import CLIENT_TIMEOUT


def build_parser() -> argparse.ArgumentParser:
    doc = exits.__doc__ or ""
    exit_codes = doc[doc.index("Exit codes:") : doc.index("A user error")] if "Exit codes:" in doc else None
    p = _OneLineErrors(
        prog="actors-cli",
        description="Run YAML playbooks on NATS JetStream.",
        epilog=exit_codes,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log actor activity to stderr")
    # -v also after the command (`actors-cli run -v f.yaml`); SUPPRESS keeps a later
    # subparser default from overwriting a -v given before the command
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log actor activity to stderr"
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_parser_with(verbose, epilog=exit_codes))

    def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--payload-key-file",
            help="file of payload keys, one a line, the first current (default: $ACTORS_PAYLOAD_KEY_FILE, "
            "$ACTORS_PAYLOAD_KEY): decrypts values, encrypts new ones",
        )
        return add_connection_flags(sp)  # --nats, credentials, TLS

    sp = with_nats(sub.add_parser("run", help="register, start and follow a playbook to its end"))
    sp.add_argument("file", help="playbook YAML file")
    sp.add_argument("--payload", help="JSON object, or @file; deep-merged over the playbook's workload")
    sp.add_argument("--execution-id", help=EXECUTION_ID_HELP)
    sp.add_argument("--register", action="append", help="also register this playbook (sub-playbooks); repeatable")
    sp.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object at the end (execution_id, state, result, error, times, existing)",
    )
    sp.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        help="seconds the execution may take (exit 4 past it); with --nats also the bound on reaching "
        f"NATS (default {CLIENT_TIMEOUT:g}; exit 5)",
    )

    sp = sub.add_parser("dev", help="embedded NATS plus every actor, in the foreground")
    sp.add_argument("--port", type=int, default=4222, help="port of the embedded NATS server (default 4222)")
    sp.add_argument("--store", help="JetStream store dir (default: a temporary one)")
    sp.add_argument("--ui-port", type=int, help="port of the web UI (default $ACTORS_UI_PORT, else 8233); 0: none")
    sp.add_argument(
        "--server-config",
        metavar="FILE",
        help="nats-server configuration for the embedded server (TLS, users); the actors then connect with the "
        "credential and TLS flags and variables below",
    )
    add_connection_flags(sp, url=False)

    sp = with_nats(sub.add_parser("serve", help="run one actor role (a pod)"))
    sp.add_argument(
        "--role",
        choices=["engine", "counter", "tools", "projector", "retention", "all", "ui"],
        default="all",
        help="the actors this pod runs (default all); ui: the web UI alone (--port: $ACTORS_UI_PORT)",
    )
    # defaults None: unset flags leave the environment's settings (actors/config/settings.py) as they are
    sp.add_argument(
        "--http-port",
        type=int,
        help="port for /healthz, /readyz and /metrics; 0: no HTTP server (default $ACTORS_HTTP_PORT, else 8080)",
    )
    sp.add_argument("--http-host", help="address the HTTP server binds (default $ACTORS_HTTP_HOST, else 0.0.0.0)")
    sp.add_argument(
        "--drain-timeout",
        type=seconds_or_zero,
        help="seconds running tool commands get to finish after SIGTERM (default $ACTORS_DRAIN_TIMEOUT, else 10)",
    )

    def with_timeout(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--timeout",
            type=seconds,
            default=None,
            help=f"seconds to reach NATS (default {CLIENT_TIMEOUT:g}); exit 5 past it",
        )
        return sp

    sp = with_timeout(with_nats(sub.add_parser("register", help="register playbooks in the catalog")))
    sp.add_argument("files", nargs="+", help="playbook YAML files")
    sp.add_argument("--json", action="store_true", help="one JSON object per file (file, path, version)")

    sp = with_timeout(with_nats(sub.add_parser("start", help="start an execution; prints its id")))
    sp.add_argument("path", help="catalog path of a registered playbook")
    sp.add_argument("--payload", help="JSON object, or @file; deep-merged over the playbook's workload")
    sp.add_argument("--version", type=int, help="catalog version to start (default: the latest)")
    sp.add_argument("--execution-id", help=EXECUTION_ID_HELP)
    sp.add_argument(
        "--json",
        action="store_true",
        help='{"execution_id", "existing", "differs"}: existing is true when the id was started before',
    )

    sp = with_nats(sub.add_parser("status", help="an execution's status"))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--watch", action="store_true", help="wait until it is terminal")
    sp.add_argument(
        "--timeout",
        type=seconds,
        help=f"seconds to reach NATS (default {CLIENT_TIMEOUT:g}; exit 5) and, with --watch, to wait "
        "for the end (default: for ever; exit 4)",
    )
    sp.add_argument("--json", action="store_true", help="the status as one JSON object")

    sp = with_timeout(with_nats(sub.add_parser("events", help="an execution's whole log, in order")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--json", action="store_true", help="one JSON object per line, numbered from 1 (n)")

    sp = with_timeout(with_nats(sub.add_parser("logs", help="what an execution's steps printed")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--step", help="only this step's output (its attempts and loop iterations)")
    sp.add_argument("--follow", action="store_true", help="print output as it comes, until the execution ends")
    sp.add_argument("--json", action="store_true", help="one JSON object per output: step, iteration, attempt, text")

    sp = with_timeout(with_nats(sub.add_parser("cancel", help="cancel an execution")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--reason", help="why, recorded in execution.cancelled (default: cancelled by user)")

    sp = with_timeout(with_nats(sub.add_parser("deadletters", help="every actor's dead letters, newest first")))
    sp.add_argument("--since", help="only letters from this time on: ISO 8601 (2026-11-23T22:00:00Z) or an age (2h)")
    sp.add_argument("--json", action="store_true", help="one JSON object per line")

    with_timeout(with_nats(add_retry_parser(sub)))

    sp = with_timeout(with_nats(sub.add_parser("list", help="executions, newest first")))
    sp.add_argument(
        "--state", help="only executions in this state (PENDING, RUNNING, HALTED, COMPLETED, FAILED, CANCELLED)"
    )
    sp.add_argument("--playbook", help="only executions of this catalog path")
    sp.add_argument("--since", help="only executions started since: a duration back (30m, 1h, 2d) or an ISO time")
    sp.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    sp.add_argument("--json", action="store_true", help="one JSON object per line")

    with_timeout(with_nats(add_archive_parser(sub)))

    sp = with_timeout(with_nats(sub.add_parser("result", help="a finished execution's result, or its error")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--json", action="store_true", help='{"execution_id", "state", "result", "error", "reason"}')

    sp = with_timeout(with_nats(sub.add_parser("playbooks", help="the catalog: every playbook and its versions")))
    sp.add_argument("--json", action="store_true", help="one JSON object per playbook")

    sp = sub.add_parser("validate", help="check playbooks; report every error")
    sp.add_argument("files", nargs="+", help="playbook YAML files")
    sp.add_argument("--json", action="store_true", help="one JSON object per file (file, ok, errors, warnings)")

    sub.add_parser("schema", help="print the playbook JSON Schema")

    add_schedule_parser(sub, [with_timeout(with_nats(argparse.ArgumentParser(add_help=False)))])
    with_timeout(with_nats(add_ui_parser(sub)))
    return p


EXECUTION_ID_HELP = "the execution's id, ^[A-Za-z0-9_-]{1,128}$ (default: a new random one)"


class _OneLineErrors(argparse.ArgumentParser):
    """A usage error is one line, as every user error is (argparse prints the usage
    first, which can take a screen for `run`); --help still shows it all."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser_with(*parents: argparse.ArgumentParser, epilog: str | None) -> type[argparse.ArgumentParser]:
    """A subcommand parser class that adds `parents`' options to every subcommand and
    ends its --help with the exit codes."""

    class Parser(_OneLineErrors):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["parents"] = [*kwargs.get("parents", ()), *parents]
            kwargs.setdefault("epilog", epilog)
            kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
            super().__init__(*args, **kwargs)

    return Parser


ASYNC = {
    "run": cmd_run,
    "dev": cmd_dev,
    "serve": cmd_serve,
    "register": cmd_register,
    "start": cmd_start,
    "status": cmd_status,
    "events": cmd_events,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "deadletters": cmd_deadletters,
    "schedule": cmd_schedule,
    "retry": cmd_retry,
    "list": cmd_list,
    "result": cmd_result,
    "playbooks": cmd_playbooks,
    "archive": cmd_archive,
    "ui": cmd_ui,
}
SYNC = {"validate": cmd_validate, "schema": cmd_schema}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_INVALID if e.code else EXIT_OK
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command in SYNC:
            return SYNC[args.command](args)
        return int(_run(ASYNC[args.command](args)))
    except UsageError as e:
        print_error(f"actors-cli: {e}")
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        code = exit_code_for(e)
        if code is None:
            raise
        print_error(f"actors-cli: {e if code == EXIT_INVALID else nats_reason(e)}")
        return code


def _run(coro: Any) -> Any:
    take_sigint = sigint_is_ours()  # before the loop: its runner installs a SIGINT handler of its own
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        return asyncio.run(interruptible(coro, take_sigint=take_sigint))
    return uvloop.run(interruptible(coro, take_sigint=take_sigint))


def entrypoint() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`actors-cli events ID | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    sys.exit(code)
