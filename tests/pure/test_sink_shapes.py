"""The design documents' flat sink shape (`sink: {tool: postgres, table: t, mode: append,
auth: ...}`) means the nested one, with errors naming file, step and the field as the user
wrote it; the postgres table-write fields are checked at load; the test-only failpoints
parse their variable and stay off without it."""

from __future__ import annotations

import pytest

from actors.playbook.loader import PlaybookInvalid, load_playbook
from actors.tools import failpoints

pytestmark = pytest.mark.timeout(30)


def pb(sink: str) -> str:
    return f"""apiVersion: actors/v1
kind: Playbook
metadata: {{name: shapes}}
workflow:
  - step: fetch
    tool: noop
    sink: {sink}
"""


def errors(sink: str) -> str:
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook(pb(sink), file="p.yaml")
    return str(e.value)


def test_the_flat_sink_shape_means_the_nested_one() -> None:
    flat = load_playbook(
        pb("{tool: postgres, table: raw_data, mode: append, auth: {type: postgres, credential: main_db},"
           " args: {rows: '{{ result.items }}'}}")
    )  # fmt: skip
    nested = load_playbook(
        pb("{tool: {kind: postgres, table: raw_data, mode: append, auth: {type: postgres, credential: main_db}},"
           " args: {rows: '{{ result.items }}'}}")
    )  # fmt: skip
    assert flat.workflow[0].sink == nested.workflow[0].sink
    sink = flat.workflow[0].sink
    assert sink is not None and sink.args == {"rows": "{{ result.items }}"}
    # without args, and a bare kind with nothing beside it, as before
    assert load_playbook(pb("{tool: postgres, table: t}")).workflow[0].sink.args == {}  # type: ignore[union-attr]
    assert load_playbook(pb("{tool: noop}")).workflow[0].sink is not None


def test_mistakes_in_either_shape_name_file_step_and_field_as_written() -> None:
    assert "p.yaml:7: step 'fetch' field 'sink.tabel': unknown key 'tabel'; did you mean 'table'?" in errors(
        "{tool: postgres, tabel: raw_data}"
    )
    assert "field 'sink.tool': unknown tool kind 'postgre'" in errors("{tool: postgre, table: raw_data}")
    assert "field 'sink.mode': invalid value 'apend'" in errors("{tool: postgres, table: t, mode: apend}")
    assert "field 'sink': mode upsert needs `key`" in errors("{tool: postgres, table: t, mode: upsert}")
    assert "field 'sink.tool': mode upsert needs `key`" in errors("{tool: {kind: postgres, table: t, mode: upsert}}")
    assert "field 'sink.kind': a flat sink names its kind in `tool`" in errors("{tool: postgres, kind: http}")
    assert "`query` or `table`, not both" in errors("{tool: postgres, table: t, query: 'SELECT 1'}")
    assert "for a table write" in errors("{tool: postgres, query: 'SELECT 1', mode: replace}")
    assert "field 'sink.args.rows': undefined name 'reslt'" in errors(
        "{tool: postgres, table: t, args: {rows: '{{ reslt }}'}}"
    )


def test_failpoints_are_off_unless_armed_and_parse_strictly() -> None:
    assert failpoints.ARMED is False  # the tests' own process never arms them
    failpoints.reached("postgres.committed")  # off: nothing happens
    assert failpoints._parse("postgres.committed=kill@3, other=kill@1") == {"postgres.committed": 3, "other": 1}
    for bad in ("postgres.committed=kill", "x=kill@0", "x=boom@2"):
        with pytest.raises(ValueError):
            failpoints._parse(bad)
