"""Anomaly models of one device's metric: trained online, published as parameters, scored.

The trainer and the scorer are apart, as the application runs them: a trainer learns a
series in micro-batches and publishes its parameters (JSON, versioned) after each; a
scorer scores every reading with the latest parameters it holds, and keeps scoring with
them while no newer ones come. Three families are offered (``MODELS``):

- ``robust``: robust streaming statistics, a level and a spread that outliers move little;
- ``forecast``: an autoregressive forecaster fitted by recursive least squares, scored on
  its residual;
- ``hst``: half-space trees (river's online isolation forest) over the normalised value
  and its change.

Each turns a reading into a raw surprise (``Model.raw``); the scorer turns raw surprise
into an anomaly score in [0, 1] against the distribution of raw surprise the trainer saw
(``kappaflow.iot.models.scoring``).
"""

from __future__ import annotations

from kappaflow.iot.models.base import Model, Params, Trainer
from kappaflow.iot.models.forecast import FORECAST
from kappaflow.iot.models.hst import HST
from kappaflow.iot.models.robust import ROBUST
from kappaflow.iot.models.scoring import ALERT_SCORE, Scorer

MODELS: dict[str, Model] = {m.name: m for m in (ROBUST, FORECAST, HST)}
#: The model the application trains and scores with, chosen by the comparison in
#: benchmarks/iot-models.md.
DEFAULT_MODEL = "forecast"

__all__ = ["ALERT_SCORE", "DEFAULT_MODEL", "MODELS", "Model", "Params", "Scorer", "Trainer"]
