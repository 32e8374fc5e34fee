"""The likelihood detector and the scorer's guards, on made series and on the committed
development and held-out series (data/anomaly)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kappaflow.iot.evaluation import corpus, read_series, replay, rounds
from kappaflow.iot.models import ALERT_SCORE, EVALUATE_MODEL, MODELS, Scorer
from kappaflow.iot.models.scoring import MUTE, PROBATION
from kappaflow.iot.nab import Report, score_series

LIKELIHOOD = MODELS["likelihood"]
DATA = Path(__file__).resolve().parent.parent / "data" / "anomaly"


def _noise(n: int, seed: int = 2) -> list[float]:
    return [float(v) for v in 20.0 + np.random.default_rng(seed).normal(0.0, 1.0, n)]


def _alarms(values: list[float], batch: int = 512) -> list[int]:
    return [row for row, s in enumerate(replay(values, LIKELIHOOD, batch)) if s >= ALERT_SCORE]


def test_a_square_wave_and_a_constant_series_raise_no_alarm() -> None:
    rows = np.arange(4000)
    square = [float(v) for v in np.where(rows % 60 < 25, 10.0, 2.0)]
    assert _alarms(square) == []
    noisy = [v + 0.01 * e for v, e in zip(square, _noise(4000), strict=True)]
    assert _alarms(noisy) == []
    assert _alarms([5.0] * 3000) == []


def test_a_spike_within_a_square_waves_range_is_found_at_the_next_reading() -> None:
    rows = np.arange(3000)
    values = [float(v) for v in np.where(rows % 60 < 25, 10.0, 2.0) + 0.01 * np.array(_noise(3000))]
    values[2080] = 7.0  # in a low phase, between the wave's two levels
    assert _alarms(values) == [2081]


def test_noise_alone_seldom_alarms() -> None:
    # Ten series of normal noise, 30,000 readings: a handful of alarms (the tails are
    # learnt from the series, at first from few readings), none in most series.
    alarms = [_alarms(_noise(3000, seed)) for seed in range(10)]
    assert sum(map(len, alarms)) <= 6
    assert sum(not found for found in alarms) >= 6


def test_scores_are_the_same_at_any_scale() -> None:
    values = _noise(3000)
    values[1700] += 9.0
    base = _alarms(values)
    assert 1700 in base
    for scale in (1e-3, 1e6):
        assert _alarms([v * scale for v in values]) == base


def test_one_alarm_per_incident_then_a_level_shift_is_the_new_normal() -> None:
    values = _noise(3000)
    for row in range(1500, 3000):
        values[row] += 8.0
    scores = replay(values, LIKELIHOOD, 512)
    assert [row for row, s in enumerate(scores) if s >= ALERT_SCORE] == [1500]
    # The readings after the alarm are held under the alert score, not zeroed.
    assert max(scores[1501 : 1501 + MUTE]) > 0.3


def test_a_flat_line_longer_than_any_before_it_alarms_once() -> None:
    values = _noise(2000)
    for row in range(1200, 1400):
        values[row] = values[1199]
    # The value of row 1199 repeated eleven times (one more than the least a flat line
    # is): row 1210, and nothing more while it lasts. Its end, readings moving again
    # after 200 repeats, is a change too (found a reading late, by the spike it makes).
    assert _alarms(values) == [1210, 1401]


def test_nothing_alarms_during_probation() -> None:
    values = _noise(1000)
    values[60] += 30.0
    scores = replay(values, LIKELIHOOD, 16)
    assert max(scores[:PROBATION]) == 0.0
    values[600] += 30.0
    assert _alarms(values, 16) == [600]


def test_a_scorer_restored_from_its_memory_scores_as_one_that_kept_it() -> None:
    values = _noise(1500, seed=3)
    values[900] += 12.0
    for row in range(1100, 1130):
        values[row] = values[1099]
    trainer, kept = LIKELIHOOD.trainer(), Scorer(LIKELIHOOD)
    memory = None
    params = None
    ours, theirs = [], []
    for batch in rounds(len(values), 100):
        restored = Scorer.restore(LIKELIHOOD, json.loads(json.dumps(memory)))
        for value in values[batch.start : batch.stop]:
            ours.append(kept.score(value, params))
            theirs.append(restored.score(value, params))
        memory = restored.state()
        params = json.loads(json.dumps(trainer.learn(values[batch.start : batch.stop])))
    assert theirs == ours
    assert max(ours[900:902]) >= ALERT_SCORE


def test_the_evaluation_model_scores_the_committed_figures_on_the_held_out_series() -> None:
    assert EVALUATE_MODEL == "likelihood"
    committed = json.loads((DATA / "results.json").read_text())
    for part in ("dev", "holdout"):
        report = Report()
        for path in corpus(DATA / part):
            series = read_series(path)
            assert series.labels is not None
            scores = replay(series.values, MODELS[EVALUATE_MODEL], committed["batch"])
            report.add(score_series(scores, series.labels, ALERT_SCORE))
        figures = report.to_json()
        expected = committed["models"][EVALUATE_MODEL][part]
        assert {k: figures[k] for k in figures} == {k: expected[k] for k in figures}
    assert committed["models"][EVALUATE_MODEL]["holdout"]["standard"] >= 70.0
