"""`Effects` combines by its fields: a merge, a copy or a clear can never drop a field,
because none of them names one (actors/core/effects.py). Pure: no server."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from actors.core.effects import NAMES_DECISION, Effects

pytestmark = [pytest.mark.timeout(30)]

FIELDS = [f.name for f in dataclasses.fields(Effects)]
NAMING = [f.name for f in dataclasses.fields(Effects) if f.metadata.get("names_decision")]
LISTS = [f.name for f in dataclasses.fields(Effects) if f.default_factory is list]
SINGLE = [f.name for f in dataclasses.fields(Effects) if f.name not in NAMING and f.name not in LISTS]


def every_field_set(tag: str, cause: int) -> Effects:
    """Effects with every field set to something of its own (its name and `tag`): a
    field added later is set here too, without editing this test. The values are
    stand-ins: combining never looks inside them."""
    values: dict[str, Any] = {}
    for name in FIELDS:
        if name in NAMING:
            values[name] = cause if name == "cause" else float(cause)
        elif name in LISTS:
            values[name] = [f"{name}-{tag}"]
        else:
            values[name] = f"{name}-{tag}"
    return Effects(**values)


def test_every_field_is_naming_a_list_or_a_single_ask() -> None:
    assert NAMING == ["cause", "at"]
    assert set(NAMING) | set(LISTS) | set(SINGLE) == set(FIELDS)
    assert all(dataclasses.fields(Effects)[FIELDS.index(n)].default is None for n in SINGLE)
    assert "reply" in SINGLE and "verdict" in SINGLE and "commands" in LISTS


def test_a_merge_of_two_effects_with_every_field_set_keeps_every_ask_of_both() -> None:
    a, b = every_field_set("a", 7), every_field_set("b", 9)
    a.merge(b)
    for name in LISTS:
        assert getattr(a, name) == [f"{name}-a", f"{name}-b"], name
    for name in SINGLE:
        assert getattr(a, name) == f"{name}-b", name  # the later decision's
    assert (a.cause, a.at) == (7, 7.0)  # a batch keeps the cause it had
    assert b == every_field_set("b", 9)  # the merged one is left as it was


def test_a_merge_into_an_empty_batch_takes_the_inputs_cause_and_an_unset_ask_keeps_the_earlier() -> None:
    into = Effects()
    into.merge(every_field_set("a", 7))
    assert into == every_field_set("a", 7)
    into.merge(Effects(cause=9, at=9.0))
    assert into == every_field_set("a", 7)  # nothing asked: nothing replaced, nothing added


def test_each_ask_alone_makes_effects_non_empty_and_what_names_the_decision_does_not() -> None:
    full = every_field_set("a", 7)
    assert not Effects()
    assert not Effects(cause=7, at=7.0)
    for name in LISTS + SINGLE:
        assert Effects(**{name: getattr(full, name)}), name


def test_a_copy_has_every_field_and_lists_of_its_own_and_changes_replace_fields() -> None:
    full = every_field_set("a", 7)
    copied = full.copy()
    assert copied == full
    for name in LISTS:
        getattr(copied, name).append("more")
    assert full == every_field_set("a", 7)
    changed = full.copy(commands=[], reply=None, cause=8)
    assert (changed.commands, changed.reply, changed.cause) == ([], None, 8)
    assert changed.events == full.events and changed.verdict == full.verdict
    with pytest.raises(TypeError):
        full.copy(command=[])  # a misspelt field is refused, not ignored


def test_clear_puts_every_field_back_to_its_default() -> None:
    full = every_field_set("a", 7)
    full.clear()
    assert full == Effects()


def test_a_field_that_combines_in_no_known_way_is_refused_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new field of another kind (a dict, a number) meets: merge could not
    know what to do with it, so the class says so when its module is imported."""
    from actors.core import effects

    @dataclasses.dataclass(slots=True)
    class Wider:
        cause: int = dataclasses.field(default=0, metadata=NAMES_DECISION)
        commands: list[str] = dataclasses.field(default_factory=list)
        counts: dict[str, int] = dataclasses.field(default_factory=dict)

    monkeypatch.setattr(effects, "Effects", Wider)
    with pytest.raises(TypeError, match=r"Effects\.counts"):
        effects._kinds()
