"""What every model shares: its trainer's bookkeeping and the parameters it publishes."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kappaflow.iot.models.season import Season

#: Published parameters: JSON-ready, with ``model``, ``version``, ``n`` (readings learnt),
#: ``surprise`` (mean and spread of the raw surprise seen in training), ``tail`` (where
#: the surprise's upper tail begins, the share of readings in it and its scale) and
#: ``repeats`` (the share of readings equal to the one before) beside each model's own.
Params = dict[str, Any]

#: Readings a model learns before its parameters score anything.
WARMUP = 30
#: How fast the trainer's view of its raw surprise forgets (per reading): a long memory,
#: so that the spread of surprise reflects days of a metric, not its last hour.
_SURPRISE_RATE = 1.0 / 2000.0
_REPEAT_RATE = 1.0 / 500.0
#: Outliers in a row that a forecaster remembers clipped (a spike lasts a few readings);
#: the next is remembered as it is, as the start of a change.
MAX_CLIPPED = 3
#: A value repeated this many times running is a stuck sensor, not a repeat.
STUCK_RUN = 10
#: The surprise's upper tail begins this many spreads above its mean; its share of the
#: readings and the mean excess over that point are learnt (``Trainer._note_tail``), so
#: that a score says how rare a surprise is on the series, whatever its tail's shape.
TAIL_FROM = 2.0
#: What the tail is taken to be before readings show it: a normal deviate's share above
#: two spreads and its mean excess there (in units of a forecast error's spread), each
#: counted as so many readings (``_WEIGHT``) seen.
_TAIL_SHARE_PRIOR = 0.0228
_TAIL_SCALE_PRIOR = 0.37
_TAIL_SHARE_WEIGHT = 50
_TAIL_SCALE_WEIGHT = 5
#: How fast the tail's scale forgets (per reading in the tail) and how many scales an
#: excess counts for at most (an anomaly learnt would widen the tail that judges the next).
_TAIL_RATE = 1.0 / 100.0
_TAIL_CAP = 6.0


class Trainer(ABC):
    """Learns one series in order; ``params`` is what it would publish now."""

    name: str
    # The tail as a trainer begins it; class-level too, so that a trainer pickled by a
    # version without them (in a training job's state) goes on learning with them.
    _tail_share = _TAIL_SHARE_PRIOR
    _tail_scale = _TAIL_SCALE_PRIOR
    _tail_seen = 0
    _tail_counted = 0

    def __init__(self) -> None:
        self.n = 0
        self.version = 0
        self._surprise_mean = 1.0
        self._surprise_var = 1.0
        self._surprises = 0
        self._repeats = 0.0
        self._last: float | None = None
        self._run = 0

    def learn(self, values: Iterable[float]) -> Params:
        """Learn a micro-batch of readings, in order, and return the next version."""
        for value in values:
            if not math.isfinite(value):
                continue
            if self.n >= WARMUP:
                self._note_surprise(self.surprise(value))
            self._run = self._run + 1 if value == self._last else 1
            if self._last is not None and self._run < STUCK_RUN:
                # A stuck stretch is not learnt as repeats: it would make itself normal.
                same = 1.0 if self._run > 1 else 0.0
                self._repeats += _REPEAT_RATE * (same - self._repeats)
            self._last = value
            self.update(value)
            self.n += 1
        self.version += 1
        return self.params()

    def _note_surprise(self, raw: float) -> None:
        # Outliers in training would widen the spread that later outliers are judged by:
        # a surprise is capped at six spreads above the mean before it is learnt.
        cap = self._surprise_mean + 6.0 * math.sqrt(self._surprise_var)
        raw = min(raw, cap)
        self._note_tail(raw)
        self._surprises += 1
        # A running mean and variance at first (from a prior of 1 and 1), then forgetting.
        rate = max(_SURPRISE_RATE, 1.0 / (self._surprises + 1))
        delta = raw - self._surprise_mean
        self._surprise_mean += rate * delta
        self._surprise_var = (1.0 - rate) * (self._surprise_var + rate * delta * delta)

    def _tail_from(self) -> float:
        return self._surprise_mean + TAIL_FROM * math.sqrt(self._surprise_var)

    def _note_tail(self, raw: float) -> None:
        """Learn whether ``raw`` is in the upper tail, and by how much (before the mean and
        spread learn it, so that the tail is judged as the scorer would have judged it)."""
        excess = raw - self._tail_from()
        share_rate = max(_SURPRISE_RATE, 1.0 / (self._tail_counted + _TAIL_SHARE_WEIGHT))
        self._tail_counted += 1
        self._tail_share += share_rate * ((1.0 if excess > 0 else 0.0) - self._tail_share)
        if excess > 0:
            excess = min(excess, _TAIL_CAP * self._tail_scale)
            rate = max(_TAIL_RATE, 1.0 / (self._tail_seen + _TAIL_SCALE_WEIGHT))
            self._tail_scale += rate * (excess - self._tail_scale)
            self._tail_seen += 1

    def params(self) -> Params:
        return {
            "model": self.name,
            "version": self.version,
            "n": self.n,
            "surprise": [self._surprise_mean, math.sqrt(self._surprise_var)],
            "tail": [self._tail_from(), self._tail_share, self._tail_scale],
            "repeats": self._repeats,
            **self.state(),
        }

    @abstractmethod
    def update(self, value: float) -> None:
        """Learn one reading."""

    @abstractmethod
    def surprise(self, value: float) -> float:
        """The raw surprise of ``value`` against what has been learnt so far."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """The model's own parameters, JSON-ready."""


@dataclass(frozen=True)
class Model:
    """A family of models: how to train one, and how to score with its parameters."""

    name: str
    trainer: Callable[[], Trainer]
    #: The raw surprise of a reading given published parameters and the readings before it
    #: (oldest first, at most ``history`` of them).
    raw: Callable[[Params, Sequence[float], float], float]
    history: int
    summary: str
    #: What the scorer remembers of a reading for the next ones' ``raw`` (by default the
    #: reading itself; a forecaster remembers an outlier clipped, as its trainer does).
    remember: Callable[[Params, Sequence[float], float], float] = lambda _p, _h, value: value
    #: The model's own parameters as Spark SQL types by JSON path (``$.coef``:
    #: ``array<double>``), and the lengths of its arrays that are fixed: what a scorer
    #: checks of parameters it reads before it scores with them.
    shape: Mapping[str, str] = field(default_factory=dict)
    lengths: Mapping[str, int] = field(default_factory=dict)
    #: Raw surprises the scorer averages before it scores them (at least; a scorer may be
    #: asked for more).
    smooth: int = 1
    #: Whether the scorer guards the score (``scoring.Scorer``): a probation period, new
    #: extremes and flat lines outlasting any before them, one alarm per incident.
    guards: bool = False
    #: A second surprise's tail probability given the parameters, the readings before and
    #: the reading (None: none), scored beside the first: the score is the larger.
    extra_tail: Callable[[Params, Sequence[float], float], float] | None = None
    #: Where the model expected the next reading, given the parameters and the readings
    #: before it: ``(centre, unit)`` such that ``raw`` is the distance from ``centre`` in
    #: ``unit`` (None: the family has no such centre, as ``hst``; or none yet). The scorer
    #: takes the raw surprise from it where given (once a reading, not twice), and turns
    #: it into the expected range of an alert's explanation (``Scorer.explain``).
    expected: Callable[[Params, Sequence[float]], tuple[float, float] | None] | None = None
    #: A seasonal surprise's tail probability given the parameters, the scorer's seasonal
    #: memory (``season.Season``, which it learns), the reading's index in its series and
    #: the reading (None: none), scored beside the others. Needs ``guards`` (their count
    #: of readings gives the index).
    seasonal: Callable[[Params, Season, int, float], float] | None = None


#: Every family's parameters have these beside their own (``Trainer.params``).
SHAPE: Mapping[str, str] = {
    "$.model": "string",
    "$.version": "bigint",
    "$.n": "bigint",
    "$.surprise": "array<double>",
    "$.tail": "array<double>",
    "$.repeats": "double",
}
LENGTHS: Mapping[str, int] = {"$.surprise": 2, "$.tail": 3}
