"""The window operators' contract: the groups they are keyed by and their rows' kinds.

A window operator (streams/windowing.py, streams/session_windows.py) runs once per group:
(``window_start``, ``shard``) for fixed windows, ``shard`` for sessions. Every row it
emits has its output schema; its ``kind`` says what the row is, and the batch writer
(streams/writer.py) routes it by that kind: changes to the store and the changelog, late
events and dead letters to their topics, ``stats`` and ``closed`` to the output's
bookkeeping.

``window_start`` is an epoch millisecond, except for two sentinels, defined here and
nowhere else:

- ``DEAD_WINDOW`` is the group of the records that did not parse: they travel through
  the operator in a group of their own and come out as dead letters;
- ``SESSIONS_WINDOW`` is the ``window_start`` of a session operator's ``stats`` and
  ``closed`` rows: sessions have no window shared by keys, so the store counts the
  sessions held under this one entry.
"""

from __future__ import annotations

#: Keys are spread over this many groups (state values, and parallel tasks) by hash.
SHARDS = 16
#: The group of the records that did not parse: they pass as dead letters.
DEAD_WINDOW = -1
#: The ``window_start`` under which a session job counts the sessions it holds.
SESSIONS_WINDOW = -2

PROVISIONAL, FINAL, CORRECTION = "provisional", "final", "correction"
LATE, DEAD, STATS, CLOSED = "late", "dlq", "stats", "closed"
