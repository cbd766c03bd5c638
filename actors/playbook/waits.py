"""What a wait iteration reads of a signal (`tool: wait` in a loop, docs/language.md,
Waiting): its key as text, `signal` in a `when`, an approval's verdict. The same rules
as the engine's for a single wait step (actors/core/waits.py), so a loop of waits and
a wait step take the same signals alike; `until` is read by actors/playbook/until.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.wire.messages import SignalSent


def signal_key(value: Any) -> str:
    """A rendered `key` as the text a sender gives (`{{ item.id }}` giving 5 waits on
    the key "5", what `actors-cli signal ID NAME --key 5` sends)."""
    return value if isinstance(value, str) else str(value) if value is not None else ""


def signal_bytes(sig: SignalSent) -> int:
    """What a kept signal weighs against its keeper's bound (the execution's mailbox,
    a loop's kept signals): its data as JSON, its name, key and sender. Deterministic:
    the same signal weighs the same in every replay."""
    return len(msgspec.json.encode(sig.data)) + len(sig.name) + len(sig.key) + len(sig.by)


def signal_view(sig: SignalSent) -> dict[str, Any]:
    """`signal` in a wait's `when`: {name, key, data, by, sent_at}, what the sender sent."""
    return {"name": sig.name, "key": sig.key, "data": sig.data, "by": sig.by, "sent_at": sig.sent_at}


def approval_result(sig: SignalSent) -> dict[str, Any]:
    """An approved approval step's result: `{approved, comment, by}` whatever the sender
    wrote (a webhook's body may say only `{"approved": true}`), `by` the signal's sender
    as the log records it (as `rejection` names it), never what the data claims."""
    data = sig.data if isinstance(sig.data, dict) else {}
    comment = data.get("comment")
    return {"approved": True, "comment": "" if comment is None else str(comment)[:500], "by": sig.by}


def rejection(step: str, sig: SignalSent) -> str | None:
    """An approval signal (data `{approved, comment, by}`): None when approved, else the
    message of the step's `Rejected` failure, naming who and the comment. Data that does
    not say `approved` true is no approval. Who is the signal's sender (`sig.by`, set by
    the client or the hook that sent it: `hook:<name>`), never the data's `by`, which
    the caller writes (a hook's body could name anyone)."""
    data = sig.data
    if isinstance(data, dict) and data.get("approved") is True:
        return None
    data = data if isinstance(data, dict) else {}
    who = sig.by or "someone"
    comment = data.get("comment")
    return f"step '{step}' was rejected by {str(who)[:200]}" + (f": {str(comment)[:500]}" if comment else "")
