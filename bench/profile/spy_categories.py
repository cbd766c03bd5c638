"""Group a py-spy profile of the engine process by cost, for bench/RESULTS.md.

    py-spy record --native --format raw -r 250 --pid PID --duration 8 -o spy.txt
    python -m bench.profile.spy_categories spy.txt

Each sample goes to the category of the innermost Python frame that matches a rule
below (so a socket write under ``publish_all`` counts as "nats-py publish path").
Idle samples (the loop in ``epoll_pwait``, idle thread-pool threads) are dropped.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

RULES = [
    ("playbook parse in the start fold (load_playbook, YAML)", r"yaml/|playbook/loader\.py"),
    ("template rendering (jinja2)", r"jinja2/|playbook/templates\.py"),
    ("ack-subject metadata parse (msg.metadata)", r"Msg\.metadata|Metadata\._from_reply|aio/msg\.py:2[0-9][0-9]"),
    ("pull fetch (tool actor)", r"_fetch_n|PullSubscription\.fetch"),
    (
        "nats-py publish path (PUB/HPUB build, PubAck futures, flusher, socket write)",
        r"Client\.publish |_send_publish|_send_command|_flush_pending|_flusher|writelines|publish_async|token_hex|nuid|"
        r"JetStreamContext\.publish |Client\.request|_request_new_style|Msg\.ack|secrets\.py|random\.py",
    ),
    (
        "nats-py receive path (read loop, parser, dispatch, PubAck JSON)",
        r"_read_loop|Parser\.parse|_process_msg|_process_headers|_build_message|_parse_header_lines|_wait_for_msgs|"
        r"next_msg|_handle_async_reply|from_response|json/|nats/js/api\.py|Subscription",
    ),
    ("python pool IPC, parent side (pypool, pyprocess)", r"tools/pypool\.py|tools/pyprocess\.py"),
    ("fold/decide, excluding templates", r"core/decide\.py|core/state\.py|core/backoff\.py"),
    ("asyncio tasks, queues, futures", r"asyncio/(tasks|queues|mixins|locks|futures)\.py"),
    ("engine actor code (decode, encode, mailbox)", r"engine/actor\.py|natsio/\w+\.py|wire\.py"),
    (
        "tool actor code (decode, encode, keep-alive task)",
        r"tools/(actor|pull|running|batching|cancels|executors|failures|kinds/\w+)\.py",
    ),
    ("projector, status KV, Client.wait", r"projector\.py|nats/js/kv\.py|Client\.wait"),
    ("starter, catalog", r"starter\.py|catalog\.py"),
    ("uvloop internals (no Python frame above)", r"^Runner\.run|^run \(uvloop"),
]
PY_FRAME = re.compile(r"\.py:\d+\)$")
IDLE_LEAF = ("epoll_pwait", "epoll_wait")


def categorise(path: str) -> tuple[int, int, Counter[str], Counter[str]]:
    cats: Counter[str] = Counter()
    syscalls: Counter[str] = Counter()
    idle = busy = 0
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, n_ = line.rsplit(" ", 1)
        frames, n = stack.split(";"), int(n_)
        py = [f for f in frames if PY_FRAME.search(f)]
        leaf = re.sub(r" \(.*", "", frames[-1])
        if leaf in IDLE_LEAF or (py and py[-1].startswith("_worker (concurrent/futures/thread.py")):
            idle += n
            continue
        busy += n
        if leaf in (
            "write",
            "writev",
            "send",
            "sendto",
            "recv",
            "recvfrom",
            "read",
            "getpid",
            "getrandom",
            "epoll_ctl",
        ):
            syscalls[leaf] += n
        got = "other"
        for f in reversed(py):
            got = next((name for name, pat in RULES if re.search(pat, f)), "other")
            if got != "other":
                break
        cats[got] += n
    return busy, idle, cats, syscalls


def main() -> int:
    busy, idle, cats, syscalls = categorise(sys.argv[1])
    print(f"{busy} busy samples of the engine process ({idle} idle samples dropped)")
    for name, n in cats.most_common():
        print(f"{100 * n / busy:5.1f}%  {name}")
    print(
        "samples whose innermost frame is a syscall: "
        + ", ".join(f"{k} {100 * v / busy:.1f}%" for k, v in syscalls.most_common())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
