"""The payload codec's pure parts (actors/wire/codec.py): which fields it seals, that sealing
is deterministic and round-trips through the typed decoders, key parsing and rotation.
End to end against a real server: tests/system/test_payload_encryption.py."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import msgspec
import pytest

import actors.wire.events as events
import actors.wire.messages as wire
from actors.config.settings import Settings, SettingsInvalid
from actors.wire.codec import (
    PayloadCodec,
    PayloadKeyInvalid,
    PayloadKeyMissing,
    PayloadKeys,
    PayloadUnreadable,
    parse_key,
    plan_of,
)

pytestmark = [pytest.mark.timeout(30)]

KEY = "k1:" + base64.b64encode(bytes(range(32))).decode()
NEW = "k2:" + base64.b64encode(bytes(range(1, 33))).decode()

# Fields that can hold arbitrary data but stay in clear, on purpose. A new field that
# can hold data must be marked SECRET / SECRET_ERROR (actors/wire/secrecy.py) or listed here.
CLEAR_ON_PURPOSE = {
    ("UnknownEvent", "data"),  # an event of a newer engine: its values were sealed by that engine's types
    ("DeadLetter", "headers"),  # message headers (ids), not values
    ("_Named", "execution_id"),
}


def _holds_data(t: Any) -> bool:
    i = msgspec.inspect
    if isinstance(t, i.AnyType):
        return True
    if isinstance(t, i.Metadata):
        return _holds_data(t.type)
    if isinstance(t, i.UnionType):
        return any(map(_holds_data, t.types))
    if isinstance(t, (i.ListType, i.VarTupleType)):
        return _holds_data(t.item_type)
    if isinstance(t, i.DictType):
        return _holds_data(t.value_type)
    return False


def test_every_field_that_can_hold_a_value_is_sealed_or_clear_on_purpose() -> None:
    forgotten = []
    for module in (wire, events):
        for name, cls in vars(module).items():
            if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct) and cls.__module__ == module.__name__):
                continue
            sealed = {f for f, _ in plan_of(cls)}
            for f in msgspec.structs.fields(cls):
                try:
                    t = msgspec.inspect.type_info(f.type)
                except TypeError:
                    continue  # a union of events: walked (plan_of), each event checked on its own
                if _holds_data(t) and f.name not in sealed and (name, f.name) not in CLEAR_ON_PURPOSE:
                    forgotten.append(f"{name}.{f.name}")
    assert not forgotten, f"mark these SECRET (actors/wire/secrecy.py) or list them as clear: {forgotten}"


def codec(*keys: str) -> PayloadCodec:
    parsed = [parse_key(k, where="test") for k in keys]
    return PayloadCodec(PayloadKeys(parsed[0], tuple(parsed[1:])))


def a_decision() -> events.DecisionRecord:
    error = {"type": "ValueError", "message": "token=s3cr3t", "retryable": False, "status": None, "traceback": "tb"}
    return events.DecisionRecord(
        cause=7,
        events=[
            events.make_event(
                events.FailureDecidedData(
                    activation=1, attempt_number=1, error=error, decision="ignore", rule=None, result={"x": "s3cr3t"}
                ),
                execution_id="e1",
                at=1.0,
                cause=7,
                step="fetch",
            )
        ],
    )


def test_sealed_messages_keep_names_clear_hide_values_and_round_trip() -> None:
    c = codec(KEY)
    rec = a_decision()
    data = c.encode(rec)
    assert b"s3cr3t" not in data and b'"tb"' not in data
    assert b'"ValueError"' not in data  # an error's type is a value too (actors/wire/secrecy.py)
    assert b'"fetch"' in data and b"step.failure_decided" in data
    assert c.encode(rec) == data  # deterministic: a replay republishes the same bytes
    back = c.decode(events.decision_decoder, data)
    assert msgspec.json.encode(back) == msgspec.json.encode(rec)
    assert msgspec.json.encode(rec).count(b"s3cr3t") == 2  # the original was not changed in place


@pytest.mark.parametrize(
    "msg",
    [
        wire.CallDone(execution_id="e", command_id="c", step="s", attempt_number=1, result=[1, {"a": 2**70}]),
        wire.Command(
            execution_id="e",
            command_id="c",
            step="s",
            kind="python",
            reply_to="r",
            attempt_number=1,
            args={"password": "hunter2"},
            element="hunter2",
            chunk=[wire.ChunkItem(iteration_index=0, args={"p": 1})],
        ),
        wire.IteratorFailed(
            execution_id="e",
            loop_id="l",
            step="s",
            total=2,
            succeeded=1,
            failed=1,
            results=["hunter2", None],
            errors=[{"index": 1, "error": {"message": "hunter2"}}],
        ),
        wire.StartRecord(execution_id="e", playbook_path="p", payload={"k": "hunter2"}),
    ],
)
def test_every_kind_of_value_field_decodes_with_its_typed_decoder(msg: Any) -> None:
    c = codec(KEY)
    data = c.encode(msg)
    assert b"hunter2" not in data
    decoder = msgspec.json.Decoder(type(msg))
    assert c.decode(decoder, data) == msg


def test_equal_values_give_equal_ciphertext_and_different_values_different_nonces() -> None:
    c = codec(KEY)
    a, b = c.seal_value("one"), c.seal_value("two")
    assert c.seal_value("one") == a and a != b
    nonce = lambda token: base64.urlsafe_b64decode(token.split(":")[2] + "==")[:12]  # noqa: E731
    assert nonce(a) != nonce(b)
    assert c.open_bytes(c.seal_bytes(b"blob")) == b"blob" and b"blob" not in c.seal_bytes(b"blob")


LOOKALIKES: list[Any] = [
    "$sealed:x:hello",
    "$$sealed:x:hello",
    "$$$sealed:",
    {"$sealed": "$sealed:zz:secretdata-in-clear"},
    {"$sealed": "$$sealed:zz"},
    [{"$sealed": "$sealed:zz:x"}],
    "sealed:x",
    {"$sealed": 1},
]


@pytest.mark.parametrize("value", LOOKALIKES)
@pytest.mark.parametrize("raw", [False, True], ids=["value", "raw"])
def test_a_value_that_looks_sealed_reads_back_exactly_in_clear_with_a_key_and_after_the_key_is_set(
    value: Any, raw: bool
) -> None:
    """A user's text is never taken for a token: in clear it is written escaped, with a
    key it is sealed like any value; each reads back as it was (a clear log read by a
    pod given a key later, too). `raw`: a tool's result, already encoded."""
    msg = wire.CallDone(
        execution_id="e1",
        command_id="c1",
        step="s",
        attempt_number=1,
        result=msgspec.Raw(msgspec.json.encode(value)) if raw else value,
    )
    decoder = msgspec.json.Decoder(wire.CallDone)
    in_clear, sealed = PayloadCodec(None).encode(msg), codec(KEY).encode(msg)
    assert PayloadCodec(None).decode(decoder, in_clear).result == value
    assert codec(KEY).decode(decoder, in_clear).result == value
    assert codec(KEY).decode(decoder, sealed).result == value


@pytest.mark.parametrize("blob", [b"$sealed:x:hello", b"$$sealed:x", b"$", b"plain"])
def test_a_blob_that_looks_sealed_reads_back_exactly(blob: bytes) -> None:
    assert PayloadCodec(None).open_bytes(PayloadCodec(None).seal_bytes(blob)) == blob
    assert codec(KEY).open_bytes(PayloadCodec(None).seal_bytes(blob)) == blob
    assert codec(KEY).open_bytes(codec(KEY).seal_bytes(blob)) == blob


def test_rotation_reads_old_values_and_writes_with_the_new_key() -> None:
    old = codec(KEY).encode(wire.StartMessage(playbook="p", payload={"v": 1}))
    rotated = codec(NEW, KEY)
    assert rotated.decode(msgspec.json.Decoder(wire.StartMessage), old).payload == {"v": 1}
    assert b"$sealed:k2:" in rotated.encode(wire.StartMessage(playbook="p", payload={"v": 1}))
    with pytest.raises(PayloadUnreadable, match="'k1', which is not among the keys given"):
        codec(NEW).decode(msgspec.json.Decoder(wire.StartMessage), old)
    with pytest.raises(PayloadKeyMissing, match="give the key"):
        PayloadCodec(None).decode(msgspec.json.Decoder(wire.StartMessage), old)
    clear = msgspec.json.encode(wire.StartMessage(playbook="p", payload={"v": 1}))  # written before any key
    assert rotated.decode(msgspec.json.Decoder(wire.StartMessage), clear).payload == {"v": 1}


def test_key_settings_parse_and_refuse_in_one_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# rotated 2026-11\n{NEW}\n\n{KEY}  # old\n")
    parsed = PayloadKeys.from_settings(None, str(keys), None)
    assert parsed is not None and parsed.current.key_id == "k2" and [k.key_id for k in parsed.old] == ["k1"]
    bare = PayloadKeys.from_settings(base64.b64encode(b"x" * 32).decode(), None, KEY)
    assert bare is not None and bare.current.key_id.startswith("k") and bare.old[0].key_id == "k1"
    assert "x" * 8 not in repr(bare)
    for bad, why in [("k1:notbase64!", "not base64"), ("k1:" + base64.b64encode(b"short").decode(), "16, 24 or 32")]:
        with pytest.raises(PayloadKeyInvalid, match=why):
            PayloadKeys.from_settings(bad, None, None)
    with pytest.raises(SettingsInvalid, match="ACTORS_PAYLOAD_KEY"):
        _ = Settings.from_env({"ACTORS_PAYLOAD_KEY": "nope!"}).payload_codec
    assert "ACTORS_PAYLOAD_KEY" not in repr(Settings(payload_key=KEY)) and KEY not in repr(Settings(payload_key=KEY))


def test_a_sealed_value_nested_past_any_sense_is_unreadable_not_a_recursion_error() -> None:
    """Its depth is measured on the decrypted text before decoding: a value sealed by a
    hostile writer holding the key cannot crash a reader with RecursionError."""
    from actors.wire.nesting import START_MESSAGE_DEPTH

    deep: Any = 1
    for _ in range(START_MESSAGE_DEPTH + 1):
        deep = [deep]
    sealed = codec(KEY).seal_value(deep)
    with pytest.raises(PayloadUnreadable, match="nests deeper"):
        codec(KEY).open_value(sealed)
    shallow = [[[1]]]
    assert codec(KEY).open_value(codec(KEY).seal_value(shallow)) == shallow
