"""Per-key stateful functions: typed state, event-time timers and a time to live.

A stateful function sees, per key and micro-batch, the key's new events (instances of
the source's record type, in event-time order) and the key's state (a dataclass), and
yields output records::

    @kf.stateful(state=Watch, output=Alert, ttl="1h", late="topic")
    def overheating(key, events, ctx):
        for e in events:
            ctx.state.last_seen = e.at
            ctx.timers.at(e.at + timedelta(minutes=5))
            ...
            yield Alert(...)

    @overheating.on_timer
    def _(key, at_ms, ctx):
        yield Alert(...)

    alerts = readings.process(overheating, by="device")

Time is event time only: timers fire when the watermark passes them, the TTL counts from
the key's latest event, and no wall-clock time reaches the function, so replaying the
same batches gives the same output. Late events (at or behind the watermark, less the
source's allowed lateness) go to the job's late topic (``late="topic"``), or reach the
function with ``ctx.is_late(event)`` true (``late="function"``). The operator is in
stateful_run.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, is_dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from kappaflow.errors import LateModeError, StatefulOutputTypeError, StateTtlError, StateTypeError
from kappaflow.streams.stateful_values import is_record_type
from kappaflow.timeutil import parse_duration, to_epoch_ms

S = TypeVar("S")
LATE_MODES = ("function", "topic")

#: ``function(key, events, ctx)``: the output records for a key's new events.
EventFunction = Callable[[tuple[Any, ...], list[Any], "StateContext[Any]"], Iterable[Any]]
#: ``function(key, at_ms, ctx)``: the output records when a key's timer fires.
TimerFunction = Callable[[tuple[Any, ...], int, "StateContext[Any]"], Iterable[Any]]


class Timers:
    """A key's event-time timers: each fires once, when the watermark reaches it."""

    def __init__(self, pending: Iterable[int]) -> None:
        self._pending = set(pending)

    def at(self, when: int | datetime) -> None:
        """Fire at ``when`` (epoch ms or an aware datetime). A time the watermark already
        passed fires in this same call, after the function returns."""
        self._pending.add(when if isinstance(when, int) else to_epoch_ms(when))

    def cancel(self, when: int | datetime) -> None:
        """Do not fire at ``when`` (nothing if no timer is set there)."""
        self._pending.discard(when if isinstance(when, int) else to_epoch_ms(when))

    def clear(self) -> None:
        """Cancel every timer of the key."""
        self._pending.clear()

    def list(self) -> list[int]:
        """The times the key's timers fire at (epoch ms), soonest first."""
        return sorted(self._pending)


class StateContext(Generic[S]):
    """What a stateful function knows besides its events: the key's state and timers, the
    watermark, and which events are late."""

    def __init__(
        self,
        key: tuple[Any, ...],
        state: S,
        timers: Timers,
        watermark: int,
        late: Iterable[Any] = (),
    ) -> None:
        self.key = key
        self.state = state
        self.timers = timers
        #: The watermark (epoch ms) this call runs under: every event up to it has come.
        self.watermark = watermark
        self._late = {id(e) for e in late}

    def is_late(self, event: Any) -> bool:
        """Whether ``event`` came at or behind the watermark (less the allowed lateness);
        only ever true with ``late="function"``."""
        return id(event) in self._late


@dataclass
class StatefulFunction(Generic[S]):
    """A function decorated with ``@kf.stateful``: what ``Stream.process`` runs."""

    function: EventFunction
    state: type[S]
    output: type
    ttl_ms: int | None
    late: str
    timer: TimerFunction | None = None

    @property
    def name(self) -> str:
        return getattr(self.function, "__name__", "process")

    def on_timer(self, function: TimerFunction) -> TimerFunction:
        """Decorate the function called when one of a key's timers fires."""
        self.timer = function
        return function

    def __call__(
        self, key: tuple[Any, ...], events: list[Any], ctx: StateContext[S]
    ) -> Iterable[Any]:
        return self.function(key, events, ctx)


def stateful(
    *,
    state: type[S],
    output: type,
    ttl: str | int | timedelta | None = None,
    late: str = "topic",
) -> Callable[[EventFunction], StatefulFunction[S]]:
    """Declare a per-key stateful function (see the module's docstring).

    ``state``: a dataclass that constructs with no arguments (a new key's state).
    ``output``: the dataclass or pydantic model the function yields. ``ttl``: forget a
    key's state and timers this long (event time) after its latest event. ``late``:
    ``"topic"`` sends late events to the job's late topic, ``"function"`` hands them over.
    """
    if not (isinstance(state, type) and is_dataclass(state)):
        raise StateTypeError(f"stateful(state=...): {state!r} is not a dataclass")
    try:
        state()
    except TypeError as exc:
        raise StateTypeError(
            f"stateful(state={state.__name__}): a new key's state is {state.__name__}(), "
            f"which fails ({exc}); give every field a default"
        ) from None
    if not is_record_type(output):
        raise StatefulOutputTypeError(
            f"stateful(output=...): {output!r} is not a dataclass or pydantic model class"
        )
    if late not in LATE_MODES:
        raise LateModeError(f"stateful(late={late!r}): use 'function' or 'topic'")
    ttl_ms = _ttl_ms(ttl)

    def decorate(function: EventFunction) -> StatefulFunction[S]:
        return StatefulFunction(function, state, output, ttl_ms, late)

    return decorate


def _ttl_ms(ttl: str | int | timedelta | None) -> int | None:
    if ttl is None:
        return None
    try:
        if isinstance(ttl, timedelta):
            found = ttl
        elif isinstance(ttl, int) and not isinstance(ttl, bool):
            found = timedelta(milliseconds=ttl)
        else:
            found = parse_duration(str(ttl))
    except Exception:
        found = timedelta(0)
    ms = int(found / timedelta(milliseconds=1))
    if ms <= 0:
        raise StateTtlError(f"stateful(ttl={ttl!r}): give a positive duration such as '1h'")
    return ms
