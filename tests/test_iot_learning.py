"""The IoT training and scoring jobs under the test harness: models learnt per device and
metric and published versioned; readings scored with the latest model of their metric."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.iot import app, score, train
from kappaflow.iot.models import ALERT_SCORE, DEFAULT_MODEL, MODELS
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.kafka.topics import create_topic, describe_topic
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

START = datetime(2026, 11, 20, tzinfo=UTC)


def readings(device: str, metric: str, values: list[float], first: int = 0) -> list[dict[str, Any]]:
    """Clean readings a minute apart, from minute ``first``."""
    return [
        {
            "device": device,
            "metric": metric,
            "value": value,
            "unit": "celsius",
            "time": (START + timedelta(minutes=first + i)).isoformat(),
            "seq": first + i,
            "id": f"{device}/{first + i}/{metric}",
        }
        for i, value in enumerate(values)
    ]


def noise(n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(v) for v in 40.0 + rng.normal(0.0, 0.5, n)]


def test_models_are_learnt_per_device_and_metric_and_published_per_batch(
    spark: SparkSession,
) -> None:
    a, b = noise(120, 1), noise(120, 2)
    batches = [
        readings("d1", "cpu_temp", a[:60]) + readings("d2", "cpu_temp", b[:60]),
        readings("d1", "cpu_temp", a[60:], first=60),
        readings("d2", "cpu_temp", b[60:], first=60),
    ]
    result = kf.testing.run(train.build, {"telemetry.clean": batches}, spark=spark, name="train")
    updates = result.records("models")
    assert sorted((u["device"], u["version"], u["learnt"]) for u in updates) == [
        ("d1", 1, 60),
        ("d1", 2, 120),
        ("d2", 1, 60),
        ("d2", 2, 120),
    ]
    assert sorted(map(tuple, result.keys("models"))) == sorted(
        [("d1", "cpu_temp")] * 2 + [("d2", "cpu_temp")] * 2
    )
    last = next(u for u in updates if (u["device"], u["version"]) == ("d1", 2))
    assert last["model"] == DEFAULT_MODEL == "likelihood"
    assert last["trained_until"].startswith("2026-11-20T01:59")
    # What was published is what a trainer fed the same readings publishes.
    expected = MODELS[DEFAULT_MODEL].trainer()
    expected.learn(a[:60])
    assert json.loads(last["params"]) == json.loads(json.dumps(expected.learn(a[60:])))


def test_an_unknown_model_family_is_refused_with_its_code(spark: SparkSession) -> None:
    try:
        kf.testing.run(
            train.build, {"telemetry.clean": [[]]}, params={"model": "oracle"}, spark=spark
        )
    except kf.KappaflowError as exc:
        assert exc.code == "KF616" and "'oracle'" in str(exc)
    else:
        raise AssertionError("the job started with an unknown model")


def test_the_application_job_refuses_a_part_it_does_not_have(spark: SparkSession) -> None:
    try:
        kf.testing.run(
            app.build, {"telemetry.raw": [[]]}, params={"parts": "clean,oracle"}, spark=spark
        )
    except kf.KappaflowError as exc:
        assert exc.code == "KF616" and "parts oracle are not among clean, train" in str(exc)
    else:
        raise AssertionError("the job started with an unknown part")


def _model_record(device: str, metric: str, values: list[float], version: int) -> dict[str, Any]:
    trainer = MODELS["forecast"].trainer()
    params: dict[str, Any] = {}
    for _ in range(version):
        params = trainer.learn(values[: len(values) // version])
    return {
        "device": device,
        "metric": metric,
        "model": "forecast",
        "version": version,
        "learnt": params["n"],
        "trained_until": START.isoformat(),
        "params": json.dumps(params),
    }


def test_readings_are_scored_with_their_metrics_model_and_bad_models_go_to_dead_letters(
    spark: SparkSession,
) -> None:
    history = noise(300, 3)
    models = [
        _model_record("d1", "cpu_temp", history, 1),
        "not json at all",
        {"device": "d1", "metric": "fan_rpm", "model": "forecast"},  # fields missing
        # Records that parse, with parameters a scorer cannot use.
        {**_model_record("d2", "cpu_temp", history, 1), "params": "{not json"},
        {**_model_record("d3", "cpu_temp", history, 1), "model": "robust"},
        _model_record("d4", "cpu_temp", history, 1) | {"params": json.dumps({"model": "forecast"})},
        _with_params(_model_record("d5", "cpu_temp", history, 1), coef=[1.0, 2.0]),
        _with_params(_model_record("d6", "cpu_temp", history, 1), model="arima"),
    ]
    later = noise(40, 4)
    later[30] += 8.0  # sixteen noise deviations: a spike
    batches = [
        readings("d1", "cpu_temp", later[:20], first=300)
        + readings("d9", "cpu_temp", [40.0, 41.0], first=300)
        + readings("d5", "cpu_temp", [40.0, 41.0], first=300),
        readings("d1", "cpu_temp", later[20:], first=320),
    ]
    result = kf.testing.run(
        score.build, {"telemetry.clean": batches, "models": [models]}, spark=spark, name="score"
    )
    scores = result.records("scores")
    ours = [s for s in scores if s["device"] == "d1"]
    assert len(ours) == 40 and {s["model_version"] for s in ours} == {1}
    by_seq = {int(s["id"].split("/")[1]) - 300: s["score"] for s in ours}
    assert by_seq[30] >= ALERT_SCORE
    # Numbered from the key's first reading, across batches: the alerting job judges a
    # reading scored again by that pair.
    first = min(ours, key=lambda s: s["time"])["id"]
    numbers = sorted((s["run"], s["seq"]) for s in ours)
    assert numbers == [(first, n) for n in range(1, 41)], numbers
    assert max(v for seq, v in by_seq.items() if seq != 30 and seq != 31) < ALERT_SCORE
    strangers = [s for s in scores if s["device"] == "d9"]
    assert [(s["score"], s["model"]) for s in strangers] == [(0.0, None), (0.0, None)]
    assert all(math.isfinite(s["score"]) for s in scores)
    reasons = sorted(d["error"] for d in result.dead_letters)
    assert len(reasons) == 7, reasons
    assert any(d["value"] == b"not json at all" for d in result.dead_letters)
    assert all(d["source_topic"] == "models" for d in result.dead_letters)
    assert {
        "params are not JSON text",
        "params are of another model family than the record",
        "params: $.version is not bigint",
        "params: $.coef does not hold 8 values",
        "params name no model family known here",
    } <= set(reasons)
    # A device whose model was refused is scored as having none.
    refused = [(s["score"], s["model"]) for s in scores if s["device"] == "d5"]
    assert refused == [(0.0, None), (0.0, None)]


def _with_params(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return record | {"params": json.dumps(json.loads(record["params"]) | changes)}


def test_training_and_scoring_on_the_broker_go_on_scoring_when_the_trainer_stops(
    spark: SparkSession, serving: Settings
) -> None:
    name = f"iot-{uuid.uuid4().hex[:8]}"
    clean, models, scores = f"{name}-clean", f"{name}-models", f"{name}-scores"
    create_topic(serving.kafka, clean, partitions=2)
    first = readings("d1", "cpu_temp", noise(90, 5)) + readings("d2", "fan_rpm", noise(90, 6))
    send_json(serving, clean, first, key="device")
    params = {"source": clean, "dest": models, "models": models}
    trainer = start_app(train.build, JobContext(f"{name}-train", params, spark, serving))
    scorer = start_app(
        score.build, JobContext(f"{name}-score", {**params, "dest": scores}, spark, serving)
    )
    try:

        def scored(count: int) -> Callable[[], list[dict[str, Any]] | None]:
            def probe() -> list[dict[str, Any]] | None:
                values = topic_values(serving, scores)
                return values if len(values) >= count else None

            return probe

        wait_for(scored(180), timeout=240, interval=1.0, what="the first readings scored")
        published = topic_values(serving, models)
        assert {(m["device"], m["metric"]) for m in published} == {
            ("d1", "cpu_temp"),
            ("d2", "fan_rpm"),
        }
        # The scorer reads the topic as a table: its key is the model's device and metric,
        # and the topic is compacted.
        assert describe_topic(serving.kafka, models)["configs"]["cleanup.policy"] == "compact"
        for query in trainer:
            query.stop()
        final = topic_values(serving, models)
        newest = {(m["device"], m["metric"]): m["version"] for m in final}
        # The trainer is stopped: what comes now is scored with the last model published.
        later = noise(30, 7)
        later[20] += 10.0
        send_json(serving, clean, readings("d1", "cpu_temp", later, first=90), key="device")
        values = wait_for(scored(210), timeout=180, interval=1.0, what="scored, trainer stopped")
    finally:
        for query in (*trainer, *scorer):
            query.stop()
    after = [v for v in values if v["id"] in {f"d1/{90 + i}/cpu_temp" for i in range(30)}]
    assert len(after) == 30
    assert {v["model_version"] for v in after} == {newest["d1", "cpu_temp"]}
    assert next(v for v in after if v["id"] == "d1/110/cpu_temp")["score"] >= ALERT_SCORE
    assert len(topic_values(serving, models)) == len(final)
