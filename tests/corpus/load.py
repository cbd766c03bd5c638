"""Read a corpus file (tests/corpus/README.md) back: its header, every stored message
of the executions it recorded, in stream order, and the blobs their messages name.

Pure: no NATS, no engine. A replay takes `Corpus.entries` (or one execution's log,
`Corpus.execution_log`, and its loops', `Corpus.loop_logs`) and serves
`Corpus.blobs` where the engine would read the object store."""

from __future__ import annotations

import base64
import datetime
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FORMAT = 1  # the header's "corpus": the layout of the file itself, not the engine's semantics
# keys every header has (README, "Format")
HEADER_KEYS = ("corpus", "scenario", "release", "semantics", "execution_id", "state", "payload_key")
ENTRY_KEYS = ("stream", "seq", "subject", "headers", "data_b64")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


class CorpusInvalid(ValueError):
    """A corpus file that cannot be read: the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored message, as the stream holds it."""

    stream: str
    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes
    time_ns: int  # the stream's timestamp: the engine's clock for this input

    @property
    def time(self) -> float:
        """The log time in epoch seconds, computed as `actors.natsio.log_time` does from
        a delivered message (through a datetime: microsecond precision), so a replay
        folds with the very `at` the live engine had."""
        return datetime.datetime.fromtimestamp(self.time_ns / 1_000_000_000.0, datetime.UTC).timestamp()


@dataclass(frozen=True, slots=True)
class Corpus:
    path: Path
    header: dict[str, Any]
    entries: list[Entry]
    blobs: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (bucket, key) -> stored bytes

    @property
    def scenario(self) -> str:
        return str(self.header["scenario"])

    @property
    def execution_id(self) -> str:
        return str(self.header["execution_id"])

    @property
    def state(self) -> str:
        return str(self.header["state"])

    @property
    def semantics(self) -> int:
        return int(self.header["semantics"])

    @property
    def payload_key(self) -> str | None:
        """The payload key the values were sealed with (`parse_key` reads it), or None."""
        key = self.header["payload_key"]
        return None if key is None else str(key)

    def stream(self, name: str) -> list[Entry]:
        return [e for e in self.entries if e.stream == name]

    def executions(self) -> list[str]:
        """Every execution with a log in the file, in the order their logs begin."""
        seen: dict[str, None] = {}
        for e in self.entries:
            if e.subject.startswith("exec."):
                seen.setdefault(e.subject.split(".")[2], None)
        return list(seen)

    def execution_log(self, execution_id: str | None = None) -> list[Entry]:
        """One execution's log in stream EXEC (`exec.<p>.<id>.>`), in order; default:
        the scenario's execution."""
        eid = execution_id or self.execution_id
        return [e for e in self.entries if e.subject.startswith("exec.") and e.subject.split(".")[2] == eid]

    def loop_logs(self, execution_id: str | None = None) -> dict[str, list[Entry]]:
        """Each loop's log in stream LOOP (`loop.<p>.<id>.<loop_id>.>`), by loop id."""
        eid = execution_id or self.execution_id
        loops: dict[str, list[Entry]] = {}
        for e in self.entries:
            parts = e.subject.split(".")
            if parts[0] == "loop" and parts[2] == eid:
                loops.setdefault(parts[3], []).append(e)
        return loops


def _entry(obj: dict[str, Any], where: str) -> Entry:
    missing = [k for k in ENTRY_KEYS if k not in obj]
    if missing:
        raise CorpusInvalid(f"{where}: entry without {', '.join(missing)}")
    headers = obj["headers"] or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise CorpusInvalid(f"{where}: headers must map names to strings")
    return Entry(
        stream=str(obj["stream"]),
        seq=int(obj["seq"]),
        subject=str(obj["subject"]),
        headers=dict(headers),
        data=base64.b64decode(obj["data_b64"]),
        time_ns=int(obj.get("time_ns", 0)),
    )


def load(path: str | Path) -> Corpus:
    """The corpus in `path`. CorpusInvalid names the line of anything malformed."""
    p = Path(path)
    lines = [line for line in p.read_text().splitlines() if line.strip()]
    if not lines:
        raise CorpusInvalid(f"{p}: empty")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as e:
        raise CorpusInvalid(f"{p}:1: header is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("corpus") != FORMAT:
        raise CorpusInvalid(f"{p}:1: not a corpus header of format {FORMAT}")
    entries = []
    for n, line in enumerate(lines[1:], 2):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusInvalid(f"{p}:{n}: not JSON: {e}") from None
        entries.append(_entry(obj, f"{p}:{n}"))
    blobs = {
        (str(b["bucket"]), str(b["key"])): zlib.decompress(base64.b64decode(b["zlib_b64"]))
        for b in header.get("blobs", [])
    }
    return Corpus(p, header, entries, blobs)


def corpus_files(directory: Path = HERE) -> list[Path]:
    """Every corpus file in `directory`, by name."""
    return sorted(directory.glob("*.jsonl"))
