"""Anomaly models of one device's metric: trained online, published as parameters, scored.

The trainer and the scorer are apart, as the application runs them: a trainer learns a
series in micro-batches and publishes its parameters (JSON, versioned) after each; a
scorer scores every reading with the latest parameters it holds, and keeps scoring with
them while no newer ones come. Four families are offered (``MODELS``):

- ``robust``: robust streaming statistics, a level and a spread that outliers move little;
- ``forecast``: an autoregressive forecaster fitted by recursive least squares, scored on
  its residual;
- ``hst``: half-space trees (river's online isolation forest) over the normalised value
  and its change;
- ``likelihood``: the distance from the median of the last readings, scored as a
  likelihood, with the scorer's guards (probation, new extremes, flat lines, one alarm per
  incident): the detector that holds up on series it has never seen.

Each turns a reading into a raw surprise (``Model.raw``); the scorer turns raw surprise
into an anomaly score in [0, 1] against the distribution of raw surprise the trainer saw
(``kappaflow.iot.models.scoring``).
"""

from __future__ import annotations

from kappaflow.iot.models.base import Model, Params, Trainer
from kappaflow.iot.models.forecast import FORECAST
from kappaflow.iot.models.hst import HST
from kappaflow.iot.models.likelihood import LIKELIHOOD
from kappaflow.iot.models.robust import ROBUST
from kappaflow.iot.models.scoring import ALERT_SCORE, Explanation, Scorer

MODELS: dict[str, Model] = {m.name: m for m in (ROBUST, FORECAST, HST, LIKELIHOOD)}
#: The model the application trains and scores with unless told (``-P model=...``): the
#: best by the NAB rules on the development and held-out series (data/anomaly, ``make
#: eval-anomaly``).
DEFAULT_MODEL = "likelihood"
#: The model ``kappaflow iot evaluate`` scores with unless told: the application's.
EVALUATE_MODEL = DEFAULT_MODEL

__all__ = [
    "ALERT_SCORE",
    "DEFAULT_MODEL",
    "EVALUATE_MODEL",
    "MODELS",
    "Explanation",
    "Model",
    "Params",
    "Scorer",
    "Trainer",
]
