"""Labelled anomalies, injected into the fleet's readings per device and metric.

Six kinds, each lasting a drawn time and sized by the metric's scale (``Metric.scale``):

- ``spike``: one to three readings far off, up or down;
- ``level_shift``: the level steps up or down and stays there;
- ``drift``: the level moves away slowly, linearly, and snaps back at the end;
- ``stuck``: the sensor repeats the value it had when it stuck;
- ``variance``: the noise grows several-fold;
- ``dropout``: the metric is not sent at all.

An anomaly starts in a sampling round with a probability that makes ``rate_per_day``
anomalies per device and metric a day on average; while one runs, no other starts in the
same cell. Each is reported as an ``Incident`` when it starts (its end is drawn then),
for the labels file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kappaflow.iot.fleet import DAY_S, Floats, Ints
from kappaflow.iot.telemetry import METRICS

KINDS = ("spike", "level_shift", "drift", "stuck", "variance", "dropout")
_NONE = -1
_SPIKE, _SHIFT, _DRIFT, _STUCK, _VARIANCE, _DROPOUT = range(len(KINDS))
#: Each kind's duration in minutes (low, high); a spike lasts one to three rounds instead.
_MINUTES = {
    _SHIFT: (10.0, 60.0),
    _DRIFT: (30.0, 120.0),
    _STUCK: (10.0, 60.0),
    _VARIANCE: (10.0, 60.0),
    _DROPOUT: (10.0, 45.0),
}
#: Each kind's size in the metric's scales (low, high).
_SIZE = {
    _SPIKE: (4.0, 8.0),
    _SHIFT: (2.5, 5.0),
    _DRIFT: (3.0, 6.0),
    _VARIANCE: (2.0, 4.0),
}


@dataclass(frozen=True)
class Incident:
    """One injected anomaly: true times (epoch s), before any clock skew."""

    device: int
    metric: int
    kind: str
    start: float
    end: float


class Anomalies:
    """The anomalies running in each (device, metric) cell of a fleet of ``n``."""

    def __init__(self, n: int, rate_per_day: float, rng: np.random.Generator) -> None:
        shape = (n, len(METRICS))
        self.rate_per_day = rate_per_day
        self.rng = rng
        self.kind = np.full(shape, _NONE, dtype=np.int64)
        self.start = np.zeros(shape)
        self.end = np.zeros(shape)
        self.size = np.zeros(shape)
        self.stuck_at = np.zeros(shape)
        self.scale = np.array([m.scale for m in METRICS])

    def apply(
        self, devices: Ints, times: Floats, interval_s: float, values: Floats
    ) -> tuple[Floats, npt.NDArray[np.bool_], list[Incident]]:
        """``values`` of ``devices`` sampled at ``times`` with their anomalies: the values,
        which of them are sent (a dropout sends nothing), and the incidents begun now."""
        t = times[:, None]
        kind = self.kind[devices]
        ended = (kind != _NONE) & (self.end[devices] <= t)
        kind[ended] = _NONE
        chance = self.rate_per_day * interval_s / DAY_S
        begins = (kind == _NONE) & (self.rng.random(kind.shape) < chance)
        incidents = self._begin(devices, times, interval_s, values, begins, kind)
        self.kind[devices] = kind
        size = self.size[devices]
        out = values.copy()
        shift = (kind == _SPIKE) | (kind == _SHIFT)
        out[shift] += size[shift]
        drift = kind == _DRIFT
        start, end = self.start[devices], self.end[devices]
        progress = np.divide(t - start, end - start, out=np.zeros_like(out), where=drift)
        out[drift] += size[drift] * progress[drift]
        stuck = kind == _STUCK
        out[stuck] = self.stuck_at[devices][stuck]
        wide = kind == _VARIANCE
        out[wide] += self.rng.normal(0.0, 1.0, int(wide.sum())) * size[wide]
        return out, kind != _DROPOUT, incidents

    def _begin(
        self,
        devices: Ints,
        times: Floats,
        interval_s: float,
        values: Floats,
        begins: npt.NDArray[np.bool_],
        kind: Ints,
    ) -> list[Incident]:
        rows, metrics = np.nonzero(begins)
        incidents = []
        for row, metric in zip(rows.tolist(), metrics.tolist(), strict=True):
            device = int(devices[row])
            chosen = int(self.rng.integers(len(KINDS)))
            start = float(times[row])
            if chosen == _SPIKE:
                # Ends just after its last reading: one to three rounds.
                end = start + interval_s * (int(self.rng.integers(1, 4)) - 0.5)
            else:
                low, high = _MINUTES[chosen]
                end = start + 60.0 * float(self.rng.uniform(low, high))
            if chosen in _SIZE:
                low, high = _SIZE[chosen]
                sign = -1.0 if chosen != _VARIANCE and self.rng.random() < 0.5 else 1.0
                self.size[device, metric] = sign * self.rng.uniform(low, high) * self.scale[metric]
            self.stuck_at[device, metric] = values[row, metric]
            self.start[device, metric] = start
            self.end[device, metric] = end
            kind[row, metric] = chosen
            incidents.append(Incident(device, metric, KINDS[chosen], start, end))
        return incidents
