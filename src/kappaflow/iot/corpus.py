"""Labelled series from the simulator, as CSV files the evaluation reads.

One file per device and metric, ``DEVICE/METRIC.csv``, with the header
``timestamp,value,is_anomaly``: the readings the device sent, in its clock's order, once
each, and whether a labelled anomaly was running then. Dropouts are left out of the labels
(a series without readings has no rows to score; the application's no-data rule finds
them), and so is every fault that is not an anomaly (skew, late and duplicate sends).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from kappaflow.iot.simulator import FleetConfig, Label, Simulation
from kappaflow.iot.telemetry import READINGS_TOPIC

_DAY_S = 86_400.0


def simulated_corpus(
    out: Path, config: FleetConfig, start: datetime, days: float, step_s: float = 3_600.0
) -> list[Path]:
    """Run ``config``'s fleet for ``days`` from ``start`` and write its series under ``out``."""
    config = replace(config, skewed_share=0.0, late_share=0.0, duplicate_share=0.0)
    begin = start.timestamp()
    simulation = Simulation(config, begin)
    series: dict[tuple[str, str], dict[str, tuple[float, float]]] = defaultdict(dict)
    labels: list[Label] = []
    for records, found in simulation.run(begin + days * _DAY_S, step_s):
        labels += found
        for record in records:
            if record.topic != READINGS_TOPIC:
                continue
            reading = json.loads(record.value)
            moment = datetime.fromisoformat(reading["time"]).timestamp()
            series[reading["device"], reading["metric"]][reading["id"]] = (
                moment,
                float(reading["value"]),
            )
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for label in labels:
        if label.cls == "anomaly" and label.kind != "dropout" and label.metric is not None:
            spans[label.device, label.metric].append((label.start, label.end))
    written: list[Path] = []
    for (device, metric), readings in sorted(series.items()):
        path = out / device / f"{metric}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as target:
            rows = csv.writer(target)
            rows.writerow(["timestamp", "value", "is_anomaly"])
            for moment, value in sorted(readings.values()):
                anomalous = any(a <= moment < b for a, b in spans[device, metric])
                stamp = datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S")
                rows.writerow([stamp, repr(value), int(anomalous)])
        written.append(path)
    return written
