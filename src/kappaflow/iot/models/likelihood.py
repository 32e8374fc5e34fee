"""A reading's surprise against its recent readings, scored as a likelihood, once an incident.

The raw surprise is the distance of a reading from the median of the ``WINDOW`` readings
before it, in their median absolute deviations (scaled to a standard deviation for normal
noise), and never in less than ``FLOOR`` of the range the series has shown nor ``USUAL`` of
a window's usual deviation on the series (learnt): a constant stretch does not make the
next small move a ten-thousand-sigma event. The mean of the last
``SMOOTH`` surprises is scored against the distribution of those the trainer saw on the
same series (``scoring.tail_probability``: a learnt exponential tail above two spreads, a
normal one below), as Numenta's anomaly likelihood scores the short mean of its raw scores
against their long-run distribution; the score is ``-log10`` of that tail over 10, so 0.5
(the alert score) is a surprise seen once in 100,000 readings.

A second surprise is scored beside it, against its own distribution: how far the last one
or two readings stood out from both their neighbours (a spike that came back), in median
changes from reading to reading; a square wave's steps, which make the first surprise
common, are no spikes. The score is the larger of the two.

A third, where the series repeats itself (``season``): the reading's distance from the
cycle the trainer learnt at its phase, so that a cycle that stops, at its mean or
anywhere, is found within half a cycle where no reading is far from recent ones; it must
be ``season.RARER`` times rarer than the others to score the same.

The window is the scorer's own last readings, so the level follows a level shift within
half a window (the new normal), and after the first alarm the readings of a new level are
not surprising for long. The scorer adds what no distribution of surprises sees
(``Model.guards``): a reading beyond the range seen so far by more than 5 % of it, and a
value repeated for longer than any repeat before it, score 1.0; no reading scores during
the probation period; after an alarm the next ``MUTE`` readings are held under the alert
score (one alarm per incident).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from operator import sub
from typing import Any

from kappaflow.iot.models.base import (
    _SURPRISE_RATE,
    _TAIL_CAP,
    _TAIL_RATE,
    _TAIL_SCALE_PRIOR,
    _TAIL_SCALE_WEIGHT,
    _TAIL_SHARE_PRIOR,
    _TAIL_SHARE_WEIGHT,
    TAIL_FROM,
    Model,
    Params,
    Trainer,
)
from kappaflow.iot.models.scoring import alert_surprise, tail_probability
from kappaflow.iot.models.season import RARER, Profile, Season, unit_for

WINDOW = 64
#: The widths of a spike, in readings, that ``spike_surprise`` looks for.
SPIKE_WIDTHS = (1, 2)
#: The share of the usual deviation of a window (learnt) below which a window's deviation
#: is not taken, and how fast that usual deviation forgets.
USUAL = 0.5
_USUAL_RATE = 1.0 / 500.0
#: Readings in the window before a surprise is measured.
LEAST = 8
SMOOTH = 2
FLOOR = 0.01
_MAD_TO_SD = 1.4826
_TINY = 1e-12


def median_spread(window: Sequence[float]) -> tuple[float, float]:
    """The median of ``window`` and its median absolute deviation, scaled to a deviation."""
    ordered = sorted(window)
    middle = ordered[len(ordered) // 2]
    # map, not a generator: this runs several times a reading (benchmarks/iot-models.md).
    deviations = sorted(map(abs, map(sub, ordered, repeat(middle, len(ordered)))))
    return middle, deviations[len(deviations) // 2] * _MAD_TO_SD


def window_centre(
    window: Sequence[float], span: float, usual: float = 0.0
) -> tuple[float, float] | None:
    """The median of ``window`` and its (scaled) median absolute deviation, taken to be no
    less than ``FLOOR`` of ``span`` nor ``USUAL`` of the ``usual`` deviation (a window gone
    flat does not make the next move a thousand-sigma event); None while the window holds
    fewer than ``LEAST`` readings."""
    if len(window) < LEAST:
        return None
    middle, spread = median_spread(window)
    return middle, max(spread, FLOOR * span, USUAL * usual, _TINY)


def window_surprise(
    window: Sequence[float], value: float, span: float, usual: float = 0.0
) -> float:
    """``value``'s distance from the median of ``window`` in its (scaled, floored) median
    absolute deviations (``window_centre``); 0 while the window holds fewer than ``LEAST``
    readings."""
    centre = window_centre(window, span, usual)
    if centre is None:
        return 0.0
    middle, unit = centre
    return abs(value - middle) / unit


def spike_surprise(window: Sequence[float], value: float, span: float, usual: float = 0.0) -> float:
    """How far the last one or two readings of ``window`` stood out from both the reading
    before them and ``value`` (a spike that came back), in the window's median absolute
    change from reading to reading (scaled to a deviation; no less than ``FLOOR`` of
    ``span`` nor ``USUAL`` of the ``usual`` deviation). A step up or down that stays, as a
    square wave's, is no spike."""
    if len(window) < LEAST:
        return 0.0
    recent = list(window)
    changes: list[float] = sorted(map(abs, map(sub, recent[1:], recent[:-1])))
    scale = max(changes[len(changes) // 2] * _MAD_TO_SD, FLOOR * span, USUAL * usual, _TINY)
    most = 0.0
    for width in SPIKE_WIDTHS:
        top, before = recent[-width:], recent[-width - 1]
        most = max(most, min(top) - max(before, value), min(before, value) - max(top))
    return most / scale


class SurpriseTail:
    """The distribution of a second surprise, learnt as ``Trainer`` learns its own: a mean
    and spread that forget slowly, and the share and scale of the tail above two spreads."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 1.0, 1.0, 0
        self.share, self.scale = _TAIL_SHARE_PRIOR, _TAIL_SCALE_PRIOR
        self.counted, self.seen = 0, 0

    def learn(self, raw: float) -> None:
        spread = math.sqrt(self.var)
        raw = min(raw, self.mean + 6.0 * spread)
        excess = raw - (self.mean + TAIL_FROM * spread)
        share_rate = max(_SURPRISE_RATE, 1.0 / (self.counted + _TAIL_SHARE_WEIGHT))
        self.counted += 1
        self.share += share_rate * ((1.0 if excess > 0 else 0.0) - self.share)
        if excess > 0:
            excess = min(excess, _TAIL_CAP * self.scale)
            rate = max(_TAIL_RATE, 1.0 / (self.seen + _TAIL_SCALE_WEIGHT))
            self.scale += rate * (excess - self.scale)
            self.seen += 1
        self.count += 1
        rate = max(_SURPRISE_RATE, 1.0 / (self.count + 1))
        delta = raw - self.mean
        self.mean += rate * delta
        self.var = (1.0 - rate) * (self.var + rate * delta * delta)

    def published(self) -> list[float]:
        """``[mean, spread, tail start, tail share, tail scale]``."""
        spread = math.sqrt(self.var)
        return [self.mean, spread, self.mean + TAIL_FROM * spread, self.share, self.scale]


class LikelihoodTrainer(Trainer):
    name = "likelihood"
    # The window's spread as surprise() found it, for update(); class-level too, so that
    # a trainer pickled without it (in a training job's state) goes on learning.
    _spread: float | None = None
    # The seasonal term and its surprise's distribution; None in a trainer pickled before
    # them (made at its next reading).
    _profile: Profile | None = None
    _seasons: SurpriseTail | None = None

    def __init__(self) -> None:
        super().__init__()
        self.low = math.inf
        self.high = -math.inf
        self._window: deque[float] = deque(maxlen=WINDOW)
        self._recent: deque[float] = deque(maxlen=SMOOTH)
        self._pending: float | None = None
        self._spikes = SurpriseTail()
        self.usual = 0.0
        self._windows = 0
        self._profile = Profile()
        self._seasons = SurpriseTail()

    def _span(self) -> float:
        return self.high - self.low if self.high > self.low else 0.0

    def surprise(self, value: float) -> float:
        # The short mean the scorer scores; the raw surprise and the window's spread are
        # kept for update(), which would compute them again.
        raw, self._spread = 0.0, None
        if len(self._window) >= LEAST:
            middle, spread = median_spread(self._window)
            unit = max(spread, FLOOR * self._span(), USUAL * self.usual, _TINY)
            raw, self._spread = abs(value - middle) / unit, spread
        self._pending = raw
        self._spikes.learn(spike_surprise(self._window, value, self._span(), self.usual))
        return (sum(self._recent) + raw) / (len(self._recent) + 1)

    def update(self, value: float) -> None:
        raw, spread = self._pending, self._spread
        if raw is None:
            raw = window_surprise(self._window, value, self._span(), self.usual)
        self._pending = self._spread = None
        if len(self._window) >= LEAST:
            self._windows += 1
            rate = max(_USUAL_RATE, 1.0 / self._windows)
            if spread is None:
                spread = median_spread(self._window)[1]
            self.usual += rate * (spread - self.usual)
        self._recent.append(raw)
        self._window.append(value)
        self.low, self.high = min(self.low, value), max(self.high, value)
        if self._profile is None or self._seasons is None:
            self._profile, self._seasons = Profile(), SurpriseTail()
        seasonal = self._profile.learn(self.n, value, self._span())
        if seasonal is not None:
            self._seasons.learn(seasonal)

    def state(self) -> dict[str, Any]:
        # Before any reading, no range: published as 0 to 0 (JSON has no infinity).
        seen = self.high >= self.low
        return {
            "low": self.low if seen else 0.0,
            "high": self.high if seen else 0.0,
            "usual": self.usual,
            "spike": self._spikes.published(),
            **(self._profile or Profile()).state(),
            "season_tail": (self._seasons or SurpriseTail()).published(),
        }


def _raw(params: Params, history: Sequence[float], value: float) -> float:
    span = max(float(params["high"]) - float(params["low"]), 0.0)
    return window_surprise(history, value, span, float(params["usual"]))


def _expected(params: Params, history: Sequence[float]) -> tuple[float, float] | None:
    span = max(float(params["high"]) - float(params["low"]), 0.0)
    return window_centre(history, span, float(params["usual"]))


def _spike_tail(params: Params, history: Sequence[float], value: float) -> float:
    """How often the trainer saw a spike as large as the one ``value`` ends, if any."""
    span = max(float(params["high"]) - float(params["low"]), 0.0)
    mean, spread, start, share, scale = params["spike"]
    seen = {"surprise": [mean, spread], "tail": [start, share, scale]}
    return tail_probability(seen, spike_surprise(history, value, span, float(params["usual"])))


def _season_tail(params: Params, season: Season, index: int, value: float) -> float:
    """How often the trainer saw a seasonal surprise as large as ``value``'s (reading
    ``index`` of its series), learnt in ``season``; 1 where the parameters have no cycle."""
    profile = params.get("profile") or []
    found = params.get("season") or (0.0, 0.0, 0.0)
    span = max(float(params["high"]) - float(params["low"]), 0.0)
    surprise = season.surprise(found, profile, unit_for(float(found[2]), span), index, value)
    if not profile:
        return 1.0
    mean, spread, start, share, scale = params["season_tail"]
    seen = {"surprise": [mean, spread], "tail": [start, share, scale]}
    # Not calm from where the seasonal tail as learnt reaches the alert score (before
    # RARER): a cycle that stopped keeps it there, on and off, for as long as it stays
    # stopped.
    alert = alert_surprise(seen)
    return min(1.0, RARER * tail_probability(seen, season.hold(surprise, alert)))


LIKELIHOOD = Model(
    name="likelihood",
    trainer=LikelihoodTrainer,
    raw=_raw,
    history=WINDOW,
    summary=f"distance from the median of the last {WINDOW} readings, scored as a "
    "likelihood, with range and flat-line guards and one alarm per incident",
    shape={
        "$.low": "double",
        "$.high": "double",
        "$.usual": "double",
        "$.spike": "array<double>",
        "$.profile": "array<double>",
        "$.season": "array<double>",
        "$.season_tail": "array<double>",
    },
    lengths={"$.spike": 5, "$.season": 3, "$.season_tail": 5},
    smooth=SMOOTH,
    guards=True,
    extra_tail=_spike_tail,
    expected=_expected,
    seasonal=_season_tail,
)
