"""Recorded series through the live path: Kafka, the training job, ``models``, the scoring job.

Each series becomes one device's metric (the device is the file's relative path, the
metric ``value``); its rows become clean readings stamped with their own timestamps. The
training and scoring jobs (``kappaflow.iot.train``, ``kappaflow.iot.score``) run in this
process on their own topics, and the rows go through them in rounds (the same rows of
every series, ``evaluation.rounds``), in lock-step: a round goes to the scorer's topic,
and once every reading of it is scored, to the trainer's; once the trainer has learnt
it, the next round begins. So each reading is scored with the model learnt from the
rounds before its own, never from its own round or later, however fast either job runs;
the scores are the ones ``evaluation.replay`` computes in one process for the same batch
size.

The two jobs read two topics (not one, as in the live application) only to keep that
order: in the live application, readings reach both at once and the scorer uses the
newest model published when its micro-batch begins.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from kappaflow.errors import JobError, WaitTimeoutError
from kappaflow.iot import score, train
from kappaflow.iot.evaluation import Series, parse_time, rounds
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.restarts import MAX_RESTARTS, failures, restartable
from kappaflow.kafka.clients import consumer, producer
from kappaflow.kafka.topics import create_topic, delete_topic, topic_partitions
from kappaflow.settings import Settings
from kappaflow.streams.runtime import Build
from kappaflow.waiting import wait_for

#: How long one round may take through a job before the replay gives up.
_ROUND_TIMEOUT_S = 300.0


class _Tail:
    """Reads a topic from its start, read_committed, and keeps what was read."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self._reader = consumer(settings.kafka)
        partitions = topic_partitions(settings.kafka, topic)
        self._reader.assign([TopicPartition(topic, p, 0) for p in partitions])

    def poll(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for message in self._reader.consume(num_messages=10_000, timeout=0.2):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise WaitTimeoutError(f"reading {message.topic()}: {error.str()}")
            found.append(json.loads(message.value() or b"{}"))
        return found

    def close(self) -> None:
        self._reader.close()


@dataclass
class _Topics:
    score_in: str
    train_in: str
    models: str
    scores: str

    def all(self) -> list[str]:
        return [self.score_in, self.train_in, self.models, self.scores]


def _readings(device: str, series: Series, rows: range) -> list[tuple[bytes, bytes]]:
    out = []
    for row in rows:
        value = series.values[row]
        if value != value:  # NaN: a row without a number is not a reading
            continue
        moment = parse_time(series.timestamps[row]).astimezone(UTC)
        reading = {
            "device": device,
            "metric": "value",
            "value": value,
            "unit": "",
            "time": moment.isoformat().replace("+00:00", "Z"),
            "seq": row,
            "id": f"{device}#{row}",
        }
        out.append((device.encode(), json.dumps(reading).encode()))
    return out


def replay_through_kafka(
    settings: Settings,
    spark: SparkSession,
    series: dict[str, Series],
    *,
    model: str,
    batch: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, list[float]]:
    """Each series' scores, row by row (0 for a row without a number), from the jobs."""
    run = f"kf-evaluate-{uuid.uuid4().hex[:8]}"
    topics = _Topics(f"{run}.score-in", f"{run}.train-in", f"{run}.models", f"{run}.scores")
    for topic in (topics.score_in, topics.train_in):
        create_topic(settings.kafka, topic, exist_ok=True)
    params = {"model": model, "forget_after": "never"}

    def running(build: Build, name: str, job_params: dict[str, str]) -> Running:
        ctx = JobContext(name, {**params, **job_params}, spark, settings)
        return Running(partial(start_app, build, ctx), name)

    trainer = running(
        train.build, f"{run}-train", {"source": topics.train_in, "dest": topics.models}
    )
    scorer = running(
        score.build,
        f"{run}-score",
        {"source": topics.score_in, "models": topics.models, "dest": topics.scores},
    )
    sender = producer(settings.kafka)
    scores_tail, models_tail = _Tail(settings, topics.scores), _Tail(settings, topics.models)
    scored: dict[str, float] = {}
    learnt: dict[str, int] = {}
    try:
        longest = max((len(s.values) for s in series.values()), default=0)
        schedule = rounds(longest, batch)
        for number, span in enumerate(schedule):
            sent: list[tuple[bytes, bytes]] = []
            want_learnt: dict[str, int] = {}
            for device, s in series.items():
                rows = range(span.start, min(span.stop, len(s.values)))
                records = _readings(device, s, rows)
                sent += records
                if records:
                    want_learnt[device] = learnt.get(device, 0) + len(records)
            _send(sender, topics.score_in, sent)
            want_scored = len(scored) + len(sent)
            _wait(scorer, lambda: _take_scores(scores_tail, scored), want_scored, "scored", number)
            _send(sender, topics.train_in, sent)
            _wait(
                trainer,
                lambda: _take_models(models_tail, learnt),
                want_learnt,
                "learnt",
                number,
            )
            if progress is not None:
                progress(number + 1, len(schedule))
    finally:
        scores_tail.close()
        models_tail.close()
        trainer.stop()
        scorer.stop()
        for topic in topics.all():
            delete_topic(settings.kafka, topic)
    return {
        device: [scored.get(f"{device}#{row}", 0.0) for row in range(len(s.values))]
        for device, s in series.items()
    }


def _send(sender: Producer, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    for key, value in records:
        while True:
            try:
                sender.produce(topic, key=key, value=value)
                break
            except BufferError:
                sender.poll(0.1)
    if sender.flush(60) != 0:
        raise WaitTimeoutError(f"records to {topic} not acknowledged in 60 s")


def _take_scores(tail: _Tail, scored: dict[str, float]) -> int:
    for record in tail.poll():
        scored[str(record["id"])] = float(record["score"])
    return len(scored)


def _take_models(tail: _Tail, learnt: dict[str, int]) -> dict[str, int]:
    for record in tail.poll():
        device = str(record["device"])
        learnt[device] = max(learnt.get(device, 0), int(record["learnt"]))
    return learnt


class Running:
    """A job of the evaluation, started in this process. Its queries start again from their
    checkpoints after a failure a restart cures, as a job's driver does (jobs/runner.py);
    any other failure ends the evaluation at once."""

    def __init__(self, start: Callable[[], list[StreamingQuery]], name: str) -> None:
        self._start = start
        self.name = name
        self.restarts = 0
        self.queries = start()

    def check(self) -> None:
        failed = failures(self.queries)
        if not failed:
            return
        if self.restarts >= MAX_RESTARTS or not restartable(failed):
            reason = failed[0].strip().splitlines()[0]
            raise JobError(f"job {self.name} failed: {reason}")
        self.restarts += 1
        print(
            f"job {self.name}: restarting its queries from their checkpoints "
            f"({self.restarts} of {MAX_RESTARTS})",
            file=sys.stderr,
            flush=True,
        )
        self.stop()
        self.queries = self._start()

    def stop(self) -> None:
        for query in self.queries:
            query.stop()


def _wait(job: Running, probe: Callable[[], object], want: object, what: str, number: int) -> None:
    def reached() -> bool | None:
        job.check()
        got = probe()
        if isinstance(want, int):
            return True if isinstance(got, int) and got >= want else None
        assert isinstance(want, dict) and isinstance(got, dict)
        return True if all(got.get(k, 0) >= n for k, n in want.items()) else None

    wait_for(reached, timeout=_ROUND_TIMEOUT_S, interval=0.05, what=f"round {number + 1} {what}")
