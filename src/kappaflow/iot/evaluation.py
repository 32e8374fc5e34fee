"""Anomaly scores of recorded series, and how well they find labelled incidents.

A series is a CSV file with the header ``timestamp,value`` (more columns may follow;
``is_anomaly`` or ``label``, where present, is the ground truth of each row). Timestamps
are written like ``2014-04-01 00:00:00`` and read as UTC.

``replay`` runs a series through a trainer and a scorer as the application does: the
readings come in micro-batches (``rounds``: small at first, then of ``batch``); each is
scored with the parameters the trainer published after the batches before it, then
learnt. ``incidents`` and ``judge``
measure the detections against the labels.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from kappaflow.errors import CommandLineError
from kappaflow.iot.models import ALERT_SCORE, Model, Params, Scorer

_LABEL_COLUMNS = ("is_anomaly", "label", "anomaly")
#: The evaluation's cost of a false alarm against a found incident's at most 1 (the
#: weights of the Numenta Anomaly Benchmark's standard profile).
_FALSE_ALARM_COST = 0.11


@dataclass
class Series:
    """One recorded series: its rows' timestamps and values, and labels where given."""

    timestamps: list[str]
    values: list[float]
    labels: list[bool] | None = None
    #: The values as written, to be written back unchanged.
    texts: list[str] = field(default_factory=list)


def parse_time(text: str) -> datetime:
    """``2014-04-01 00:00:00`` (or ISO-8601; without a zone, UTC)."""
    moment = datetime.fromisoformat(text.strip())
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _open(path: Path) -> TextIO:
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")


def read_series(path: Path) -> Series:
    """The series of a CSV file (gzipped where its name ends in ``.gz``)."""
    with _open(path) as source:
        rows = csv.reader(source)
        header = [name.strip().lower() for name in next(rows, [])]
        if header[:2] != ["timestamp", "value"]:
            raise CommandLineError(f"{path}: the header must begin with timestamp,value")
        label_at = next((header.index(c) for c in _LABEL_COLUMNS if c in header), None)
        series = Series([], [], [] if label_at is not None else None)
        for number, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) < 2:
                raise CommandLineError(f"{path}:{number}: a row needs a timestamp and a value")
            try:
                parse_time(row[0])
            except ValueError:
                raise CommandLineError(
                    f"{path}:{number}: {row[0]!r} is not a timestamp like 2014-04-01 00:00:00"
                ) from None
            series.timestamps.append(row[0])
            series.values.append(_number(row[1]))
            series.texts.append(row[1])
            if series.labels is not None and label_at is not None:
                series.labels.append(_number(row[label_at]) > 0)
    return series


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def write_scores(path: Path, series: Series, scores: Sequence[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["timestamp", "value", "anomaly_score"])
        for stamp, text, score in zip(series.timestamps, series.texts, scores, strict=True):
            rows.writerow([stamp, text, f"{score:.6f}"])


#: The first micro-batch of a replay; each next one is twice as large, up to ``batch``, so
#: that a series is scored from its first dozens of readings on, and then in large rounds.
FIRST_BATCH = 16


def rounds(length: int, batch: int) -> list[range]:
    """The rows of each micro-batch of a replay of ``length`` rows: ``FIRST_BATCH`` rows,
    then twice as many each time, up to ``batch`` rows."""
    found: list[range] = []
    begin, size = 0, min(FIRST_BATCH, batch)
    while begin < length:
        found.append(range(begin, min(begin + size, length)))
        begin += size
        size = min(size * 2, batch)
    return found


def replay(values: Sequence[float], model: Model, batch: int) -> list[float]:
    """Each value's score, scored with the parameters of the batches before its own."""
    trainer = model.trainer()
    scorer = Scorer(model)
    params: Params | None = None
    scores: list[float] = []
    for rows in rounds(len(values), batch):
        chunk = values[rows.start : rows.stop]
        scores.extend(0.0 if math.isnan(v) else scorer.score(v, params) for v in chunk)
        params = trainer.learn(chunk)
    return scores


@dataclass(frozen=True)
class Incident:
    """Rows ``start`` to ``end`` (exclusive) are labelled anomalous."""

    start: int
    end: int


def incidents(labels: Sequence[bool]) -> list[Incident]:
    found: list[Incident] = []
    start: int | None = None
    for row, anomalous in enumerate([*labels, False]):
        if anomalous and start is None:
            start = row
        elif not anomalous and start is not None:
            found.append(Incident(start, row))
            start = None
    return found


@dataclass
class Verdict:
    """Detections against incidents, over one series or summed over many."""

    incidents: int = 0
    found: int = 0
    alarms: int = 0
    false_alarms: int = 0
    #: Rows outside every incident's window, and those of them scored at or above the
    #: threshold: how often a normal reading would raise a detection.
    quiet_rows: int = 0
    false_rows: int = 0
    #: Rows from each found incident's start to its first detection.
    delays: list[int] = field(default_factory=list)
    #: The Numenta-style score's raw sum and its null (nothing detected) and best values.
    nab: float = 0.0
    nab_null: float = 0.0
    nab_best: float = 0.0

    def add(self, other: Verdict) -> None:
        self.incidents += other.incidents
        self.found += other.found
        self.alarms += other.alarms
        self.false_alarms += other.false_alarms
        self.quiet_rows += other.quiet_rows
        self.false_rows += other.false_rows
        self.delays += other.delays
        self.nab += other.nab
        self.nab_null += other.nab_null
        self.nab_best += other.nab_best

    @property
    def precision(self) -> float:
        hits = self.alarms - self.false_alarms
        return hits / self.alarms if self.alarms else 0.0

    @property
    def recall(self) -> float:
        return self.found / self.incidents if self.incidents else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def nab_score(self) -> float:
        """0 for detecting nothing, 100 for finding every incident at once, no false alarm."""
        span = self.nab_best - self.nab_null
        return 100.0 * (self.nab - self.nab_null) / span if span else 0.0

    def to_json(self) -> dict[str, float | int | None]:
        ordered = sorted(self.delays)
        return {
            "incidents": self.incidents,
            "found": self.found,
            "alarms": self.alarms,
            "false_alarms": self.false_alarms,
            "false_row_share": round(self.false_rows / self.quiet_rows, 6)
            if self.quiet_rows
            else None,
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "f1": round(self.f1, 4),
            "median_delay_rows": ordered[len(ordered) // 2] if ordered else None,
            "nab_score": round(self.nab_score, 2),
        }


def _early_credit(position: int, window: Incident) -> float:
    """Near 1 for a detection at the window's start, 0 at its end (a scaled sigmoid)."""
    relative = (position - window.end) / max(window.end - window.start, 1)
    return 2.0 / (1.0 + math.exp(5.0 * relative)) - 1.0


def judge(
    scores: Sequence[float], labels: Sequence[bool], threshold: float = ALERT_SCORE
) -> Verdict:
    """Detections (runs of rows scored at or above ``threshold``; each run is one alarm)
    against the labelled incidents. An incident is found by an alarm that begins within
    its window: the labelled rows, stretched to a tenth of the series over the number of
    incidents where shorter, as the Numenta Anomaly Benchmark sizes its windows."""
    truth = incidents(labels)
    verdict = Verdict(incidents=len(truth))
    if truth:
        least = max(1, len(labels) // (10 * len(truth)))
        windows = [Incident(i.start, max(i.end, min(i.start + least, len(labels)))) for i in truth]
    else:
        windows = []
    verdict.nab_null = -float(len(windows))
    verdict.nab_best = sum(_early_credit(w.start, w) for w in windows)
    windowed = [False] * len(scores)
    for w in windows:
        for row in range(w.start, min(w.end, len(scores))):
            windowed[row] = True
    verdict.quiet_rows = windowed.count(False)
    verdict.false_rows = sum(
        s >= threshold and not w for s, w in zip(scores, windowed, strict=True)
    )
    first: dict[int, int] = {}
    alarm_rows = [
        row
        for row, score in enumerate(scores)
        if score >= threshold and (row == 0 or scores[row - 1] < threshold)
    ]
    window_at = 0
    for row in alarm_rows:
        verdict.alarms += 1
        while window_at < len(windows) and windows[window_at].end <= row:
            window_at += 1
        inside = window_at < len(windows) and windows[window_at].start <= row
        if inside:
            first.setdefault(window_at, row)
        else:
            verdict.false_alarms += 1
            verdict.nab -= _FALSE_ALARM_COST
    for index, window in enumerate(windows):
        if index in first:
            verdict.found += 1
            verdict.delays.append(first[index] - window.start)
            verdict.nab += _early_credit(first[index], window)
        else:
            verdict.nab -= 1.0
    return verdict


def corpus(root: Path) -> list[Path]:
    """Every CSV file under ``root`` (``.csv``, or gzipped ``.csv.gz``), in a stable order."""
    found = [*root.rglob("*.csv"), *root.rglob("*.csv.gz")]
    return sorted(path for path in found if path.is_file())


def scores_name(name: str) -> str:
    """Where the scores of the series at relative path ``name`` go: the same path, as
    plain CSV."""
    return name.removesuffix(".gz")
