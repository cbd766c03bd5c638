"""A step's whole story (`actors-cli describe`, `Client.step_stories`) and tracebacks on
the YAML's lines, end to end: a playbook registered from `flow.yaml` runs a python step
that prints, a loop with one tolerated failure, and a step that fails twice (a retry);
`describe`, `result` and `run` name the failure's line in flow.yaml, and a step that
does not exist is a one-line error."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import System
from tests.support.cli import EXIT_INVALID, cli, one_line

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

# the line numbers below are this text's: `return 10 // x` is line 17, `return d[key]` 28
FLOW = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: describe_flow}
workflow:
  - step: start
    args: {n: 3}
    tool:
      kind: python
      code: |
        def main(n):
            print("hello", n)
            return {"n": n}
    next: each
  - step: each
    loop: {collection: "{{ [1, 0, 2] }}", element: x, tolerated_failures: 1}
    args: {x: "{{ x }}"}
    tool: {kind: python, code: "def main(x): return 10 // x"}
    next: fetch
  - step: fetch
    args: {key: missing}
    retry: {max_attempts: 2, initial_delay: 0.1}
    tool:
      kind: python
      code: |
        def main(key):
            d = {}

            return d[key]
"""
FETCH_LINE = 'File "flow.yaml", line 28'
LOOP_LINE = 'File "flow.yaml", line 17'


async def test_describe_result_and_run_show_the_failure_on_the_yaml_line(system: System) -> None:
    path = system.tmp / "flow.yaml"
    path.write_text(FLOW)
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path, execution_id="describe-1")
    status = await system.client.wait(eid, timeout=30)
    assert status.state == "FAILED"
    url = system.server.url

    # every step on a line: state, attempts (a loop's done/total), error type
    table = await cli("describe", eid, url=url)
    assert table.code == 0, table.err
    rows = {line.split()[0]: line.split() for line in table.out.splitlines()[1:]}
    assert rows["start"][1:3] == ["COMPLETED", "1"]
    assert rows["each"][1:3] == ["COMPLETED", "3/3"]
    assert rows["fetch"][1:3] == ["FAILED", "2"] and rows["fetch"][-1] == "KeyError"

    # one step: args as rendered, both attempts with their traceback on the YAML's line,
    # the retry between them, the rule that gave up
    one = await cli("describe", eid, "fetch", url=url)
    assert one.code == 0, one.err
    assert 'args       {"key":"missing"}' in one.out
    assert one.out.count(FETCH_LINE) == 2
    assert "KeyError: 'missing'  at flow.yaml:28" in one.out
    assert "    return d[key]" in one.out  # the source line, from the YAML
    assert re.search(r"retry\s+in 100ms by retry\[0\]", one.out)
    assert "exhausted after 2 attempts (max 2, retry[0])" in one.out
    assert re.search(r"started\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", one.out)  # UTC, with its zone

    full = await cli("describe", eid, "fetch", "--json", url=url)
    story = json.loads(full.out)
    assert [a["number"] for a in story["attempts"]] == [1, 2]
    assert all(FETCH_LINE in a["error"]["traceback"] for a in story["attempts"])
    assert story["attempts"][0]["retry"]["delay"] == 0.1 and story["attempts"][1]["retry"] is None
    assert story["attempts"][0]["worker"] and story["attempts"][0]["ended_at"] >= story["attempts"][0]["started_at"]

    # the client call the CLI and the UI print (a CLI process less per step)
    start = (await system.client.step_story(eid, "start")).to_dict()
    assert start["result"] == {"n": 3} and start["attempts"][0]["output"]["head"] == "hello 3\n"
    # a loop: the counter's counts and its first failure, on the YAML's line too
    loop = (await system.client.step_story(eid, "each")).to_dict()["loop"]
    assert (loop["total"], loop["done"], loop["failed"]) == (3, 3, 1)
    assert loop["errors"][0]["index"] == 1 and LOOP_LINE in loop["errors"][0]["error"]["traceback"]

    # `result`: the one-line error, then the root cause's traceback
    res = await cli("result", eid, url=url)
    assert res.code == 1
    assert res.out.startswith("error: KeyError: 'missing' (step 'fetch'")
    assert FETCH_LINE in res.out
    res_json = json.loads((await cli("result", eid, "--json", url=url)).out)
    assert FETCH_LINE in res_json["error"]["traceback"]

    missing = await cli("describe", eid, "nosuch", url=url)
    assert missing.code == EXIT_INVALID and not missing.out
    assert "no step 'nosuch'" in one_line(missing.err)

    # `run` of a failed execution: its traceback, no `ok end`, no partial `result:`
    ran = await cli("run", str(path), url=url)
    assert ran.code == 1, ran.err
    assert FETCH_LINE in ran.out
    assert not re.search(r"ok\s+end", ran.out) and re.search(r"ERR end\s", ran.out)
    assert "result:" not in ran.out
