"""The stream layout keeps a running execution's records however old: no stream or
bucket of an execution's records has an age limit of its own (the retention actor
removes finished executions, whole), and a deployment made by an earlier version,
whose streams and buckets expired everything after 7 days, is brought up to date by
the engine's `ensure`."""

from __future__ import annotations

import pytest
from nats.js import api

from actors.pod.roles import connect
from streams.layout import (
    ARCHIVE_BUCKET,
    BLOB_BUCKET,
    DLQ_STREAM,
    ENDED_STREAM,
    EXEC_STREAM,
    INDEX_STREAM,
    LOOP_STREAM,
    PAYLOAD_BUCKET,
    RETENTION_CONSUMER,
    ensure,
    obj_stream,
)
from streams.server import NatsServer
from tests.conftest import make_layout

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
WEEK = 7 * 24 * 3600.0
RECORDS = (EXEC_STREAM, LOOP_STREAM, INDEX_STREAM, ENDED_STREAM, obj_stream(BLOB_BUCKET), obj_stream(PAYLOAD_BUCKET))


async def test_no_stream_of_an_executions_records_expires_and_earlier_deployments_are_updated(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    try:
        # as an earlier version made them: 7 days on the logs and the blobs
        await js.add_stream(
            api.StreamConfig(name=EXEC_STREAM, subjects=["exec.>"], max_age=WEEK, allow_msg_schedules=True)
        )
        await js.create_object_store(BLOB_BUCKET, config=api.ObjectStoreConfig(bucket=BLOB_BUCKET, ttl=WEEK))
        layout = make_layout(dead_letter_retention=3600.0, archive_retention=90 * 24 * 3600.0)
        await ensure(js, layout)
        for stream in RECORDS:
            assert (await js.stream_info(stream)).config.max_age == 0, stream
        assert (await js.stream_info(DLQ_STREAM)).config.max_age == 3600.0
        assert (await js.stream_info(obj_stream(ARCHIVE_BUCKET))).config.max_age == 90 * 24 * 3600.0
        consumer = await js.consumer_info(ENDED_STREAM, RETENTION_CONSUMER)
        assert consumer.config.max_deliver == -1  # an end is never given up on: its records would stay for ever
    finally:
        await nc.close()
