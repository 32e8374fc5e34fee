"""Labelled series with the shapes device telemetry has, made from a seed.

Each series is a base signal (a level, noise that is normal, heavy-tailed or counted,
slow drift, daily and weekly cycles where its sampling shows them, a periodic square wave,
quantised flat stretches, harmless recurring bursts) at a scale between 1e-3 and 1e6,
sampled every 1, 5, 10, 15 or 60 minutes with a few rows missing; then none to three
labelled anomalies: a spike, a dip, a level shift that stays (a new normal), a change of
variance, a stuck sensor (a flat line longer than any before it), a dropout to zero, a
square wave or cycle that stops or changes period. An anomaly is labelled at its onset
row, one row per anomaly, as the Numenta Anomaly Benchmark labels its series; its window
(``kappaflow.iot.nab``) is the scorer's business.

``write_corpus`` writes one gzipped CSV per series, ``timestamp,value,is_anomaly``: the
format ``kappaflow iot evaluate`` reads.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

_STEPS_MIN = (1, 5, 5, 10, 15, 60)
_KINDS = ("spike", "dip", "shift", "variance", "stuck", "dropout", "pattern")
_START = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass
class Made:
    """One series: its name, sampling step, rows' values and onset labels."""

    name: str
    step_min: int
    values: np.ndarray
    labels: np.ndarray
    kinds: list[str]


def _noise(rng: np.random.Generator, n: int) -> tuple[np.ndarray, str]:
    kind = rng.choice(["normal", "laplace", "ar", "bursty"])
    if kind == "normal":
        return rng.normal(0.0, 1.0, n), str(kind)
    if kind == "laplace":
        return rng.laplace(0.0, 1.0 / math.sqrt(2.0), n), str(kind)
    if kind == "ar":
        # Correlated noise: a slowly wandering sensor.
        out = np.empty(n)
        phi, level = rng.uniform(0.6, 0.95), 0.0
        shocks = rng.normal(0.0, math.sqrt(1 - phi * phi), n)
        for i in range(n):
            level = phi * level + shocks[i]
            out[i] = level
        return out, str(kind)
    # A cloud server's load: mostly quiet, with short harmless bursts of a few rows.
    base = rng.normal(0.0, 1.0, n)
    bursts = rng.random(n) < 0.01
    base[bursts] += rng.exponential(3.0, int(bursts.sum()))
    return base, str(kind)


def _base(rng: np.random.Generator, n: int, step_min: int) -> tuple[np.ndarray, float, list[str]]:
    """The normal signal in units of its noise, and the noise's share of it."""
    noise, noise_kind = _noise(rng, n)
    shape: list[str] = [noise_kind]
    t = np.arange(n) * step_min / 1440.0  # days
    signal = np.zeros(n)
    day_rows, week_rows = 1440 / step_min, 7 * 1440 / step_min
    if day_rows * 3 <= n and rng.random() < 0.6:
        amp = rng.uniform(2.0, 12.0)
        phase = rng.uniform(0, 2 * math.pi)
        daily = np.sin(2 * math.pi * t + phase)
        if rng.random() < 0.4:
            # Office hours: a sharp plateau by day instead of a sine.
            daily = (daily > 0.3).astype(float) * 2 - 1
        signal += amp * daily
        shape.append("daily")
    if week_rows * 2 <= n and rng.random() < 0.5:
        weekend = ((np.floor(t) % 7) >= 5).astype(float)
        signal -= rng.uniform(1.0, 6.0) * weekend
        shape.append("weekly")
    if rng.random() < 0.25:
        period = int(rng.integers(20, 200))
        duty = rng.uniform(0.2, 0.6)
        wave = ((np.arange(n) % period) < duty * period).astype(float)
        signal += rng.uniform(5.0, 20.0) * wave
        noise *= rng.uniform(0.0, 0.3)  # a machine's cycle: clean
        shape.append(f"square{period}")
    if rng.random() < 0.4:
        # Drift: a slow random walk or a trend, a few noise units over the series.
        walk = np.cumsum(rng.normal(0.0, 1.0, n))
        signal += rng.uniform(1.0, 6.0) * walk / max(np.abs(walk).max(), 1e-9)
        shape.append("drift")
    if rng.random() < 0.15:
        # A periodic harmless burst (a backup every few hours): normal, and recurring.
        every = int(rng.integers(30, 300))
        burst = (np.arange(n) % every) < 3
        signal += rng.uniform(4.0, 10.0) * burst
        shape.append("cron")
    return signal + noise, float(rng.uniform(0.5, 3.0)), shape


def _anomaly(kind: str, rng: np.random.Generator, x: np.ndarray, at: int, zero: np.ndarray) -> None:
    """Put an anomaly of ``kind`` into ``x`` from row ``at`` on (in place); a dropout's
    rows are marked in ``zero``, to read 0 whatever the series' scale and offset."""
    n = len(x)
    sd = max(float(np.std(np.diff(x[:at]))) / math.sqrt(2.0), 1e-9)
    span = float(np.percentile(x[:at], 99) - np.percentile(x[:at], 1)) or sd
    if kind in ("spike", "dip"):
        size = rng.uniform(0.5, 1.5) * span + rng.uniform(4, 8) * sd
        x[at : at + int(rng.integers(1, 4))] += size if kind == "spike" else -size
    elif kind == "shift":
        x[at:] += rng.choice([-1, 1]) * (rng.uniform(0.4, 1.0) * span + 4 * sd)
    elif kind == "variance":
        end = min(n, at + int(rng.integers(n // 20, n // 5)))
        x[at:end] += rng.normal(0.0, rng.uniform(4.0, 8.0) * sd + 0.3 * span, end - at)
    elif kind == "stuck":
        end = min(n, at + int(rng.integers(n // 20, n // 8)))
        x[at:end] = x[at]
    elif kind == "dropout":
        end = min(n, at + int(rng.integers(5, n // 20)))
        zero[at:end] = True
    else:
        # The pattern stops: the series loses its cycles and wave for a stretch, keeping
        # its level (a pump that stops cycling, traffic that stops following the day).
        end = min(n, at + int(rng.integers(n // 15, n // 6)))
        x[at:end] = np.median(x[:at]) + rng.normal(0.0, sd, end - at)


def make_series(seed: int, name: str) -> Made:
    """One labelled series from ``seed``."""
    rng = np.random.default_rng(seed)
    step_min = int(rng.choice(_STEPS_MIN))
    n = int(rng.integers(2000, 4500))
    x, _, shape = _base(rng, n, step_min)
    count = int(rng.choice([0, 1, 1, 2, 2, 3]))
    labels = np.zeros(n, dtype=bool)
    zero = np.zeros(n, dtype=bool)
    kinds: list[str] = []
    if count:
        # Onsets after the probation period, spaced so that windows do not merge.
        gap = (n - int(0.2 * n)) // count
        for k in range(count):
            at = int(0.2 * n) + k * gap + int(rng.integers(gap // 5, gap - gap // 5))
            kind = str(rng.choice(_KINDS))
            if kind == "pattern" and not any(s.startswith("square") or s == "daily" for s in shape):
                kind = "shift"
            _anomaly(kind, rng, x, at, zero)
            labels[at] = True
            kinds.append(kind)
    # Scale and offset: from thousandths to millions.
    scale = 10.0 ** rng.uniform(-3, 6)
    offset = rng.uniform(0, 50) if rng.random() < 0.7 else 0.0
    values = np.where(zero, 0.0, (x + offset) * scale)
    if rng.random() < 0.3:
        # A sensor of coarse resolution: readings in steps of half the noise's deviation.
        resolution = scale * 0.5
        values = np.round(values / resolution) * resolution
    return Made(name, step_min, values, labels, [*shape, *kinds])


def write_series(path: Path, made: Made, missing: np.ndarray) -> None:
    """``made`` as gzipped CSV, without the rows ``missing`` marks (a labelled row stays)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # No time in the gzip header: the same seed writes the same bytes.
    with io.TextIOWrapper(gzip.GzipFile(path, "wb", mtime=0), newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["timestamp", "value", "is_anomaly"])
        for row, (value, label) in enumerate(zip(made.values, made.labels, strict=True)):
            if missing[row] and not label:
                continue
            stamp = _START + timedelta(minutes=made.step_min * row)
            rows.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S"), f"{value:.6g}", int(label)])


def write_corpus(out: Path, seed: int, count: int) -> list[Path]:
    """``count`` series from ``seed``, as ``out/series-NN.csv.gz``; a manifest of their
    shapes in ``out/manifest.tsv``."""
    out.mkdir(parents=True, exist_ok=True)
    seeds = np.random.default_rng(seed).integers(0, 2**31, count)
    written: list[Path] = []
    manifest = [["file", "rows", "step_min", "shape"]]
    for index, sub in enumerate(seeds):
        name = f"series-{index:02d}.csv.gz"
        made = make_series(int(sub), name)
        gaps = np.random.default_rng(int(sub) + 1).random(len(made.values)) < 0.003
        path = out / name
        write_series(path, made, gaps)
        manifest.append([name, str(len(made.values)), str(made.step_min), " ".join(made.kinds)])
        written.append(path)
    with (out / "manifest.tsv").open("w", newline="") as target:
        csv.writer(target, delimiter="\t").writerows(manifest)
    return written
