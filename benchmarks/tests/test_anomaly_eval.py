"""The rolling z-score the anomaly models are compared with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kappaflow_bench.anomaly_eval import zscores


def test_a_reading_is_measured_against_the_window_before_it() -> None:
    values = [1.0, 3.0] * 10 + [12.0, math.nan, 2.0]
    z = zscores(values, window=4)
    # Before four readings, nothing; the window before row 20 is 1, 3, 1, 3: mean 2,
    # deviation 1, and 12 is ten deviations off.
    assert list(z[:4]) == [0.0] * 4
    assert z[20] == pytest.approx(10.0)
    assert z[5] == pytest.approx(1.0)
    # A missing reading is taken as the one before it: the window before row 22 is
    # 1, 3, 12 and 12 again.
    window = np.array([1.0, 3.0, 12.0, 12.0])
    assert z[22] == pytest.approx(abs(2.0 - window.mean()) / window.std())


def test_a_constant_window_measures_nothing() -> None:
    assert list(zscores([5.0] * 10 + [6.0], window=5)) == [0.0] * 11
