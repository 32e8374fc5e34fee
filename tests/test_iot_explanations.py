"""Each score explains itself: the range the model expected the reading in and its
likelihood; an anomaly alert carries them with the model that raised it."""

from __future__ import annotations

import csv
import json
import math
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from conftest import RunCli
from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.iot import alerts, nab, plots
from kappaflow.iot.evaluation import read_series, rounds
from kappaflow.iot.models import ALERT_SCORE, MODELS, Scorer
from test_iot_alerts import START, scored
from test_iot_models import _daily

#: A reading: its value, score, expected range and likelihood.
Explained = tuple[float, float, float | None, float | None, float | None]


def _explained(name: str, values: list[float]) -> list[Explained]:
    model = MODELS[name]
    trainer, scorer = model.trainer(), Scorer(model)
    params = None
    out: list[Explained] = []
    for rows in rounds(len(values), 64):
        for value in values[rows.start : rows.stop]:
            score = scorer.score(value, params)
            why = scorer.explain()
            out.append((value, score, why.expected_low, why.expected_high, why.likelihood))
        params = trainer.learn(values[rows.start : rows.stop])
    return out


@pytest.mark.parametrize("name", ["forecast", "robust"])
def test_a_reading_alarms_where_it_is_outside_the_range_its_model_expected(name: str) -> None:
    # The forecaster and robust statistics score a reading's surprise alone (no spike
    # surprise, no guards): at or above the alert score exactly outside the range.
    values = _daily(3000, seed=5)
    for row in (900, 1700, 2400):
        values[row] += 40.0
    rows = _explained(name, values)
    judged = [r for r in rows[200:] if r[2] is not None]
    assert len(judged) == len(rows) - 200
    for value, score, low, high, likelihood in judged:
        assert low is not None and high is not None and likelihood is not None
        assert low < high
        # A tie at the edge aside (a tolerance of a billionth of the range).
        edge = 1e-9 * (high - low)
        if value < low - edge or value > high + edge:
            assert score >= ALERT_SCORE, (value, score, low, high)
        elif low + edge < value < high - edge:
            assert score < ALERT_SCORE, (value, score, low, high)
        # The likelihood is the score's tail on a linear scale.
        assert math.isclose(
            score, min(1.0, -math.log10(max(1.0 - likelihood, 1e-300)) / 10), abs_tol=1e-6
        )
    assert all(rows[row][1] >= ALERT_SCORE for row in (900, 1700, 2400))


@pytest.mark.parametrize("name", ["forecast", "robust"])
def test_a_reading_at_either_end_of_the_expected_range_scores_the_alert_score(name: str) -> None:
    model = MODELS[name]
    values = _daily(1500, seed=8)
    trainer, scorer = model.trainer(), Scorer(model)
    params = None
    checked = 0
    for rows in rounds(len(values), 64):
        for row in rows:
            before = scorer.state()
            scorer.score(values[row], params)
            why = scorer.explain()
            if row % 25 == 0 and why.expected_low is not None:
                assert why.expected_high is not None
                for end in (why.expected_low, why.expected_high):
                    # The same scorer, as it was before this reading, given the end instead.
                    again = Scorer.restore(model, before)
                    assert again.score(end, params) == pytest.approx(ALERT_SCORE, abs=1e-6)
                checked += 1
        params = trainer.learn(values[rows.start : rows.stop])
    assert checked > 50


def test_the_likelihood_models_range_follows_the_series_and_a_spike_is_outside_it() -> None:
    values = _daily(3000, seed=6)
    values[2000] += 15.0
    rows = _explained("likelihood", values)
    value, score, low, high, likelihood = rows[2000]
    assert score >= ALERT_SCORE and low is not None and high is not None
    assert not low <= value <= high and likelihood is not None and likelihood > 0.99999
    # Quiet readings are inside the range they were expected in, and it moves with the
    # daily cycle: its middle follows the readings' level.
    quiet = [r for r in rows[300:1900] if r[1] < 0.3]
    inside = sum(
        1 for v, _s, lo, hi, _l in quiet if lo is not None and hi is not None and lo <= v <= hi
    )
    assert inside / len(quiet) > 0.99
    middles = np.array([(lo or 0.0) / 2 + (hi or 0.0) / 2 for _v, _s, lo, hi, _l in quiet])
    readings = np.array([v for v, *_ in quiet])
    assert np.corrcoef(middles, readings)[0, 1] > 0.9


def test_no_parameters_no_explanation_and_hst_has_no_range() -> None:
    scorer = Scorer(MODELS["likelihood"])
    scorer.score(1.0, None)
    assert (scorer.explain().expected_low, scorer.explain().likelihood) == (None, None)
    rows = _explained("hst", _daily(400, seed=7))
    assert all(r[2] is None and r[3] is None for r in rows)
    assert rows[-1][4] is not None


def test_an_anomaly_alert_says_which_model_what_was_expected_and_what_was_seen(
    spark: SparkSession,
) -> None:
    def explained(minute: int, value: float, score: float, model: str) -> dict[str, object]:
        return {
            **scored("d1" if model == "likelihood" else "d2", "cpu_temp", minute, value, score),
            "model": model,
            "expected_low": 48.0,
            "expected_high": 52.0,
            "likelihood": 1.0 - 10 ** (-10 * score),
        }

    # A likelihood model alarms once per incident itself: its first high score raises;
    # the forecaster's needs three in a row.
    d1 = [explained(m, v, s, "likelihood") for m, (v, s) in enumerate([(50, 0.1), (71, 0.93)])]
    d1 += [explained(m, 50.0, 0.1, "likelihood") for m in range(2, 8)]
    d2 = [explained(m, 60.0 + m, 0.9, "forecast") for m in range(3)]
    result = kf.testing.run(alerts.build, {"scores": [d1 + d2]}, spark=spark, name="alerts")
    raised = {a["device"]: a for a in result.records("alerts") if a["status"] == "raised"}
    one = raised["d1"]
    assert (one["rule"], one["time"][11:16], one["model"], one["value"]) == (
        "anomaly",
        "00:01",
        "likelihood",
        71.0,
    )
    assert (one["expected_low"], one["expected_high"]) == (48.0, 52.0)
    assert one["likelihood"] == pytest.approx(1.0 - 10**-9.3)
    assert one["reason"] == "scored 0.93 >= 0.5: 71 where 48 to 52 was expected"
    two = raised["d2"]
    assert (two["time"][11:16], two["model"], two["value"]) == ("00:02", "forecast", 62.0)
    assert two["reason"].startswith("3 readings in a row scored >= 0.5: 62 where 48 to 52")
    resolved = [a for a in result.records("alerts") if a["status"] == "resolved"]
    assert [(a["device"], a["time"][11:16]) for a in resolved] == [("d1", "00:06")]
    assert resolved[0]["expected_low"] is None and resolved[0]["model"] is None


def test_an_alert_is_explained_in_a_few_words() -> None:
    record = {
        "value": 71.23,
        "expected_low": 58.4,
        "expected_high": 63.91,
        "model": "likelihood",
        "likelihood": 1.0 - 1e-7,
    }
    assert (
        alerts.explanation(record) == "71.23 seen, 58.4 to 63.91 expected (likelihood; 1 in 1e+07)"
    )
    assert alerts.explanation({"value": 4010.0}) == "4010 seen"
    assert alerts.explanation({"value": 2.0, "likelihood": 1.0}) == "2 seen (never seen)"
    assert alerts.explanation({"rule": "no_data", "value": None}) == ""


def test_evaluate_plots_each_series_with_its_windows_alarms_and_scores(
    cli: RunCli, tmp_path: Path
) -> None:
    values = _daily(1200, seed=9)
    labels = [0] * 1200
    for row in (500, 900):
        values[row] += 30.0
        labels[row] = 1
    moments = [START + timedelta(minutes=m) for m in range(1200)]
    folder = tmp_path / "in" / "plant"
    folder.mkdir(parents=True)
    with (folder / "temp.csv").open("w") as out:
        out.write("timestamp,value,is_anomaly\n")
        for moment, value, label in zip(moments, values, labels, strict=True):
            out.write(f"{moment:%Y-%m-%d %H:%M:%S},{value!r},{label}\n")
    result = cli(
        "iot", "evaluate", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--path", "local", "--plot",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert json.loads(result.out)["plots"] == 1
    picture = (tmp_path / "out" / "plant" / "temp.png").read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n") and len(picture) > 20_000
    # What the picture holds: the two windows, the alarms at the alert score, the scores.
    with (tmp_path / "out" / "plant" / "temp.csv").open() as scored:
        scores = [float(row["anomaly_score"]) for row in csv.DictReader(scored)]
    series = read_series(folder / "temp.csv")
    figure = plots.series_figure("temp", series, scores, ALERT_SCORE)
    top, bottom = figure.axes
    windows = [p for p in top.patches if p.get_gid() == "window"]
    assert len(windows) == len(nab.windows(series.labels or [])) == 2
    alarms = next(line for line in top.lines if line.get_gid() == "alarms")
    rows = plots.alarm_rows(scores, ALERT_SCORE)
    assert 500 in rows and 900 in rows
    assert np.asarray(alarms.get_ydata()).tolist() == [values[r] for r in rows]
    drawn = next(line for line in bottom.lines if line.get_gid() == "scores")
    assert np.asarray(drawn.get_ydata()).tolist() == scores
