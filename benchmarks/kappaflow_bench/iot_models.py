"""The IoT application's anomaly models compared on labelled series.

Two corpora: the simulator's fleet (``kappaflow.iot.corpus``; its labels are the
anomalies it injected) and the labelled anomaly series that ship inside the ``aeon``
wheel on PyPI (UCR 135 InternalBleeding16 and the ECG ``ecg-diff-count-3`` test series;
its gait recording has no labelled anomaly and is left out). The wheel is
downloaded once, without its dependencies, and only its CSV files are read.

Each model replays each series as the application would (micro-batches of ``batch``,
scored with the parameters of the batches before) and is judged at several thresholds.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kappaflow.iot.corpus import simulated_corpus
from kappaflow.iot.evaluation import Series, Verdict, judge, read_series, replay
from kappaflow.iot.models import MODELS
from kappaflow.iot.simulator import FleetConfig
from kappaflow_bench.report import machine, write_json

AEON = "aeon==1.6.0"
_AEON_SERIES = {
    "ucr135": "aeon/datasets/data/KDD-TSAD_135/135_UCR_Anomaly_InternalBleeding16_TEST.csv",
    "ecg": "aeon/datasets/data/UnitTest/ecg-diff-count-3_TEST.csv",
}
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def aeon_corpus(cache: Path) -> dict[str, Series]:
    """The labelled series of the aeon wheel: each value column one series."""
    wheels = sorted(cache.glob("aeon-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", AEON, "--no-deps", "-q", "-d", str(cache)],
            check=True,
        )
        wheels = sorted(cache.glob("aeon-*.whl"))
    found: dict[str, Series] = {}
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for name, member in _AEON_SERIES.items():
            rows = list(csv.reader(io.TextIOWrapper(wheel.open(member), newline="")))
            header = [h.strip() for h in rows[0]]
            label_at = header.index("is_anomaly")
            labels = [float(r[label_at]) > 0 for r in rows[1:]]
            stamps = [r[0] for r in rows[1:]]
            channels = [i for i in range(1, len(header)) if i != label_at]
            for channel in channels:
                key = name if len(channels) == 1 else f"{name}/{header[channel]}"
                found[key] = Series(stamps, [float(r[channel]) for r in rows[1:]], labels)
    return found


def simulator_corpus(root: Path, devices: int, days: float, seed: int) -> dict[str, Series]:
    interval_s = 60.0
    config = FleetConfig(devices=devices, rate=devices * 6 / interval_s, seed=seed)
    if not root.exists():
        simulated_corpus(root, config, datetime(2026, 1, 5, tzinfo=UTC), days)
    return {
        str(path.relative_to(root).with_suffix("")): read_series(path)
        for path in sorted(root.rglob("*.csv"))
    }


@dataclass
class Scored:
    model: str
    corpus: str
    seconds: float
    rows: int
    by_threshold: dict[str, dict[str, Any]] = field(default_factory=dict)


def compare(corpora: dict[str, dict[str, Series]], batch: int) -> list[Scored]:
    results: list[Scored] = []
    for corpus_name, series in corpora.items():
        for name, model in MODELS.items():
            began = time.perf_counter()
            scores = {key: replay(s.values, model, batch) for key, s in series.items()}
            scored = Scored(
                name,
                corpus_name,
                time.perf_counter() - began,
                sum(len(s.values) for s in series.values()),
            )
            for threshold in THRESHOLDS:
                verdict = Verdict()
                for key, s in series.items():
                    assert s.labels is not None
                    verdict.add(judge(scores[key], s.labels, threshold))
                scored.by_threshold[f"{threshold:.1f}"] = verdict.to_json()
            results.append(scored)
    return results


def run(out_dir: Path, cache: Path, devices: int, days: float, seed: int, batch: int) -> Path:
    corpora = {
        "simulator": simulator_corpus(
            cache / f"simulator-{devices}x{days:g}d-seed{seed}", devices, days, seed
        ),
        "aeon": aeon_corpus(cache / "aeon"),
    }
    results = compare(corpora, batch)
    return write_json(
        out_dir / "result.json",
        {
            "machine": machine(),
            "date": datetime.now(UTC).isoformat(),
            "batch": batch,
            "simulator": {"devices": devices, "days": days, "seed": seed, "interval_s": 60},
            "aeon": AEON,
            "series": {name: len(series) for name, series in corpora.items()},
            "results": [r.__dict__ for r in results],
        },
    )
