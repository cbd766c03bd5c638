"""The archive document (actors/store/archive.py): what goes in comes back byte for
byte, and a document that is not one is refused in one line naming where it is and
which line, never read into memory past its bound."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from actors.store import archive
from actors.store.archive import (
    ArchiveHeader,
    ArchiveInvalid,
    DirArchive,
    StoredMessage,
    decode_archive,
    encode_archive,
)
from streams.subjects import subject_matches

HEADER = ArchiveHeader(
    version=1, execution_id="e1", archived_at=1.5, status='{"execution_id":"e1","state":"COMPLETED"}'
)


def test_what_is_archived_comes_back_byte_for_byte() -> None:
    binary = bytes(range(256))
    messages = [
        StoredMessage.of("EXEC", "exec.0.e1.in.start", 1, 2.5, b'{"type":"start"}', {"Nats-Msg-Id": "x"}),
        StoredMessage.of("LOOP", "loop.0.e1.l.in.res.c", 7, 3.0, binary, None),
    ]
    doc = decode_archive(encode_archive(HEADER, messages, [("blobs", "e1/result/ab", binary)]), where="here")
    assert doc.execution_id == "e1" and doc.status() is not None and doc.status().state == "COMPLETED"  # type: ignore[union-attr]
    assert doc.stream("EXEC") == [("exec.0.e1.in.start", b'{"type":"start"}', 1, 2.5)]
    assert doc.stream("LOOP") == [("loop.0.e1.l.in.res.c", binary, 7, 3.0)]
    assert doc.messages[0].headers == {"Nats-Msg-Id": "x"}
    assert doc.object("blobs", "e1/result/ab") == binary and doc.object("payloads", "e1/result/ab") is None


def _gz(*lines: bytes) -> bytes:
    return gzip.compress(b"\n".join(lines) + b"\n", mtime=0)  # the same bytes in every test process


HEAD = b'{"kind":"archive","version":1,"execution_id":"e1","archived_at":1}'


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"plain text", "not a gzip-compressed archive"),
        (gzip.compress(b"", mtime=0)[:10], "not a gzip-compressed archive"),
        (_gz(b""), "empty, not an archive"),
        (_gz(b'{"kind":"message","stream":"EXEC","subject":"s","seq":1,"time":0}'), "line 1 is not an archive header"),
        (_gz(b'{"kind":"archive","version":9,"execution_id":"e1","archived_at":1}'), "archive version 9, newer"),
        (_gz(b'{"kind":"archive","version":1,"execution_id":"../etc","archived_at":1}'), "'../etc' is not one"),
        (_gz(HEAD, b"{not json"), "line 2:"),
        (
            _gz(HEAD, b'{"kind":"object","bucket":"blobs","key":"k","data_b64":"***"}'),
            "line 2: object 'k' is not base64",
        ),
        (_gz(HEAD, HEAD), "line 2: a second archive header"),
        (_gz(HEAD, b'{"kind":"message","stream":"EXEC"}'), "line 2:"),
    ],
)
def test_a_document_that_is_not_an_archive_is_refused_naming_where_and_the_line(data: bytes, says: str) -> None:
    with pytest.raises(ArchiveInvalid) as e:
        decode_archive(data, where="archive 'x'")
    assert str(e.value).startswith("archive 'x': ") and says in str(e.value) and "\n" not in str(e.value)


def test_a_document_past_its_bound_uncompressed_is_refused_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "MAX_ARCHIVE_BYTES", 10_000)
    bomb = gzip.compress(HEAD + b"\n" + b" " * 10_000_000 + b"\n")  # a few KB that unpack to 10 MB
    assert len(bomb) < 20_000
    with pytest.raises(ArchiveInvalid, match="over 10000 bytes uncompressed"):
        decode_archive(bomb, where="x")


def test_no_archive_file_is_named_by_something_that_is_not_an_execution_id(tmp_path: Path) -> None:
    store = DirArchive(tmp_path)
    assert store.path("e1").parent.parent == tmp_path
    for hostile in ("../e1", "a/b", "", ".", "x" * 200):
        with pytest.raises(ArchiveInvalid, match="is not one"):
            store.path(hostile)


@pytest.mark.parametrize(
    ("filter_", "subject", "matches"),
    [
        ("exec.1.e.>", "exec.1.e.in.start", True),
        ("exec.1.e.>", "exec.1.e", False),
        ("dlq.*.e", "dlq.engine.e", True),
        ("dlq.*.e", "dlq.engine.f", False),
        ("loop.1.e.*.in.res.>", "loop.1.e.l1.in.res.c1", True),
        ("loop.1.e.*.in.res.>", "loop.1.e.l1.in.spec", False),
        ("index.start.e", "index.start.e", True),
        ("index.start.e", "index.start.e.x", False),
    ],
)
def test_archived_messages_are_picked_by_subject_as_nats_picks_them(filter_: str, subject: str, matches: bool) -> None:
    assert subject_matches(filter_, subject) is matches


def test_a_line_past_its_bound_is_refused_before_it_is_decompressed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bomb with no newline: a line is read up to its bound, never more."""
    monkeypatch.setattr(archive, "MAX_LINE_BYTES", 1_000)
    bomb = gzip.compress(HEAD + b"\n" + b"x" * 50_000_000)
    with pytest.raises(ArchiveInvalid, match="a line over 1000 bytes"):
        decode_archive(bomb, where="x")
