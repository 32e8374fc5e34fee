"""The IoT demo panel's figures from the topics it follows, without services."""

from __future__ import annotations

import time

from kappaflow.demos.iot import MODELS, SCORES, Outputs


def test_the_median_time_to_a_score_is_of_the_last_ten_seconds() -> None:
    outputs = Outputs()
    assert outputs.lag_p50() is None
    now = time.monotonic()
    # Slow scores seen half a minute ago are out of the window, and forgotten.
    outputs.lags.extend([(now - 30.0, 9_000.0)] * 5)
    event = {"time": "2026-11-27T10:00:00.000+00:00"}
    for late_ms in (30, 10, 20):
        outputs.take(SCORES, b"k", event, 1_795_773_600_000 + late_ms)
    assert outputs.lag_p50() == 20.0
    assert len(outputs.lags) == 3 and outputs.scored == 3


def test_the_newest_model_version_and_the_series_with_one() -> None:
    outputs = Outputs()
    for key, version in ((b"a", 2), (b"b", 5), (b"a", 3)):
        outputs.take(MODELS, key, {"version": version, "model": "forecast"}, 0)
    assert (outputs.version, outputs.model, len(outputs.keys)) == (5, "forecast", 2)
