"""Continuous counting through crashes, restarts, a replay and a removal, against the real
broker, Redis and Spark: exactly-once across a job's lifetimes."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer, TopicPartition
from conftest import RunCli
from faults import count_with_crash
from live_jobs import topic_values

from kappaflow.counting.job import OUTPUT
from kappaflow.errors import WaitTimeoutError
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import list_topics, topic_partitions
from kappaflow.settings import Settings
from kappaflow.spark.checkpoint import committed, offsets_consumed
from kappaflow.streams.output.writer import STEPS
from kappaflow.timeutil import from_epoch_ms, iso
from kappaflow.waiting import wait_for
from test_counting import (
    BASE,
    WINDOW_MS,
    changelog,
    events,
    expected,
    job_name,  # noqa: F401 (a fixture, the job's name: see its use)
    send,
    start,
    stats,
    store_counts,
    wait_stats,
)

pytestmark = pytest.mark.long

# A crash before a batch writes anything re-runs it like any other; the steps after a
# write are where exactly-once could break. The counting job crashes after its serving
# store's write and inside its open transaction; the job API's test of the same batch
# writer (test_app_crashes.py, three sinks) after the lake's write and after the commit.
CRASH_STEPS = ["after-store", "in-transaction"]


def uncommitted_values(settings: Settings, topic: str) -> list[bytes]:
    """Every record value in ``topic``, aborted transactions' too (read_uncommitted)."""
    reader = consumer(settings.kafka, **{"isolation.level": "read_uncommitted"})
    try:
        partitions = topic_partitions(settings.kafka, topic)
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        values: list[bytes] = []
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            message = reader.poll(5.0)
            assert message is not None, f"no end of {topic} within 5 s"
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition() or 0)
                continue
            values.append(message.value() or b"")
        return values
    finally:
        reader.close()


def start_with_crash(
    cli: RunCli, job: str, source: str, step: str, first_batch: int, record: Path
) -> None:
    """Start counting job ``job`` through the fault-injection pipeline (tests/support)."""
    args, env = count_with_crash(source, WINDOW_MS, f"{step}:{first_batch}", record)
    result = cli("jobs", "start", job, *args, env=env)
    assert result.code == 0, result.err


def test_crashes_after_the_store_and_inside_the_transaction_change_nothing(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
    tmp_path: Path,
) -> None:
    """One job crashes at each of CRASH_STEPS of a batch's writes in turn: restarted with
    the next step's fault, it first runs the crashed batch again (the fault is armed only for the
    batches after it), then crashes in the batch that new events make. Started at last
    without a fault, it holds and has published each event's count once."""
    source = new_topic(partitions=2)
    first = events()
    sent: list[dict[str, Any] | bytes] = [*first, dict(first[3])]
    send(serving, source, sent)
    record = tmp_path / "crash.json"
    jobs = JobManager(serving)
    query = serving.checkpoint_root / job_name / OUTPUT
    # The first crash comes in a batch after the first, at the first step of its writes.
    start_with_crash(cli, job_name, source, CRASH_STEPS[0], 1, record)
    counted = sum(expected([v for v in sent if isinstance(v, dict)]).values())
    wait_stats(serving, job_name, counted=counted, duplicates=len(sent) - counted)

    # What each crash's batch reads: for the first, new events with a duplicate, an
    # event too late for its window and a record that does not parse; for each after,
    # the newest event counted before (a duplicate across the crash) and new events.
    too_late = {"page": "/p1", "ts": BASE + 5_000, "id": "too-late"}
    fresh = events(20, start=len(first))
    inputs: list[list[dict[str, Any] | bytes]] = [[*fresh, dict(fresh[5]), too_late, b"garbage"]]
    while len(inputs) < len(CRASH_STEPS):
        newest = fresh[-1]
        fresh = events(5, start=int(newest["id"].removeprefix("e")) + 1)
        inputs.append([dict(newest), *fresh])

    crashes: list[dict[str, Any]] = []
    for (step, following), values in zip(
        itertools.pairwise([*CRASH_STEPS, None]), inputs, strict=True
    ):
        send(serving, source, values)
        sent += values
        wait_for(
            lambda: True if record.exists() and jobs.get_state(job_name) == "crashed" else None,
            timeout=180,
            what=f"the crash at {step}",
        )
        crashed = json.loads(record.read_text())
        assert crashed["step"] == step and crashed["batch"] >= 1
        assert all(crashed["batch"] > before["batch"] for before in crashes)
        crashes.append(crashed)
        record.unlink()
        if following is not None:
            # The crashed batch runs again without a crash; a batch after it crashes.
            start_with_crash(cli, job_name, source, following, crashed["batch"] + 1, record)
        else:
            start(cli, job_name, source)  # resumes from the checkpoint, without a fault

    # Spark has run the last crashed batch again and committed it, as it did the others
    # before the batches that crashed after them ...
    wait_for(
        lambda: True if committed(query, crashes[-1]["batch"]) else None,
        timeout=180,
        what=f"batch {crashes[-1]['batch']} to be run again",
    )
    assert all(committed(query, c["batch"]) for c in crashes)
    # ... and everything sent has been read and accounted for.
    in_time = [v for v in sent if isinstance(v, dict) and v["id"] != too_late["id"]]
    want = expected(in_time)
    counted = sum(want.values())
    late, dead = [too_late], [v for v in sent if isinstance(v, bytes)]
    final = wait_stats(
        serving,
        job_name,
        counted=counted,
        duplicates=len(in_time) - counted,
        late=len(late),
        dead_letters=len(dead),
    )
    assert (final.counted, final.duplicates, final.late, final.dead_letters) == (
        counted,
        len(in_time) - counted,
        len(late),
        len(dead),
    )
    assert offsets_consumed(query, final.last_batch) == len(sent) == final.accounted

    assert store_counts(serving, job_name) == want
    changes = changelog(serving, job_name)
    identities = [(c["key"], c["window_start"], c["version"]) for c in changes]
    assert len(identities) == len(set(identities)), "a change was published twice"
    by_window: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for change in changes:
        by_window[(change["key"], change["window_start"])].append(change)
    for history in by_window.values():  # no change lost either: each follows the last
        assert [c["version"] for c in history] == list(range(1, len(history) + 1))
        for before, after in itertools.pairwise(history):
            assert after["previous"] == before["count"]
    assert {(key, _iso(start_ms)): n for (key, start_ms), n in want.items()} == {
        window: history[-1]["count"] for window, history in by_window.items()
    }
    assert [
        json.loads(e["event"])["id"]
        for e in topic_values(serving, f"{job_name}.late", at_least=len(late))
    ] == [e["id"] for e in late]
    assert len(topic_values(serving, f"{job_name}.dlq", at_least=len(dead))) == len(dead)
    # The crash in-transaction left the batch's marker in an open transaction of the
    # driver's (the tasks had committed the batch's records in transactions of their
    # own), which the restarted job's producer aborted: a read_uncommitted reader sees
    # it, read_committed not.
    assert "in-transaction" in [c["step"] for c in crashes]
    markers = f"{job_name}.commits"
    assert len(uncommitted_values(serving, markers)) > len(topic_values(serving, markers))


def test_a_restarted_job_fences_off_its_predecessors_producer(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
) -> None:
    """A driver that stalled mid-transaction (not dead, only slow) cannot commit once a
    new driver of its job has started: the job's fixed transactional id fences it."""
    source, elsewhere = new_topic(), new_topic()
    values = events(10)
    send(serving, source, values)
    stalled = Producer(
        {**serving.kafka.client_config(), "transactional.id": f"kappaflow.job.{job_name}"}
    )
    stalled.init_transactions(30)
    stalled.begin_transaction()
    stalled.produce(elsewhere, b"from the stalled driver")
    assert stalled.flush(30) == 0

    start(cli, job_name, source)
    wait_stats(serving, job_name, counted=10)
    with pytest.raises(KafkaException) as refused:
        stalled.commit_transaction(30)
    error = refused.value.args[0]
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error
    assert topic_values(serving, elsewhere) == []
    assert uncommitted_values(serving, elsewhere) == [b"from the stalled driver"]
    assert store_counts(serving, job_name) == expected(values)


def _iso(millis: int) -> str:
    return iso(from_epoch_ms(millis))


def test_replay_of_the_log_gives_the_live_results(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
) -> None:
    source = new_topic(partitions=2)
    values = events(40)
    send(serving, source, values[:20])
    start(cli, job_name, source)
    wait_stats(serving, job_name, counted=20)
    send(serving, source, values[20:])
    wait_stats(serving, job_name, counted=40)
    live = store_counts(serving, job_name)
    assert live == expected(values)

    replay = f"{job_name}-replay"
    started = start(cli, replay, source, "--available-now")
    assert "running" in started.err or "finished" in started.err
    wait_for(
        lambda: True if JobManager(serving).get_state(replay) == "finished" else None,
        timeout=180,
        what="the replay to finish",
    )
    assert store_counts(serving, replay) == live


def test_a_removed_job_starts_over(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
) -> None:
    source = new_topic()
    values = events(30)
    send(serving, source, values)
    start(cli, job_name, source)
    wait_stats(serving, job_name, counted=30)
    running = cli("count", "remove", job_name)
    assert running.code == 1 and "stop it first" in running.err
    assert "Traceback" not in running.err

    assert cli("count", "stop", job_name).code == 0
    removed = cli("count", "remove", job_name)
    assert removed.code == 0, removed.err
    assert "4 topics" in removed.err  # messages go to stderr, data to stdout
    assert JobManager(serving).get_state(job_name) == "absent"
    assert not (serving.checkpoint_root / job_name).exists()
    assert store_counts(serving, job_name) == {}
    assert stats(serving, job_name).counted == 0
    names = {t["name"] for t in list_topics(serving.kafka)}
    assert not {f"{job_name}.counts", f"{job_name}.commits"} & names
    assert cli("count", "remove", job_name).code == 1  # nothing left to remove

    # Started again, the job counts the source from its start, not from where it was.
    start(cli, job_name, source)
    assert wait_stats(serving, job_name, counted=30).counted == 30
    assert store_counts(serving, job_name) == expected(values)
    # ... and publishes its changes again (a NAME.commits left behind would have
    # made it skip its first batches as published). The store is written before Kafka,
    # so the changelog may come a moment after the counts.
    wanted = {(key, iso(from_epoch_ms(start))): n for (key, start), n in expected(values).items()}
    assert wait_published(serving, job_name, wanted) == wanted


def test_a_duplicate_of_the_first_batch_counts_once_through_its_crashes(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
    tmp_path: Path,
) -> None:
    """The first batch crashes at each step of its writes in turn (every restart runs it
    again and crashes at the next step); what is sent after its first crash is the next
    batch: a copy of each of its events, beside an event without an id in the same page
    and window, and new events. Each copy is a duplicate, each event without an id
    counts."""
    source = new_topic(partitions=2)
    first = events(10)
    send(serving, source, first)
    record = tmp_path / "crash.json"
    jobs = JobManager(serving)
    query = serving.checkpoint_root / job_name / OUTPUT
    later: list[dict[str, Any]] = [
        *(dict(e) for e in first),
        *({"page": e["page"], "ts": e["ts"]} for e in first),
        *events(10, start=len(first)),
    ]
    for number, step in enumerate(STEPS):
        start_with_crash(cli, job_name, source, step, 0, record)
        wait_for(
            lambda: True if record.exists() and jobs.get_state(job_name) == "crashed" else None,
            timeout=180,
            what=f"the crash at {step}",
        )
        assert json.loads(record.read_text()) == {"step": step, "batch": 0, "output": OUTPUT}
        record.unlink()
        if number == 0:
            send(serving, source, later)  # batch 0 is planned: these are batch 1
    start(cli, job_name, source)

    sent = [*first, *later]
    with_id = [e for e in sent if "id" in e]
    want = Counter(expected(with_id))
    want.update((e["page"], e["ts"] - e["ts"] % WINDOW_MS) for e in sent if "id" not in e)
    counted = sum(want.values())
    # Every record read and accounted for (counted or dropped as a duplicate) ...
    final = wait_stats(serving, job_name, accounted=len(sent))
    assert offsets_consumed(query, final.last_batch) == len(sent) == final.accounted
    # ... each copy a duplicate.
    assert (final.counted, final.duplicates) == (counted, len(sent) - counted)
    assert store_counts(serving, job_name) == dict(want)
    wanted = {(key, _iso(start_ms)): n for (key, start_ms), n in want.items()}
    assert wait_published(serving, job_name, wanted) == wanted


def wait_published(
    settings: Settings, job: str, wanted: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    """Each window's count in its latest change on the changelog, once it is ``wanted``
    or a minute has passed: the store is written before Kafka, so the changelog may come
    a moment after the store's counts."""
    seen: dict[tuple[str, str], int] = {}

    def published() -> bool | None:
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for change in changelog(settings, job):
            window = (change["key"], change["window_start"])
            if change["version"] >= latest.get(window, {"version": -1})["version"]:
                latest[window] = change
        seen.clear()
        seen.update({k: c["count"] for k, c in latest.items()})
        return True if seen == wanted else None

    with contextlib.suppress(WaitTimeoutError):  # the caller's comparison shows what differs
        wait_for(published, timeout=60, what="the changelog")
    return seen
