"""The anomaly models on the repository's own labelled series, by the NAB rules.

Two sets of series from ``kappaflow.iot.synthetic``, made from different seeds: the
development set, on which models, their constants and the default threshold are chosen,
and the held-out set, scored once with what the development set chose. Each model replays
each series as ``kappaflow iot evaluate --path local`` does (rounds of 16, 32, ... up to
``batch`` readings, each scored with the parameters of the rounds before) and is scored
at the alert score by ``kappaflow.iot.nab``, in its three profiles.

Beside them, a rolling z-score (the distance of a reading from the mean of the ``window``
readings before it, in their standard deviations): its window and threshold are the best
on the development set, and the held-out set is scored with them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kappaflow.iot.evaluation import Series, corpus, read_series, replay
from kappaflow.iot.models import ALERT_SCORE, MODELS
from kappaflow.iot.nab import Report, score_series
from kappaflow.iot.synthetic import write_corpus

#: The two sets: name, seed, number of series.
SETS = (("dev", 1, 28), ("holdout", 2, 28))
ZSCORE_WINDOWS = (50, 200, 1000)
ZSCORE_THRESHOLDS = (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)


def ensure(data: Path) -> dict[str, dict[str, Series]]:
    """Each set's series by file name, written first where missing."""
    found: dict[str, dict[str, Series]] = {}
    for name, seed, count in SETS:
        folder = data / name
        if not folder.exists() or not corpus(folder):
            write_corpus(folder, seed, count)
        found[name] = {p.name: read_series(p) for p in corpus(folder)}
    return found


def zscores(values: Sequence[float], window: int) -> np.ndarray:
    """Each reading's distance from the mean of the ``window`` readings before it, in
    their standard deviations (0 before ``window`` readings, or where they are constant)."""
    x = np.asarray(values, dtype=float)
    # A missing reading is taken as the one before it.
    for i in np.flatnonzero(~np.isfinite(x)):
        x[i] = x[i - 1] if i else 0.0
    x = x - x[0]
    sums = np.concatenate([[0.0], np.cumsum(x)])
    squares = np.concatenate([[0.0], np.cumsum(x * x)])
    rows = np.arange(len(x))
    begin = np.maximum(rows - window, 0)
    count = rows - begin
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (sums[rows] - sums[begin]) / count
        var = (squares[rows] - squares[begin]) / count - mean * mean
        z: np.ndarray = np.abs(x - mean) / np.sqrt(var)
    z[(count < window) | ~np.isfinite(z)] = 0.0
    return z


def nab(
    series: dict[str, Series], scores: Mapping[str, Sequence[float] | np.ndarray], threshold: float
) -> Report:
    report = Report()
    for name, s in series.items():
        assert s.labels is not None
        report.add(score_series(scores[name], s.labels, threshold))
    return report


def run(data: Path, out: Path, models: Sequence[str], batch: int) -> dict[str, Any]:
    sets = ensure(data)
    results: dict[str, Any] = {"threshold": ALERT_SCORE, "batch": batch, "models": {}}
    for model in models:
        entry: dict[str, Any] = {}
        for name, series in sets.items():
            began = time.perf_counter()
            scores = {k: replay(s.values, MODELS[model], batch) for k, s in series.items()}
            rows = sum(len(s.values) for s in series.values())
            entry[name] = {
                **nab(series, scores, ALERT_SCORE).to_json(),
                "readings_per_s": round(rows / (time.perf_counter() - began)),
            }
        results["models"][model] = entry
    best: tuple[float, int, float] | None = None
    dev = sets["dev"]
    for window in ZSCORE_WINDOWS:
        z = {k: zscores(s.values, window) for k, s in dev.items()}
        for threshold in ZSCORE_THRESHOLDS:
            standard = nab(dev, z, threshold).tallies["standard"].normalised
            if best is None or standard > best[0]:
                best = (standard, window, threshold)
    assert best is not None
    _, window, threshold = best
    results["zscore"] = {"window": window, "threshold": threshold}
    for name, series in sets.items():
        z = {k: zscores(s.values, window) for k, s in series.items()}
        results["zscore"][name] = nab(series, z, threshold).to_json()
    out.write_text(json.dumps(results, indent=2) + "\n")
    return results
