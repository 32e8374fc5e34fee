"""From raw surprise to an anomaly score in [0, 1], with the parameters last received.

A model's raw surprise means different things on different series (a forecast error of
three spreads is rare on a smooth temperature, common on a bursty request rate), so the
scorer judges it against the surprise the trainer saw on the same series: how often the
trainer saw a surprise as large as the mean of the last ``smooth`` raw ones
(``tail_probability``: in the tail it learnt, an exponential fall fitted to the excesses
it saw; below, a normal tail on its mean and spread) is ``p``, and ``-log10(p) /
_LOG_CAP``, clipped to [0, 1], the score. A score of 0.5 is a tail of 1e-5, 1.0 a tail of
1e-10: a long-run rate of false alarms, not a guess at a probability of anomaly. The tail
is learnt, not assumed normal, because forecast errors seldom are: a normal tail put
hundreds of times more normal readings at 0.5 than it promised
(``benchmarks/iot-models.md``).

A sensor that repeats one value ``STUCK_RUN`` times, on a series that seldom repeats a
value (``repeats`` in the parameters), scores at least ``ALERT_SCORE`` while it lasts.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from kappaflow.iot.models.base import MAX_CLIPPED, STUCK_RUN, WARMUP, Model, Params

#: The score at and above which a reading is anomalous, for the alert rules and for the
#: evaluation's detections.
ALERT_SCORE = 0.5
_LOG_CAP = 10.0
_MIN_TAIL = 1e-300
_RARE_REPEATS = 0.02
_TINY = 1e-9


def tail_probability(params: Params, surprise: float) -> float:
    """How often the trainer saw a raw surprise as large as ``surprise`` on the series:
    above where its tail begins, the tail's share times an exponential fall with the
    tail's scale; below, a normal tail on the surprise's mean and spread, but no rarer
    than the tail's share."""
    start, share, scale = params["tail"]
    if surprise > start:
        return float(share * math.exp(-(surprise - start) / max(scale, _TINY)))
    mean, spread = params["surprise"]
    z = (surprise - mean) / max(spread, _TINY)
    return max(0.5 * math.erfc(z / math.sqrt(2.0)), float(share))


class Scorer:
    """Scores the readings of one series, in order, each with the parameters given."""

    def __init__(self, model: Model, smooth: int = 1) -> None:
        self.model = model
        self._history: deque[float] = deque(maxlen=max(model.history, 1))
        self._raw: deque[float] = deque(maxlen=max(smooth, 1))
        self._run = 0
        self._last: float | None = None
        self._clipped = 0

    def state(self) -> dict[str, Any]:
        """What the scorer remembers, JSON-ready, for ``restore``."""
        return {
            "history": list(self._history),
            "raw": list(self._raw),
            "run": self._run,
            "last": self._last,
            "clipped": self._clipped,
        }

    @classmethod
    def restore(cls, model: Model, state: dict[str, Any] | None, smooth: int = 1) -> Scorer:
        """A scorer of ``model`` remembering ``state`` (from ``state()``; None: nothing)."""
        scorer = cls(model, smooth)
        if state is not None:
            scorer._history.extend(state["history"])
            scorer._raw.extend(state["raw"])
            scorer._run = int(state["run"])
            scorer._last = state["last"]
            scorer._clipped = int(state.get("clipped", 0))
        return scorer

    def score(self, value: float, params: Params | None) -> float:
        """The anomaly score of ``value``, then remember it as the latest reading."""
        if not math.isfinite(value):
            return 1.0
        self._run = self._run + 1 if value == self._last else 1
        self._last = value
        remembered = value
        try:
            if params is None or params["n"] < WARMUP:
                return 0.0
            if self._clipped >= MAX_CLIPPED:
                # The readings before were remembered clipped: so many outliers in a row
                # are a change, not a spike, and are remembered as they are (else the
                # memory would drift from the series for as long as these parameters last).
                self._clipped = 0
            else:
                remembered = self.model.remember(params, self._history, value)
                self._clipped = self._clipped + 1 if remembered != value else 0
            raw = self.model.raw(params, self._history, value)
            self._raw.append(raw)
            tail = max(tail_probability(params, sum(self._raw) / len(self._raw)), _MIN_TAIL)
            score = min(1.0, max(0.0, -math.log10(tail) / _LOG_CAP))
            if self._run >= STUCK_RUN and params["repeats"] < _RARE_REPEATS:
                score = max(score, ALERT_SCORE)
            return score
        finally:
            self._history.append(remembered)
