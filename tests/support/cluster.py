"""A JetStream cluster seen from a test: which node leads a stream."""

from __future__ import annotations

from nats.aio.client import Client as NATS


async def leader_of(nc: NATS, stream: str) -> int:
    """The index of the node leading `stream` (NatsCluster names them node<i>)."""
    info = await nc.jsm().stream_info(stream)
    assert info.cluster is not None and info.cluster.leader
    return int(info.cluster.leader.removeprefix("node"))
