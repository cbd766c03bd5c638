"""README's CLI samples are what the commands really print: each block marked
`<!-- sample: NAME -->` is a `$ actors-cli ...` line and its output; this runs every
command against a real system and compares, ids, times, durations and worker names
aside (and runs of spaces, which follow their widths). `ID` in a command is the
execution the `run-failed` sample started.

After a change to what a command prints: `README_SAMPLES_WRITE=1 pytest
tests/system/test_readme_samples.py` writes the outputs into README.md (then read the
diff)."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests.conftest import System
from tests.support.cli import ROOT, cli

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

README = ROOT / "README.md"
SAMPLE = re.compile(r"<!-- sample: (?P<name>[\w-]+) -->\n```text\n(?P<body>.*?)```\n", re.DOTALL)
# the order they run in: `run-failed` makes the execution the others read
ORDER = ("run-help", "run-failed", "status", "describe")
WIDTH = {"COLUMNS": "100"}  # --help wraps to the terminal: the README's width

_NORMAL = (
    (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)"), "<time>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s)\b|\b\d+m\d\ds\b"), "<duration>"),
    (re.compile(r"(worker\s+)\S+"), r"\1<worker>"),
    (re.compile(r"[ \t]+"), " "),
)


def normal(text: str) -> str:
    for pattern, replacement in _NORMAL:
        text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def samples(text: str) -> dict[str, tuple[str, str]]:
    """name -> (command line without `$ `, the output shown under it)."""
    found = {}
    for m in SAMPLE.finditer(text):
        first, _, rest = m["body"].partition("\n")
        assert first.startswith("$ actors-cli "), f"sample {m['name']}: starts with {first!r}"
        found[m["name"]] = (first[2:], rest)
    return found


async def test_the_readme_shows_what_the_cli_prints(system: System) -> None:
    text = README.read_text()
    shown = samples(text)
    assert set(ORDER) - {"describe"} <= set(shown), f"README lacks samples: {set(ORDER) - set(shown)}"
    execution_id = None
    printed: dict[str, str] = {}
    for name in [n for n in ORDER if n in shown]:
        command, _ = shown[name]
        args = [execution_id if a == "ID" else a for a in shlex.split(command)[1:]]
        assert None not in args, f"sample {name} names ID before run-failed ran"
        code, out, err, _ = await cli(*[str(a) for a in args], url=system.server.url, env=WIDTH)
        printed[name] = out + err
        if name == "run-failed":
            assert code == 1, err
            found = re.search(r"execution ([0-9a-f]{32})", out)
            assert found, out
            execution_id = found[1]
    if os.environ.get("README_SAMPLES_WRITE"):
        text = README.read_text()  # again: others may have edited it meanwhile
        for name, out in printed.items():
            command, old = samples(text)[name]
            text = text.replace(f"$ {command}\n{old}```", f"$ {command}\n{out.rstrip()}\n```", 1)
        README.write_text(text)
        return
    for name, out in printed.items():
        assert normal(shown[name][1]) == normal(out), f"README's {name} sample is not what `{shown[name][0]}` prints"
