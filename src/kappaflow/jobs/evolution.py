"""State that evolves: which of an output's state definition changes a restart keeps, as
Flink's state schema evolution does, and what each does to the state.

An output's state is ``kept`` when what it holds has not changed, ``migrated`` when it
changed in a way the state can take, ``reset`` when the start was told to begin it afresh
(``jobs start --reset-state OUTPUT``), and ``refused`` otherwise. Migrated:

- an aggregate added to a window output: the engine's window state keeps each aggregate
  under its name (io.kappaflow.engine.Aggregates), so a key's state read under the new
  list has the new aggregate empty from the first batch after the restart; the window's
  values say so under ``_partial_since``. Only state the engine's Java operator wrote in
  that layout (``STATE_FORMAT``) can take it;
- an aggregate removed: its values are dropped;
- a field added to a stateful function's state dataclass (every field has a default:
  the state starts from it), or removed (its value is dropped): the state is kept as JSON
  by field name (streams/stateful_values.py);
- a field's numeric type widened (``int`` to ``float``, a type to the same or ``None``).

Anything else that changes what an output's state holds is refused (KF622 from a
savepoint, KF735 on a restart), naming the change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: A window output's state keeps its aggregates by name (plan.json ``state_format``).
STATE_FORMAT = 2
#: The signature's key for it, which is not itself a change.
FORMAT_KEY = "state_format"

KEPT, MIGRATED, RESET, REFUSED = "kept", "migrated", "reset", "refused"

#: Number types one may widen to: from the key to any of its values.
_WIDER = {"int": {"float"}, "bool": {"int", "float"}}


@dataclass(frozen=True)
class StateChange:
    """One change of an output's state definition: what the state does with it."""

    change: str
    state: str
    why: str


def state_changes(
    held: Mapping[str, Any], now: Mapping[str, Any], *, by_name: bool
) -> list[StateChange]:
    """The changes from ``held`` (an output's state definition as recorded, jobs/plan.py
    ``signature``) to ``now``. ``by_name``: its window state keeps aggregates by name."""
    found: list[StateChange] = []
    for key in sorted(k for k in held.keys() | now.keys() if k != FORMAT_KEY):
        before, after = held.get(key), now.get(key)
        if before == after:
            continue
        if key == "aggregates" and isinstance(before, dict) and isinstance(after, dict):
            found += _aggregates(before, after, by_name=by_name)
        elif key == "state" and before is None:
            continue  # recorded before the fields were: nothing to compare with
        elif key == "state" and isinstance(before, dict) and isinstance(after, dict):
            found += _fields(before, after)
        else:
            found.append(
                StateChange(
                    f"{key}: {before!r} -> {after!r}",
                    REFUSED,
                    "it changes what the output's state holds",
                )
            )
    return found


def verdict(changes: Iterable[StateChange]) -> str:
    """An output's state as a whole: refused, migrated or kept."""
    states = {c.state for c in changes}
    return REFUSED if REFUSED in states else MIGRATED if states else KEPT


def _aggregates(
    held: Mapping[str, str], now: Mapping[str, str], *, by_name: bool
) -> list[StateChange]:
    found = []
    for name in sorted(held.keys() - now.keys()):
        found.append(StateChange(f"aggregate {name} removed", MIGRATED, "its values are dropped"))
    for name in sorted(now.keys() - held.keys()):
        change = f"aggregate {name} added ({now[name]})"
        if by_name:
            why = (
                "it counts the events from the restart on: the windows then open say so under "
                "_partial_since"
            )
            found.append(StateChange(change, MIGRATED, why))
        else:
            why = (
                "this state was written before kappaflow kept aggregates by name (or by the "
                "Python window operator); --reset-state starts it afresh"
            )
            found.append(StateChange(change, REFUSED, why))
    for name in sorted(held.keys() & now.keys()):
        if held[name] != now[name]:
            change = f"aggregate {name}: {held[name]} -> {now[name]}"
            found.append(StateChange(change, REFUSED, "its values hold another aggregate"))
    return found


def _fields(held: Mapping[str, str], now: Mapping[str, str]) -> list[StateChange]:
    found = []
    for name in sorted(held.keys() - now.keys()):
        found.append(StateChange(f"state field {name} removed", MIGRATED, "its value is dropped"))
    for name in sorted(now.keys() - held.keys()):
        change = f"state field {name}: {now[name]} added"
        found.append(StateChange(change, MIGRATED, "each key's state starts it at its default"))
    for name in sorted(held.keys() & now.keys()):
        if held[name] == now[name]:
            continue
        change = f"state field {name}: {held[name]} -> {now[name]}"
        if widens(held[name], now[name]):
            found.append(StateChange(change, MIGRATED, "a wider type reads the values held"))
        else:
            why = "the values held may not fit the new type (a narrowed or other type)"
            found.append(StateChange(change, REFUSED, why))
    return found


def widens(before: str, after: str) -> bool:
    """Whether every value of type ``before`` is one of type ``after`` (types as
    stateful_values.py ``type_text`` writes them): ``int`` to ``float``, ``T`` to
    ``T | None``."""
    held, now = _union(before), _union(after)
    return all(t in now or _WIDER.get(t, set()) & now for t in held)


def _union(text: str) -> set[str]:
    return {part.strip() for part in text.split("|")}
