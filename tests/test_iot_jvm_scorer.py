"""The IoT scorer on the JVM (io.kappaflow.iot.SeriesScorer, built at setup) scores as the
Python scorer does, with the same memory, on a series with each kind of anomaly."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from py4j.java_gateway import get_field
from pyspark.sql import SparkSession

from kappaflow.iot.evaluation import rounds
from kappaflow.iot.jvm.scorer import scorer_jar
from kappaflow.iot.models import ALERT_SCORE, MODELS, Scorer
from kappaflow.settings import Settings
from test_iot_models import _daily
from test_iot_season import square


def _series() -> list[float]:
    values = _daily(3000, seed=21)
    rng = np.random.default_rng(4)
    for row in range(1000, 1003):
        # A spike beyond the daily cycle's swing too: robust statistics, whose spread the
        # cycle widens, put one of 12 at 0.41 since scores read the series' own tail.
        values[row] += 20.0
    for row in range(1500, 3000):
        values[row] += 6.0  # a level shift
    for row in range(2000, 2040):
        values[row] = values[1999]  # a stuck sensor
    for row in range(2500, 2700):
        values[row] += float(rng.normal(0.0, 4.0))  # changed variance
    return values


@pytest.mark.parametrize("name", ["forecast", "robust"])
def test_the_jvm_scorer_scores_and_remembers_as_the_python_scorer(
    spark: SparkSession, kafka: Settings, name: str
) -> None:
    if scorer_jar(kafka) is None:
        pytest.fail("setup built no kappaflow-iot.jar (javac missing?): run `make setup`")
    jvm: Any = spark.sparkContext._jvm
    scorers = jvm.io.kappaflow.iot
    model = MODELS[name]
    values = _series()
    trainer, python = model.trainer(), Scorer(model)
    memory = ""
    params: dict[str, Any] | None = None
    ours: list[float] = []
    theirs: list[float] = []
    for rows in rounds(len(values), 16):
        # A new JVM scorer for every batch, from the memory the last one left, as a
        # stateful processor keeps it between batches; every other batch from the Python
        # scorer's memory instead (the two read each other's).
        if len(ours) % 2:
            memory = json.dumps(python.state())
        jvm_scorer = scorers.SeriesScorer.restore(name, memory)
        given = scorers.Params.parse(json.dumps(params)) if params is not None else None
        for value in values[rows.start : rows.stop]:
            ours.append(python.score(value, params))
            theirs.append(jvm_scorer.score(value, given))
        memory = jvm_scorer.state()
        remembered = json.loads(memory)
        assert remembered.keys() == python.state().keys()
        assert remembered["history"] == pytest.approx(python.state()["history"], rel=1e-12)
        assert (remembered["run"], remembered["clipped"]) == (
            python.state()["run"],
            python.state()["clipped"],
        )
        params = trainer.learn(values[rows.start : rows.stop])
    assert theirs == pytest.approx(ours, abs=1e-9)
    # The series is not trivially scored: both raise and stay quiet where they should.
    assert max(ours[1000:1003]) >= ALERT_SCORE > float(np.median(ours[200:900]))


def test_parameters_the_jvm_scorer_cannot_score_with_are_refused_with_the_reason(
    spark: SparkSession,
) -> None:
    jvm: Any = spark.sparkContext._jvm
    params = MODELS["forecast"].trainer().learn(_daily(100))
    parse = jvm.io.kappaflow.iot.Params.parse
    assert get_field(parse(json.dumps(params)), "n") == 100
    broken = {
        "{not json": "params are not JSON text",
        json.dumps({**params, "model": "hst"}): "params name no model family known here",
        json.dumps({**params, "coef": [0.1]}): "params: $.coef does not hold 8 values",
        json.dumps({**params, "tail": [2.0, 0.02]}): "params: $.tail does not hold 3 values",
        json.dumps({k: v for k, v in params.items() if k != "repeats"}): "$.repeats is not",
        json.dumps({**params, "coef": ["x"] * 8}): "params: $.coef is not array<double>",
        json.dumps({**params, "n": 99.5}): "params: $.n is not bigint",
    }
    for text, reason in broken.items():
        with pytest.raises(Exception, match=reason.replace("$", r"\$")):
            parse(text)


def test_the_jvm_scorer_scores_the_likelihood_family_with_its_guards_as_python_does(
    spark: SparkSession, kafka: Settings
) -> None:
    """The likelihood family's window, smoothing and guards (probation, new extremes, flat
    lines, the mute after an alarm) give the same scores and memory on the JVM."""
    if scorer_jar(kafka) is None:
        pytest.fail("setup built no kappaflow-iot.jar (javac missing?): run `make setup`")
    jvm: Any = spark.sparkContext._jvm
    scorers = jvm.io.kappaflow.iot
    model = MODELS["likelihood"]
    values = _series()
    trainer, python = model.trainer(), Scorer(model)
    memory = ""
    params: dict[str, Any] | None = None
    ours: list[float] = []
    theirs: list[float] = []
    for rows in rounds(len(values), 64):
        if len(ours) % 2:
            memory = json.dumps(python.state())
        jvm_scorer = scorers.SeriesScorer.restore("likelihood", memory)
        given = scorers.Params.parse(json.dumps(params)) if params is not None else None
        for value in values[rows.start : rows.stop]:
            ours.append(python.score(value, params))
            theirs.append(jvm_scorer.score(value, given))
        remembered, expected = json.loads(jvm_scorer.state()), python.state()
        memory = json.dumps(remembered)
        assert remembered.keys() == expected.keys()
        assert remembered["guard"] == pytest.approx(expected["guard"], rel=1e-12)
        assert remembered["raw"] == pytest.approx(expected["raw"], rel=1e-12)
        params = trainer.learn(values[rows.start : rows.stop])
    assert theirs == pytest.approx(ours, abs=1e-9)
    # Probation, then one alarm per incident: the spike, the shift, the stuck sensor and
    # the changed variance raise one each. (Before, the daily cycle's first climbs to new
    # extremes raise a few: the range is learnt while the cycle is first seen.)
    assert max(ours[:100]) == 0.0
    alarms = [row for row, score in enumerate(ours) if score >= ALERT_SCORE]
    later = [row for row in alarms if row >= 900]
    assert later[:3] == [1000, 1501, 2010] and len(later) == 4 and 2500 <= later[3] < 2530


@pytest.mark.parametrize("name", ["likelihood", "forecast", "robust"])
def test_the_jvm_scorer_explains_each_reading_as_the_python_scorer(
    spark: SparkSession, kafka: Settings, name: str
) -> None:
    """The range each model expected a reading in, and its likelihood, are the same on
    the JVM (the real-time scorer writes them in every score, as the micro-batch scorer
    does)."""
    if scorer_jar(kafka) is None:
        pytest.fail("setup built no kappaflow-iot.jar (javac missing?): run `make setup`")
    jvm: Any = spark.sparkContext._jvm
    model = MODELS[name]
    values = _series()
    trainer, python = model.trainer(), Scorer(model)
    jvm_scorer = jvm.io.kappaflow.iot.SeriesScorer.restore(name, "")
    params: dict[str, Any] | None = None
    ours: list[tuple[float | None, ...]] = []
    theirs: list[tuple[float | None, ...]] = []
    for rows in rounds(len(values), 64):
        given = jvm.io.kappaflow.iot.Params.parse(json.dumps(params)) if params else None
        for value in values[rows.start : rows.stop]:
            python.score(value, params)
            jvm_scorer.score(value, given)
            why = python.explain()
            ours.append((why.expected_low, why.expected_high, why.likelihood))
            theirs.append(
                (jvm_scorer.expectedLow(), jvm_scorer.expectedHigh(), jvm_scorer.likelihood())
            )
        params = trainer.learn(values[rows.start : rows.stop])
    # None where the Python scorer has none (no parameters yet), numbers alike elsewhere.
    assert [[x is None for x in row] for row in theirs] == [
        [x is None for x in row] for row in ours
    ]
    explained = [(a, b) for a, b in zip(ours, theirs, strict=True) if a[0] is not None]
    assert len(explained) > 2500
    for mine, jvms in explained:
        assert jvms == pytest.approx(mine, rel=1e-9, abs=1e-9)


def test_the_jvm_scorer_scores_the_seasonal_term_as_python_does(spark: SparkSession) -> None:
    """On a square wave that stops for a while (test_iot_season), the seasonal term's
    profile, its memory and the alarm it raises are the same on the JVM, reading by
    reading, through batches of parameters that refine the period."""
    jvm: Any = spark.sparkContext._jvm
    scorers = jvm.io.kappaflow.iot
    model = MODELS["likelihood"]
    values = square(stop=2000)
    trainer, python = model.trainer(), Scorer(model)
    memory = ""
    params: dict[str, Any] | None = None
    ours: list[float] = []
    theirs: list[float] = []
    profiles = 0
    for rows in rounds(len(values), 128):
        if len(ours) % 2:
            memory = json.dumps(python.state())
        jvm_scorer = scorers.SeriesScorer.restore("likelihood", memory)
        given = scorers.Params.parse(json.dumps(params)) if params is not None else None
        profiles += bool(params and params["profile"])
        for value in values[rows.start : rows.stop]:
            ours.append(python.score(value, params))
            theirs.append(jvm_scorer.score(value, given))
        remembered, expected = json.loads(jvm_scorer.state()), python.state()
        memory = json.dumps(remembered)
        assert remembered.keys() == expected.keys()
        if expected["season"] is None:
            assert remembered["season"] is None
        else:
            assert remembered["season"] == pytest.approx(expected["season"], rel=1e-12)
        params = trainer.learn(values[rows.start : rows.stop])
    assert profiles >= 5
    assert theirs == pytest.approx(ours, abs=1e-9)
    found = [row for row, score in enumerate(theirs) if score >= ALERT_SCORE]
    # The stop, within a cycle of its start; nothing else before the cycle comes back.
    assert 1993 <= found[0] < 2060 and all(row >= 2280 for row in found[1:])
