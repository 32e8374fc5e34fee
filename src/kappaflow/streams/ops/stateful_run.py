"""Running stateful functions (stateful.py) per key, over Spark's ``transformWithState``.

``KeyedProcessor`` is the StatefulProcessor: per key it keeps one value state, ``state``
(STATE_SCHEMA): the user's state as JSON, when the key expires (its TTL, in event time)
and the user's pending timers, each also registered with Spark as an event-time timer.
The TTL is a timer as well, rather than Spark's TTL, which counts processing time and
would make a replay forget keys at other points. Timers are only registered after the
watermark (TwsTester refuses others): one set at or behind it fires in the same call.

Events come in as rows holding the JSON of the record's fields (stateful_values.py),
their event time and source position, and leave as OUTPUT_SCHEMA rows: ``record`` rows
whose ``row`` is the JSON of an output object, and ``late`` rows with the late event's
exact offset, for the batch writer to read back and publish to the job's late topic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.errors import StatefulOutputError, StateRestoreError, TimerLoopError
from kappaflow.streams import kinds
from kappaflow.streams.stateful import StateContext, StatefulFunction, Timers
from kappaflow.streams.stateful_values import dumps, from_plain, resolve_hints, to_plain
from kappaflow.timeutil import from_epoch_ms, iso

STATE_SCHEMA = "state STRING, expires BIGINT, timers ARRAY<BIGINT>"
OUTPUT_COLUMNS = (
    "kind",
    "key",
    "row",
    "reason",
    "watermark",
    "time",
    "src_partition",
    "src_offset",
    "offsets",
    "events",
)
OUTPUT_SCHEMA = (
    "kind STRING, key STRING, row STRING, reason STRING, watermark BIGINT, time BIGINT, "
    "src_partition INT, src_offset BIGINT, offsets ARRAY<BIGINT>, events BIGINT"
)
# No leading underscore: Spark hands the processor such columns renamed.
RECORD, TIME, PARTITION, OFFSET = "kf_record", "kf_time", "kf_partition", "kf_offset"
_Output = Row(*OUTPUT_COLUMNS)
#: Timers due at once that one call may fire before it calls it a loop.
MAX_DUE = 1_000


class KeyedProcessor(StatefulProcessor):
    """A stateful function per key; see the module's docstring."""

    def __init__(self, function: StatefulFunction[Any], record: type, lateness_ms: int) -> None:
        self.function = function
        self.record = record
        self.lateness_ms = lateness_ms
        self.hints = resolve_hints(record, function.state, function.output)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.value = handle.getValueState("state", STATE_SCHEMA)

    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[Row], timerValues: TimerValues
    ) -> Iterator[Row]:
        watermark = timerValues.getCurrentWatermarkInMs()
        ordered = sorted(
            ((r[RECORD], r[TIME], r[PARTITION], r[OFFSET]) for r in rows),
            key=lambda r: (r[1], r[2], r[3]),
        )
        run = _Run(self, _key(key), watermark)
        events: list[Any] = []
        late: list[Any] = []
        for text, time, partition, offset in ordered:
            is_late = watermark > 0 and time + self.lateness_ms <= watermark
            if is_late and self.function.late == "topic":
                run.late_row(int(time), int(partition), int(offset))
                continue
            event = from_plain(self.record, json.loads(text), self.record.__name__, self.hints)
            events.append(event)
            if is_late:
                late.append(event)
            run.saw(int(time), int(partition), int(offset))
        if events:
            run.stats_row(len(events))
            ctx = run.context(late)
            run.emit(self.function(run.key, events, ctx), run.newest)
            run.fire_due(ctx)
            run.save(ctx)
        yield from run.rows()

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        at = expiredTimerInfo.getExpiryTimeInMs()
        run = _Run(self, _key(key), timerValues.getCurrentWatermarkInMs())
        if not run.stored:
            return
        run.registered.discard(at)  # Spark forgets a timer once it fired
        ctx = run.context([])
        if at in ctx.timers.list():
            ctx.timers.cancel(at)
            run.call_timer(ctx, at)
        run.fire_due(ctx)
        run.save(ctx)
        yield from run.rows()

    def close(self) -> None:
        pass


class _Run:
    """One call of the processor for one key: its stored state, and what it emits."""

    def __init__(self, processor: KeyedProcessor, key: tuple[Any, ...], watermark: int) -> None:
        self.p = processor
        self.key = key
        self.key_json = dumps(to_plain(list(key), "key"))
        self.watermark = watermark
        self.out: list[Row] = []
        self.newest: tuple[int, int | None, int | None] = (-(2**63), None, None)
        stored = processor.value.get()
        self.stored = stored is not None
        fn = processor.function
        if stored is None:
            self.state: Any = fn.state()
            self.expires: int | None = None
            self.pending: list[int] = []
        else:
            text, self.expires, timers = stored
            self.pending = [int(t) for t in timers or ()]
            try:
                text_value = json.loads(text)
                self.state = from_plain(fn.state, text_value, fn.state.__name__, processor.hints)
            except (TypeError, ValueError) as exc:
                raise StateRestoreError(
                    f"{fn.name}: the stored state of key {self.key_json} does not fit "
                    f"{fn.state.__name__}: {exc}"
                ) from None
        self.registered = set(self.pending) | ({self.expires} if self.expires else set())

    def context(self, late: Sequence[Any]) -> StateContext[Any]:
        return StateContext(self.key, self.state, Timers(self.pending), self.watermark, late)

    def saw(self, time: int, partition: int, offset: int) -> None:
        self.newest = (time, partition, offset) if time >= self.newest[0] else self.newest
        ttl = self.p.function.ttl_ms
        if ttl is not None:
            self.expires = max(self.expires or 0, time + ttl)

    def late_row(self, time: int, partition: int, offset: int) -> None:
        lateness = self.p.lateness_ms
        reason = (
            f"late: event time {iso(from_epoch_ms(time))} of key {self.key_json} is at or "
            f"behind the watermark {iso(from_epoch_ms(self.watermark))}"
            + (f" less the allowed lateness {lateness} ms" if lateness else "")
            + f" ({self.p.function.name})"
        )
        self._row(kinds.LATE, None, reason, time, partition, offset, [offset])

    def emit(self, produced: Iterable[Any], at: tuple[int, int | None, int | None]) -> None:
        fn = self.p.function
        for item in produced or ():
            if not isinstance(item, fn.output):
                raise StatefulOutputError(
                    f"{fn.name} yielded a {type(item).__name__}, not a {fn.output.__name__}"
                )
            try:
                row = dumps(to_plain(item, fn.output.__name__))
            except (TypeError, ValueError) as exc:
                raise StatefulOutputError(f"{fn.name}: {exc}") from None
            self._row(kinds.RECORD, row, None, *at, None)

    def call_timer(self, ctx: StateContext[Any], at: int) -> None:
        if self.p.function.timer is not None:
            self.emit(self.p.function.timer(self.key, at, ctx), (at, None, None))

    def fire_due(self, ctx: StateContext[Any]) -> None:
        """Fire, soonest first, the timers set at or behind the watermark."""
        for _ in range(MAX_DUE):
            due = [t for t in ctx.timers.list() if t <= self.watermark]
            if not due:
                return
            ctx.timers.cancel(due[0])
            self.call_timer(ctx, due[0])
        raise TimerLoopError(
            f"{self.p.function.name}: key {self.key_json} set {MAX_DUE} timers at or behind "
            f"the watermark {self.watermark} in one call; set timers after the time handled"
        )

    def save(self, ctx: StateContext[Any]) -> None:
        """Store the state and timers, or forget the key: its TTL ran out, or it holds only
        a new key's state and no timer."""
        fn = self.p.function
        pending = ctx.timers.list()
        expired = self.expires is not None and self.expires <= self.watermark
        if expired or (not pending and ctx.state == fn.state()):
            self.p.value.clear()
            wanted: set[int] = set()
        else:
            try:
                text = dumps(to_plain(ctx.state, fn.state.__name__, state=True))
            except (TypeError, ValueError) as exc:
                raise StateRestoreError(f"{fn.name}: cannot store the state: {exc}") from None
            self.p.value.update((text, self.expires, pending))
            wanted = set(pending) | ({self.expires} if self.expires else set())
        for t in sorted(self.registered - wanted):
            self.p.handle.deleteTimer(t)
        for t in sorted(wanted - self.registered):
            self.p.handle.registerTimer(t)

    def stats_row(self, events: int) -> None:
        """How many events reached the function in this call (the output's accounting)."""
        self._row("stats", None, None, None, None, None, None, events)

    def _row(self, kind: str, row: str | None, reason: str | None, *rest: Any) -> None:
        time, partition, offset, offsets, *events = rest
        self.out.append(
            _Output(
                kind,
                self.key_json,
                row,
                reason,
                self.watermark,
                time,
                partition,
                offset,
                offsets,
                events[0] if events else 0,
            )
        )

    def rows(self) -> Iterator[Row]:
        yield from self.out


def _key(key: Any) -> tuple[Any, ...]:
    """Spark's grouping key as a tuple."""
    return key if isinstance(key, tuple) else (key,)
