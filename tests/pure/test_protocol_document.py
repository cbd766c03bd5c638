"""The protocol document (docs/protocol/) is the truth and stays so: its schemas are
the ones generated from the Structs that encode the messages (a Struct changed without
`python -m actors.wire.protocol --write` fails here), every `$ref` of asyncapi.yaml
resolves, and every public message has a schema and a message in the document."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from jsonschema import Draft202012Validator

from actors.wire import protocol
from actors.wire.codec import PayloadCodec, PayloadKeys, parse_key
from actors.wire.messages import ExecutionStatus, RequestError, ResultReply, StartMessage, StartReply

pytestmark = pytest.mark.timeout(60)

DOC = yaml.safe_load(protocol.ASYNCAPI.read_text())


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def pointer(doc: Any, fragment: str) -> Any:
    """The node a JSON pointer (`/a/b`) names in `doc`; KeyError when none."""
    node = doc
    for part in filter(None, fragment.split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((protocol.SCHEMA_DIR / f"{name}.json").read_text()))


def test_the_committed_schemas_are_the_generated_ones() -> None:
    assert protocol.differing() == [], "run: python -m actors.wire.protocol --write"


def test_check_names_a_schema_that_differs(tmp_path: Path) -> None:
    assert protocol.write(tmp_path) == sorted(f"{m.name}.json" for m in protocol.MESSAGES)
    assert protocol.differing(tmp_path) == []
    (tmp_path / "StartReply.json").write_text("{}")
    (tmp_path / "Gone.json").write_text("{}")
    assert protocol.differing(tmp_path) == ["Gone.json", "StartReply.json"]


def test_every_schema_is_a_valid_draft_2020_12_schema() -> None:
    for m in protocol.MESSAGES:
        schema = json.loads((protocol.SCHEMA_DIR / f"{m.name}.json").read_text())
        assert schema["$schema"] == protocol.SCHEMA_DIALECT
        Draft202012Validator.check_schema(schema)


def test_every_ref_in_the_document_resolves() -> None:
    found = list(refs(DOC))
    assert found
    for ref in found:
        where, _, fragment = ref.partition("#")
        target: Any = DOC
        if where:
            path = protocol.ASYNCAPI.parent / where
            assert path.is_file(), f"{ref}: no file {path}"
            target = json.loads(path.read_text())
        try:
            pointer(target, fragment)
        except (KeyError, IndexError, ValueError):
            pytest.fail(f"{ref}: {fragment} is not in {where or 'asyncapi.yaml'}")


def test_every_public_message_has_a_schema_and_a_message_in_the_document() -> None:
    messages = DOC["components"]["messages"]
    for m in protocol.MESSAGES:
        assert (protocol.SCHEMA_DIR / f"{m.name}.json").is_file(), m.name
        assert m.name in messages, f"{m.name}: no message in asyncapi.yaml"
        assert messages[m.name]["payload"]["schema"]["$ref"] == f"./schemas/{m.name}.json"
    assert set(messages) == {m.name for m in protocol.MESSAGES}
    # and each message but the errors (parts of replies and events) is on a channel
    on_channels = {ref.rsplit("/", 1)[1] for c in DOC["channels"].values() for ref in refs(c.get("messages", {}))}
    assert {m.name for m in protocol.MESSAGES} - on_channels == {"ErrorInfo", "RequestError"}


def test_every_operation_names_a_channel_of_the_document() -> None:
    for name, op in DOC["operations"].items():
        channel = op["channel"]["$ref"].removeprefix("#/channels/")
        assert channel in DOC["channels"], name
        for ref in refs(op.get("messages", [])):
            assert ref.startswith(f"#/channels/{channel}/messages/"), f"{name}: {ref} is not its channel's"


def test_every_channel_parameter_is_declared() -> None:
    for name, channel in DOC["channels"].items():
        address = channel["address"]
        tokens = {t[1:-1] for t in (address or "").split(".") if t.startswith("{")}
        assert tokens == set(channel.get("parameters", {})), name


def test_replies_require_every_field_and_omitted_defaults_are_optional() -> None:
    """A reply writes every field, so a client may rely on each; a field a Struct with
    `omit_defaults` leaves out at its default must not be required."""
    assert validator("StartReply").is_valid(json.loads(msgspec.json.encode(StartReply("a", True))))
    assert not validator("StartReply").is_valid({"execution_id": "a", "started": True})
    running = ExecutionStatus(execution_id="a", state="RUNNING")  # type: ignore[arg-type]
    encoded = json.loads(msgspec.json.encode(running))
    assert encoded == {"execution_id": "a", "state": "RUNNING"} and validator("ExecutionStatus").is_valid(encoded)
    assert validator("ErrorInfo").is_valid({"type": "X", "message": "m"})  # `retryable` absent: false
    assert not validator("RequestError").is_valid({"type": "X", "message": "m"})  # a reply's: always written


def test_requests_refuse_unknown_fields_as_the_engine_does() -> None:
    assert not validator("StartMessage").is_valid({"playbook": "p", "surprise": 1})
    assert not validator("ResultRequest").is_valid({"execution_id": "a", "wait": 1})
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"playbook": "p", "surprise": 1}', type=StartMessage)


def test_sealed_values_fit_the_schemas() -> None:
    key = parse_key("t1:" + "A" * 43, where="test")
    codec = PayloadCodec(PayloadKeys(key))
    reply = ResultReply(
        execution_id="a",
        status=ExecutionStatus(
            execution_id="a",
            state="FAILED",  # type: ignore[arg-type]
            error={"type": "ValueError", "message": "no", "step": "s"},
        ),
        result={"deep": [1, 2]},
        error=RequestError(type="T", message="m"),
    )
    sealed = json.loads(codec.encode(reply))
    assert sealed["result"] == {"$sealed": sealed["result"]["$sealed"]}
    # a reply's error type stays clear (a client without the key tells refusals apart); its message is sealed
    assert sealed["error"]["type"] == "T" and sealed["error"]["message"].startswith("$sealed:t1:")
    assert sealed["status"]["error"]["type"].startswith("$sealed:t1:") and sealed["status"]["error"]["step"] == "s"
    assert validator("ResultReply").is_valid(sealed)
    start = json.loads(codec.encode(StartMessage(playbook="p", payload={"x": 1})))
    assert validator("StartMessage").is_valid(start) and start["payload"]["$sealed"].startswith("$sealed:t1:")


def test_fields_holding_users_values_are_marked_sealed() -> None:
    schema = json.loads((protocol.SCHEMA_DIR / "ResultReply.json").read_text())
    defs = schema["$defs"]
    assert defs["ResultReply"]["properties"]["result"]["x-sealed"] == "value"
    assert defs["ExecutionStatus"]["properties"]["error"]["x-sealed"] == "error"
    assert "x-sealed" not in defs["ExecutionStatus"]["properties"]["state"]


def test_the_sealed_form_as_the_document_words_it_opens_and_makes_the_codecs_tokens() -> None:
    """An implementation written from asyncapi.yaml's "Sealed values" alone (standard
    primitives, none of actors/wire/codec.py) reads what the codec writes and writes
    the same bytes, so the description is exact enough to implement."""
    secret = bytes(range(32))
    text = base64.urlsafe_b64encode(secret).decode().rstrip("=")  # URL-safe, unpadded, no id
    key_id = "k" + hmac.new(secret, b"actors payload key id", hashlib.sha256).hexdigest()[:8]
    codec = PayloadCodec(PayloadKeys(parse_key(text, where="test")))

    def subkey(info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=len(secret), salt=None, info=info).derive(secret)

    k, n, aad = (
        subkey(b"actors payload encryption"),
        subkey(b"actors payload nonce"),
        b"actors payload v1 " + key_id.encode(),
    )

    def seal(v: Any) -> Any:
        plain = msgspec.json.encode(v)
        nonce = hmac.new(n, plain, hashlib.sha256).digest()[:12]
        token = f"$sealed:{key_id}:" + base64.urlsafe_b64encode(
            nonce + AESGCM(k).encrypt(nonce, plain, aad)
        ).decode().rstrip("=")
        return {"$sealed": token} if isinstance(v, dict) else [{"$sealed": token}] if isinstance(v, list) else token

    def open_(v: Any) -> Any:
        token = v if isinstance(v, str) else v["$sealed"] if isinstance(v, dict) else v[0]["$sealed"]
        _, kid, body = token.split(":", 2)
        assert kid == key_id
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        return json.loads(AESGCM(k).decrypt(raw[:12], raw[12:], aad))

    for value in ({"a": [1, "x"]}, [1, 2], "text", 7, True):
        written = json.loads(codec.encode(StartMessage(playbook="p", payload={"v": value})))["payload"]
        assert open_(written) == {"v": value}
        assert seal({"v": value}) == written  # same bytes: the nonce is derived, not random
        reply = json.loads(codec.encode(ResultReply(execution_id="a", result=value)))["result"]
        assert reply == seal(value) and open_(reply) == value
    blob = codec.seal_bytes(b'{"big": 1}')
    prefix = f"$sealed:{key_id}:".encode()
    assert blob.startswith(prefix)
    raw = blob[len(prefix) :]  # raw bytes, not base64
    assert AESGCM(k).decrypt(raw[:12], raw[12:], aad) == b'{"big": 1}'


def test_clear_values_that_look_sealed_are_escaped_as_the_document_says() -> None:
    clear = PayloadCodec(None)
    written = json.loads(clear.encode(ResultReply(execution_id="a", result="$sealed:x:y")))
    assert written["result"] == "$$sealed:x:y"
    assert json.loads(clear.encode(ResultReply(execution_id="a", result={"$sealed": "$$sealed:z"})))["result"] == {
        "$sealed": "$$$sealed:z"
    }
    assert clear.seal_bytes(b"$sealed:abc") == b"$$sealed:abc"
