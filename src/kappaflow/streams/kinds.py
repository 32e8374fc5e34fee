"""The operators' contract with the batch writer: the groups window operators are keyed by,
and the kinds of the rows every operator emits.

A window operator (streams/ops/windowing.py, streams/ops/session_windows.py) runs once per group:
(``window_start``, ``shard``) for fixed windows, ``shard`` for sessions. Every row it
emits has its output schema; its ``kind`` says what the row is, and the batch writer
(streams/output/writer.py) routes it by that kind: changes to the store and the changelog, late
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

#: A window's changes: its values while it may still change, once closed, and each
#: change after that from an event within the allowed lateness.
PROVISIONAL, FINAL, CORRECTION = "provisional", "final", "correction"
CHANGES = (PROVISIONAL, FINAL, CORRECTION)
#: A plain stream's or a stateful function's record; an event behind the watermark; a
#: record that did not parse; an output's statistics of the batch; windows closed.
RECORD, LATE, DEAD, STATS, CLOSED = "record", "late", "dlq", "stats", "closed"
#: An operator's rows packed into one Arrow blob (ops/arrow_ipc.py).
PACKED = "packed"
#: An event as it entered a stream join: the writer sends those behind the join's
#: watermark, which Spark's join drops, to the late topic.
BEHIND = "behind"
#: A replayed dead letter of the job read back from its source (its ``replay`` column
#: says which; ``reason`` is set when it failed again): the writer counts them.
REPLAY = "replay"
