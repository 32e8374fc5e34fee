"""Which changes of an output's state a restart keeps (jobs/evolution.py), and what a
start from a savepoint says it does to each output's state (jobs/restore.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kappaflow.jobs.evolution import MIGRATED, REFUSED, state_changes, verdict, widens
from kappaflow.jobs.restore import compare_plans, output_states
from kappaflow.streams.stateful_values import state_fields

pytestmark = pytest.mark.unit

WINDOW: dict[str, Any] = {
    "source": "orders",
    "kind": "windowed aggregate",
    "window_ms": 60_000,
    "by": ["country"],
    "aggregates": {"n": "Count(column=None)"},
}


def test_aggregates_added_and_removed_are_migrated_where_the_state_keeps_them_by_name() -> None:
    now = {**WINDOW, "aggregates": {"total": "Sum(column='amount', integral=False)"}}
    changes = state_changes(WINDOW, now, by_name=True)
    assert [(c.change, c.state) for c in changes] == [
        ("aggregate n removed", MIGRATED),
        ("aggregate total added (Sum(column='amount', integral=False))", MIGRATED),
    ]
    assert verdict(changes) == MIGRATED
    # State written before aggregates were kept by name cannot take a new one.
    older = state_changes(WINDOW, now, by_name=False)
    assert [c.state for c in older] == [MIGRATED, REFUSED]
    changed = {**WINDOW, "aggregates": {"n": "Count(column='x')"}}
    assert [c.state for c in state_changes(WINDOW, changed, by_name=True)] == [REFUSED]
    # The format marker is no change; the window's size is.
    marked = {**WINDOW, "state_format": 2}
    assert state_changes(marked, WINDOW, by_name=True) == []
    assert verdict(state_changes(WINDOW, {**WINDOW, "window_ms": 1}, by_name=True)) == REFUSED


@dataclass
class Before:
    seen: int = 0
    score: int = 0
    note: str = ""


@dataclass
class After:
    seen: int = 0
    score: float | None = None
    peak: float = 0.0


def test_state_fields_added_removed_and_widened_are_migrated_narrowed_refused() -> None:
    held = {"kind": "stateful function", "state": state_fields(Before)}
    now = {"kind": "stateful function", "state": state_fields(After)}
    assert now["state"] == {"seen": "int", "score": "float | None", "peak": "float"}
    changes = state_changes(held, now, by_name=False)
    assert [(c.change, c.state) for c in changes] == [
        ("state field note removed", MIGRATED),
        ("state field peak: float added", MIGRATED),
        ("state field score: int -> float | None", MIGRATED),
    ]
    back = state_changes(now, held, by_name=False)
    assert [(c.change, c.state) for c in back if c.state == REFUSED] == [
        ("state field score: float | None -> int", REFUSED)
    ]
    # A definition recorded before the fields were compares nothing.
    assert state_changes({"kind": "stateful function"}, now, by_name=False) == []
    assert widens("int", "float") and widens("str", "str | None")
    assert not widens("float", "int") and not widens("int | None", "int")


def test_a_reset_output_takes_its_changes_and_says_so() -> None:
    held = {"revenue": {**WINDOW, "state_format": 2}, "seen": {"kind": "records"}}
    states = {
        "revenue": {**WINDOW, "aggregates": {**WINDOW["aggregates"], "top": "Max(column='a')"}},
        "seen": {"kind": "stateful function"},
        "new": {"kind": "records"},
    }
    plan: dict[str, list[Any]] = {"outputs": [], "sources": []}
    changes = compare_plans(held, plan, states, plan)
    assert [(c.output, c.taken, c.state) for c in changes] == [
        ("new", True, None),
        ("revenue", True, MIGRATED),
        ("seen", False, REFUSED),
    ]
    reset = compare_plans(held, plan, states, plan, reset={"seen"})
    assert [(c.output, c.change, c.taken, c.state) for c in reset if c.output == "seen"] == [
        ("seen", "kind: 'records' -> 'stateful function'", True, "reset"),
        ("seen", "state reset", True, "reset"),
    ]
    assert output_states(held, states, reset) == {
        "new": "new",
        "revenue": "migrated",
        "seen": "reset",
    }
