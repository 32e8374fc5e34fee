"""The devices' physics: what each sensor would read, before anomalies and faults.

Every device lives in a home with a daily rhythm (its own time zone and habits): the room
follows the thermostat's set point with a cooler night, the load follows the household's
activity, the component temperatures follow the room and the load, and the fan follows
the processor's temperature. Each sensor has Gaussian noise and a slow calibration drift
of its own. Users change set points and devices change state (home, away, asleep), which
the fleet reports as device events. Everything is vectorised over devices with numpy, so
that a fleet of 100,000 devices costs a few array operations per sampling step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kappaflow.iot.telemetry import METRICS

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

DAY_S = 86_400.0
#: Device states and how active the household is in each.
STATES = ("home", "away", "asleep")
_ACTIVITY = np.array([1.0, 0.25, 0.1])
#: Events per device and day: set point changes, state changes.
_COMMANDS_PER_DAY = 3.0
_STATE_CHANGES_PER_DAY = 4.0
#: Sensor noise, as a share of each metric's scale.
_NOISE = np.array([0.12, 0.12, 0.15, 0.25, 0.15, 0.25])
_ROOM, _CPU_TEMP, _DISK_TEMP, _CPU, _MEM, _FAN = range(len(METRICS))


@dataclass(frozen=True)
class DeviceEvent:
    """A device event as the fleet makes it (the simulator stamps and sends it)."""

    device: int
    time: float
    kind: str
    fields: dict[str, Any]


class Fleet:
    """``n`` devices' households and sensors, drawn from ``rng``."""

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        self.n = n
        self.rng = rng
        # When each household's evening peaks (seconds after UTC midnight): time zones
        # and habits spread over the day.
        self.peak_s = rng.uniform(0.0, DAY_S, n)
        self.set_point = rng.normal(21.0, 1.2, n).round(1)
        self.cpu_base = rng.uniform(5.0, 20.0, n)
        self.mem_base = rng.uniform(25.0, 60.0, n)
        self.state = np.zeros(n, dtype=np.int64)
        # Calibration drift per sensor, in its metric's unit per day.
        scales = np.array([m.scale for m in METRICS])
        self.drift_per_s = rng.normal(0.0, 0.02, (n, len(METRICS))) * scales / DAY_S
        self.noise_sd = _NOISE * scales
        self.low = np.array([m.low for m in METRICS])
        self.high = np.array([m.high for m in METRICS])

    def values(self, devices: Ints, times: Floats, since: float) -> Floats:
        """What the sensors of ``devices`` read at ``times`` (epoch s; ``since``: the
        simulation's start, from which drift accumulates): one row per device, one column
        per metric, in canonical units."""
        k = len(devices)
        # 0 at the household's quietest moment, 1 at its evening peak.
        phase = 2.0 * np.pi * (times - self.peak_s[devices]) / DAY_S
        rhythm = 0.5 * (1.0 + np.cos(phase))
        activity = rhythm * _ACTIVITY[self.state[devices]]
        noise = self.rng.normal(0.0, 1.0, (k, len(METRICS))) * self.noise_sd
        out = np.empty((k, len(METRICS)))
        out[:, _ROOM] = self.set_point[devices] - 1.5 + 1.5 * rhythm
        out[:, _CPU] = self.cpu_base[devices] + 55.0 * activity
        out[:, _MEM] = self.mem_base[devices] + 20.0 * activity
        out[:, _CPU_TEMP] = out[:, _ROOM] + 18.0 + 0.35 * out[:, _CPU]
        out[:, _DISK_TEMP] = out[:, _ROOM] + 9.0 + 0.08 * out[:, _CPU]
        out[:, _FAN] = 900.0 + 45.0 * np.maximum(out[:, _CPU_TEMP] - 40.0, 0.0)
        out += noise + self.drift_per_s[devices] * (times - since)[:, None]
        return np.clip(out, self.low, self.high)

    def events(self, start: float, end: float, awake: npt.NDArray[np.bool_]) -> list[DeviceEvent]:
        """The users' commands and state changes of devices ``awake`` in [start, end)."""
        span = (end - start) / DAY_S
        out: list[DeviceEvent] = []
        for device in np.flatnonzero(self.rng.random(self.n) < _COMMANDS_PER_DAY * span):
            point = round(float(np.clip(self.rng.normal(21.0, 1.5), 16.0, 27.0)) * 2) / 2
            self.set_point[device] = point
            if awake[device]:
                fields = {"command": "set_room_temp", "value": point}
                out.append(self._event(int(device), start, end, "command", fields))
        for device in np.flatnonzero(self.rng.random(self.n) < _STATE_CHANGES_PER_DAY * span):
            state = int(self.rng.integers(len(STATES)))
            if state == self.state[device]:
                continue
            previous = STATES[self.state[device]]
            self.state[device] = state
            if awake[device]:
                fields = {"state": STATES[state], "previous": previous}
                out.append(self._event(int(device), start, end, "state", fields))
        return out

    def _event(
        self, device: int, start: float, end: float, kind: str, fields: dict[str, Any]
    ) -> DeviceEvent:
        return DeviceEvent(device, float(self.rng.uniform(start, end)), kind, fields)
