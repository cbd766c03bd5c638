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
from actors.cli.describe import add_describe_parser, cmd_describe
from actors.cli.exits import EXIT_INVALID, EXIT_OK, UsageError, exit_code_for, nats_reason
from actors.cli.hooks import add_hook_parser, cmd_hook
from actors.cli.inputs import seconds, seconds_or_zero
from actors.cli.interrupt import interruptible, sigint_is_ours
from actors.cli.items import add_items_parser, cmd_items
from actors.cli.listing import cmd_list, cmd_playbooks, cmd_result
from actors.cli.logs import cmd_logs
from actors.cli.output import print_error, use_local_time
from actors.cli.retrying import add_retry_parser, cmd_retry
from actors.cli.rollback import add_prepare_rollback_parser, cmd_prepare_rollback
from actors.cli.schedule import add_schedule_parser, cmd_schedule
from actors.cli.security import add_connection_flags
from actors.cli.serving import cmd_dev, cmd_serve
from actors.cli.signals import add_signal_parsers, cmd_approve, cmd_reject, cmd_signal
from actors.cli.triggers import add_trigger_parser, cmd_trigger
from actors.cli.ui import add_ui_parser, cmd_ui
from actors.natsio.dial import CLIENT_TIMEOUT


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrors(
        prog="actors-cli",
        description="Run YAML playbooks on NATS JetStream. `actors-cli COMMAND --help` for a command's options "
        "and examples; `actors-cli help connect` for the connection options every command takes.",
        epilog=exits_text(),
        formatter_class=_Formatter,
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log actor activity to stderr")
    # typed as every add_X_parser takes it: their parsers are _CommandParsers all the same
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = p.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )

    def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return add_connection_flags(sp)  # --nats shown; credentials, TLS, payload keys: `help connect`

    sp = with_nats(sub.add_parser("run", help="register, start and follow a playbook to its end"))
    sp.add_argument("file", help="playbook YAML file")
    sp.add_argument("--payload", metavar="JSON", help="JSON object, or @file; deep-merged over the playbook's workload")
    sp.add_argument("--execution-id", metavar="ID", help=EXECUTION_ID_HELP)
    sp.add_argument(
        "--register", metavar="FILE", action="append", help="also register this playbook (sub-playbooks); repeatable"
    )
    sp.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object at the end (execution_id, state, result, error, times, existing)",
    )
    sp.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="seconds the execution may take (exit 4 past it); with --nats also the bound on reaching "
        f"NATS (default {CLIENT_TIMEOUT:g}; exit 5)",
    )

    sp = sub.add_parser(
        "dev",
        help="embedded NATS plus every actor and the web UI, in the foreground",
        description="Start a nats-server with JetStream, every actor and the web UI in this one process, in the "
        "foreground, until Ctrl-C. It prints the NATS_URL the other commands need and the UI's address. "
        "For trying playbooks on one machine: nothing is kept after it stops unless --store names a directory.",
    )
    sp.add_argument("--port", type=int, default=4222, help="port of the embedded NATS server (default 4222)")
    sp.add_argument("--store", metavar="DIR", help="JetStream store dir, kept across runs (default: a temporary one)")
    sp.add_argument(
        "--ui-port", type=int, metavar="PORT", help="port of the web UI (default $ACTORS_UI_PORT, else 8233); 0: none"
    )
    sp.add_argument(
        "--server-config",
        metavar="FILE",
        help="nats-server configuration for the embedded server (TLS, users); the actors then connect with the "
        "credential and TLS options of `actors-cli help connect`",
    )
    add_connection_flags(sp, url=False)

    sp = with_nats(sub.add_parser("serve", help="run one actor role (a pod)"))
    sp.add_argument(
        "--role",
        choices=["engine", "counter", "tools", "projector", "retention", "trigger", "all", "ui"],
        default="all",
        help="the actors this pod runs: engine (executions, starts, schedule fires), counter (loops), tools "
        "(steps), projector (statuses), retention (archival), trigger (starts for NATS messages), all of them "
        "(all, the default), or ui (the web UI alone; --port: $ACTORS_UI_PORT)",
    )
    # defaults None: unset flags leave the environment's settings (actors/config/settings.py) as they are
    sp.add_argument(
        "--http-port",
        type=int,
        metavar="PORT",
        help="port for /healthz, /readyz and /metrics; 0: no HTTP server (default $ACTORS_HTTP_PORT, else 8080)",
    )
    sp.add_argument(
        "--http-host", metavar="HOST", help="address the HTTP server binds (default $ACTORS_HTTP_HOST, else 0.0.0.0)"
    )
    sp.add_argument(
        "--drain-timeout",
        type=seconds_or_zero,
        metavar="SECONDS",
        help="seconds running tool commands get to finish after SIGTERM (default $ACTORS_DRAIN_TIMEOUT, else 10)",
    )

    def with_timeout(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--timeout",
            type=seconds,
            default=None,
            metavar="SECONDS",
            help=f"seconds to reach NATS (default {CLIENT_TIMEOUT:g}); exit 5 past it",
        )
        return sp

    sp = with_timeout(with_nats(sub.add_parser("register", help="register playbooks in the catalog")))
    sp.add_argument("files", nargs="+", help="playbook YAML files")
    sp.add_argument("--json", action="store_true", help="one JSON object per file (file, path, version)")

    sp = with_timeout(with_nats(sub.add_parser("start", help="start an execution; prints its id")))
    sp.add_argument("path", help="catalog path of a registered playbook")
    sp.add_argument("--payload", metavar="JSON", help="JSON object, or @file; deep-merged over the playbook's workload")
    sp.add_argument("--version", type=int, metavar="N", help="catalog version to start (default: the latest)")
    sp.add_argument("--execution-id", metavar="ID", help=EXECUTION_ID_HELP)
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
        metavar="SECONDS",
        help=f"seconds to reach NATS (default {CLIENT_TIMEOUT:g}; exit 5) and, with --watch, to wait "
        "for the end (default: for ever; exit 4)",
    )
    sp.add_argument("--json", action="store_true", help="the status as one JSON object")

    sp = with_timeout(with_nats(sub.add_parser("events", help="an execution's whole log, in order")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--json", action="store_true", help="one JSON object per line, numbered from 1 (n)")

    sp = with_timeout(with_nats(sub.add_parser("logs", help="what an execution's steps printed")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--step", metavar="STEP", help="only this step's output (its attempts and loop iterations)")
    sp.add_argument("--follow", action="store_true", help="print output as it comes, until the execution ends")
    sp.add_argument("--json", action="store_true", help="one JSON object per output: step, iteration, attempt, text")

    sp = with_timeout(with_nats(sub.add_parser("cancel", help="cancel an execution")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument(
        "--reason", metavar="TEXT", help="why, recorded in execution.cancelled (default: cancelled by user)"
    )

    sp = with_timeout(with_nats(sub.add_parser("deadletters", help="every actor's dead letters, newest first")))
    sp.add_argument(
        "--since", metavar="WHEN", help="only letters from this time on: ISO 8601 (2026-11-23T22:00:00Z) or an age (2h)"
    )
    sp.add_argument("--json", action="store_true", help="one JSON object per line")

    with_timeout(with_nats(add_retry_parser(sub)))
    with_timeout(with_nats(add_items_parser(sub)))

    sp = with_timeout(with_nats(sub.add_parser("list", help="executions, newest first")))
    sp.add_argument(
        "--state",
        metavar="STATE",
        help="only executions in this state (PENDING, RUNNING, HALTED, COMPLETED, FAILED, CANCELLED)",
    )
    sp.add_argument("--playbook", metavar="PATH", help="only executions of this catalog path")
    sp.add_argument(
        "--since", metavar="WHEN", help="only executions started since: a duration back (30m, 1h, 2d) or an ISO time"
    )
    sp.add_argument("--limit", type=int, default=50, metavar="N", help="at most this many (default 50)")
    sp.add_argument("--json", action="store_true", help="one JSON object per line")

    with_timeout(with_nats(add_archive_parser(sub)))
    with_timeout(with_nats(add_prepare_rollback_parser(sub)))

    sp = with_timeout(with_nats(sub.add_parser("result", help="a finished execution's result, or its error")))
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("--json", action="store_true", help='{"execution_id", "state", "result", "error", "reason"}')

    sp = with_timeout(with_nats(sub.add_parser("playbooks", help="the catalog: every playbook and its versions")))
    sp.add_argument("--json", action="store_true", help="one JSON object per playbook")

    sp = sub.add_parser("validate", help="check playbooks; report every error")
    sp.add_argument("files", nargs="+", help="playbook YAML files")
    sp.add_argument("--json", action="store_true", help="one JSON object per file (file, ok, errors, warnings)")

    sub.add_parser("schema", help="print the playbook JSON Schema")

    add_schedule_parser(sub, [with_timeout(with_nats(_CommandParser(add_help=False)))])
    add_hook_parser(sub, [with_timeout(with_nats(_CommandParser(add_help=False)))])
    add_trigger_parser(sub, [with_timeout(with_nats(_CommandParser(add_help=False)))])
    with_timeout(with_nats(add_ui_parser(sub)))

    sp = sub.add_parser("help", help="help on a command, or on a topic: connect (NATS, TLS, keys), exits")
    sp.add_argument("topic", nargs="?", help="connect, exits, or a command's name")

    with_timeout(with_nats(add_describe_parser(sub)))
    for sp in add_signal_parsers(sub):
        with_timeout(with_nats(sp))
    # registration points of other commands: `with_timeout(with_nats(add_X_parser(sub)))` above this line

    finish_help(sub)
    return p


EXECUTION_ID_HELP = "the execution's id, ^[A-Za-z0-9_-]{1,128}$ (default: a new random one)"


class _OneLineErrors(argparse.ArgumentParser):
    """A usage error is one line, as every user error is (argparse prints the usage
    first, which can take a screen for `run`); --help still shows it all."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.HelpFormatter):
    """Paragraphs of a description wrapped to the terminal; one with line breaks of its
    own (the examples, the exit codes) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(
            "".join(indent + line for line in paragraph.splitlines(keepends=True))
            if "\n" in paragraph.strip("\n")
            else super(_Formatter, self)._fill_text(paragraph, width, indent)
            for paragraph in text.split("\n\n")
        )


class _CommandParser(_OneLineErrors):
    """A command's parser: its --help is its own options first, then the short
    `connection` group, then `finish_help`'s -h, -v, examples and the exit codes in
    one line (they were the first and last 60 lines of every --help)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["add_help"] = False  # -h goes last: finish_help
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


# What a command's --help ends with: a few lines a user can copy. A command with none
# (one another module registers) still gets the exit codes line.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": (
        'actors-cli run examples/hello.yaml --payload \'{"name": "you"}\'   # its own NATS and actors',
        "actors-cli run flow.yaml --nats nats://127.0.0.1:4222 --timeout 60 --json",
    ),
    "dev": ("actors-cli dev --store ./nats-data &   # then: export NATS_URL=nats://127.0.0.1:4222",),
    "serve": ("actors-cli serve --role tools --nats nats://nats:4222 --http-port 8080",),
    "register": ("actors-cli register examples/hello.yaml sub/*.yaml",),
    "start": (
        'id=$(actors-cli start examples/hello --payload \'{"name": "ops"}\')',
        "actors-cli start examples/hello --version 2 --execution-id nightly-2026-11-26",
    ),
    "status": ("actors-cli status ID", "actors-cli status ID --watch --timeout 600"),
    "events": ("actors-cli events ID", "actors-cli events ID --json | jq -c 'select(.type == \"call.error\")'"),
    "logs": ("actors-cli logs ID --step fetch", "actors-cli logs ID --follow"),
    "cancel": ("actors-cli cancel ID --reason 'wrong payload'",),
    "signal": (
        "actors-cli signal ID payment-received --data '{\"amount\": 42}'",
        "actors-cli signal ID shipped --key order-7",
    ),
    "approve": ("actors-cli approve ID", "actors-cli approve ID review --comment 'looks good'"),
    "reject": ("actors-cli reject ID --comment 'wrong amount'",),
    "deadletters": ("actors-cli deadletters --since 2h",),
    "retry": ("actors-cli retry ID", 'actors-cli retry ID --from fetch --payload \'{"day": "2026-11-25"}\''),
    "list": (
        "actors-cli list --state FAILED --since 1d",
        "actors-cli list --playbook examples/hello --limit 10 --local",
    ),
    "archive": ("actors-cli archive --older-than 30d --to /var/backups/actors",),
    "prepare-rollback": ("actors-cli prepare-rollback   # as the engine user, after ACTORS_FAST_ANSWERS=0",),
    "result": ("actors-cli result ID", "actors-cli result ID --json"),
    "playbooks": ("actors-cli playbooks",),
    "validate": ("actors-cli validate flows/*.yaml",),
    "schema": ("actors-cli schema > playbook.schema.json",),
    "schedule": (
        "actors-cli schedule add nightly --playbook examples/hello --cron '0 2 * * *'",
        "actors-cli schedule list",
    ),
    "schedule add": (
        "actors-cli schedule add nightly --playbook examples/hello --cron '0 2 * * *' --timezone Europe/Paris",
        "actors-cli schedule add every5 --playbook etl/load --cron '*/5 * * * *' --payload @payload.json",
    ),
    "schedule list": ("actors-cli schedule list --local",),
    "hook": (
        "actors-cli hook add orders --playbook shop/order   # prints its token, once",
        "actors-cli hook add approvals --signal approval",
        "actors-cli hook list",
    ),
    "hook add": (
        "actors-cli hook add orders --playbook shop/order --version 3",
        "actors-cli hook add paid --signal payment-received --json",
    ),
    "hook rotate": ("actors-cli hook rotate orders",),
    "trigger": (
        "actors-cli trigger add orders --subject orders.created --stream ORDERS --playbook shop/order",
        "actors-cli trigger list",
    ),
    "trigger add": (
        "actors-cli trigger add orders --subject 'orders.*' --stream ORDERS --playbook shop/order "
        '--payload \'{"order": "{{ message.data.id }}", "seq": "{{ message.seq }}"}\'',
        "actors-cli trigger add pings --subject ops.ping --playbook ops/pong   # core NATS: at most once",
    ),
    "trigger list": ("actors-cli trigger list --local",),
    "ui": ("actors-cli ui --port 8233 --token-file ~/.actors-ui-token",),
    "help": ("actors-cli help connect", "actors-cli help run"),
}
# the commands that print times: UTC unless --local (output.when)
TIMED = {"status", "list", "playbooks", "deadletters", "schedule list", "hook list", "trigger list"}
TIMED |= {"describe", "items"}
EXITS_LINE = (
    "exit codes: 0 done (COMPLETED), 1 FAILED, 2 CANCELLED, 3 bad input or unknown id,\n"
    "  4 timeout, 5 NATS unavailable, 130 Ctrl-C (details: actors-cli help exits)"
)


def exits_text() -> str:
    """The exit codes as actors/cli/exits.py's docstring says them."""
    doc = exits.__doc__ or ""
    return doc[doc.index("Exit codes:") : doc.index("A user error")] if "Exit codes:" in doc else ""


def finish_help(sub: argparse._SubParsersAction[argparse.ArgumentParser], prefix: str = "") -> None:
    """What every command's parser gets once its own options are in (so they come first
    in --help): -h and -v, --local where it prints times, a description (its one-line
    help, when it has none), examples and the exit codes line. Nested commands too
    (`schedule add`)."""
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, sp in sub.choices.items():
        full = f"{prefix}{name}"
        if full in TIMED and "--local" not in sp._option_string_actions:
            sp.add_argument("--local", action="store_true", help="times in this machine's time zone (default: UTC)")
        if "-h" not in sp._option_string_actions:
            sp.add_argument("-h", "--help", action="help", default=argparse.SUPPRESS, help="show this help and exit")
        if "-v" not in sp._option_string_actions:
            # -v also after the command (`actors-cli run -v f.yaml`); SUPPRESS keeps this
            # default from overwriting a -v given before the command
            sp.add_argument(
                "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log actor activity to stderr"
            )
        if sp.description is None and helps.get(name):
            sp.description = str(helps[name])
        examples = EXAMPLES.get(full, ())
        tail = ("examples:\n" + "".join(f"  {e}\n" for e in examples) + "\n" if examples else "") + EXITS_LINE
        sp.epilog = f"{sp.epilog}\n\n{tail}" if sp.epilog else tail
        for action in sp._actions:
            if isinstance(action, argparse._SubParsersAction):
                finish_help(action, prefix=f"{full} ")


def cmd_help(args: argparse.Namespace) -> int:
    """`actors-cli help [TOPIC]`: the connection options, the exit codes, or a command's --help."""
    from actors.cli.security import connect_help

    topic = args.topic
    parser = build_parser()
    if topic is None:
        parser.print_help()
    elif topic in ("connect", "connection"):
        sys.stdout.write(connect_help(_Formatter))
    elif topic in ("exits", "exit", "codes"):
        doc = exits.__doc__ or ""
        sys.stdout.write(doc[doc.find("Exit codes:") :].strip() + "\n")
    else:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if topic not in sub.choices:
            raise UsageError(f"no help topic {topic!r}: connect, exits, or one of {', '.join(sub.choices)}")
        sub.choices[topic].print_help()
    return EXIT_OK


ASYNC = {
    "run": cmd_run,
    "dev": cmd_dev,
    "serve": cmd_serve,
    "register": cmd_register,
    "start": cmd_start,
    "status": cmd_status,
    "events": cmd_events,
    "logs": cmd_logs,
    "describe": cmd_describe,
    "cancel": cmd_cancel,
    "signal": cmd_signal,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "deadletters": cmd_deadletters,
    "schedule": cmd_schedule,
    "hook": cmd_hook,
    "trigger": cmd_trigger,
    "retry": cmd_retry,
    "items": cmd_items,
    "list": cmd_list,
    "result": cmd_result,
    "playbooks": cmd_playbooks,
    "archive": cmd_archive,
    "prepare-rollback": cmd_prepare_rollback,
    "ui": cmd_ui,
}
SYNC = {"validate": cmd_validate, "schema": cmd_schema, "help": cmd_help}


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
    use_local_time(getattr(args, "local", False))
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
