"""actors-cli: run, watch and operate playbook executions.

Exit codes: `actors.cli.exits` (also at the end of `actors-cli --help`).

Every command that talks to NATS takes --nats URL (or NATS_URL; credentials go in the
URL: nats://user:password@host:4222); `run` without one starts an embedded
nats-server and every actor in this process. Client commands reach NATS within
--timeout seconds (default 30) or exit 5; each request they make rides out a stream
leader election or a reconnect (sent again, a start with the same execution id and
Nats-Msg-Id) for up to --timeout, then exits 5. `serve` instead waits for its server
as long as it takes (a pod starts before its server is up). Any node of a cluster
listed in the URL will do: one that is down is skipped.

One module per idea:

* `main`: the argument parser and the entry point (`entrypoint`, `main`)
* `exits`: the exit codes, and the one line an error of the user's or NATS's prints
* `commands`: what each command that runs and ends does; `serving`: `dev` and `serve`
* `inputs`: settings, --timeout, execution id and payload from flags and environment
* `connection`: the `Client` a command works through (or an embedded server)
* `output`: what is printed (JSON lines, a status, the log table); `live`: `run`'s live view
"""

from actors.cli.exits import EXIT_CANCELLED, EXIT_FAILED, EXIT_INVALID, EXIT_NATS, EXIT_OK, EXIT_TIMEOUT
from actors.cli.main import build_parser, entrypoint, main

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_NATS",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "build_parser",
    "entrypoint",
    "main",
]
