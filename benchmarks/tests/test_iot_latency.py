"""The latency benchmark's reader of the outputs, on the real broker: what it writes for
each record, and how it counts the series whose models score."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from live_jobs import send_json

from kappaflow.kafka.topics import COMPACTED, create_topic
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from kappaflow_bench.iot_latency import read_records, watch
from kappaflow_bench.iot_latency_run import LOG_APPEND_TIME


def test_the_reader_counts_mature_models_and_high_scores(kafka: Settings, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    scores, alerts, models = (f"lat-{run}-{name}" for name in ("scores", "alerts", "models"))
    for topic in (scores, alerts):
        create_topic(kafka.kafka, topic, partitions=2, configs=LOG_APPEND_TIME)
    create_topic(kafka.kafka, models, partitions=2, configs={**COMPACTED, **LOG_APPEND_TIME})

    def update(device: str, learnt: int) -> dict[str, object]:
        return {"device": device, "metric": "fan_rpm", "version": learnt, "learnt": learnt}

    # d1 has learnt its 30 readings, d2 not yet, d3 only in a later update.
    send_json(kafka, models, [update("d1", 30), update("d2", 29), update("d3", 12)], key="device")
    time = "2026-11-28T00:00:00.000Z"
    sent = [
        {"device": "d1", "metric": "fan_rpm", "time": time, "score": s, "model_version": 1}
        for s in (0.0, 0.49, 0.5, 0.97)
    ]
    send_json(kafka, scores, sent, key="device")
    path = tmp_path / "records.csv"
    stop, seen = threading.Event(), [0, 0, 0, 0]
    reader = threading.Thread(
        target=watch, args=(kafka.kafka, (scores, alerts, models), str(path), stop, seen)
    )
    reader.start()
    try:
        wait_for(lambda: True if seen[:3] == [4, 0, 3] else None, timeout=60, what="the records")
        assert seen[3] == 1
        send_json(kafka, models, [update("d3", 31)], key="device")
        wait_for(lambda: True if seen[3] == 2 else None, timeout=60, what="d3 mature")
    finally:
        stop.set()
        reader.join(timeout=60)
    records = read_records(path)
    assert len(records.scores) == 4 and len(records.models) == 4
    assert records.high == 2
