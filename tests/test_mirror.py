"""Replication to a backup cluster and failover, against two real brokers, MirrorMaker 2,
Redis and Spark: records copied as they are, topics outside the mirror's pattern not; a
consumer group and a counting job going on on the backup once the primary is stopped,
with what is lost and what is read again measured, and the job's accounting after it; a
counting job's batch cut off by the failover run again on the backup; and a mirror that
cannot start leaving nothing behind. (The mirror's configuration and
MirrorMaker's records decoded: test_mirror_config.py.)

The module runs one failover: the tests before it use the running primary, the tests
after it (in this order) what the failover left.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from conftest import Result, error_line, make_settings, run_kappaflow
from faults import count_with_crash
from live_jobs import send_json

from kappaflow.counting.failover import start_from
from kappaflow.counting.store import CountStore
from kappaflow.errors import KappaflowError, TopicNotFoundError
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.mirror import Mirror
from kappaflow.kafka.mirror_status import decode_checkpoint
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import create_topic, list_topics
from kappaflow.procs import ProcState, free_port
from kappaflow.serving.client import redis_client
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings, load_settings
from kappaflow.spark.checkpoint import batch_end_offsets, committed, last_committed
from kappaflow.timeutil import from_epoch_ms, iso, parse_time, to_epoch_ms
from kappaflow.waiting import wait_for
from test_counting import DEFINITION, events

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

OFFSET_LAG_MAX = 10
SYNC_INTERVAL_S = 1
#: Short intervals, so that a test waits seconds, not minutes, for MirrorMaker to notice
#: a topic or a group and to translate a group's offsets.
MIRROR_ENV = {
    "KAPPAFLOW_MIRROR__SYNC_INTERVAL_S": str(SYNC_INTERVAL_S),
    "KAPPAFLOW_MIRROR__REFRESH_INTERVAL_S": "2",
    "KAPPAFLOW_MIRROR__OFFSET_LAG_MAX": str(OFFSET_LAG_MAX),
    "KAPPAFLOW_MIRROR__HEAP": "256m",
}
TOPICS = "mx-.*"
WINDOW_MS = 10_000
#: How far before the point the mirror reached a failed-over counting job goes back
#: (docs/deployment.md): more than a batch's planning may trail its records' timestamps.
MARGIN_MS = 10_000


@dataclass
class Clusters:
    primary: Settings
    backup: Settings
    brokers: dict[str, EmbeddedBroker]
    #: The counting job that runs on the primary from the start, and its source.
    job: str
    clicks: str

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Result:
        """`kappaflow` in the primary's state directory (the mirror's, the job's)."""
        return run_kappaflow(
            self.primary, *args, env={**MIRROR_ENV, **(env or {})}, timeout=timeout
        )


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    """Two single-node clusters, the mirror between them, and a counting job on the
    primary (started beside the mirror: each takes seconds to get going)."""
    primary = make_settings(tmp_path_factory.mktemp("primary"))
    backup = make_settings(tmp_path_factory.mktemp("backup"))
    brokers = {"primary": EmbeddedBroker(primary), "backup": EmbeddedBroker(backup)}
    redis = EmbeddedRedis(primary)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda b: b.start(), brokers.values()))
    redis.start()
    found = Clusters(primary, backup, brokers, f"count-{uuid.uuid4().hex[:6]}", topic(primary))
    try:
        with ThreadPoolExecutor(2) as pool:
            mirror = pool.submit(
                found.cli, "mirror", "start", "--to", backup.kafka.bootstrap, "--topics", TOPICS
            )
            job = pool.submit(
                found.cli, "count", "start", found.job, "--source", found.clicks, *DEFINITION
            )
            for started in (mirror.result(), job.result()):
                assert started.code == 0, started.err
        # `kappaflow status` lists the mirror while it runs, with where it copies to.
        rows = {r["service"]: r for r in map(json.loads, found.cli("status", "--json").lines())}
        assert rows["mirror"]["state"] == "running", rows
        assert rows["mirror"]["address"] == f"to {backup.kafka.bootstrap}", rows
        yield found
    finally:
        found.cli("jobs", "stop", found.job, "--timeout", "10")
        # `kappaflow down` stops the mirror with the primary's services.
        downed = found.cli("down")
        for broker in brokers.values():
            broker.stop(timeout=20)
        redis.stop()
    assert "mirror stopped" in downed.err, downed.out + downed.err
    assert Mirror(primary).process.status().state is ProcState.STOPPED


def topic(settings: Settings, partitions: int = 2) -> str:
    name = f"mx-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka, name, partitions=partitions)
    return name


def records(settings: Settings, name: str) -> list[dict[str, Any]]:
    """Every record of a topic: partition, offset, key, value, timestamp, headers."""
    return [
        {
            "partition": m.partition(),
            "offset": m.offset(),
            "key": m.key(),
            "value": m.value(),
            "timestamp": m.timestamp()[1],
            "headers": m.headers(),
        }
        for m in read_records(settings.kafka, name, start=StartAt(beginning=True))
    ]


def wait_mirrored(clusters: Clusters, name: str, count: int) -> list[dict[str, Any]]:
    def copied() -> list[dict[str, Any]] | None:
        try:
            found = records(clusters.backup, name)
        except TopicNotFoundError:
            return None  # the mirror has not made it yet
        return found if len(found) >= count else None

    return wait_for(
        copied, timeout=90, interval=0.5, what=f"{count} records of {name} on the backup"
    )


# Before the failover: the primary runs.


def test_records_reach_the_backup_as_they_are(clusters: Clusters) -> None:
    # Outside the mirror's pattern (as the counting job's own topics are): never copied.
    elsewhere = f"nx-{uuid.uuid4().hex[:8]}"
    create_topic(clusters.primary.kafka, elsewhere, partitions=2)
    name = topic(clusters.primary)
    producer = Producer(clusters.primary.kafka.client_config())
    for i in range(10):
        producer.produce(elsewhere, key=f"k{i}", value=json.dumps({"n": i}))
    # Timestamps of their own, an hour back: the copy must keep them, not restamp them.
    stamped = to_epoch_ms(parse_time("1h"))
    for i in range(40):
        producer.produce(
            name,
            key=f"k{i % 7}",
            value=json.dumps({"n": i}),
            timestamp=stamped + i,
            headers=[("source", b"test")],
        )
    assert producer.flush(30) == 0
    sent = records(clusters.primary, name)
    assert len(sent) == 40 and {r["partition"] for r in sent} == {0, 1}

    copied = wait_mirrored(clusters, name, 40)

    def by_position(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        keys = ("partition", "offset", "key", "value", "timestamp", "headers")
        return sorted(tuple(r[k] for k in keys) for r in rows)

    assert by_position(copied) == by_position(sent)
    # Created before the copied topic, with records before its records: the mirror has
    # seen it, and left it.
    on_backup = {t["name"] for t in list_topics(clusters.backup.kafka)}
    assert elsewhere not in on_backup
    assert f"{clusters.job}.counts" in {t["name"] for t in list_topics(clusters.primary.kafka)}
    assert f"{clusters.job}.counts" not in on_backup
    status = clusters.cli("mirror", "status", "--json")
    assert status.code == 0, status.err
    found = json.loads(status.out)
    assert found["state"] == "running" and found["backup"] == clusters.backup.kafka.bootstrap
    assert found["connectors"]["MirrorSourceConnector"] == "RUNNING"
    mine = [p for p in found["partitions"] if p["topic"] == name]
    assert [(p["partition"], p["lag"]) for p in mine] == [(0, 0), (1, 0)]
    assert all(p["primary_end"] == p["backup_end"] for p in mine)
    newest = max(r["timestamp"] for r in sent)
    assert max(parse_time(p["mirrored_until"]) for p in mine) == from_epoch_ms(newest)


def test_a_mirror_that_cannot_start_leaves_nothing(clusters: Clusters, tmp_path: Path) -> None:
    """Bad input, in a state directory of its own with the primary as its Kafka."""
    own = load_settings(
        state_dir=tmp_path / "state",
        jars_dir=clusters.primary.jars_path,
        kafka={"bootstrap_servers": clusters.primary.kafka.bootstrap},
    )
    home = tmp_path / "state" / "mirror"

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return run_kappaflow(own, *args, env={**MIRROR_ENV, **(env or {})}, timeout=90)

    def nothing_left() -> None:
        assert not (home / "mirror.pid").exists() and not (home / "mm2.properties").exists()
        assert not (home / "plan.json").exists() and not (home / "log4j2.properties").exists()
        ours = [
            p
            for p in psutil.process_iter(["cmdline"])
            if f"-Dkappaflow.mirror.home={home}" in " ".join(p.info["cmdline"] or ())
        ]
        assert ours == []

    down = f"127.0.0.1:{free_port()}"
    unreachable = run("mirror", "start", "--to", down, env={"KAPPAFLOW_KAFKA__TIMEOUT_S": "3"})
    line = error_line(unreachable, "KF421", 1)
    assert f"the backup cluster at {down} does not answer" in line
    assert "nothing was started" in line
    nothing_left()
    assert not home.exists(), "nothing is written before both clusters answer"

    error_line(run("mirror", "start"), "KF422", 1)  # no backup given
    itself = run("mirror", "start", "--to", clusters.primary.kafka.bootstrap)
    assert "is the primary itself" in error_line(itself, "KF422", 1)
    nothing_left()

    # MirrorMaker itself fails: a heap the JVM refuses. It is stopped, its configuration
    # (which would hold passwords) removed; its log stays, to read why.
    bad_heap = run(
        "mirror", "start", "--to", clusters.backup.kafka.bootstrap,
        env={"KAPPAFLOW_MIRROR__HEAP": "lots"},
    )  # fmt: skip
    assert "exited during start-up" in error_line(bad_heap, "KF420", 1)
    nothing_left()

    stopped = run("mirror", "status", "--json")
    assert stopped.code == 0, stopped.err
    assert json.loads(stopped.out) == {
        "state": "stopped",
        "pid": None,
        "started_at": None,
        "primary": clusters.primary.kafka.bootstrap,
        "backup": None,
        "topics": ".*",
        "groups": ".*",
    }
    assert run("mirror", "stop").err.strip() == "mirror was not running"


@dataclass
class Interrupted:
    """A counting job on the primary whose driver died in the middle of a batch, after
    its store's writes and inside its Kafka transaction: the batch a failover cuts off."""

    job: str
    source: str
    #: Before its first record's timestamp: where it goes on from on the backup.
    since_ms: int
    sent: list[dict[str, Any]]
    #: The step and batch it died in (tests/support/faults.py).
    crashed: dict[str, Any]
    #: Its query's checkpoint.
    query: Path


@pytest.fixture(scope="module")
def interrupted(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Interrupted:
    primary = clusters.primary
    source, job = topic(primary), f"cut-{uuid.uuid4().hex[:6]}"
    since_ms = int(time.time() * 1000) - 1000
    record = tmp_path_factory.mktemp("crash") / "crash.json"
    first = events(30)
    # Each in a transaction of its own: the commit markers take offsets on the primary
    # that the backup does not have, so the batch the primary planned names offsets that
    # mean other records on the backup (or none), and only a move by time runs it right.
    producer = Producer(
        {**primary.kafka.client_config(), "transactional.id": job, "log_level": "0"}
    )
    producer.init_transactions(30)
    for value in first:
        producer.begin_transaction()
        producer.produce(source, key=value["page"], value=json.dumps(value))
        producer.commit_transaction(30)
    args, env = count_with_crash(source, WINDOW_MS, "in-transaction:1", record)
    started = clusters.cli("jobs", "start", job, *args, env=env)
    assert started.code == 0, started.err
    store = CountStore(redis_client(primary), job)
    wait_for(
        lambda: True if store.stats().counted == len(first) else None,
        timeout=180,
        what="the first batch counted on the primary",
    )
    # The next batch's writes die in its transaction.
    second = [*events(20, start=30), dict(first[-1])]
    send_json(primary, source, second, key="page")
    jobs = JobManager(primary)
    wait_for(
        lambda: True if record.exists() and jobs.get_state(job) == "crashed" else None,
        timeout=180,
        what="the job's driver to die in a batch",
    )
    sent = [*first, *second]
    wait_mirrored(clusters, source, len(sent))
    crashed = json.loads(record.read_text())
    query = primary.checkpoint_root / job / "counts"
    return Interrupted(job, source, since_ms, sent, crashed, query)


def test_a_batch_is_cut_off_on_the_primary(interrupted: Interrupted) -> None:
    """Before the failover: the batch's store writes are done, its Kafka transaction is
    open, and Spark has not committed it (the failover forgets it: move_source)."""
    crashed = interrupted.crashed
    assert crashed["step"] == "in-transaction" and crashed["batch"] >= 1, crashed
    assert not committed(interrupted.query, crashed["batch"])
    assert last_committed(interrupted.query) == crashed["batch"] - 1


# The failover.


@dataclass
class Stream:
    """Events sent to the primary until it stops, each with where the primary put it."""

    settings: Settings
    orders: str
    clicks: str
    #: Acknowledged by the primary: id → (topic, partition, offset).
    acked: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    #: Every event sent, by id.
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: int = 0
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    #: Set when the orders' consumer has left: no order is sent after.
    orders_done: threading.Event = field(default_factory=threading.Event)
    #: Set once the counting job has counted enough: no click is sent after.
    clicks_done: threading.Event = field(default_factory=threading.Event)

    def delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            return
        value = json.loads(msg.value())
        self.acked[value["id"]] = (msg.topic(), msg.partition(), msg.offset())

    def send_transactions(self, count: int) -> None:
        """Clicks each in a transaction of its own: each commit marker takes an offset on
        the primary that the backup does not have, so the clusters' offsets differ (as
        they do for any topic a kappaflow job writes), and only a move by time lands the
        job where it was."""
        producer = Producer(
            {
                **self.settings.kafka.client_config(),
                "transactional.id": f"mx-{uuid.uuid4().hex[:6]}",
                "log_level": "0",
            }
        )
        producer.init_transactions(30)
        for i in range(count):
            now = int(time.time() * 1000)
            click: dict[str, Any] = {"page": f"/p{i % 3}", "ts": now, "id": f"t{i}"}
            self.values[f"t{i}"] = click
            producer.begin_transaction()
            producer.produce(
                self.clicks, key=f"/p{i % 3}", value=json.dumps(click), on_delivery=self.delivered
            )
            producer.commit_transaction(30)
        producer.flush(30)

    def run(self) -> None:
        producer = Producer(
            {
                **self.settings.kafka.client_config(),
                "enable.idempotence": True,
                "linger.ms": 5,
                # A send the stopped primary cannot take fails in seconds, not minutes.
                "message.timeout.ms": 5000,
                "log_level": "0",
            }
        )

        i = 0
        while not self.stop.is_set():
            now = int(time.time() * 1000)
            click: dict[str, Any] = {"page": f"/p{i % 3}", "ts": now, "id": f"c{i}"}
            order: dict[str, Any] = {"id": f"o{i}", "n": i}
            sending = [] if self.clicks_done.is_set() else [(self.clicks, click, f"/p{i % 3}")]
            if not self.orders_done.is_set():
                sending.append((self.orders, order, str(i % 5)))
            for name, value, key in sending:
                self.values[str(value["id"])] = value
                producer.produce(
                    name,
                    key=key,
                    value=json.dumps(value),
                    timestamp=now,
                    on_delivery=self.delivered,
                )
            self.sent += 1
            i += 1
            producer.poll(0)
            # About 25 events a second on each topic.
            self.stop.wait(0.04)
        producer.flush(15)


@dataclass
class Failover:
    stream: Stream
    #: The group's committed offsets on the primary when its consumer stopped.
    committed: dict[int, int]
    #: What the consumer processed on the primary: id → partition.
    consumed: dict[str, int]
    job: str
    #: The counting job's end offsets of its last committed batch on the primary.
    job_offsets: dict[int, int]
    #: Its last batch's time (epoch ms), as `count status` reports it.
    job_last_batch_ms: int
    #: The mirror's status once the primary was gone.
    mirror_status: dict[str, Any]


def ids_by_partition(messages: list[dict[str, Any]]) -> dict[str, int]:
    return {json.loads(m["value"])["id"]: m["partition"] for m in messages}


@pytest.fixture(scope="module")
def failover(clusters: Clusters) -> Iterator[Failover]:
    """A consumer group and a counting job on the primary, each sent events until it has
    processed enough and read them to their end; then the primary stopped."""
    primary, job = clusters.primary, clusters.job
    stream = Stream(primary, topic(primary), clusters.clicks)
    stream.send_transactions(40)
    sender = threading.Thread(target=stream.run, daemon=True)
    sender.start()
    try:
        # The orders' producer stops once their consumer has processed enough, and the
        # consumer commits up to the end of the log, so that MirrorMaker translates the
        # group's last commit at the end (one far behind it translates more coarsely:
        # docs/deployment.md). The clicks go on until the primary stops.
        consumed, committed = consume_some(
            primary, stream.orders, "billing", 200, stream.orders_done
        )
        # The group's last commit translated to the backup, and committed there.
        wait_for(
            Synced(clusters, "billing", stream.orders),
            timeout=60,
            interval=0.5,
            what="the group's offsets synced to the backup",
        )
        store = CountStore(redis_client(primary), job)
        wait_for(
            lambda: True if store.stats().counted >= 200 else None,
            timeout=180,
            interval=0.5,
            what="the counting job to count 200 events on the primary",
        )
        # The clicks stop; the job reads them to their end and the mirror copies them, so
        # that what the job reads again on the backup is known: every click stamped after
        # the point it goes on from. (A batch cut off by the primary's loss, whose
        # statistics reached Redis, would run again on the backup with other records and
        # its statistics would not be added: docs/deployment.md.)
        stream.clicks_done.set()
        home = Path(primary.checkpoint_location) / job / "counts"
        caught_up = CaughtUp(primary, home, stream.clicks, store)
        wait_for(caught_up, timeout=120, interval=0.5, what="the job to read the clicks' end")
        clicks_sent = len(records(primary, stream.clicks))
        wait_mirrored(clusters, stream.clicks, clicks_sent)
        # A transactional producer's commit markers take source offsets the job reads:
        # its 40 single-record transactions make the events read exceed those accounted.
        on_primary = json.loads(clusters.cli("count", "status", job).out)
        assert on_primary["events_read"] - on_primary["accounted"] == 40, on_primary
        clusters.brokers["primary"].stop(timeout=30)
    finally:
        stream.stop.set()
        sender.join(30)
    last = last_committed(home)
    assert last is not None
    job_offsets = {int(p): o for p, o in batch_end_offsets(home, last)[stream.clicks].items()}
    progress = JobManager(primary).progress(job)
    status = clusters.cli("mirror", "status", "--json")
    assert status.code == 0, status.err
    yield Failover(
        stream,
        committed,
        consumed,
        job,
        job_offsets,
        to_epoch_ms(parse_time(progress[f"{job}.counts"]["timestamp"])),
        json.loads(status.out),
    )


class CaughtUp:
    """Whether a counting job's last committed batch read its source to the end, its
    store holds that batch's statistics, and no batch followed for a few seconds."""

    def __init__(self, settings: Settings, home: Path, source: str, store: CountStore) -> None:
        self.settings, self.home, self.source, self.store = settings, home, source, store
        self.since: float | None = None

    def __call__(self) -> bool | None:
        last = last_committed(self.home)
        planned = max(int(p.name) for p in (self.home / "offsets").iterdir() if p.name.isdigit())
        ends = topic_ends(self.settings, self.source)
        done = last is not None and planned == last == self.store.stats().last_batch
        if not done or batch_end_offsets(self.home, planned)[self.source] != ends:
            self.since = None
            return None
        self.since = self.since or time.monotonic()
        return True if time.monotonic() - self.since >= 3 else None


def topic_ends(settings: Settings, name: str) -> dict[str, int]:
    reader = Consumer({**settings.kafka.client_config(), "group.id": "ends", "log_level": "0"})
    try:
        return {
            str(p): reader.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
            for p in (0, 1)
        }
    finally:
        reader.close()


def consume_some(
    settings: Settings, name: str, group: str, at_least: int, enough: threading.Event
) -> tuple[dict[str, int], dict[int, int]]:
    """A consumer of ``group`` processes at least ``at_least`` records, committing after
    each; then it sets ``enough`` (the topic's producer sends no more), reads to the end of
    the log and leaves. What it processed (id → partition) and its committed offsets."""
    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": "0",
        }
    )
    consumer.subscribe([name])
    processed: dict[str, int] = {}
    partitions = [TopicPartition(name, p) for p in (0, 1)]

    def behind() -> int:
        ends = [consumer.get_watermark_offsets(tp, timeout=5)[1] for tp in partitions]
        return sum(
            end - tp.offset for end, tp in zip(ends, consumer.position(partitions), strict=True)
        )

    # Whether the consumer reached the end of the log once its producer had stopped: a
    # consumer slower than the producer (a loaded machine) would never catch up with a
    # log that still grows.
    drained = False
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                processed[json.loads(message.value() or b"{}")["id"]] = message.partition() or 0
                consumer.commit(message=message, asynchronous=False)
                if len(processed) >= at_least:
                    enough.set()
            elif enough.is_set() and behind() == 0:
                drained = True
                break
        offsets = consumer.committed(partitions, timeout=10)
    finally:
        enough.set()
        consumer.close()
    assert drained, "the consumer did not reach the end of the log"
    return processed, {tp.partition: tp.offset for tp in offsets}


def group_offsets(settings: Settings, group: str, name: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = AdminClient({**settings.kafka.client_config(), "log_level": "0"})
    wanted = [ConsumerGroupTopicPartitions(group, [TopicPartition(name, p) for p in (0, 1)])]
    result = admin.list_consumer_group_offsets(wanted)[group].result(timeout=10)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


class Synced:
    """Whether MirrorMaker has translated a group's offsets and committed them on the
    backup, and they have stayed put for a few sync intervals (a checkpoint is written
    only when the translation moves forward, so none marks the last one)."""

    def __init__(self, clusters: Clusters, group: str, name: str) -> None:
        self.clusters, self.group, self.name = clusters, group, name
        self.last: dict[int, int] | None = None
        self.since = time.monotonic()

    def __call__(self) -> bool | None:
        newest: dict[int, int] = {}
        try:
            for message in read_records(
                self.clusters.backup.kafka,
                "primary.checkpoints.internal",
                start=StartAt(beginning=True),
            ):
                found = decode_checkpoint(message.key() or b"", message.value() or b"")
                if found is not None and found[:2] == (self.group, self.name):
                    newest[found[2]] = found[4]
        except KappaflowError:
            return None  # no checkpoint yet
        on_backup = group_offsets(self.clusters.backup, self.group, self.name)
        if set(on_backup) != {0, 1} or on_backup != newest:
            self.last = None
            return None
        if on_backup != self.last:
            self.last, self.since = on_backup, time.monotonic()
        return True if time.monotonic() - self.since >= 3 * SYNC_INTERVAL_S else None


def lost(stream: Stream, name: str, on_backup: set[str]) -> set[str]:
    """What the primary acknowledged to the sender but the backup does not hold."""
    return {i for i, (t, _, _) in stream.acked.items() if t == name} - on_backup


def test_a_consumer_group_goes_on_on_the_backup(clusters: Clusters, failover: Failover) -> None:
    stream = failover.stream
    backup_records = records(clusters.backup, stream.orders)
    on_backup = ids_by_partition(backup_records)
    # Records the primary took after the mirror's last copy: lost with the primary.
    missing = lost(stream, stream.orders, set(on_backup))
    synced_to = group_offsets(clusters.backup, "billing", stream.orders)
    consumer = Consumer(
        {
            **clusters.backup.kafka.client_config(),
            "group.id": "billing",
            "enable.auto.commit": False,
            # Were the translated offsets missing, this would read everything again
            # (and the repeat bound below would fail): they must be there.
            "auto.offset.reset": "earliest",
            "log_level": "0",
        }
    )
    consumer.subscribe([stream.orders])
    ends = Counter[int]()
    for r in backup_records:
        ends[r["partition"]] = max(ends[r["partition"]], r["offset"] + 1)
    later: list[str] = []

    def at_end() -> bool | None:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            later.append(json.loads(message.value() or b"{}")["id"])
        positions = consumer.position([TopicPartition(stream.orders, p) for p in ends])
        # No position before the first record: a partition read to its end on the primary
        # starts, and stays, at its committed offset.
        at = {
            tp.partition: tp.offset if tp.offset >= 0 else synced_to[tp.partition]
            for tp in positions
        }
        return True if all(at[p] >= end for p, end in ends.items()) else None

    try:
        wait_for(at_end, timeout=60, interval=0, what="the consumer to read the backup to its end")
    finally:
        consumer.close()
    repeated = Counter(failover.consumed[i] for i in later if i in failover.consumed)
    seen = set(failover.consumed) | set(later)
    report(
        "consumer group failover",
        records_on_backup=len(on_backup),
        consumed_on_primary=len(failover.consumed),
        consumed_on_backup=len(later),
        repeated_per_partition=dict(repeated),
        committed_on_primary=failover.committed,
        synced_to_backup=synced_to,
        acked_by_primary_not_on_backup=len(missing),
        sent_not_acked=stream.failed,
    )
    # Nothing lost: every record the backup holds was processed on one side or the other.
    assert set(on_backup) <= seen
    assert len(later) == len(set(later)), "read twice on the backup"
    # What is read again is what the translation stopped short of: at most offset.lag.max
    # records per partition before the group's last commit.
    for partition, offset in failover.committed.items():
        assert 0 <= offset - synced_to[partition] <= OFFSET_LAG_MAX
        assert repeated[partition] == offset - synced_to[partition]


def report(what: str, **figures: Any) -> None:
    """Figures the runbook quotes (docs/deployment.md), in the test's output."""
    print(f"\n{what}: " + json.dumps(figures, default=str))


def test_a_counting_job_goes_on_on_the_backup(clusters: Clusters, failover: Failover) -> None:
    stream, job, backup = failover.stream, failover.job, clusters.backup
    on_backup = "--bootstrap-servers", backup.kafka.bootstrap
    # The primary is gone, the driver still runs: its checkpoint cannot move yet.
    running = clusters.cli(
        *on_backup, "count", "start", job, "--source", stream.clicks, *DEFINITION,
        "--from-time", "now",
    )  # fmt: skip
    assert "is running: stop it first" in error_line(running, "KF423", 1)
    stopped = clusters.cli("jobs", "stop", job, "--timeout", "10")
    assert stopped.code == 0, stopped.err
    store = CountStore(redis_client(clusters.primary), job)
    before = store.stats()

    # The point to go on from (the runbook): the earlier of what the mirror reached and
    # the job's last batch, less a margin.
    reached = to_epoch_ms(parse_time(failover.mirror_status["mirrored_until"]))
    since = min(reached, failover.job_last_batch_ms) - MARGIN_MS
    # A job that never ran starts at the first record of each partition stamped then.
    there = load_settings(
        state_dir=clusters.primary.state_dir, kafka={"bootstrap_servers": backup.kafka.bootstrap}
    )
    fresh, moved = start_from(there, "never-ran", stream.clicks, from_epoch_ms(since))
    assert moved == []
    starts = {int(p): o for p, o in json.loads(fresh)[stream.clicks].items()}
    assert set(starts) == {0, 1}
    for r in records(backup, stream.clicks):
        assert (r["offset"] >= starts[r["partition"]]) == (r["timestamp"] >= since), r

    restarted = clusters.cli(
        *on_backup, "count", "start", job, "--source", stream.clicks, *DEFINITION,
        "--from-time", iso(from_epoch_ms(since)),
    )  # fmt: skip
    assert restarted.code == 0, restarted.err
    assert "goes on from" in restarted.err and "counts: after batch" in restarted.err

    # The producers fail over too: more events, sent to the backup.
    now = int(time.time() * 1000)
    after = [{"page": f"/p{i % 3}", "ts": now + i, "id": f"b{i}"} for i in range(60)]
    producer = Producer(backup.kafka.client_config())
    for value in after:
        producer.produce(stream.clicks, key=str(value["page"]), value=json.dumps(value))
    assert producer.flush(30) == 0

    held_records = records(backup, stream.clicks)
    held = {json.loads(m["value"])["id"]: json.loads(m["value"]) for m in held_records}
    # What the job counted on the primary that the mirror never copied stays counted:
    # the counts then hold events the backup does not.
    counted_there = {
        i
        for i, (t, p, offset) in stream.acked.items()
        if t == stream.clicks and offset < failover.job_offsets[p]
    }
    counted_not_held = counted_there - set(held)
    want = expected([*held.values(), *(stream.values[i] for i in counted_not_held)])

    def counts() -> dict[tuple[str, int], int]:
        return {(w.key, w.window_start): w.count for w in store.windows()}

    try:
        wait_for(
            lambda: True if counts() == want else None,
            timeout=180,
            interval=1,
            what="the job's counts to equal the oracle over the backup's events",
        )
    finally:
        clusters.cli("jobs", "stop", job, "--timeout", "10")
    stats = store.stats()
    reread = (stats.duplicates - before.duplicates, stats.late - before.late)
    # What the job had counted on the primary and reads again from the backup: each is
    # dropped by its id, or reported late where its window is gone; the mirror's own
    # copies of a record (it copies at least once) among them.
    again = [
        value["id"]
        for value, stamp in ((json.loads(r["value"]), r["timestamp"]) for r in held_records)
        if stamp >= since and value["id"] in counted_there
    ]
    owed = set(again)
    report(
        "counting job failover",
        events_on_backup=len(held),
        sent_to_backup_after=len(after),
        clicks_acked_by_primary_not_on_backup=len(lost(stream, stream.clicks, set(held))),
        counted_on_primary_not_on_backup=len(counted_not_held),
        reread_dropped_as_duplicates=reread[0],
        reread_reported_late=reread[1],
        counted_on_primary_and_read_again=len(owed),
        went_back_ms=min(reached, failover.job_last_batch_ms) - since,
    )
    # Everything the backup holds is counted, once (the counts equal the oracle); what
    # was read again was dropped by its id, or reported late where its window was gone.
    assert owed, "the job read nothing again: the failover's re-reading is untested"
    assert sum(reread) == len(again), (reread, len(again), len(owed))
    # Each event read again counts in both the events read and those accounted; the
    # primary's commit markers stay read and unaccounted (the backup holds none).
    status = json.loads(clusters.cli(*on_backup, "count", "status", job).out)
    assert status["accounted"] == stats.accounted
    assert status["events_read"] - status["accounted"] == 40, status


def test_a_batch_cut_off_by_the_failover_runs_again_on_the_backup(
    clusters: Clusters, failover: Failover, interrupted: Interrupted
) -> None:
    """The job whose batch the failover cut off goes on on the backup from before its
    first record: the batch runs again there under its id, with the backup's records,
    and the counts hold every event once, none lost, none counted twice; the backup's
    changelog has each change once, and ends at each window's count."""
    job, source, backup = interrupted.job, interrupted.source, clusters.backup
    on_backup = "--bootstrap-servers", backup.kafka.bootstrap
    restarted = clusters.cli(
        *on_backup, "count", "start", job, "--source", source, *DEFINITION,
        "--from-time", iso(from_epoch_ms(interrupted.since_ms)),
    )  # fmt: skip
    assert restarted.code == 0, restarted.err
    assert "counts: after batch" in restarted.err
    store = CountStore(redis_client(clusters.primary), job)
    batch = interrupted.crashed["batch"]
    try:
        wait_for(
            lambda: True if committed(interrupted.query, batch) else None,
            timeout=180,
            interval=1,
            what="the cut-off batch run again on the backup",
        )
        # The producers fail over too: more events than the primary's commit markers
        # took offsets, so that a batch after it that started where the primary's plan
        # ended would skip some of them.
        after = events(40, start=51)
        send_json(backup, source, after, key="page")
        want = expected([*interrupted.sent, *after])

        def counts() -> dict[tuple[str, int], int]:
            return {(w.key, w.window_start): w.count for w in store.windows()}

        wait_for(
            lambda: True if counts() == want else None,
            timeout=180,
            interval=1,
            what="the counts to equal the oracle over every event sent",
        )
    finally:
        clusters.cli("jobs", "stop", job, "--timeout", "10")
    changes = [json.loads(m["value"]) for m in records(backup, f"{job}.counts")]
    identities = [(c["page"], c["window_start"], c["version"]) for c in changes]
    assert changes and len(identities) == len(set(identities)), "a change was published twice"
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for change in changes:
        window = (change["page"], change["window_start"])
        if window not in last or change["version"] > last[window]["version"]:
            last[window] = change
    for (page, start), change in last.items():
        held = want[(page, to_epoch_ms(parse_time(start)))]
        assert (change["values"] or {"count": 0})["count"] == held, change


def expected(events: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """Counts per (page, window start), computed without the engine; ids counted once."""
    unique = {e["id"]: e for e in events}
    found: Counter[tuple[str, int]] = Counter()
    for value in unique.values():
        found[(value["page"], value["ts"] - value["ts"] % WINDOW_MS)] += 1
    return dict(found)
