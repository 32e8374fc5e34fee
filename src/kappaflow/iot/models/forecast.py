"""A streaming forecaster scored on its residual: autoregression by recursive least squares.

The next reading is forecast from the last ``LAGS`` readings around a slowly moving
centre, in units of the series' spread (so that the coefficients do not depend on the
metric's unit); the coefficients are refitted with every reading by recursive least
squares that forgets old readings geometrically. A reading's surprise is its forecast
error in spreads of the recent errors. Errors are clipped at three spreads before they
are learnt, so that an anomaly bends the coefficients and the error spread little.

The published parameters are the coefficients, the centre and the spreads; the scorer
keeps the last ``LAGS`` readings it saw and forecasts from them with those parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kappaflow.iot.models.base import MAX_CLIPPED, Model, Params, Trainer

LAGS = 8
_FORGET = 0.998
_CENTRE_RATE = 1.0 / 500.0
_SPREAD_RATE = 1.0 / 300.0
_CLIP = 3.0
_MAD_TO_SD = math.sqrt(math.pi / 2.0)
_TINY = 1e-9
_MAX_TRACE = 1e4
#: Inputs are clipped to this many spreads, so that a series whose spread collapsed (a
#: constant stretch) cannot overflow the fit when it moves again.
_INPUT_BOUND = 20.0


def _inputs(history: Sequence[float], centre: float, scale: float) -> np.ndarray:
    """The last ``LAGS`` readings, newest first, centred and scaled (the centre where
    there are fewer)."""
    recent = list(history)[-LAGS:]
    recent.reverse()
    recent += [centre] * (LAGS - len(recent))
    return np.clip((np.asarray(recent) - centre) / scale, -_INPUT_BOUND, _INPUT_BOUND)


class ForecastTrainer(Trainer):
    name = "forecast"

    def __init__(self) -> None:
        super().__init__()
        self.centre = 0.0
        self.scale = 0.0
        self.error_spread = 0.0
        self.coef = np.zeros(LAGS)
        self._p = np.eye(LAGS) * 10.0
        self._history: list[float] = []
        self._clipped = 0

    def _forecast(self) -> float:
        scale = max(self.scale, _TINY)
        x = _inputs(self._history, self.centre, scale)
        return self.centre + scale * float(self.coef @ x)

    def update(self, value: float) -> None:
        if self.n < 10:
            # The first readings set the centre and the scale the coefficients work in.
            self.centre += (value - self.centre) / (self.n + 1)
            self.scale += (abs(value - self.centre) * _MAD_TO_SD - self.scale) / (self.n + 1)
            self._remember(value)
            return
        scale = max(self.scale, _TINY)
        x = _inputs(self._history, self.centre, scale)
        error = (value - self.centre) / scale - float(self.coef @ x)
        bound = _CLIP * max(self.error_spread / scale, _TINY) if self.n > 20 else math.inf
        clipped = max(-bound, min(bound, error))
        px = self._p @ x
        gain = px / (_FORGET + float(x @ px))
        self.coef = self.coef + gain * clipped
        p = (self._p - np.outer(gain, px)) / _FORGET
        # Rounding makes the covariance lose its symmetry, then its positive definiteness,
        # and then the fit diverges: it is kept symmetric.
        self._p = 0.5 * (p + p.T)
        trace = float(np.trace(self._p))
        if trace > _MAX_TRACE:
            # A series that stops moving (a stuck sensor) excites no direction: forgetting
            # alone would grow the covariance without bound.
            self._p *= _MAX_TRACE / trace
        # Early on, the spreads are running means; later they forget at their rates.
        rate = max(_SPREAD_RATE, 1.0 / (self.n - 9))
        self.error_spread += rate * (abs(clipped) * scale * _MAD_TO_SD - self.error_spread)
        deviation = value - self.centre
        dev_bound = _CLIP * scale * 3.0
        self.centre += _CENTRE_RATE * max(-dev_bound, min(dev_bound, deviation))
        self.scale += rate * (min(abs(deviation), dev_bound) * _MAD_TO_SD - self.scale)
        # An outlier is remembered clipped, so that it does not skew the next forecasts;
        # one after MAX_CLIPPED in a row is a change, and is remembered as it is.
        if clipped != error and self._clipped < MAX_CLIPPED:
            self._remember(value - (error - clipped) * scale)
            self._clipped += 1
        else:
            self._remember(value)
            self._clipped = 0

    def _remember(self, value: float) -> None:
        self._history.append(value)
        if len(self._history) > LAGS:
            del self._history[0]

    def surprise(self, value: float) -> float:
        return abs(value - self._forecast()) / max(self.error_spread, _TINY)

    def state(self) -> dict[str, Any]:
        return {
            "centre": self.centre,
            "scale": self.scale,
            "error_spread": self.error_spread,
            "coef": [float(c) for c in self.coef],
        }


def _raw(params: Params, history: Sequence[float], value: float) -> float:
    centre = float(params["centre"])
    scale = max(float(params["scale"]), _TINY)
    x = _inputs(history, centre, scale)
    forecast = centre + scale * float(np.asarray(params["coef"]) @ x)
    return abs(value - forecast) / max(float(params["error_spread"]), _TINY)


def _expected(params: Params, history: Sequence[float]) -> tuple[float, float]:
    """The forecast, and the spread of forecast errors."""
    centre = float(params["centre"])
    scale = max(float(params["scale"]), _TINY)
    x = _inputs(history, centre, scale)
    forecast = centre + scale * float(np.asarray(params["coef"]) @ x)
    return forecast, max(float(params["error_spread"]), _TINY)


def _remember(params: Params, history: Sequence[float], value: float) -> float:
    """``value``, or where it is an outlier, the forecast plus three error spreads."""
    centre = float(params["centre"])
    scale = max(float(params["scale"]), _TINY)
    x = _inputs(history, centre, scale)
    forecast = centre + scale * float(np.asarray(params["coef"]) @ x)
    bound = _CLIP * float(params["error_spread"])
    return forecast + max(-bound, min(bound, value - forecast))


FORECAST = Model(
    name="forecast",
    trainer=ForecastTrainer,
    raw=_raw,
    history=LAGS,
    remember=_remember,
    expected=_expected,
    summary=f"forecast error of an AR({LAGS}) model fitted by recursive least squares",
    shape={
        "$.centre": "double",
        "$.scale": "double",
        "$.error_spread": "double",
        "$.coef": "array<double>",
    },
    lengths={"$.coef": LAGS},
)
