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

A family with ``guards`` (``likelihood``) is scored differently around the tail: no
reading scores during the first ``PROBATION`` readings; a reading beyond the range seen so
far by more than ``RANGE_TOLERANCE`` of it scores 1.0 (once per new extreme, since the
range grows with it) where it is surprising too (a raw surprise of ``RANGE_SURPRISE``) or
far beyond (``RANGE_FAR`` of the range: a trend's steady new highs are neither), and so
does a value repeated once more than the longest repeat seen
before (and at least ``FLAT_LEAST`` times); after a score at the alert score, the next
``MUTE`` readings are held just under it (``MUTED``), since NAB-style judges and people
alike count one incident once: the first alarm is what matters, each further one in the
same incident earns nothing and, outside it, costs a false alarm.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from kappaflow.iot.models.base import MAX_CLIPPED, STUCK_RUN, WARMUP, Model, Params
from kappaflow.iot.models.season import Season

#: The score at and above which a reading is anomalous, for the alert rules and for the
#: evaluation's detections.
ALERT_SCORE = 0.5
_LOG_CAP = 10.0
_MIN_TAIL = 1e-300
_RARE_REPEATS = 0.02
_TINY = 1e-9
#: The guards' constants, chosen on the development series (data/anomaly, make
#: eval-anomaly): readings of probation, readings held under the alert score after an
#: alarm, the share of the range a new extreme must pass it by (and the raw surprise it
#: must have, unless it passes the range by ``RANGE_FAR``), the least repeats of a flat
#: line, and the score of a muted reading.
PROBATION = 100
MUTE = 100
RANGE_TOLERANCE = 0.05
FLAT_LEAST = 10
MUTED = 0.49
RANGE_SURPRISE = 5.0
RANGE_FAR = 0.25


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


def alert_surprise(params: Params) -> float:
    """The least (smoothed) raw surprise whose tail probability scores ``ALERT_SCORE``:
    in the tail learnt, where its exponential fall reaches ``10 ** -(ALERT_SCORE *
    _LOG_CAP)``; where the tail's share is already that rare, its start (below it, the
    tail is the share at least, or a normal tail within two spreads, far more common)."""
    start, share, scale = (float(x) for x in params["tail"])
    rare = 10.0 ** -(ALERT_SCORE * _LOG_CAP)
    if share <= rare:
        return start
    return start + max(scale, _TINY) * math.log(share / rare)


@dataclass(frozen=True)
class Explanation:
    """What a model expected of a reading (``expected_low`` to ``expected_high``: the
    values whose surprise stays under the alert score; None where the family or its
    parameters have no centre, as ``hst``, or no parameters yet) and the reading's anomaly
    likelihood (one minus the tail probability of its surprise; None without
    parameters)."""

    expected_low: float | None
    expected_high: float | None
    likelihood: float | None


class Scorer:
    """Scores the readings of one series, in order, each with the parameters given."""

    def __init__(self, model: Model, smooth: int = 1) -> None:
        self.model = model
        self._history: deque[float] = deque(maxlen=max(model.history, 1))
        self._raw: deque[float] = deque(maxlen=max(smooth, model.smooth, 1))
        self._run = 0
        self._last: float | None = None
        self._clipped = 0
        # The guards' memory: readings seen, readings still muted, the range seen, the
        # longest run of repeats seen.
        self._seen = 0
        self._quiet = 0
        self._low = math.inf
        self._high = -math.inf
        self._longest = 0
        # The seasonal term's memory (``Model.seasonal``).
        self._season = Season()
        # The current reading's raw surprise (0 without parameters), for the guards; and
        # its explanation: the range the model expected it in, and its likelihood.
        self._surprise = 0.0
        self._band: tuple[float, float] | None = None
        self._likelihood: float | None = None

    def explain(self) -> Explanation:
        """What the model expected of the reading scored last, and how likely it was."""
        low, high = self._band if self._band is not None else (None, None)
        return Explanation(low, high, self._likelihood)

    def state(self) -> dict[str, Any]:
        """What the scorer remembers, JSON-ready, for ``restore``."""
        memory: dict[str, Any] = {
            "history": list(self._history),
            "raw": list(self._raw),
            "run": self._run,
            "last": self._last,
            "clipped": self._clipped,
        }
        if self.model.guards:
            seen = self._high >= self._low
            memory["guard"] = {
                "seen": self._seen,
                "quiet": self._quiet,
                "low": self._low if seen else None,
                "high": self._high if seen else None,
                "longest": self._longest,
            }
        if self.model.seasonal is not None:
            memory["season"] = self._season.state()
        return memory

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
            guard = state.get("guard")
            if guard is not None:
                scorer._seen, scorer._quiet = int(guard["seen"]), int(guard["quiet"])
                if guard["low"] is not None:
                    scorer._low, scorer._high = float(guard["low"]), float(guard["high"])
                scorer._longest = int(guard["longest"])
            scorer._season = Season.restore(state.get("season"))
        return scorer

    def score(self, value: float, params: Params | None) -> float:
        """The anomaly score of ``value``, then remember it as the latest reading."""
        if not math.isfinite(value):
            return 1.0
        repeated = value == self._last
        if not repeated and self._run > 1:
            # A run of repeats ended: the guards remember the longest.
            self._longest = max(self._longest, self._run - 1)
        self._run = self._run + 1 if repeated else 1
        self._last = value
        if not self.model.guards:
            return self._tail_score(value, params)
        return self._guard(value, self._tail_score(value, params))

    def _tail_score(self, value: float, params: Params | None) -> float:
        remembered = value
        self._surprise = 0.0
        self._band, self._likelihood = None, None
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
            # A family with a centre has its raw surprise from it: the distance from the
            # centre in its unit (as ``raw`` computes it), found once for the explanation too.
            centre = None
            if self.model.expected is not None:
                centre = self.model.expected(params, self._history)
                raw = 0.0 if centre is None else abs(value - centre[0]) / centre[1]
            else:
                raw = self.model.raw(params, self._history, value)
            self._surprise = raw
            self._raw.append(raw)
            tail = tail_probability(params, sum(self._raw) / len(self._raw))
            if self.model.extra_tail is not None:
                tail = min(tail, self.model.extra_tail(params, self._history, value))
            if self.model.seasonal is not None:
                tail = min(tail, self.model.seasonal(params, self._season, self._seen, value))
            tail = max(tail, _MIN_TAIL)
            self._likelihood = 1.0 - tail
            if centre is not None:
                self._band = self._expected_band(params, centre)
            score = min(1.0, max(0.0, -math.log10(tail) / _LOG_CAP))
            if (
                not self.model.guards
                and self._run >= STUCK_RUN
                and params["repeats"] < _RARE_REPEATS
            ):
                score = max(score, ALERT_SCORE)
            return score
        finally:
            self._history.append(remembered)

    def _expected_band(self, params: Params, centre: tuple[float, float]) -> tuple[float, float]:
        """The values the reading could have had without its level surprise reaching the
        alert score (given the raw surprises before it that the score averages): the
        model's centre plus or minus that many of its units. A spike, a new extreme or a
        flat line may raise a reading within it all the same."""
        middle, unit = centre
        most = alert_surprise(params) * len(self._raw) - (sum(self._raw) - self._raw[-1])
        reach = max(most, 0.0) * unit
        return float(middle - reach), float(middle + reach)

    def _guard(self, value: float, score: float) -> float:
        """``score`` with the guards of a guarded family applied, which learn ``value``."""
        self._seen += 1
        span = self._high - self._low
        if self._seen > PROBATION and span > 0:
            margin = RANGE_TOLERANCE * span
            beyond = value > self._high + margin or value < self._low - margin
            far = span * RANGE_FAR
            if beyond and (
                self._surprise >= RANGE_SURPRISE
                or value > self._high + far
                or value < self._low - far
            ):
                score = 1.0
        if self._seen > PROBATION and self._run - 1 == max(self._longest, FLAT_LEAST) + 1:
            score = 1.0
        self._low, self._high = min(self._low, value), max(self._high, value)
        if self._seen <= PROBATION:
            return 0.0
        if self._quiet > 0:
            self._quiet -= 1
            return min(score, MUTED)
        if score >= ALERT_SCORE:
            self._quiet = MUTE
        return score
