"""A fleet of devices sending telemetry, with the faults real fleets have.

Each device samples all its metrics once per round (every ``interval_s``, staggered over
the fleet so that the fleet sends ``rate`` readings a second) and sends a heartbeat every
``heartbeat_s``. On top of the fleet's physics (``fleet``) and the labelled anomalies
(``anomalies``), devices misbehave as devices do:

- **clock skew**: a share of devices stamp readings by a clock that is off by up to
  ``max_skew_s`` either way;
- **out of order**: a share of readings is held back up to ``max_delay_s`` and sent after
  newer ones;
- **duplicates**: a share of readings is sent twice, with the same id;
- **silence**: devices go quiet (no readings, no heartbeats, no events) for minutes and
  come back; each silence is labelled as a fault.

Given the same configuration and start, a simulation sends the same records: tests and
the evaluation replay it. Times are epoch seconds of the simulation's clock, which is the
wall clock when it runs live and a chosen start when it backfills as fast as it can.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kappaflow.iot.anomalies import Anomalies, Incident
from kappaflow.iot.fleet import DAY_S, DeviceEvent, Fleet, Floats, Ints
from kappaflow.iot.telemetry import (
    EVENTS_TOPIC,
    METRICS,
    READINGS_TOPIC,
    reading_id,
    to_reported,
)


@dataclass(frozen=True)
class FleetConfig:
    """What a simulation is made of; every share is of devices or readings."""

    devices: int = 1_000
    #: Readings a second, for the whole fleet.
    rate: float = 1_000.0
    seed: int = 1
    #: Anomalies a day per device and metric, on average.
    anomalies_per_day: float = 1.0
    skewed_share: float = 0.1
    max_skew_s: float = 300.0
    late_share: float = 0.01
    max_delay_s: float = 30.0
    duplicate_share: float = 0.005
    #: Silences a day per device, on average, and how long each lasts (minutes).
    silences_per_day: float = 1.0
    silence_minutes: tuple[float, float] = (5.0, 30.0)
    heartbeat_s: float = 30.0
    #: Share of devices whose firmware reports Fahrenheit and ratios.
    imperial_share: float = 0.2

    @property
    def interval_s(self) -> float:
        """Seconds between a device's sampling rounds."""
        return self.devices * len(METRICS) / self.rate


@dataclass(frozen=True)
class Outgoing:
    """A record to send: its topic, key and JSON value."""

    topic: str
    key: bytes
    value: bytes


@dataclass(frozen=True)
class Label:
    """An incident as the labels file records it, in the device's own clock (epoch s, to
    the millisecond as readings are stamped)."""

    device: str
    metric: str | None
    cls: str
    kind: str
    start: float
    end: float

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "metric": self.metric,
            "class": self.cls,
            "kind": self.kind,
            "start": _iso([self.start])[0],
            "end": _iso([self.end])[0],
        }


@dataclass
class Tally:
    """What a simulation has sent so far."""

    readings: int = 0
    events: int = 0
    heartbeats: int = 0
    duplicates: int = 0
    delayed: int = 0
    anomalies: int = 0
    silences: int = 0
    #: The simulation's clock: how far it has run (epoch s).
    clock: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """What was sent, by kind (the clock left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "clock"}


#: A record waiting to be sent: when, in what order among equals, and the record (plain
#: tuples: the heap compares them in C, and ``order`` is unique, so records never are).
_Held = tuple[float, int, Outgoing]


def device_names(n: int) -> list[str]:
    """The ids of a fleet of ``n`` devices."""
    return [f"dev-{i:06d}" for i in range(n)]


class Simulation:
    """A fleet from ``config`` whose clock starts at ``start`` (epoch s)."""

    def __init__(self, config: FleetConfig, start: float) -> None:
        self.config = config
        self.start = start
        n = config.devices
        self.rng = np.random.default_rng(config.seed)
        self.fleet = Fleet(n, self.rng)
        # The anomalies draw from a generator of their own: the same seed without
        # anomalies sends the same readings, so each anomaly's deviation can be measured.
        self.anomalies = Anomalies(
            n, config.anomalies_per_day, np.random.default_rng((config.seed, 1))
        )
        self.names = device_names(n)
        self.keys = [name.encode() for name in self.names]
        skewed = self.rng.random(n) < config.skewed_share
        self.skew = np.where(skewed, self.rng.uniform(-1.0, 1.0, n) * config.max_skew_s, 0.0)
        imperial = self.rng.random(n) < config.imperial_share
        self.units = [
            [m.imperial_unit if imp and m.imperial_unit else m.unit for m in METRICS]
            for imp in imperial.tolist()
        ]
        self.next_round = start + self.rng.uniform(0.0, config.interval_s, n)
        self.next_beat = start + self.rng.uniform(0.0, config.heartbeat_s, n)
        self.seq = np.zeros(n, dtype=np.int64)
        self.silent_until = np.full(n, -np.inf)
        self.clock = start
        self.tally = Tally(clock=start)
        self._held: list[_Held] = []
        self._order = 0

    def advance(self, until: float) -> tuple[list[Outgoing], list[Label]]:
        """Run the clock to ``until``: the records sent meanwhile, in the order sent, and
        the incidents that began."""
        if until <= self.clock:
            return [], []
        labels = self._silences(self.clock, until)
        awake = self.silent_until <= self.clock
        for event in self.fleet.events(self.clock, until, awake):
            self._hold(event.time, self._event(event))
        while True:
            due = np.flatnonzero(self.next_round < until)
            if len(due) == 0:
                break
            labels += self._round(due, self.next_round[due].copy())
            self.next_round[due] += self.config.interval_s
        self._heartbeats(until)
        self.clock = until
        self.tally.clock = until
        sent = []
        while self._held and self._held[0][0] < until:
            sent.append(heapq.heappop(self._held)[2])
        return sent, labels

    def run(self, until: float, step_s: float) -> Iterator[tuple[list[Outgoing], list[Label]]]:
        """``advance`` in steps of ``step_s`` to ``until``, as fast as it goes, then what
        is still held back (``drain``)."""
        while self.clock < until:
            yield self.advance(min(self.clock + step_s, until))
        yield self.drain(), []

    def drain(self) -> list[Outgoing]:
        """The records held back to be sent late or again, sent now: a simulation that
        ends sends every reading it made."""
        held = sorted(self._held)
        self._held = []
        return [record for _, _, record in held]

    def _round(self, devices: Ints, times: Floats) -> list[Label]:
        """One sampling round of ``devices`` at ``times``."""
        awake = self.silent_until[devices] <= times
        devices, times = devices[awake], times[awake]
        if len(devices) == 0:
            return []
        values = self.fleet.values(devices, times, self.start)
        values, sent, incidents = self.anomalies.apply(
            devices, times, self.config.interval_s, values
        )
        values = np.clip(values, self.fleet.low, self.fleet.high)
        self.seq[devices] += 1
        stamps = _iso(times + self.skew[devices])
        late = self.rng.random(values.shape) < self.config.late_share
        delays = self.rng.uniform(0.0, self.config.max_delay_s, values.shape)
        twice = self.rng.random(values.shape) < self.config.duplicate_share
        for row, device in enumerate(devices.tolist()):
            name, seq, units = self.names[device], int(self.seq[device]), self.units[device]
            for col, metric in enumerate(METRICS):
                if not sent[row, col]:
                    continue
                unit = units[col]
                value = round(to_reported(unit, float(values[row, col])), 3)
                # As json.dumps writes it (names and units are plain ASCII), a few times
                # faster: the fleet's sending is the simulator's hot loop.
                text = (
                    f'{{"device": "{name}", "metric": "{metric.name}", "value": {value!r}, '
                    f'"unit": "{unit}", "time": "{stamps[row]}", "seq": {seq}, '
                    f'"id": "{reading_id(name, seq, metric.name)}"}}'
                )
                out = Outgoing(READINGS_TOPIC, self.keys[device], text.encode())
                at = float(times[row]) + (float(delays[row, col]) if late[row, col] else 0.0)
                self._hold(at, out)
                self.tally.readings += 1
                self.tally.delayed += int(late[row, col])
                if twice[row, col]:
                    self._hold(at + float(delays[row, col]) / 10.0, out)
                    self.tally.duplicates += 1
        self.tally.anomalies += len(incidents)
        return [self._anomaly_label(i) for i in incidents]

    def _silences(self, start: float, end: float) -> list[Label]:
        """Devices that go quiet at ``start`` (one chance in the step [start, end))."""
        config = self.config
        chance = config.silences_per_day * (end - start) / DAY_S
        quiet = (self.silent_until <= start) & (self.rng.random(config.devices) < chance)
        labels = []
        for device in np.flatnonzero(quiet).tolist():
            # From the step's start: its rounds and heartbeats are the first not sent.
            begin = start
            length = 60.0 * float(self.rng.uniform(*config.silence_minutes))
            self.silent_until[device] = begin + length
            skew = float(self.skew[device])
            labels.append(
                Label(
                    self.names[device], None, "fault", "silent", begin + skew, begin + length + skew
                )
            )
        self.tally.silences += len(labels)
        return labels

    def _heartbeats(self, until: float) -> None:
        beat = self.config.heartbeat_s
        while True:
            due = np.flatnonzero(self.next_beat < until)
            if len(due) == 0:
                return
            times = self.next_beat[due]
            awake = self.silent_until[due] <= times
            stamps = _iso(times + self.skew[due])
            for device, at, stamp in zip(
                due[awake].tolist(),
                times[awake].tolist(),
                np.asarray(stamps)[awake].tolist(),
                strict=True,
            ):
                record = {"device": self.names[device], "time": stamp, "kind": "heartbeat"}
                self._hold(
                    at, Outgoing(EVENTS_TOPIC, self.keys[device], json.dumps(record).encode())
                )
            self.tally.heartbeats += int(awake.sum())
            self.next_beat[due] += beat

    def _event(self, event: DeviceEvent) -> Outgoing:
        stamp = _iso([event.time + float(self.skew[event.device])])[0]
        record = {"device": self.names[event.device], "time": stamp, "kind": event.kind}
        self.tally.events += 1
        value = json.dumps({**record, **event.fields}).encode()
        return Outgoing(EVENTS_TOPIC, self.keys[event.device], value)

    def _hold(self, send_at: float, record: Outgoing) -> None:
        self._order += 1
        heapq.heappush(self._held, (send_at, self._order, record))

    def _anomaly_label(self, incident: Incident) -> Label:
        skew = float(self.skew[incident.device])
        return Label(
            self.names[incident.device],
            METRICS[incident.metric].name,
            "anomaly",
            incident.kind,
            _ms(incident.start + skew),
            _ms(incident.end + skew),
        )


def _iso(epoch_s: Any) -> list[str]:
    """Epoch seconds as ISO-8601 UTC text with milliseconds and a ``Z``."""
    ms = np.round(np.asarray(epoch_s, dtype=np.float64) * 1000.0).astype("datetime64[ms]")
    return [f"{text}Z" for text in np.datetime_as_string(ms, unit="ms").tolist()]


def _ms(epoch_s: float) -> float:
    """Epoch seconds rounded to the millisecond, as ``_iso`` writes them."""
    return round(epoch_s * 1000.0) / 1000.0
