"""Deliveries that never arrived, told by the numbers a consumer gives its deliveries.

A push consumer numbers every delivery it makes (its delivery sequence), one after
another, a redelivery too. A number skipped is a delivery that was lost on the way: a
connection or a node that died with it in flight, a consumer leader that changed, or
(during a handover) a delivery another pod of the queue group took. The server delivers
a lost input again only after `ack_wait`, while the inputs stored after it come at
once: an actor that folded them would fold its log out of order, and then skip the lost
one when it comes as one it already has (a loop waiting for ever on a result its log
holds). So each delivery is marked with its consumer's gap epoch, the number of gaps
seen on that consumer so far, and whether it is a redelivery; an actor whose next input
comes from a later epoch than the last it folded, or after a redelivery it folded, asks
its log first whether that input is the next one (actors/runtime/logactor.py
`LogActor.in_order`). Between two gaps first deliveries arrive in stream order, so
nothing is asked: the cost is a lookup per actor and gap, and one after each input
delivered again.
"""

from __future__ import annotations

from nats.aio.msg import Msg

from actors.natsio.private import message_tag, tag_message

__all__ = ["DeliveryGaps", "epoch_of", "mark", "resent"]

# set on the message itself (actors/natsio/private.py `tag_message`): the mailbox
# carries messages, and every message in a mailbox came through the host's `_on_msg`,
# which marks it
_EPOCH = "_actors_gap_epoch"
_AGAIN = "_actors_delivered_again"


class DeliveryGaps:
    """The gap epoch of each consumer (stream, consumer name) a host reads."""

    __slots__ = ("_epoch", "_next")

    def __init__(self) -> None:
        self._next: dict[tuple[str, str], int] = {}  # the delivery sequence expected next
        self._epoch: dict[tuple[str, str], int] = {}

    def delivered(self, stream: str, consumer: str, seq: int) -> int:
        """A delivery numbered `seq` arrived: its gap epoch. The first delivery seen of a
        consumer counts as after a gap (what came before went elsewhere: another pod, an
        earlier subscription), and so does one numbered out of turn either way (a
        consumer made again, or a new leader that numbers from what it was told)."""
        key = (stream, consumer)
        expected = self._next.get(key)
        self._next[key] = seq + 1
        epoch = self._epoch.get(key, 0)
        if seq != expected:
            epoch += 1
            self._epoch[key] = epoch
        return epoch

    def epoch(self, stream: str, consumer: str) -> int:
        """The consumer's gap epoch now: deliveries that arrive later carry a later one
        when one went missing meanwhile."""
        return self._epoch.get((stream, consumer), 0)


def mark(msg: Msg, epoch: int, *, again: bool) -> None:
    """`msg` was delivered in gap epoch `epoch`; `again`: not for the first time."""
    tag_message(msg, _EPOCH, epoch)
    if again:
        tag_message(msg, _AGAIN, True)


def epoch_of(msg: Msg) -> int | None:
    """The gap epoch `msg` was delivered in (None: not delivered through a host)."""
    epoch = message_tag(msg, _EPOCH)
    return epoch if isinstance(epoch, int) else None


def resent(msg: Msg) -> bool:
    """Was `msg` delivered before? Other inputs lost with its first delivery may come
    back after inputs delivered for the first time, with no gap between: the input an
    actor takes after a resent one is asked for too."""
    return message_tag(msg, _AGAIN) is True
