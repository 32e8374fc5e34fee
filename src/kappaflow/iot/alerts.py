"""The alerting job: rules on the scores and the raw values, one alert per incident.

Written on the public job API only. Start it with::

    kappaflow jobs start iot-alerts --app kappaflow.iot.alerts:build

From ``scores`` (``-P source=...``), per device and metric, a stateful function applies
three rules and writes to ``alerts`` (``-P dest=...``), keyed by ``[device, metric]``:

- ``anomaly``: ``SUSTAINED`` readings in a row scored at or above ``ALERT_SCORE`` (one
  reading for a model family that raises one alarm per incident itself, ``likelihood``,
  whose scorer holds the readings after an alarm under the alert score); it is resolved
  by ``CALM`` readings in a row below it;
- ``no_data``: no reading for ``SILENCE`` of event time (an event-time timer, so it fires
  as the watermark, which other devices' readings move, passes); the next reading
  resolves it;
- ``rate``: a metric of the fleet (``kappaflow.iot.telemetry.METRICS``) that moves more
  than ``RATE_SCALES`` of its scales within a minute; a reading that moves less than that
  from the one before resolves it.

A reading scored again (a restarted real-time scorer scores the readings of its last
batch once more) is judged once: each score carries the scorer's ``run`` of the key and
its ``seq`` in it, and a pair judged before is passed over.

An alert is raised once per incident: a rule already raised for a key raises nothing more
until it is resolved. Each record says ``raised`` or ``resolved``, with the reason, the
event time, for ``anomaly`` the score that raised it, and the rules open for the key
after it. A raised ``anomaly`` explains itself: the ``model`` that scored the reading,
the ``value`` seen, the range the model expected it in (``expected_low`` to
``expected_high``: where its surprise stays under the alert score) and its anomaly
``likelihood`` (one minus the tail probability of its surprise), as the score record
carried them (null where it had none); a raised ``rate`` has the ``value``::

    {"device": "dev-000042", "metric": "cpu_temp", "rule": "anomaly",
     "status": "raised", "reason": "scored 0.93 >= 0.5: 71.2 where 58.4 to 63.9 was
     expected", "time": "2026-11-25T09:03:01.250Z", "score": 0.93, "open": ["anomaly"],
     "model": "likelihood", "value": 71.2, "expected_low": 58.4, "expected_high": 63.9,
     "likelihood": 0.9999999991}

The serving store keeps each key's latest record (``kf:iot-alerts:alerts:latest``), so
the open alerts are the keys whose latest record has rules in ``open``.

Readings behind the watermark are judged too (``late="function"``), in the order they
come; a key that sent nothing for ``FORGET_AFTER`` is forgotten with its open alerts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.iot.models import ALERT_SCORE, MODELS
from kappaflow.iot.score import SCORES_TOPIC
from kappaflow.iot.telemetry import METRICS

ALERTS_TOPIC = "alerts"
SUSTAINED = 3
CALM = 5
SILENCE_MS = 5 * 60_000
RATE_SCALES = 4.0
FORGET_AFTER = "1d"
#: How many readings judged out of order a key remembers (``_again``).
GAPS_KEPT = 1000
_SCALE = {m.name: m.scale for m in METRICS}
_MINUTE_MS = 60_000


@dataclass
class Scored:
    device: str
    metric: str
    value: float
    time: kf.EventTime
    id: str
    score: float
    #: The scorer's run of the key (the id of the first reading it scored) and the
    #: reading's number in it: a reading scored again has the same pair.
    run: str | None = None
    seq: int | None = None
    #: The model that scored the reading and its explanation (``kappaflow.iot.score``).
    model: str | None = None
    expected_low: float | None = None
    expected_high: float | None = None
    likelihood: float | None = None


@dataclass
class Alert:
    device: str
    metric: str
    rule: str
    status: str
    reason: str
    time: datetime
    score: float | None = None
    #: The key's rules open after this record: the serving store keeps each key's latest.
    open: list[str] = field(default_factory=list)
    #: What raised it: for ``anomaly``, the model, the value seen, the range the model
    #: expected it in and its likelihood; for ``rate``, the value.
    model: str | None = None
    value: float | None = None
    expected_low: float | None = None
    expected_high: float | None = None
    likelihood: float | None = None


@dataclass
class Watch:
    #: Readings in a row at or above the alert score, and below it.
    high: int = 0
    calm: int = 0
    #: The rules raised and not yet resolved.
    open: list[str] = field(default_factory=list)
    last_seen: int = 0
    last_value: float | None = None
    #: The scorer's run judged, the number up to which all its readings were judged, and
    #: those judged above it (readings that came out of event-time order).
    run: str = ""
    judged: int = 0
    above: list[int] = field(default_factory=list)


def _again(w: Watch, e: Scored, first: int) -> bool:
    """Whether ``e`` is a reading judged before: a real-time scorer restarted scores the
    readings of its last batch again (at least once). ``first`` is the lowest number of
    ``e``'s run among the events at hand, where the run is new to the key."""
    if e.run is None or e.seq is None:
        return False
    if e.run != w.run:
        w.run, w.judged, w.above = e.run, first - 1, []
    if e.seq <= w.judged:
        return True
    # ``above`` stays sorted: a binary search, not a scan, for each reading.
    at = bisect_left(w.above, e.seq)
    if at < len(w.above) and w.above[at] == e.seq:
        return True
    w.above.insert(at, e.seq)
    _advance(w)
    return False


def _advance(w: Watch, keep: int | None = None) -> None:
    """Move ``judged`` over the numbers judged in a row; with ``keep``, also over the
    lowest of ``above`` until no more than ``keep`` remain (a number that never comes, a
    score the job could not read, holds back no more than that many)."""
    n = 0
    while n < len(w.above) and (
        w.above[n] == w.judged + 1 or (keep is not None and len(w.above) - n > keep)
    ):
        w.judged = w.above[n]
        n += 1
    if n:
        del w.above[:n]


def _raise(w: Watch, e: Scored, rule: str, reason: str, score: float | None = None) -> Alert:
    w.open.append(rule)
    alert = Alert(e.device, e.metric, rule, "raised", reason, e.time, score, list(w.open))
    alert.value = e.value
    if rule == "anomaly":
        alert.model, alert.likelihood = e.model, e.likelihood
        alert.expected_low, alert.expected_high = e.expected_low, e.expected_high
    return alert


def _sustained(e: Scored) -> int:
    """High scores in a row that raise an anomaly: one for a family that raises one alarm
    per incident itself (its scorer holds the readings after an alarm under the alert
    score), ``SUSTAINED`` for the others."""
    family = MODELS.get(e.model or "")
    return 1 if family is not None and family.guards else SUSTAINED


def _anomaly_reason(e: Scored, needed: int) -> str:
    if needed > 1:
        reason = f"{needed} readings in a row scored >= {ALERT_SCORE}"
    else:
        reason = f"scored {e.score:.3g} >= {ALERT_SCORE}"
    if e.expected_low is not None and e.expected_high is not None:
        reason += (
            f": {e.value:.4g} where {e.expected_low:.4g} to {e.expected_high:.4g} was expected"
        )
    return reason


def _resolve(w: Watch, e: Scored, rule: str, reason: str) -> Alert:
    w.open.remove(rule)
    return Alert(e.device, e.metric, rule, "resolved", reason, e.time, None, list(w.open))


def explanation(alert: Mapping[str, Any]) -> str:
    """An alert record's explanation in a few words, for people (the CLI, the dashboard):
    ``71.2 seen, 58.4 to 63.9 expected (likelihood; 1 in 3.2e+09)``; empty where the
    record explains nothing. The reading is ``seen`` in a real-time alert, whose
    ``value`` is the score its rule compared, and ``value`` in the others."""
    value = alert.get("seen", alert.get("value"))
    low, high = alert.get("expected_low"), alert.get("expected_high")
    if value is None:
        return ""
    words = f"{value:.4g} seen"
    if low is not None and high is not None:
        words += f", {low:.4g} to {high:.4g} expected"
    notes = [str(alert["model"])] if alert.get("model") else []
    likelihood = alert.get("likelihood")
    if likelihood is not None:
        tail = 1.0 - float(likelihood)
        notes.append(f"1 in {1.0 / tail:.2g}" if tail > 0 else "never seen")
    return words + (f" ({'; '.join(notes)})" if notes else "")


@kf.stateful(state=Watch, output=Alert, ttl=FORGET_AFTER, late="function")
def watch(
    key: tuple[Any, ...], events: list[Scored], ctx: kf.StateContext[Watch]
) -> Iterator[Alert]:
    w = ctx.state
    firsts: dict[str, int] = {}
    for e in events:
        if e.run is not None and e.seq is not None:
            firsts[e.run] = min(firsts.get(e.run, e.seq), e.seq)
    for e in events:
        if _again(w, e, firsts.get(e.run or "", 1)):
            continue
        t = kf.to_epoch_ms(e.time)
        if "no_data" in w.open:
            yield _resolve(w, e, "no_data", "a reading came")
        if w.last_seen:
            ctx.timers.cancel(w.last_seen + SILENCE_MS)
        moved = None if w.last_value is None else abs(e.value - w.last_value)
        previous = w.last_seen
        w.last_seen = max(w.last_seen, t)
        w.last_value = e.value
        ctx.timers.at(w.last_seen + SILENCE_MS)
        # Sustained high score.
        if e.score >= ALERT_SCORE:
            w.high, w.calm = w.high + 1, 0
            needed = _sustained(e)
            if w.high >= needed and "anomaly" not in w.open:
                yield _raise(w, e, "anomaly", _anomaly_reason(e, needed), e.score)
        else:
            w.high, w.calm = 0, w.calm + 1
            if w.calm >= CALM and "anomaly" in w.open:
                yield _resolve(w, e, "anomaly", f"{CALM} readings in a row scored < {ALERT_SCORE}")
        # Rate of change, for the fleet's metrics (whose scales are known).
        scale = _SCALE.get(e.metric)
        if scale is None or moved is None:
            continue
        limit = RATE_SCALES * scale
        if moved > limit and 0 <= t - previous <= _MINUTE_MS and "rate" not in w.open:
            yield _raise(w, e, "rate", f"moved {moved:.3g} within a minute (limit {limit:g})")
        elif moved <= limit and "rate" in w.open:
            yield _resolve(w, e, "rate", f"moved {moved:.3g}, within {limit:g}")
    # Once the batch is judged: a number that came out of order within it is not lost.
    _advance(w, GAPS_KEPT)


@watch.on_timer
def silent(key: tuple[Any, ...], at_ms: int, ctx: kf.StateContext[Watch]) -> Iterator[Alert]:
    w = ctx.state
    if "no_data" not in w.open:
        w.open.append("no_data")
        reason = f"no reading for {SILENCE_MS // 60_000} minutes"
        at = kf.from_epoch_ms(at_ms)
        yield Alert(str(key[0]), str(key[1]), "no_data", "raised", reason, at, None, list(w.open))


#: What a real-time score alert carries of its reading: the reading and its explanation.
REALTIME_CARRIED = ("seen", "model", "expected_low", "expected_high", "likelihood")


def build_realtime(job: kf.Job) -> None:
    """The alert that latency matters for, in Spark's real-time mode: a reading scored at
    or above ``ALERT_SCORE`` raises ``score`` the moment its score is in ``scores``, by a
    declarative rule that runs in the JVM (no Python operator)::

        kappaflow jobs start iot-alerts-rt --app kappaflow.iot.alerts:build_realtime \\
            --real-time [-P source=scores] [-P dest=alerts]

    Each such reading raises one (the rule keeps no state: ``anomaly``'s readings in a
    row, ``no_data`` and ``rate`` stay with ``build``'s micro-batch job, where a few
    seconds do not matter). At least once, keyed by ``[device, metric]``::

        {"device": "dev-000042", "metric": "cpu_temp", "time": "2026-11-25T09:03:01.250Z",
         "seen": 71.2, "model": "likelihood", "expected_low": 58.4, "expected_high": 63.9,
         "likelihood": 0.99999, "rule": "score", "field": "score", "value": 0.93,
         "op": ">=", "threshold": 0.5, "status": "raised", "reason": "score 0.93 >= 0.5"}
    """
    scores = job.source(
        job.param("source", SCORES_TOPIC),
        Scored,
        key=["device", "metric"],
        time="time",
        watermark="1m",
    )
    # The alert's ``value`` is the score; the reading travels as ``seen``, with the
    # model's explanation, as the micro-batch alerts' do.
    explained = scores.with_column("seen", F.col("value"))
    alerts = explained.alerts(carry=REALTIME_CARRIED, score=("score", ">=", ALERT_SCORE))
    # Named: a topic's name (``dest``) may hold dots, which an output's name may not.
    alerts.to(kf.topic(job.param("dest", ALERTS_TOPIC)), kf.store(), name="alerts")


def build(job: kf.Job) -> None:
    scores = job.source(
        job.param("source", SCORES_TOPIC),
        Scored,
        key=["device", "metric"],
        time="time",
        watermark="1m",
    )
    alerts = scores.process(watch, by=["device", "metric"], name="alerts")
    alerts.to(kf.topic(job.param("dest", ALERTS_TOPIC)), kf.store())
