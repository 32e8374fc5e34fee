"""Scores of detections by the rules of the Numenta Anomaly Benchmark (NAB).

The rules, as Lavin and Ahmad published them (arXiv:1510.03336) and NAB's scorer
(``nab/sweeper.py``) applies them:

- each labelled anomaly gets a window centred on it, ``int(0.1 * n / k)`` rows long for a
  series of ``n`` rows and ``k`` anomalies, clipped to the series; overlapping windows merge;
- the first ``min(floor(0.15 n), 750)`` rows are the probation period: not scored, and a
  window that begins in it is dropped;
- a window is worth ``-A_FN`` when nothing in it is detected, else its earliest detection's
  ``A_TP * sigma(y) / sigma(-1)``, ``y = -(right - row + 1) / width`` (1 at the window's
  left edge, near 0 at its right), with ``sigma(y) = 2 / (1 + exp(5 y)) - 1``: one true
  positive per window, later ones earn nothing and cost nothing;
- a detection outside every window costs ``A_FP * sigma(y)`` with ``y = (row - right) /
  (width - 1)`` past the window before it (little just after it, ``A_FP`` beyond about a
  window's width), or ``A_FP`` before the first window;
- a corpus' score is the sum over its series, normalised so that never detecting scores 0
  and detecting every window at its left edge with no false positive scores 100.

A labelled anomaly is a run of rows labelled 1: a run of one row is a point label, as
NAB's ``combined_labels.json``; a longer run is taken at its middle row, and its window
covers the run as well (so that NAB's own windows, written as runs of labelled rows, come
back as themselves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Profile:
    """An application profile's weights (NAB's ``config/profiles.json``)."""

    name: str
    tp: float
    fp: float
    fn: float


PROFILES = (
    Profile("standard", tp=1.0, fp=0.11, fn=1.0),
    Profile("reward_low_FP_rate", tp=1.0, fp=0.22, fn=1.0),
    Profile("reward_low_FN_rate", tp=1.0, fp=0.11, fn=2.0),
)
#: Share of a series that is probation, and the most rows it can be.
PROBATION_SHARE = 0.15
PROBATION_CAP = 750
#: Share of a series that its anomalies' windows take together.
WINDOW_SHARE = 0.10


def sigma(y: float) -> float:
    """NAB's scaled sigmoid: near 1 for y = -1, 0 at y = 0, -1 from y = 3 on."""
    if y > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * y)) - 1.0


def probation(length: int) -> int:
    """Rows not scored at the start of a series of ``length`` rows."""
    return int(min(math.floor(PROBATION_SHARE * length), PROBATION_SHARE * 5000))


def anomalies(labels: Sequence[bool]) -> list[tuple[int, int]]:
    """The runs of labelled rows, ``(first, last)`` inclusive."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for row, anomalous in enumerate([*labels, False]):
        if anomalous and start is None:
            start = row
        elif not anomalous and start is not None:
            runs.append((start, row - 1))
            start = None
    return runs


def windows(labels: Sequence[bool]) -> list[tuple[int, int]]:
    """The scored anomaly windows, ``(left, right)`` inclusive, in order."""
    length = len(labels)
    runs = anomalies(labels)
    if not runs:
        return []
    half = int(WINDOW_SHARE * length / len(runs)) // 2
    found: list[tuple[int, int]] = []
    for first, last in runs:
        middle = (first + last) // 2
        left, right = max(0, min(first, middle - half)), min(length - 1, max(last, middle + half))
        if found and left <= found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], right))
        else:
            found.append((left, right))
    begin = probation(length)
    return [w for w in found if w[0] >= begin]


@dataclass
class Tally:
    """One profile's raw score, with a null and a perfect detector's, over one series or
    summed over many."""

    score: float = 0.0
    null: float = 0.0
    perfect: float = 0.0
    windows: int = 0
    found: int = 0
    false_positives: int = 0

    def add(self, other: Tally) -> None:
        self.score += other.score
        self.null += other.null
        self.perfect += other.perfect
        self.windows += other.windows
        self.found += other.found
        self.false_positives += other.false_positives

    @property
    def normalised(self) -> float:
        """0 for never detecting, 100 for every window at its start and no false positive."""
        span = self.perfect - self.null
        return 100.0 * (self.score - self.null) / span if span else 0.0


@dataclass
class Report:
    """Every profile's tally."""

    tallies: dict[str, Tally] = field(default_factory=lambda: {p.name: Tally() for p in PROFILES})

    def add(self, other: Report) -> None:
        for name, tally in other.tallies.items():
            self.tallies[name].add(tally)

    def to_json(self) -> dict[str, object]:
        standard = self.tallies[PROFILES[0].name]
        return {
            "windows": standard.windows,
            "found": standard.found,
            "false_positives": standard.false_positives,
            **{name: round(t.normalised, 2) for name, t in self.tallies.items()},
        }


def _row_weights(length: int, spans: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the window it is in (-1: none), and its unweighted sigmoid value (a
    true positive's credit in a window, a false positive's cost outside)."""
    window_of = np.full(length, -1)
    value = np.full(length, -1.0)
    previous: tuple[int, int] | None = None
    bounds = [*spans, (length, length)]
    row = 0
    for index, (left, right) in enumerate(bounds):
        # Rows before this window, after the one before it.
        for r in range(row, min(left, length)):
            if previous is not None:
                width = previous[1] - previous[0] + 1
                value[r] = sigma((r - previous[1]) / max(width - 1, 1))
        if left >= length:
            break
        width = right - left + 1
        for r in range(left, right + 1):
            window_of[r] = index
            value[r] = sigma(-(right - r + 1) / width)
        previous, row = (left, right), right + 1
    return window_of, value


def score_series(
    scores: Sequence[float] | np.ndarray, labels: Sequence[bool], threshold: float
) -> Report:
    """The NAB tallies of one series' scores, detections being scores >= ``threshold``."""
    length = len(labels)
    spans = windows(labels)
    window_of, value = _row_weights(length, spans)
    detected = np.asarray(scores, dtype=float) >= threshold
    detected[: probation(length)] = False
    top = sigma(-1.0)
    report = Report()
    outside = detected & (window_of < 0)
    fp_cost = float(value[outside].sum())  # each value is in [-1, 0]
    earliest: list[float | None] = []
    for index in range(len(spans)):
        rows = np.flatnonzero(detected & (window_of == index))
        earliest.append(float(value[rows[0]]) if rows.size else None)
    for profile in PROFILES:
        tally = report.tallies[profile.name]
        tally.windows = len(spans)
        tally.found = sum(e is not None for e in earliest)
        tally.false_positives = int(outside.sum())
        tally.null = -profile.fn * len(spans)
        tally.perfect = profile.tp * len(spans)
        tally.score = profile.fp * fp_cost + sum(
            -profile.fn if e is None else profile.tp * e / top for e in earliest
        )
    return report
