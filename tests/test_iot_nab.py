"""NAB's scoring rules, on small series whose scores are computed here by hand."""

from __future__ import annotations

import math

import pytest

from kappaflow.iot.nab import probation, score_series, sigma, windows


def _labels(length: int, *rows: int) -> list[bool]:
    labels = [False] * length
    for row in rows:
        labels[row] = True
    return labels


def _detect(length: int, *rows: int) -> list[float]:
    scores = [0.0] * length
    for row in rows:
        scores[row] = 0.9
    return scores


def test_the_scaled_sigmoid_and_the_probation_period() -> None:
    # sigma(y) = 2 / (1 + e^(5y)) - 1 = tanh(-5y / 2), and -1 beyond three widths.
    assert sigma(-1.0) == pytest.approx(math.tanh(2.5)) == pytest.approx(0.98661, abs=1e-5)
    assert sigma(0.0) == 0.0
    assert sigma(3.5) == -1.0
    assert probation(200) == 30 and probation(4000) == 600 and probation(20_000) == 750


def test_a_window_is_centred_on_its_label_and_a_tenth_of_the_series_over_the_labels() -> None:
    # 200 rows, one label: 20 rows, 10 either side.
    assert windows(_labels(200, 100)) == [(90, 110)]
    # Two labels: 10 rows each (5 either side); close ones merge.
    assert windows(_labels(200, 60, 150)) == [(55, 65), (145, 155)]
    assert windows(_labels(200, 60, 64)) == [(55, 69)]
    # A run of labelled rows is one anomaly at its middle, its window covering the run.
    run = [False] * 200
    for row in range(95, 106):
        run[row] = True
    assert windows(run) == [(90, 110)]
    # A window that begins in the probation period (30 rows) is dropped.
    assert windows(_labels(200, 33, 150)) == [(145, 155)]
    assert windows(_labels(200, 35, 150)) == [(30, 40), (145, 155)]


def test_the_earliest_detection_in_a_window_counts_and_false_positives_cost() -> None:
    labels = _labels(200, 100)  # window (90, 110): 21 rows, probation 30 rows
    # Detected in the window's middle (and again later, for nothing), far before it
    # (row 50), just after it (111), and in the probation period (20, not scored).
    report = score_series(_detect(200, 20, 50, 100, 104, 111), labels, threshold=0.5)
    credit = math.tanh(2.5 * 11 / 21) / math.tanh(2.5)  # y = -(110 - 100 + 1) / 21
    after = math.tanh(2.5 * 1 / 20)  # y = (111 - 110) / (21 - 1): the cost's sigmoid
    standard = report.tallies["standard"]
    assert (standard.windows, standard.found, standard.false_positives) == (1, 1, 2)
    assert standard.score == pytest.approx(credit - 0.11 - 0.11 * after)
    assert standard.normalised == pytest.approx(100 * (credit - 0.11 - 0.11 * after + 1) / 2)
    assert standard.normalised == pytest.approx(87.61, abs=0.01)
    low_fp = report.tallies["reward_low_FP_rate"]
    assert low_fp.normalised == pytest.approx(100 * (credit - 0.22 - 0.22 * after + 1) / 2)
    low_fn = report.tallies["reward_low_FN_rate"]
    assert low_fn.null == -2.0 and low_fn.perfect == 1.0
    assert low_fn.normalised == pytest.approx(100 * (credit - 0.11 - 0.11 * after + 2) / 3)
    # Beyond three window widths after it, a false positive costs A_FP in full.
    far = score_series(_detect(200, 100, 180), labels, threshold=0.5).tallies["standard"]
    assert far.score == pytest.approx(credit - 0.11)


def test_never_detecting_scores_zero_and_detecting_each_window_first_scores_one_hundred() -> None:
    labels = _labels(400, 150, 300)  # two windows of 20 rows: (140, 160), (290, 310)
    assert score_series([0.0] * 400, labels, 0.5).tallies["standard"].normalised == 0.0
    perfect = score_series(_detect(400, 140, 290), labels, 0.5)
    for tally in perfect.tallies.values():
        assert tally.normalised == pytest.approx(100.0)
    # The threshold decides what is a detection; a missed window is worth -A_FN.
    half = score_series(_detect(400, 140), labels, 0.5).tallies["reward_low_FN_rate"]
    assert half.score == pytest.approx(1.0 - 2.0) and half.normalised == pytest.approx(100 * 3 / 6)
    assert score_series(_detect(400, 140, 290), labels, 0.95).tallies["standard"].score == -2.0
