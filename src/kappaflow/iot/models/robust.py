"""Robust streaming statistics: a level and a spread that outliers move little.

The level follows the series by exponential smoothing of residuals clipped at three
spreads (a Huber step), so that a spike pulls it by at most three spreads times the rate;
the spread is the smoothed absolute clipped residual, scaled to a standard deviation for
normal noise. A reading's surprise is its distance from the level in spreads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kappaflow.iot.models.base import Model, Params, Trainer

_LEVEL_RATE = 1.0 / 100.0
_SPREAD_RATE = 1.0 / 300.0
_CLIP = 3.0
#: Mean absolute deviation to standard deviation, for normal noise.
_MAD_TO_SD = math.sqrt(math.pi / 2.0)
_TINY = 1e-9


class RobustTrainer(Trainer):
    name = "robust"

    def __init__(self) -> None:
        super().__init__()
        self.level = 0.0
        self.spread = 0.0

    def update(self, value: float) -> None:
        if self.n == 0:
            self.level = value
            return
        residual = value - self.level
        if self.n < 10:
            # Too few readings for a spread to clip by: learn the first ones as they come.
            self.level += residual / (self.n + 1)
            self.spread += (abs(residual) * _MAD_TO_SD - self.spread) / (self.n + 1)
            return
        bound = _CLIP * max(self.spread, _TINY)
        clipped = max(-bound, min(bound, residual))
        # Early on, level and spread are running means; later they forget at their rates.
        self.level += max(_LEVEL_RATE, 1.0 / (self.n + 1)) * clipped
        rate = max(_SPREAD_RATE, 1.0 / (self.n + 1))
        self.spread += rate * (abs(clipped) * _MAD_TO_SD - self.spread)

    def surprise(self, value: float) -> float:
        return abs(value - self.level) / max(self.spread, _TINY)

    def state(self) -> dict[str, Any]:
        return {"level": self.level, "spread": self.spread}


def _raw(params: Params, _history: Sequence[float], value: float) -> float:
    return abs(value - float(params["level"])) / max(float(params["spread"]), _TINY)


def _expected(params: Params, _history: Sequence[float]) -> tuple[float, float]:
    return float(params["level"]), max(float(params["spread"]), _TINY)


ROBUST = Model(
    name="robust",
    trainer=RobustTrainer,
    raw=_raw,
    history=0,
    expected=_expected,
    summary="distance from a robust level, in robust spreads",
    shape={"$.level": "double", "$.spread": "double"},
)
