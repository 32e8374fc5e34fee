"""The IoT anomaly models, their scorer and ``kappaflow iot evaluate``, on made series."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunCli, run_kappaflow

from kappaflow.errors import JobError
from kappaflow.iot.evaluation import Incident, _early_credit, incidents, judge, replay
from kappaflow.iot.models import ALERT_SCORE, DEFAULT_MODEL, MODELS, Scorer
from kappaflow.iot.replay import Running
from kappaflow.iot.score import _stored
from kappaflow.jobs.restarts import MAX_RESTARTS
from kappaflow.settings import Settings


def _daily(n: int, seed: int = 5) -> list[float]:
    """A minute-sampled metric with a daily cycle and noise."""
    rng = np.random.default_rng(seed)
    minutes = np.arange(n)
    cycle = 50.0 + 8.0 * np.sin(2 * math.pi * minutes / 1440.0)
    return [float(v) for v in cycle + rng.normal(0.0, 1.0, n)]


def test_a_spike_and_a_level_shift_score_high_and_the_rest_low() -> None:
    values = _daily(3000)
    values[1500] += 12.0
    for row in range(2200, 2300):
        values[row] += 10.0
    scores = replay(values, MODELS["forecast"], batch=16)
    assert len(scores) == len(values)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores[1500] >= ALERT_SCORE
    assert max(scores[2200:2203]) >= ALERT_SCORE
    labels = [False] * len(values)
    labels[1500] = True
    for row in range(2200, 2300):
        labels[row] = True
    verdict = judge(scores, labels)
    assert verdict.found == 2
    # Beyond the two incidents, noise alone raises nothing: the series is seeded, and
    # the level shift's alarms (four runs in all) are all in its window.
    assert (verdict.alarms, verdict.false_alarms) == (4, 0), verdict.to_json()


def test_the_score_follows_the_tail_the_series_has_not_a_normal_one() -> None:
    # Forecast errors with a heavy tail (Laplace noise): a normal tail fitted to their
    # mean and spread put about 1% of these readings at the alert score.
    rng = np.random.default_rng(3)
    values = [float(v) for v in 50.0 + rng.laplace(0.0, 1.0, 20_000)]
    values[15_000] += 25.0
    scores = replay(values, MODELS["forecast"], batch=512)
    quiet = [s for row, s in enumerate(scores) if row > 100 and row != 15_000]
    assert sum(s >= ALERT_SCORE for s in quiet) / len(quiet) < 0.001
    assert scores[15_000] >= ALERT_SCORE


def test_the_forecaster_stays_fitted_over_a_long_series_of_noise() -> None:
    # Its least-squares fit once lost the symmetry of its covariance to rounding after
    # some 15,000 readings, and diverged: forecasts of thousands on a series around 50.
    rng = np.random.default_rng(7)
    values = [float(v) for v in 50.0 + rng.normal(0.0, 1.0, 20_000)]
    trainer = MODELS["forecast"].trainer()
    params = trainer.learn(values)
    assert sum(abs(c) for c in params["coef"]) < 1.0
    assert params["error_spread"] == pytest.approx(1.0, rel=0.2)
    scores = replay(values, MODELS["forecast"], batch=512)
    assert max(scores[100:]) < ALERT_SCORE


def test_parameters_a_scorer_kept_from_before_the_tail_score_nothing_until_the_next() -> None:
    params = MODELS["forecast"].trainer().learn(_daily(100))
    assert _stored(json.dumps(params)) == params
    older = {k: v for k, v in params.items() if k != "tail"}
    assert _stored(json.dumps(older)) is None and _stored(None) is None


def test_robust_statistics_find_a_spike_but_lag_a_daily_cycle() -> None:
    values = _daily(3000)
    values[1500] += 12.0
    for row in range(2200, 2300):
        values[row] += 10.0
    scores = replay(values, MODELS["robust"], batch=16)
    assert scores[1500] >= ALERT_SCORE
    # Its level trails the cycle by about an hour and a half of readings, which widens
    # its spread: a shift of ten noise deviations stays under the alert score.
    assert max(scores[2200:2203]) < ALERT_SCORE


def test_a_stuck_sensor_scores_at_the_alert_score() -> None:
    values = _daily(1500)
    for row in range(1200, 1260):
        values[row] = values[1199]
    scores = replay(values, MODELS["robust"], batch=16)
    assert max(scores[1200:1208]) < ALERT_SCORE
    assert min(scores[1215:1260]) >= ALERT_SCORE


@pytest.mark.parametrize("name", sorted(MODELS))
def test_published_parameters_score_the_same_after_a_trip_through_json(name: str) -> None:
    values = _daily(800, seed=9)
    trainer = MODELS[name].trainer()
    for begin in range(0, 700, 50):
        params = trainer.learn(values[begin : begin + 50])
    assert params["version"] == 14 and params["n"] == 700 and params["model"] == name
    sent = json.loads(json.dumps(params))
    direct, carried = Scorer(MODELS[name]), Scorer(MODELS[name])
    for value in values[700:]:
        assert direct.score(value, params) == carried.score(value, sent)


def test_the_scorer_keeps_scoring_with_the_last_parameters_it_has() -> None:
    values = _daily(600)
    params = MODELS["forecast"].trainer().learn(values[:500])
    scorer = Scorer(MODELS["forecast"])
    assert scorer.score(values[500], None) == 0.0
    # No newer parameters come (the trainer is stopped): scoring goes on with these.
    scores = [scorer.score(v, params) for v in values[501:]]
    spike = scorer.score(values[-1] + 15.0, params)
    assert max(scores) < ALERT_SCORE <= spike


def test_judge_counts_incidents_alarms_and_delays() -> None:
    labels = [False] * 100
    for row in (*range(20, 30), *range(60, 65)):
        labels[row] = True
    assert [(i.start, i.end) for i in incidents(labels)] == [(20, 30), (60, 65)]
    scores = [0.0] * 100
    scores[23] = scores[24] = 0.9  # one alarm, three rows into the first incident
    scores[45] = 0.7  # a false alarm
    verdict = judge(scores, labels)
    assert (verdict.found, verdict.alarms, verdict.false_alarms) == (1, 2, 1)
    # The incidents' own rows are their windows (longer than a tenth of the series over
    # two incidents, five rows): 85 rows outside, one of them scored high.
    assert (verdict.quiet_rows, verdict.false_rows) == (85, 1)
    assert verdict.delays == [3]
    assert verdict.recall == 0.5 and verdict.precision == 0.5
    # The early-detection credit: a scaled sigmoid, tanh(2.5) at a window's start and
    # tanh(1.75) three rows (0.3 of the window) later.
    first, second = Incident(20, 30), Incident(60, 65)
    assert _early_credit(20, first) == pytest.approx(math.tanh(2.5))
    assert _early_credit(23, first) == pytest.approx(math.tanh(1.75))
    assert _early_credit(30, first) == pytest.approx(0.0)
    # Found late, one false alarm (0.11), one incident missed (-1); best: both at once.
    assert verdict.nab == pytest.approx(math.tanh(1.75) - 0.11 - 1.0)
    assert verdict.nab_best == pytest.approx(_early_credit(20, first) + _early_credit(60, second))
    assert verdict.nab_best == pytest.approx(2 * math.tanh(2.5))
    assert verdict.nab_null == -2.0
    expected = 100 * (math.tanh(1.75) - 0.11 - 1.0 + 2.0) / (2 * math.tanh(2.5) + 2.0)
    assert verdict.nab_score == pytest.approx(expected)
    assert verdict.nab_score == pytest.approx(46.09, abs=0.01)


def _write(path: Path, rows: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["timestamp", "value"])
        writer.writerows(rows)


def test_evaluate_writes_each_series_scores_at_its_path_in_its_order(
    cli: RunCli, tmp_path: Path
) -> None:
    values = _daily(400)
    values[300] += 12.0  # a spike of 12 noise deviations
    hourly = [
        (f"2014-04-{1 + h // 24:02d} {h % 24:02d}:00:00", f"{v:g}") for h, v in enumerate(values)
    ]
    seconds = [
        (f"2019-07-01 00:{s // 60:02d}:{s % 60:02d}", str(v))
        for s, v in enumerate(_daily(300, seed=2))
    ]
    seconds[150] = (seconds[150][0], "")  # a missing value keeps its row
    _write(tmp_path / "in" / "servers" / "cpu.csv", hourly)
    _write(tmp_path / "in" / "traffic.csv", seconds)
    result = cli(
        "iot", "evaluate", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--path", "local",
    )  # fmt: skip
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert (summary["files"], summary["rows"], summary["path"]) == (2, 700, "local")
    for name, rows in (("servers/cpu.csv", hourly), ("traffic.csv", seconds)):
        with (tmp_path / "out" / name).open() as scored:
            lines = list(csv.reader(scored))
        assert lines[0] == ["timestamp", "value", "anomaly_score"]
        assert [(t, v) for t, v, _ in lines[1:]] == rows
        assert all(0.0 <= float(s) <= 1.0 for _, _, s in lines[1:])
    # The spike is found; the quiet rows around it, and the series without one, are not.
    with (tmp_path / "out" / "servers" / "cpu.csv").open() as scored:
        cpu = [float(s) for _, _, s in list(csv.reader(scored))[1:]]
    with (tmp_path / "out" / "traffic.csv").open() as scored:
        traffic = [float(s) for _, _, s in list(csv.reader(scored))[1:]]
    assert cpu[300] >= ALERT_SCORE
    assert max(cpu[:300] + cpu[301:]) < ALERT_SCORE
    assert max(traffic) < ALERT_SCORE


def test_evaluate_refuses_a_file_without_the_header_in_one_line(
    cli: RunCli, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.csv").write_text("time,reading\n2014-04-01 00:00:00,1\n")
    result = cli("iot", "evaluate", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "o"))
    assert result.code != 0
    assert "timestamp,value" in result.err and "Traceback" not in result.err
    (tmp_path / "in" / "bad.csv").write_text("timestamp,value\nyesterday,1\n")
    result = cli("iot", "evaluate", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "o"))
    assert result.code != 0 and "bad.csv:2" in result.err


@pytest.mark.long
# Two evaluations of up to 600 s each: pytest's timeout must not cut them short.
@pytest.mark.timeout(1400)
def test_evaluate_through_kafka_and_the_jobs_scores_as_the_trainer_and_scorer_do_alone(
    kafka: Settings, tmp_path: Path
) -> None:
    """The live path (Kafka, the training job, the models topic, the scoring job) gives
    each row the score the same trainer and scorer give it in one process, with the
    application's default model (likelihood: its probation, range guard and mute too)."""
    spiked = _daily(200, seed=4)
    spiked[150] += 15.0
    _write(
        tmp_path / "in" / "a" / "temp.csv",
        [(f"2014-04-01 {m // 60:02d}:{m % 60:02d}:00", repr(v)) for m, v in enumerate(spiked)],
    )
    # A second a reading; a new normal from row 220, a sensor stuck from 260 to 289.
    load = _daily(300, seed=8)
    for row in range(220, 300):
        load[row] += 10.0
    for row in range(260, 290):
        load[row] = load[259]
    _write(
        tmp_path / "in" / "load.csv",
        [(f"2019-07-01 00:{s // 60:02d}:{s % 60:02d}", repr(v)) for s, v in enumerate(load)],
    )
    outs, summaries = {}, {}
    for route in ("kafka", "local"):
        out = tmp_path / route
        # Rounds of 16, 32, then 64 rows, each a micro-batch of both jobs and a wait for
        # them: a few minutes on a busy machine, beyond the CLI's usual deadline.
        result = run_kappaflow(
            kafka, "iot", "evaluate", "--input", str(tmp_path / "in"), "--out", str(out),
            "--batch", "64", "--path", route, timeout=600,
        )  # fmt: skip
        assert result.code == 0, result.err
        summaries[route] = json.loads(result.out)
        assert (summaries[route]["rows"], summaries[route]["model"]) == (500, DEFAULT_MODEL)
        outs[route] = {name: (out / name).read_text() for name in ("a/temp.csv", "load.csv")}
    assert DEFAULT_MODEL == "likelihood"
    assert outs["kafka"] == outs["local"]
    temp = list(csv.reader(outs["kafka"]["a/temp.csv"].splitlines()))[1:]
    assert float(temp[150][2]) >= ALERT_SCORE
    # The new normal raises one alarm, at its first reading, and the mute holds the rest.
    scores = [float(r[2]) for r in csv.reader(outs["kafka"]["load.csv"].splitlines()[1:])]
    assert max(scores[:100]) == 0.0
    assert [row for row, s in enumerate(scores) if s >= ALERT_SCORE] == [220]


class _Query:
    """What the evaluation's supervision reads of a streaming query."""

    def __init__(self, error: str | None = None) -> None:
        self.error, self.stopped = error, False

    @property
    def isActive(self) -> bool:  # noqa: N802 (Spark's name)
        return self.error is None and not self.stopped

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


def test_an_evaluation_job_starts_again_after_a_python_worker_missed_its_start() -> None:
    late = "org.apache.spark.SparkException: Python worker failed to connect back.\n\tat ..."
    starts: list[list[_Query]] = []

    def start() -> list[Any]:
        starts.append([_Query(late), _Query()])
        return list(starts[-1])

    job = Running(start, "kf-evaluate-x-score")
    for restart in range(1, MAX_RESTARTS + 1):
        job.check()
        assert len(starts) == restart + 1
        assert all(q.stopped or q.error for q in starts[-2])
    with pytest.raises(JobError, match=r"kf-evaluate-x-score failed: .*failed to connect back"):
        job.check()


def test_an_evaluation_job_that_fails_otherwise_ends_the_evaluation_at_once() -> None:
    starts: list[int] = []

    def start() -> list[Any]:
        starts.append(1)
        return [_Query(), _Query("StreamingQueryException: division by zero")]

    job = Running(start, "kf-evaluate-x-train")
    with pytest.raises(JobError, match="division by zero"):
        job.check()
    assert starts == [1]
    healthy: list[Any] = [_Query()]
    Running(lambda: healthy, "kf-evaluate-x-score").check()
