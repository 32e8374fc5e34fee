"""A seasonal term: the reading against where its cycle would have it.

Where a series repeats itself (a machine's square wave, a day at hourly sampling), a
reading is expected near the cycle's value at its phase. The trainer finds the period,
in readings, by autocorrelation over its last ``BUFFER`` readings (``find_period``: the
first peak of at least ``PEAK`` correlation that rises ``PROMINENCE`` above the trough
before it, so that drift, whose autocorrelation only falls, has none), and learns the
cycle's value at each phase (``Profile``: per phase, a running mean that moves by at most
``CLIP`` units a visit, so that a stretch without the cycle is not learnt as the cycle).
A period is found from the readings' count, not their timestamps: a missing reading moves
the phase by one, so the profile is read at the phase and at its neighbours, the closest.

The seasonal surprise (``Season``) is a reading's distance from the profile at its phase,
after a level that follows the rest (``LEVEL_RATE``: a level shift or a drift is the
window's business, not the cycle's), in the usual such distance (learnt) and averaged
over a few readings (``SMOOTH_RATE``). A perfectly periodic series keeps it small; a cycle
that stops, at its mean or anywhere, makes it as large as the cycle's swing within one
half-period. It is scored against its own distribution, learnt by the trainer, as the
likelihood model scores its other surprises.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

#: The periods looked for, in readings, and the readings searched.
SHORTEST = 8
LONGEST = 320
BUFFER = 1024
#: Readings between two searches for the period.
EVERY = 128
#: The autocorrelation a period must show, and how far above the trough before it.
PEAK = 0.5
PROMINENCE = 0.4
#: Among peaks, the first within this share of the highest (a period's multiples peak too).
FIRST_WITHIN = 0.9
#: Cycles learnt before the profile scores anything.
CYCLES = 3
#: Phases either side of a reading's own whose values it may take.
SLACK = 3
#: Readings, at least, between two seasonal surprises at the alert (``Season.hold``;
#: a cycle's length where longer).
CALM = 0
#: How much rarer than the other surprises a seasonal one must be to score the same: it
#: is learnt from fewer readings, on a profile some readings old.
RARER = 10.0
#: Readings whose seasonal surprise the trainer learns before it publishes the profile.
LEARNT = 200
#: How fast each phase's value learns (per visit), and how many units a visit moves it.

RATE = 0.3
CLIP = 3.0
#: How fast the level of the readings against the profile follows them, how fast the
#: surprise is averaged, and how fast the usual distance forgets.
LEVEL_RATE = 1.0 / 16.0
SMOOTH_RATE = 0.25
UNIT_RATE = 1.0 / 500.0
#: The least unit, as a share of the range seen (as the window's, ``likelihood.FLOOR``).
FLOOR = 0.1
#: The mean absolute distance scaled to a deviation (normal noise).
_ABS_TO_SD = 1.2533
_TINY = 1e-12


def find_period(values: Sequence[float], current: float = 0.0) -> float:
    """The period of ``values`` in readings, to a fraction of one (0: none); ``current``,
    the period found before, is kept while the readings still show it."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    longest = min(LONGEST, n // CYCLES)
    if longest < SHORTEST + 1:
        return 0.0
    x = x - x.mean()
    energy = float(np.dot(x, x))
    if energy <= 0.0:
        return 0.0
    size = 1 << (2 * n - 1).bit_length()
    spectrum = np.fft.rfft(x, size)
    products = np.fft.irfft(spectrum * np.conj(spectrum), size)[: longest + 1]
    # Each lag's correlation over the pairs it has.
    acf = products / (n - np.arange(longest + 1)) * n / energy
    trough = np.minimum.accumulate(acf)
    lag = round(current)
    shown = SHORTEST <= lag <= longest and acf[lag] >= PEAK / 2
    shown = shown and acf[lag] - trough[lag] >= PROMINENCE / 2
    found = _fresh_period(acf, trough, longest)
    if shown:
        # The period seen before, refined where found again within a reading of it.
        return found if found > 0 and abs(found - current) < 1.0 else current
    return found


def _fresh_period(acf: np.ndarray, trough: np.ndarray, longest: int) -> float:
    lags = np.arange(SHORTEST, longest)
    peaks = lags[
        (acf[lags] >= acf[lags - 1])
        & (acf[lags] >= acf[lags + 1])
        & (acf[lags] >= PEAK)
        & (acf[lags] - trough[lags] >= PROMINENCE)
    ]
    if len(peaks) == 0:
        return 0.0
    highest = float(acf[peaks].max())
    first = int(peaks[acf[peaks] >= FIRST_WITHIN * highest][0])
    # The period to a fraction of a reading, from the peaks of its multiples in reach,
    # each found near where the last estimate puts it (a missing reading now and then
    # makes the period in readings a little shorter than the cycle's).
    period = float(first)
    for times in range(2, (longest - 1) // first + 1):
        near = round(times * period)
        if near + 1 > longest - 1:
            break
        top = max(range(max(1, near - 1), min(longest - 1, near + 1) + 1), key=lambda k: acf[k])
        before, at, after = acf[top - 1], acf[top], acf[top + 1]
        bend = before - 2.0 * at + after
        offset = 0.5 * (before - after) / bend if bend < 0 else 0.0
        period = (top + max(-0.5, min(0.5, offset))) / times
    return float(period)


def phase_of(period: float, anchor: float, buckets: int, index: int) -> int:
    """The profile's bucket for reading ``index`` of a series of ``period`` whose phase 0
    was at reading ``anchor``."""
    return min(buckets - 1, int((index - anchor) % period / period * buckets))


def outside(
    profile: Sequence[float], period: float, anchor: float, index: int, value: float, level: float
) -> float:
    """How far ``value``, less ``level``, lies outside the profile's values at ``index``'s
    phase and the ``SLACK`` phases either side (0 within them; negative below): a missing
    reading moves the phase, and a step of the cycle may come a reading early or late."""
    buckets = len(profile)
    phase = phase_of(period, anchor, buckets, index)
    low = high = profile[phase]
    for step in range(1, min(SLACK, buckets // 2) + 1):
        for other in (profile[(phase + step) % buckets], profile[(phase - step) % buckets]):
            low, high = min(low, other), max(high, other)
    x = value - level
    if x > high:
        return x - high
    if x < low:
        return x - low
    return 0.0


class Season:
    """The running level and averaged surprise of a series' readings against a profile
    (scorer and trainer alike)."""

    def __init__(self) -> None:
        self.buckets = 0
        self.level: float | None = None
        self.smooth = 0.0
        # The last reading's distance from the profile (``outside``).
        self.last = 0.0
        # Readings since the surprise last reached the alert (``hold``).
        self.calm = CALM

    def hold(self, surprise: float, alert: float) -> float:
        """``surprise``, or 0 where it reaches ``alert`` within a cycle's length of the last
        that did: a cycle that stops alarms once, not again each time it would have turned
        (a stop that lasts is the window's new normal; the profile learns it slowly)."""
        if surprise < alert:
            self.calm += 1
            return surprise
        armed = self.calm >= max(self.buckets, CALM)
        self.calm = 0
        return surprise if armed else 0.0

    def surprise(
        self,
        season: Sequence[float],
        profile: Sequence[float],
        unit: float,
        index: int,
        value: float,
    ) -> float:
        """The averaged seasonal surprise of ``value``, reading ``index`` of its series,
        against ``profile`` with ``season``'s period and anchor (0 without a profile, and
        for the first reading against one of another length), learnt."""
        if len(profile) != self.buckets:
            self.buckets, self.level, self.smooth, self.calm = len(profile), None, 0.0, CALM
        if not profile:
            return 0.0
        period, anchor = float(season[0]), float(season[1])
        if self.level is None:
            self.level = value - profile[phase_of(period, anchor, len(profile), index)]
            self.last = 0.0
            return 0.0
        r = outside(profile, period, anchor, index, value, self.level)
        self.last = r
        self.level += LEVEL_RATE * r
        self.smooth += SMOOTH_RATE * (abs(r) / max(unit, _TINY) - self.smooth)
        return self.smooth

    def state(self) -> list[float] | None:
        if self.level is None:
            return None
        return [float(self.buckets), self.level, self.smooth, float(self.calm)]

    @classmethod
    def restore(cls, memory: Sequence[float] | None) -> Season:
        season = cls()
        if memory is not None:
            season.buckets, season.level, season.smooth, season.calm = (
                int(memory[0]),
                float(memory[1]),
                float(memory[2]),
                int(memory[3]),
            )
        return season


class Profile:
    """What the trainer learns of a series' cycle: its period, the value at each phase and
    the usual distance of a reading from it."""

    def __init__(self) -> None:
        self.period = 0.0
        self.anchor = 0.0
        self.values: list[float] = []
        self.visits = 0
        self.unit = 0.0
        self.units = 0
        self.recent: deque[float] = deque(maxlen=BUFFER)
        self.season = Season()

    def ready(self) -> bool:
        return self.period > 0 and self.visits >= CYCLES * len(self.values)

    def published(self) -> list[float]:
        """The profile, once its surprise has been learnt for ``LEARNT`` readings (else
        none: the scorer scores no seasonal surprise)."""
        return self.values if self.ready() and self.units >= LEARNT else []

    def learn(self, index: int, value: float, span: float) -> float | None:
        """Learn reading ``index``; its seasonal surprise as a scorer with the profile
        before it would find it (None while the profile does not score)."""
        raw: float | None = None
        far = False
        if self.ready():
            unit = unit_for(self.unit, span)
            raw = self.season.surprise(self._season(), self.values, unit, index, value)
            r = self.season.last
            far = abs(r) > CLIP * unit
            self.units += 1
            rate = max(UNIT_RATE, 1.0 / self.units)
            self.unit += rate * (abs(r) * _ABS_TO_SD - self.unit)
        if self.period > 0:
            phase = phase_of(self.period, self.anchor, len(self.values), index)
            step = value - self.values[phase]
            if self.visits < len(self.values):
                self.values[phase] = value
            elif far:
                # Far from the cycle (a stop of it, an outlier): learnt by a unit at most.
                bound = unit_for(self.unit, span)
                self.values[phase] += RATE * max(-bound, min(bound, step))
            else:
                # Near the cycle's values about its phase: learnt as it is, so that the
                # profile follows a phase moved by a missing reading.
                self.values[phase] += RATE * step
            self.visits += 1
        self.recent.append(value)
        if (index + 1) % EVERY == 0:
            found = find_period(self.recent, self.period)
            if found > 0 and self.period > 0 and int(found) == len(self.values):
                # The same period, refined: phase 0 moves so that the next reading's phase
                # stays where it was.
                at = (index + 1 - self.anchor) % self.period / self.period
                self.period, self.anchor = found, index + 1 - at * found
            elif found != self.period:
                self.period, self.anchor, self.visits = found, 0.0, 0
                self.values = [0.0] * int(found)
                self.unit, self.units = 0.0, 0
                self.season = Season()
        return raw

    def state(self) -> dict[str, Any]:
        profile = self.published()
        return {
            "season": [*self._season(), self.unit] if profile else [0.0, 0.0, 0.0],
            "profile": profile,
        }

    def _season(self) -> list[float]:
        return [self.period, self.anchor]


def unit_for(unit: float, span: float) -> float:
    """The unit of a seasonal surprise: the usual distance (learnt), no less than
    ``FLOOR`` of the range seen."""
    return max(unit, FLOOR * span, _TINY)
