"""What a device sends: one reading per record, and device events beside them.

A reading is one metric's value at one moment, as JSON, keyed by the device id::

    {"device": "dev-000042", "metric": "cpu_temp", "value": 131.27, "unit": "F",
     "time": "2026-11-25T09:00:01.250Z", "seq": 1234, "id": "dev-000042/1234/cpu_temp"}

``time`` is the device's own clock (ISO-8601 with a zone), ``seq`` counts the device's
sampling rounds and ``id`` names the reading, so that a reading sent twice can be
recognised. Devices of the ``imperial`` firmware report temperatures in Fahrenheit and
loads as ratios; the cleaning job normalises them to ``METRICS``' units.

Device events (``kind``: ``heartbeat``, ``command``, ``state``) go to a topic of their own::

    {"device": "dev-000042", "time": "...", "kind": "command",
     "command": "set_room_temp", "value": 22.5}
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where devices send readings and events.
READINGS_TOPIC = "telemetry.raw"
EVENTS_TOPIC = "devices.events"
#: Where the HTTP gateway sends what it refuses.
GATEWAY_DLQ_TOPIC = "gateway.dlq"


@dataclass(frozen=True)
class Metric:
    """A metric every device reports, in its canonical unit."""

    name: str
    unit: str
    #: The unit devices of the imperial firmware report it in (None: the same).
    imperial_unit: str | None
    #: The spread of its normal day, in the canonical unit: how large anomalies are.
    scale: float
    #: The range a sensor can report (clipped there).
    low: float
    high: float


METRICS = (
    Metric("room_temp", "celsius", "fahrenheit", 1.5, -40.0, 60.0),
    Metric("cpu_temp", "celsius", "fahrenheit", 6.0, -40.0, 125.0),
    Metric("disk_temp", "celsius", "fahrenheit", 2.5, -40.0, 100.0),
    Metric("cpu_util", "percent", "ratio", 15.0, 0.0, 100.0),
    Metric("mem_util", "percent", "ratio", 6.0, 0.0, 100.0),
    Metric("fan_rpm", "rpm", None, 150.0, 0.0, 6000.0),
)
METRIC_NAMES = tuple(m.name for m in METRICS)


def to_reported(unit: str, value: float) -> float:
    """A canonical value in ``unit`` as a device of that firmware reports it."""
    if unit == "fahrenheit":
        return value * 9.0 / 5.0 + 32.0
    if unit == "ratio":
        return value / 100.0
    return value


def to_canonical(unit: str, value: float) -> float:
    """A reported value in ``unit`` in its metric's canonical unit."""
    if unit == "fahrenheit":
        return (value - 32.0) * 5.0 / 9.0
    if unit == "ratio":
        return value * 100.0
    return value


def reading_id(device: str, seq: int, metric: str) -> str:
    return f"{device}/{seq}/{metric}"
