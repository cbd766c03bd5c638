"""An input's values that travel as blobs (too large for a message) read back before
it is folded: by the engine, live and in a replay, and by `Client.retry` folding an
old execution's log. A blob that is gone, or that is not what its key names (changed
after it was written: `BlobCorrupt`), becomes the input's error (the step or the
execution fails saying so, naming the key), never an input retried for ever."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from actors.core.effects import loop_failed
from actors.store.blobs import BLOB_MISSING, VALUE_CORRUPT, BlobCorrupt, get_blob, get_payload, resolve_result
from actors.wire.messages import CallDone, ErrorInfo, Input, IteratorCompleted, StartRecord


async def read_back(js: JetStreamContext, inp: Input) -> Input:
    """`inp` with the values it names as blobs read back into it."""
    if isinstance(inp, CallDone) and inp.result_ref is not None:
        return await resolve_result(js, inp)
    if isinstance(inp, StartRecord) and inp.payload_ref is not None:
        return await _start_payload(js, inp)
    if isinstance(inp, IteratorCompleted) and inp.results is None and inp.results_ref:
        try:
            inp.results = await get_blob(js, inp.results_ref)
        except (NotFoundError, BlobCorrupt) as e:
            # the blob expired, was removed or changed: the loop's results are gone, say so
            missing = (
                ErrorInfo(type=VALUE_CORRUPT, message=f"loop results {e}")
                if isinstance(e, BlobCorrupt)
                else ErrorInfo(type="ResultsMissing", message=f"blob {inp.results_ref} not found")
            )
            return loop_failed(
                inp.execution_id,
                inp.loop_id,
                inp.step,
                missing,
                total=inp.total,
                succeeded=inp.succeeded,
                failed=inp.failed,
            )
    return inp


async def _start_payload(js: JetStreamContext, inp: StartRecord) -> StartRecord:
    """The start record with its payload read back; one that is gone or changed fails
    the execution (its `error`, which the fold turns into `playbook.failed`)."""
    assert inp.payload_ref is not None
    error: ErrorInfo | None = None
    try:
        payload = await get_payload(js, inp.payload_ref)
    except BLOB_MISSING:
        payload = None
    except BlobCorrupt as e:
        payload, error = None, ErrorInfo(type=VALUE_CORRUPT, message=f"start payload {e}")
    if isinstance(payload, dict):
        inp.payload, inp.payload_ref = payload, None
    elif inp.error is None:
        inp.error = error or ErrorInfo(
            type="ValueMissing", message=f"start payload blob {inp.payload_ref} not found (expired or removed)"
        )
    return inp
