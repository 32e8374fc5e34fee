"""The training job: anomaly models per device and metric, learnt online, published.

Written on the public job API only. Start it with::

    kappaflow jobs start iot-train --app kappaflow.iot.train:build

From ``telemetry.clean`` (``-P source=...``), each device's metric is learnt in
micro-batches by a trainer of the model family ``-P model=...`` (``likelihood`` by default;
``kappaflow.iot.models``). After every micro-batch that brought a key readings, the key's
parameters go to the compacted topic ``models`` (``-P dest=...``), keyed by
``[device, metric]``, with their version (the micro-batches learnt) and the count of
readings learnt. A scorer reads them from there (``kappaflow.iot.score``).

The trainer's whole state (what it needs to go on learning, which is more than what it
publishes) is kept in Spark's state store, pickled: it never leaves the job. What is
published is JSON, so that a scorer never unpickles what it reads from a topic. Readings
behind the watermark are learnt too (``late="function"``), in the order they come.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kappaflow as kf
from kappaflow.iot.clean import CLEAN_TOPIC, CleanReading
from kappaflow.iot.models import DEFAULT_MODEL, MODELS, Trainer

MODELS_TOPIC = "models"
#: A key with no reading for this long (event time) is forgotten, model and all.
FORGET_AFTER = "7d"


@dataclass
class ModelUpdate:
    """One version of one device's metric's model, as the ``models`` topic carries it."""

    device: str
    metric: str
    model: str
    version: int
    learnt: int
    #: The newest reading learnt, by event time.
    trained_until: datetime
    #: The model's parameters, as JSON text (``kappaflow.iot.models.Params``).
    params: str


@dataclass
class Learning:
    #: The trainer, pickled and base64-encoded; empty for a new key.
    trainer: str = ""


def _thaw(text: str) -> Trainer:
    trainer: Trainer = pickle.loads(base64.b64decode(text))
    return trainer


def _freeze(trainer: Trainer) -> str:
    return base64.b64encode(pickle.dumps(trainer)).decode()


def model_family(job: kf.Job) -> str:
    """The job's ``-P model=...``, one of ``MODELS``."""
    model = job.param("model", DEFAULT_MODEL)
    if model not in MODELS:
        raise kf.InvalidParameterError(
            f"job {job.name!r}: model {model!r} is not one of {', '.join(sorted(MODELS))}"
        )
    return model


def forget_after(job: kf.Job) -> str | None:
    """The job's ``-P forget_after=...`` (a duration, or ``never``)."""
    forget = job.param("forget_after", FORGET_AFTER)
    return None if forget == "never" else forget


def trainer_function(model: str, ttl: str | None = FORGET_AFTER) -> kf.StatefulFunction[Learning]:
    """The per-key training function for the model family ``model``."""
    family = MODELS[model]

    @kf.stateful(state=Learning, output=ModelUpdate, ttl=ttl, late="function")
    def train(
        key: tuple[Any, ...], events: list[CleanReading], ctx: kf.StateContext[Learning]
    ) -> Iterator[ModelUpdate]:
        trainer = _thaw(ctx.state.trainer) if ctx.state.trainer else family.trainer()
        params = trainer.learn(e.value for e in events)
        ctx.state.trainer = _freeze(trainer)
        newest = max(e.time for e in events)
        yield ModelUpdate(
            str(key[0]),
            str(key[1]),
            trainer.name,
            int(params["version"]),
            int(params["n"]),
            newest,
            json.dumps(params),
        )

    return train


def build(job: kf.Job) -> None:
    readings = job.source(
        job.param("source", CLEAN_TOPIC), CleanReading, key="device", time="time", watermark="1m"
    )
    trained = readings.process(
        trainer_function(model_family(job), forget_after(job)),
        by=["device", "metric"],
        name="models",
    )
    trained.to(kf.topic(job.param("dest", MODELS_TOPIC), compact=True))
