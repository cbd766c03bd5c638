"""The corpus files themselves (tests/corpus/README.md): each parses, its header is
complete and says the state its scenario ends in, its log is the stream order of a
real execution that reached that state, its blobs are the bytes their keys name, and
the README's scenarios, the recorder's and the files agree (a scenario added without
its recording fails here). Replaying them is tests/integration/test_corpus.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.natsio.replay import held_start
from actors.store.blobs import check_digest
from actors.wire.codec import PayloadCodec, PayloadKeys, parse_key
from actors.wire.messages import StartRecord, input_decoder
from streams.layout import EXEC_STREAM, EXECUTION_ID, LOOP_STREAM
from streams.subjects import partition_of
from tests.corpus.load import FORMAT, HEADER_KEYS, HERE, TERMINAL, Corpus, corpus_files, load
from tests.corpus.record import SCENARIOS

pytestmark = [pytest.mark.timeout(30)]

FILES = corpus_files()
# the lifecycle event that ends an execution in each state (what the status projector reads)
FINAL_EVENT = {
    "COMPLETED": "lc.playbook.completed",
    "FAILED": "lc.playbook.failed",
    "CANCELLED": "lc.execution.cancelled",
}
# what would tie a file to the machine that recorded it
MACHINE_PATHS = (b"/tmp/", b"/work/", b"/home/", b"/root/", b"/Users/")


def readme_scenarios() -> list[str]:
    """The scenario names of the README's table (its rows start with a backquoted name)."""
    text = (HERE / "README.md").read_text()
    section = text.split("## Scenarios", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.MULTILINE)


@pytest.fixture(params=FILES, ids=[f.stem for f in FILES])
def corpus(request: pytest.FixtureRequest) -> Corpus:
    path: Path = request.param
    return load(path)


def test_the_readme_the_recorder_and_the_files_name_the_same_scenarios() -> None:
    listed = readme_scenarios()
    assert len(listed) == len(set(listed)), "a scenario listed twice in the README"
    assert set(listed) == set(SCENARIOS), "README table and record.SCENARIOS differ"
    assert {f.stem for f in FILES} == set(SCENARIOS), "record every scenario: python -m tests.corpus.record"


def test_the_header_is_complete_and_names_the_state_its_scenario_ends_in(corpus: Corpus) -> None:
    header = corpus.header
    assert [k for k in HEADER_KEYS if k not in header] == []
    assert header["corpus"] == FORMAT
    assert corpus.scenario == corpus.path.stem
    assert isinstance(header["release"], str) and header["release"]
    assert isinstance(header["semantics"], int) and header["semantics"] >= 1
    assert EXECUTION_ID.match(corpus.execution_id)
    assert corpus.state in TERMINAL
    scenario = SCENARIOS[corpus.scenario]
    assert corpus.state == scenario.expect
    assert corpus.payload_key == scenario.payload_key
    if corpus.payload_key is not None:
        parse_key(corpus.payload_key, where=corpus.scenario)  # PayloadKeyInvalid if not a key


def test_the_log_is_in_stream_order_and_ends_in_its_state(corpus: Corpus) -> None:
    assert {e.stream for e in corpus.entries} <= {EXEC_STREAM, LOOP_STREAM}
    for stream in (EXEC_STREAM, LOOP_STREAM):
        entries = corpus.stream(stream)
        seqs = [e.seq for e in entries]
        assert seqs == sorted(set(seqs)), f"{stream}: sequences not strictly increasing"
        times = [e.time_ns for e in entries]
        assert all(t > 0 for t in times) and times == sorted(times), f"{stream}: times out of order"
    partitions = int(corpus.header["partitions"])
    for e in corpus.entries:
        parts = e.subject.split(".")
        assert parts[0] == ("exec" if e.stream == EXEC_STREAM else "loop"), e.subject
        assert int(parts[1]) == partition_of(parts[2], partitions), e.subject
    log = corpus.execution_log()
    prefix = f"exec.{partition_of(corpus.execution_id, partitions)}.{corpus.execution_id}."
    # its start record, on its own subject or (semantics 6) stored with its first decision
    assert log and held_start(log[0].subject, log[0].data) is not None, "the log begins with its start"
    assert log[0].subject == prefix + "in.start" or int(corpus.header["semantics"]) >= 6
    # on its own subject, or (semantics 5) in the last step's answer record (`in.answer.lc.<type>`)
    final = FINAL_EVENT[corpus.state]
    assert sum(e.subject in (prefix + final, prefix + "in.answer." + final) for e in log) == 1
    assert all(e.headers.get("Nats-Msg-Id") for e in log if ".ev." in e.subject or ".lc." in e.subject)


def test_blobs_are_the_bytes_their_keys_name(corpus: Corpus) -> None:
    for (bucket, key), data in corpus.blobs.items():
        assert bucket in ("blobs", "payloads"), bucket
        check_digest(key, data)  # BlobCorrupt when the bytes are not the key's
    sizes = {(b["bucket"], b["key"]): b["size"] for b in corpus.header["blobs"]}
    assert sizes == {k: len(v) for k, v in corpus.blobs.items()}


def test_a_sealed_log_opens_with_its_key_and_only_that_log_is_sealed(corpus: Corpus) -> None:
    sealed = [e for e in corpus.entries if b"$sealed:" in e.data]
    if corpus.payload_key is None:
        assert sealed == []
        return
    assert sealed, "payload encryption on, yet nothing sealed"
    codec = PayloadCodec(PayloadKeys(parse_key(corpus.payload_key, where=corpus.scenario)))
    first = corpus.execution_log()[0]
    start = codec.decode(input_decoder, held_start(first.subject, first.data) or b"")
    assert isinstance(start, StartRecord) and start.payload["secret"] == "corpus-secret-7"


def test_nothing_ties_a_file_to_the_machine_that_recorded_it(corpus: Corpus) -> None:
    raw = corpus.path.read_bytes()
    blob = b"".join(e.data for e in corpus.entries)
    for where in (raw, blob):
        assert [p for p in MACHINE_PATHS if p in where] == []


def test_big_values_are_blobs_and_the_files_stay_small() -> None:
    """Big values travel as blobs, kept compressed: no file grows past what a review reads."""
    for path in FILES:
        assert path.stat().st_size < 64 * 1024, f"{path.name}: {path.stat().st_size} bytes"
    big = load(HERE / "big_value.jsonl")
    assert {bucket for bucket, _ in big.blobs} == {"blobs", "payloads"}
    large = load(HERE / "loop_large.jsonl")
    assert any("/collection/" in key for _, key in large.blobs)
