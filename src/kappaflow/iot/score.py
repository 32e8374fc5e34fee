"""The scoring job: every clean reading scored with the latest model of its metric.

Written on the public job API only. Start it with::

    kappaflow jobs start iot-score --app kappaflow.iot.score:build

Each reading of ``telemetry.clean`` (``-P source=...``) is joined to the compacted topic
``models`` (``-P models=...``) as a table, seen as it is at each micro-batch, and scored
per device and metric by a ``kappaflow.iot.models.Scorer`` that keeps the readings its
model needs (a forecaster's last few) and the last parameters it was given. A reading
whose metric has no model yet scores 0 (and is remembered for the model of ``-P
model=...``, the trainer's); when the trainer stops, the table keeps its last
parameters and scoring goes on with them. Scores go to ``scores`` (``-P dest=...``),
keyed by ``[device, metric]``::

    {"device": "dev-000042", "metric": "cpu_temp", "value": 61.2,
     "time": "2026-11-25T09:00:01.250Z", "id": "...", "score": 0.07,
     "model": "likelihood", "model_version": 118, "run": "...", "seq": 5012,
     "expected_low": 58.4, "expected_high": 63.9, "likelihood": 0.41}

``expected_low`` to ``expected_high`` is the range the model expected the reading in (its
level surprise under the alert score there) and ``likelihood`` one minus the tail
probability of its surprise (``kappaflow.iot.models.Explanation``): null without
parameters, and the range for ``hst``, which has no centre.

``run`` and ``seq`` number the key's readings as scored: ``run`` is the id of the first
reading the key's state scored (a key forgotten and seen again starts a new run), ``seq``
the reading's number in it. A scorer that scores a reading again (the real-time scorer
after a restart) gives it the same pair, which the alerting job uses to judge it once.

A ``models`` record whose parameters do not parse, or that names a model family this
version does not know, goes to the job's dead-letter topic and leaves the key's last
good parameters in use. Readings behind the watermark are scored too
(``late="function"``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.iot.clean import CLEAN_TOPIC, CleanReading
from kappaflow.iot.models import MODELS, Params, Scorer
from kappaflow.iot.models.base import LENGTHS, SHAPE
from kappaflow.iot.train import (
    FORGET_AFTER,
    MODELS_TOPIC,
    ModelUpdate,
    forget_after,
    model_family,
)

SCORES_TOPIC = "scores"


@dataclass
class Modelled:
    """A clean reading with its metric's latest model, where there is one."""

    device: str
    metric: str
    value: float
    time: datetime
    id: str
    model: str | None
    version: int | None
    params: str | None


@dataclass
class Score:
    device: str
    metric: str
    value: float
    time: datetime
    id: str
    score: float
    model: str | None
    model_version: int | None
    #: The run of the key's scoring (the id of its first reading scored) and the reading's
    #: number in it: a reading scored again from the same state has the same pair.
    run: str
    seq: int
    #: The explanation (``kappaflow.iot.models.Explanation``): the range the model
    #: expected the reading in, and its anomaly likelihood; null without parameters (and
    #: the range for a family without a centre, ``hst``).
    expected_low: float | None = None
    expected_high: float | None = None
    likelihood: float | None = None


@dataclass
class Scoring:
    #: The scorer's memory (``Scorer.state``), as JSON text; empty for a new key.
    scorer: str = ""
    #: The parameters last scored with, as JSON text, and their version.
    params: str = ""
    version: int = 0
    #: The run (its first reading's id) and the readings scored in it.
    run: str = ""
    seq: int = 0


def _newer(state: Scoring, event: Modelled) -> Params | None:
    """The event's parameters where newer than the key's and readable; they become the
    key's."""
    if event.params is None or event.version is None or event.version <= state.version:
        return None
    try:
        params = json.loads(event.params)
    except ValueError:
        return None
    if not isinstance(params, dict) or params.get("model") not in MODELS:
        return None
    if params["model"] != event.model:
        return None
    state.params, state.version = event.params, event.version
    return params


def _stored(text: str | None) -> Params | None:
    """The key's stored parameters; None for none, or for those of a version before
    ``tail`` was published (the key scores 0 until the trainer's next version)."""
    params: Params | None = json.loads(text) if text else None
    return params if params is not None and "tail" in params else None


def scorer_function(model: str, ttl: str | None = FORGET_AFTER) -> kf.StatefulFunction[Scoring]:
    """The per-key scoring function; ``model`` is the family whose scorer remembers the
    readings that come before the key's first parameters."""
    default = MODELS[model]

    @kf.stateful(state=Scoring, output=Score, ttl=ttl, late="function")
    def score(
        key: tuple[Any, ...], events: list[Modelled], ctx: kf.StateContext[Scoring]
    ) -> Iterator[Score]:
        memory = json.loads(ctx.state.scorer) if ctx.state.scorer else None
        # Parsed once a call, and again only when an event brings a newer version.
        params = _stored(ctx.state.params)
        scorer: Scorer | None = None
        for e in events:
            params = _newer(ctx.state, e) or params
            version = ctx.state.version if params is not None else None
            family = MODELS[params["model"]] if params is not None else default
            if scorer is None or scorer.model is not family:
                memory = scorer.state() if scorer is not None else memory
                scorer = Scorer.restore(family, memory)
            # Without parameters the score is 0, and the reading is still remembered: the
            # first model's first forecasts need the readings before it.
            value = scorer.score(e.value, params)
            name = family.name if params is not None else None
            state = ctx.state
            state.run, state.seq = state.run or e.id, state.seq + 1
            why = scorer.explain()
            yield Score(
                e.device,
                e.metric,
                e.value,
                e.time,
                e.id,
                value,
                name,
                version,
                state.run,
                state.seq,
                why.expected_low,
                why.expected_high,
                why.likelihood,
            )
        if scorer is not None:
            ctx.state.scorer = json.dumps(scorer.state())

    return score


def params_problem() -> Column:
    """What is wrong with a ``models`` record's ``params``, in words, or null: JSON text
    that does not parse, a family other than the record's or one this version does not
    know, a parameter missing or not of its family's type or length."""
    params = F.try_parse_json(F.col("params"))
    family = F.try_variant_get(params, "$.model", "string")
    problem = (
        F.when(params.isNull(), F.lit("params are not JSON text"))
        .when(~family.isin(*MODELS), F.lit("params name no model family known here"))
        .when(family != F.col("model"), F.lit("params are of another model family than the record"))
    )
    for name, model in MODELS.items():
        ours = F.col("model") == F.lit(name)
        lengths = {**LENGTHS, **model.lengths}
        for path, kind in {**SHAPE, **model.shape}.items():
            value = F.try_variant_get(params, path, kind)
            problem = problem.when(ours & value.isNull(), F.lit(f"params: {path} is not {kind}"))
            if path in lengths:
                problem = problem.when(
                    ours & (F.size(value) != lengths[path]),
                    F.lit(f"params: {path} does not hold {lengths[path]} values"),
                )
    return problem


def build(job: kf.Job) -> None:
    readings = job.source(
        job.param("source", CLEAN_TOPIC),
        CleanReading,
        key="device",
        time="time",
        watermark="1m",
    )
    problem = params_problem()
    models = job.table(
        job.param("models", MODELS_TOPIC), ModelUpdate, key=["device", "metric"]
    ).reject(problem.isNotNull(), problem)
    modelled = readings.join(models, on=["device", "metric"], how="left").select(
        "device", "metric", "value", "time", "id", "model", "version", "params"
    )
    scores = modelled.process(
        scorer_function(model_family(job), forget_after(job)),
        by=["device", "metric"],
        name="scores",
        record=Modelled,
    )
    scores.to(kf.topic(job.param("dest", SCORES_TOPIC)))
