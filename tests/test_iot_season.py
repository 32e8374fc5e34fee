"""The likelihood model's seasonal term (kappaflow.iot.models.season): the period found
by autocorrelation, no alarm on a periodic series, and a cycle that stops at its mean
found, which the window alone does not see."""

from __future__ import annotations

import dataclasses

import numpy as np

from kappaflow.iot.evaluation import replay
from kappaflow.iot.models import ALERT_SCORE, MODELS
from kappaflow.iot.models.scoring import PROBATION
from kappaflow.iot.models.season import find_period

LIKELIHOOD = MODELS["likelihood"]
#: The same model without its seasonal term.
WINDOW_ONLY = dataclasses.replace(LIKELIHOOD, seasonal=None)


def square(n: int = 3000, period: int = 60, seed: int = 5, stop: int | None = None) -> list[float]:
    """A machine's square wave (a cycle of ``period`` readings, on 40 % of it) with a
    little noise, a reading in 300 missing (the phase moves by one each time), and from
    ``stop`` on, for 300 readings, the cycle stopped at the series' median."""
    rng = np.random.default_rng(seed)
    x = 50.0 + 10.0 * ((np.arange(n) % period) < 0.4 * period) + rng.normal(0.0, 0.2, n)
    if stop is not None:
        x[stop : stop + 300] = np.median(x[:stop]) + rng.normal(0.0, 0.2, 300)
    kept = rng.random(n) >= 1.0 / 300.0
    return [float(v) for v in x[kept]]


def alarms(values: list[float], model: object = LIKELIHOOD) -> list[int]:
    scores = replay(values, LIKELIHOOD if model is LIKELIHOOD else WINDOW_ONLY, 512)
    return [row for row, s in enumerate(scores) if s >= ALERT_SCORE]


def test_the_period_is_found_to_a_fraction_of_a_reading_and_none_in_noise_or_drift() -> None:
    # 60 readings a cycle, one reading in 300 missing: 59.8 readings a cycle.
    found = find_period(square()[-1024:])
    assert 59.6 < found < 60.0
    rng = np.random.default_rng(3)
    assert find_period(list(rng.normal(0.0, 1.0, 1024))) == 0.0
    assert find_period(list(np.cumsum(rng.normal(0.0, 1.0, 1024)))) == 0.0
    # A period seen before is kept while the readings show it.
    assert find_period(square()[-1024:], found) == found


def test_a_periodic_series_draws_no_alarm_after_probation_and_its_profile_is_published() -> None:
    values = square()
    assert alarms(values) == []
    params = LIKELIHOOD.trainer().learn(values)
    assert len(params["profile"]) == 59
    assert 59.6 < params["season"][0] < 60.0
    # The profile holds the cycle: its two levels.
    assert min(params["profile"]) < 51.0 < 59.0 < max(params["profile"])


def test_a_cycle_that_stops_at_its_mean_is_found_once_where_the_window_alone_misses_it() -> None:
    values = square(stop=2000)
    onset = 2000 - 7  # readings missing before the stop: it begins a few rows earlier
    found = alarms(values)
    assert found and all(row > PROBATION for row in found)
    # Within a cycle of its start, and once: the stop lasts 300 readings.
    assert len(found) == 1 and onset <= found[0] < onset + 60
    assert alarms(values, WINDOW_ONLY) == []
