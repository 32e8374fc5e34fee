"""The embedded cluster of three KRaft nodes, in the manner of Kafka's own replication
tests (kafkatest's ``ReplicationTest`` and ``EndToEndTest``): a producer with acks=all
writes at a steady rate while the leader of a partition is killed (SIGKILL) and started
again, or a follower is paused (SIGSTOP) and resumed; afterwards every acknowledged record
is read back once, at the partition and offset it was acknowledged at. A counting job
running through a leader's death keeps exact counts. Failover figures are printed (see
them with ``-s``)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import signal
import socket
import ssl
import struct
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.admin import AdminClient, ConfigResource, PartitionMetadata, ResourceType
from conftest import EXTERNAL_KAFKA, Result, error_line, make_settings, run_kappaflow
from live_jobs import stop_if_running
from wire import can_capture, captured

from kappaflow.errors import WaitTimeoutError
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.clients import admin, producer
from kappaflow.kafka.node import KafkaNode
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import create_topic, describe_topic
from kappaflow.procs import ProcState, free_port, port_in_use
from kappaflow.security import SecurityHome
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import NODE_PORT_STEP, Settings, brokers_marker
from kappaflow.timeutil import from_epoch_ms, iso
from kappaflow.waiting import wait_for
from test_counting import BASE, DEFINITION, changelog, expected, stats, store_counts, wait_stats

pytestmark = [
    pytest.mark.integration,
    pytest.mark.cluster,
    pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="embedded cluster only"),
]

NODES = 3
#: Records per second of the verifying producers. A producer with acks=1 loses what its
#: leader had not yet replicated when it died, a window of a few milliseconds on one
#: machine: at 100 records/s one such kill lost nothing, at 1,000 it lost 3 records,
#: which the test then reports. More would only load the two cores further.
RATE = 1000
#: Page views per second to the counting job.
VIEW_RATE = 25


def spaced_ports() -> dict[str, int]:
    """A client and a controller port whose nodes' ports (NODE_PORT_STEP apart) are all
    free now."""

    def pick() -> dict[str, int] | None:
        port, controller = free_port(), free_port()
        ports = [p + NODE_PORT_STEP * n for p in (port, controller) for n in range(NODES)]
        if max(ports) > 65535 or len(set(ports)) < len(ports):
            return None
        if any(port_in_use("127.0.0.1", p) for p in ports):
            return None
        return {"port": port, "controller_port": controller}

    return wait_for(pick, timeout=10, interval=0, what="free ports for three nodes")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings of a state directory of its own whose three nodes run, started by
    `kappaflow kafka start --brokers 3`; later commands are not told the number."""
    state_dir = tmp_path_factory.mktemp("cluster-state")
    settings = make_settings(state_dir, **spaced_ports(), brokers=NODES)
    try:
        started = run_kappaflow(settings, "kafka", "start", "--brokers", str(NODES))
        assert started.code == 0, started.err
        assert f"kafka started on {settings.kafka.bootstrap}" in started.err
        yield settings
    finally:
        EmbeddedBroker(settings).stop(timeout=10)


@pytest.fixture(scope="module")
def with_redis(cluster: Settings) -> Iterator[Settings]:
    """The cluster, with its own Redis."""
    store = EmbeddedRedis(cluster)
    store.start()
    try:
        yield cluster
    finally:
        store.stop()


class AckedProducer:
    """kafkatest's VerifiableProducer: records 0, 1, 2, … at a steady rate with acks=all
    and idempotence, each acknowledged one kept with its partition and offset."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        record: Callable[[int], tuple[bytes, bytes]],
        rate: int = RATE,
    ) -> None:
        self.topic = topic
        self.record = record
        self.rate = rate
        self.client = producer(settings.kafka, acks="all", **{"delivery.timeout.ms": 120_000})
        self.acked: dict[int, tuple[int, int]] = {}
        self.acked_at: list[float] = []
        self.errors: list[str] = []
        self.unflushed = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{topic}", daemon=True)

    def __enter__(self) -> AckedProducer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=180)

    def wait_acked(self, more: int, what: str) -> None:
        """Wait until ``more`` records more than now are acknowledged."""
        wanted = len(self.acked) + more
        wait_for(
            lambda: True if len(self.acked) >= wanted else None,
            timeout=90,
            what=f"{more} records acknowledged {what}",
        )

    def longest_silence(self) -> float:
        """The longest time between two acknowledgements, seconds."""
        times = sorted(self.acked_at)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def _run(self) -> None:
        interval, sent = 1 / self.rate, 0
        due = time.monotonic()
        while not self._stop.is_set():
            key, value = self.record(sent)
            self.client.produce(
                self.topic,
                key=key,
                value=value,
                on_delivery=functools.partial(self._delivered, sent),
            )
            sent += 1
            self.client.poll(0)
            due += interval
            # Pacing, not waiting for a condition: the next record's time to be sent.
            self._stop.wait(max(0.0, due - time.monotonic()))
        self.unflushed = self.client.flush(150)

    def _delivered(self, n: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(f"record {n}: {err.str()}")
            return
        self.acked[n] = (msg.partition() or 0, msg.offset() or 0)
        self.acked_at.append(time.monotonic())


def numbered(n: int) -> tuple[bytes, bytes]:
    """Record ``n``: its number as key and value (the keys spread it over partitions)."""
    return str(n).encode(), str(n).encode()


def assert_delivered(settings: Settings, topic: str, sent: AckedProducer) -> dict[str, int]:
    """kafkatest's ``validate_delivery`` with idempotence: every acknowledged record is
    in the log once, where it was acknowledged; read ``read_committed`` to the end."""
    assert sent.errors == [], sent.errors[:5]
    assert sent.unflushed == 0, f"{sent.unflushed} records were never acknowledged"
    seen: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for message in read_records(settings.kafka, topic, start=StartAt(beginning=True)):
        seen[int(message.value() or b"-1")].append(
            (message.partition() or 0, message.offset() or 0)
        )
    lost = sorted(set(sent.acked) - set(seen))
    twice = sorted(n for n, places in seen.items() if len(places) > 1)
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:10]}"
    assert not twice, f"{len(twice)} records twice in the log, e.g. {twice[:10]}"
    moved = [n for n, place in sent.acked.items() if seen[n] != [place]]
    assert not moved, f"{len(moved)} records not where they were acknowledged: {moved[:10]}"
    return {"acked": len(sent.acked), "lost": len(lost), "duplicated": len(twice)}


def partitions_via(
    settings: Settings, topic: str, nodes: list[KafkaNode]
) -> dict[int, PartitionMetadata] | None:
    """``topic``'s partitions as ``nodes`` answer them (None: no answer in 3 s), so that
    a node that is down or paused is not asked."""
    client = AdminClient(
        {
            **settings.kafka.client_config(),
            "bootstrap.servers": ",".join(node.address for node in nodes),
            "log_level": "0",
        }
    )
    try:
        found = client.list_topics(topic, timeout=3).topics.get(topic)
    except KafkaException:
        return None
    return dict(found.partitions) if found is not None and found.error is None else None


def others(broker: EmbeddedBroker, index: int) -> list[KafkaNode]:
    return [node for node in broker.nodes if node.index != index]


def wait_isr_full(settings: Settings, topic: str, timeout: float = 120) -> float:
    """Wait until every partition of ``topic`` has all its replicas in sync; seconds."""
    began = time.monotonic()
    nodes = EmbeddedBroker(settings).nodes

    def full() -> bool | None:
        parts = partitions_via(settings, topic, nodes)
        if parts is None:
            return None
        return True if all(len(p.isrs) == len(p.replicas) for p in parts.values()) else None

    wait_for(full, timeout=timeout, interval=0.5, what=f"every replica of {topic} in sync")
    return time.monotonic() - began


def kill_leader(settings: Settings, topic: str, partition: int) -> dict[str, float]:
    """SIGKILL the leader of ``topic``/``partition`` and wait until it is gone and another
    node leads (kafkatest's ``hard_bounce`` up to the restart): the node, and how long
    the new leader took."""
    broker = EmbeddedBroker(settings)
    leader = describe_topic(settings.kafka, topic)["partitions"][partition]["leader"]
    node = broker.nodes[leader - 1]
    pid = node.status().pid
    assert pid is not None
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: True if node.process.exited(pid) else None, timeout=30, what="the kill")

    def new_leader() -> int | None:
        parts = partitions_via(settings, topic, others(broker, leader))
        now = parts[partition].leader if parts is not None else -1
        return now if now not in (-1, leader) else None

    wait_for(new_leader, timeout=60, interval=0.1, what=f"a new leader of {topic}/{partition}")
    return {"killed_node": leader, "new_leader_s": time.monotonic() - killed}


def test_three_nodes_remembered_and_replicated_by_default(cluster: Settings) -> None:
    assert brokers_marker(cluster.state_dir).read_text().strip() == "3"
    # Not told --brokers: the state directory says how many nodes there are.
    status = run_kappaflow(cluster, "kafka", "status", "--json")
    rows = [json.loads(line) for line in status.lines()]
    assert [(r["node"], r["state"], r["bootstrap"]) for r in rows] == [
        (n, "running", f"127.0.0.1:{cluster.kafka.node_ports(n)[0]}") for n in (1, 2, 3)
    ]
    services = [json.loads(line) for line in run_kappaflow(cluster, "status", "--json").lines()]
    assert [s["service"] for s in services][:3] == ["kafka-1", "kafka-2", "kafka-3"]
    # kappaflow's topics take the cluster's replication: three replicas, two in sync.
    topic = f"rf-{uuid.uuid4().hex[:8]}"
    created = run_kappaflow(cluster, "topics", "create", topic, "-p", "3")
    assert created.code == 0, created.err
    described = describe_topic(cluster.kafka, topic)
    assert described["replication_factor"] == 3
    assert described["configs"]["min.insync.replicas"] == "2"
    assert {p["leader"] for p in described["partitions"]} == {1, 2, 3}


def test_a_paused_follower_leaves_the_isr_and_nothing_is_lost(cluster: Settings) -> None:
    topic = f"rt-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.kafka, topic, partitions=3)
    broker = EmbeddedBroker(cluster)
    with AckedProducer(cluster, topic, numbered) as sent:
        sent.wait_acked(RATE, "before the pause")
        partition = describe_topic(cluster.kafka, topic)["partitions"][0]
        assert len(partition["isr"]) == 3, partition
        follower = next(r for r in partition["replicas"] if r != partition["leader"])
        pid = broker.nodes[follower - 1].status().pid
        assert pid is not None
        paused = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:

            def shrunk() -> bool | None:
                parts = partitions_via(cluster, topic, others(broker, follower))
                return True if parts is not None and follower not in parts[0].isrs else None

            wait_for(shrunk, timeout=90, interval=0.5, what=f"node {follower} to leave the ISR")
            shrink_s = time.monotonic() - paused
            # Two replicas in sync are min.insync.replicas: acks=all writes go on.
            sent.wait_acked(RATE, "with the follower out of the ISR")
        finally:
            os.kill(pid, signal.SIGCONT)
        isr_full_s = wait_isr_full(cluster, topic)
        sent.wait_acked(RATE, "after the follower came back")
    figures = {"isr_shrunk_s": shrink_s, "isr_full_s": isr_full_s}
    figures["longest_silence_s"] = sent.longest_silence()
    figures.update(assert_delivered(cluster, topic, sent))
    print(f"\nfollower paused: {json.dumps({k: round(v, 2) for k, v in figures.items()})}")


def page_view(n: int) -> tuple[bytes, bytes]:
    """Page view ``n`` over three pages, keyed by its page. Its time cycles through 25 s,
    under the watermark's 5 s and the lateness allowed (20 s): however a failover delays
    one partition behind the other, no event is late."""
    page = f"/p{n % 3}"
    value = {"page": page, "ts": BASE + (n % 25) * 1000, "id": f"e{n}"}
    return page.encode(), json.dumps(value).encode()


def test_a_killed_leader_loses_no_acknowledged_record_nor_a_count(with_redis: Settings) -> None:
    """kafkatest's hard bounce, once: the node leading the counting job's changelog
    (partition 0) is killed while a producer writes to a topic of its own (whose
    partitions the three nodes lead one each) and page views go to the job; it is
    started again with `kappaflow kafka start`. Not one acknowledged record is lost or
    written twice, and the job, running throughout, counts each page view once."""
    cluster = with_redis
    topic, source = f"rt-{uuid.uuid4().hex[:8]}", f"views-{uuid.uuid4().hex[:8]}"
    job = f"count-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.kafka, topic, partitions=3)
    create_topic(cluster.kafka, source, partitions=2)
    down: list[Result] = []
    try:
        began = time.monotonic()
        started = run_kappaflow(cluster, "count", "start", job, "--source", source, *DEFINITION)
        assert started.code == 0, started.err
        counts = f"{job}.counts"
        assert describe_topic(cluster.kafka, counts)["replication_factor"] == 3
        with AckedProducer(cluster, source, page_view, VIEW_RATE) as views:
            wait_stats(cluster, job, counted=VIEW_RATE)
            job_s = time.monotonic() - began
            with AckedProducer(cluster, topic, numbered, RATE) as sent:
                sent.wait_acked(RATE, "before the kill")
                figures = {"job_counting_s": job_s, **kill_leader(cluster, counts, 0)}
                dead = int(figures["killed_node"])
                # A node down: the cluster answers commands, and says which node is down.
                down.append(run_kappaflow(cluster, "topics", "describe", topic))
                down.append(run_kappaflow(cluster, "kafka", "status", "--json"))
                restarted = time.monotonic()
                down.append(run_kappaflow(cluster, "kafka", "start"))
                figures["restart_s"] = time.monotonic() - restarted
                sent.wait_acked(RATE, "after the restart")
                figures["isr_full_s"] = max(wait_isr_full(cluster, t) for t in (topic, counts))
            caught_up = time.monotonic()
            wait_stats(cluster, job, counted=len(views.acked))
            figures["job_caught_up_s"] = time.monotonic() - caught_up
        figures["longest_silence_s"] = sent.longest_silence()

        described, status, restart = down
        assert described.code == 0, described.err
        leaders = {p["leader"] for p in json.loads(described.out)["partitions"]}
        assert dead not in leaders and leaders <= {1, 2, 3}
        states = {json.loads(line)["node"]: json.loads(line)["state"] for line in status.lines()}
        assert states == {n: "stale" if n == dead else "running" for n in (1, 2, 3)}
        assert restart.code == 0, restart.err
        assert f"kafka node {dead} started on 127.0.0.1:" in restart.err
        figures.update(assert_delivered(cluster, topic, sent))

        assert views.errors == [] and views.unflushed == 0
        values = [json.loads(page_view(n)[1]) for n in sorted(views.acked)]
        want = expected(values)
        final = wait_stats(cluster, job, counted=len(values))
        assert (final.counted, final.duplicates, final.late) == (len(values), 0, 0)
        assert store_counts(cluster, job) == want
        # The changelog: each change once, none lost, the last of each window its count
        # (once the last batch's changes are in: the store is written before the topic).
        wanted = {(key, iso(from_epoch_ms(ms))): n for (key, ms), n in want.items()}
        history: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)

        def published() -> bool | None:
            history.clear()
            for change in changelog(cluster, job):
                history[(change["key"], change["window_start"])].append(change)
            last = {window: versions[-1]["count"] for window, versions in history.items()}
            return True if last == wanted else None

        with contextlib.suppress(WaitTimeoutError):  # the assertions below say what differs
            wait_for(published, timeout=60, what="the changelog's last batch")
        for window, versions in history.items():
            assert [c["version"] for c in versions] == list(range(1, len(versions) + 1)), window
            for before, after in itertools.pairwise(versions):
                assert after["previous"] == before["count"], window
        last = {window: versions[-1]["count"] for window, versions in history.items()}
        assert last == wanted
        assert stats(cluster, job).counted == len(values)
        figures["views_counted"] = len(values)
        print(f"\nleader killed: {json.dumps({k: round(v, 2) for k, v in figures.items()})}")
    finally:
        stop_if_running(cluster, job)


def test_reading_a_partition_whose_only_replica_is_down_is_kf406(cluster: Settings) -> None:
    """A topic of one replica whose node is stopped: its partition has no leader, so
    looking up offsets by time, or the log's ends, fails; the cluster still answers."""
    topic = f"r1-{uuid.uuid4().hex[:8]}"
    created = run_kappaflow(cluster, "topics", "create", topic, "-p", "1", "-r", "1")
    assert created.code == 0, created.err
    sent = producer(cluster.kafka)
    sent.produce(topic, value=b"kept")
    assert sent.flush(30) == 0
    broker = EmbeddedBroker(cluster)
    replica = describe_topic(cluster.kafka, topic)["partitions"][0]["leader"]
    assert broker.nodes[replica - 1].stop(timeout=60)
    try:

        def leaderless() -> bool | None:
            parts = partitions_via(cluster, topic, others(broker, replica))
            return True if parts is not None and parts[0].leader == -1 else None

        wait_for(leaderless, timeout=60, interval=0.5, what=f"{topic} without a leader")
        env = {"KAPPAFLOW_KAFKA__TIMEOUT_S": "5"}
        by_time = run_kappaflow(cluster, "consume", topic, "--since", "1h", env=env)
        line = error_line(by_time, "KF406", 1)
        # librdkafka raises, or answers the partition with an error: either is said so.
        assert f"cannot look up offsets by time in {topic!r}" in line
        from_start = run_kappaflow(cluster, "consume", topic, "--from-beginning", env=env)
        assert f"cannot read the ends of {topic!r} partition 0" in error_line(
            from_start, "KF406", 1
        )
    finally:
        restarted = run_kappaflow(cluster, "kafka", "start")
        assert restarted.code == 0, restarted.err
    read = run_kappaflow(cluster, "consume", topic, "--from-beginning")
    assert read.code == 0, read.err
    assert [json.loads(line)["value"] for line in read.lines()] == ["kept"]


def test_a_cluster_fully_down_is_a_clear_error(cluster: Settings) -> None:
    stopped = run_kappaflow(cluster, "kafka", "stop")
    assert stopped.code == 0 and "kafka stopped" in stopped.err
    broker = EmbeddedBroker(cluster)
    assert [s.state for s in broker.statuses()] == [ProcState.STOPPED] * 3
    refused = run_kappaflow(cluster, "topics", "list", env={"KAPPAFLOW_KAFKA__TIMEOUT_S": "3"})
    line = error_line(refused, "KF401", 1)
    assert cluster.kafka.bootstrap in line and "kappaflow kafka start" in line
    # Another number of nodes than the storage was made with: refused, nothing changed.
    before = {str(p): p.stat().st_mtime_ns for p in broker.home.rglob("*")}
    shrunk = run_kappaflow(cluster, "kafka", "start", "--brokers", "1")
    assert "--brokers 3" in error_line(shrunk, "KF310", 1)
    assert {str(p): p.stat().st_mtime_ns for p in broker.home.rglob("*")} == before
    assert brokers_marker(cluster.state_dir).read_text().strip() == "3"
    assert [s.state for s in broker.statuses()] == [ProcState.STOPPED] * 3


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Three nodes started with `kappaflow kafka start --brokers 3 --secure`."""
    state_dir = tmp_path_factory.mktemp("secure-cluster-state")
    settings = make_settings(state_dir, **spaced_ports(), brokers=NODES, secure=True)
    try:
        started = run_kappaflow(settings, "kafka", "start", "--brokers", "3", "--secure")
        assert started.code == 0, started.err
        assert f"on {settings.kafka.bootstrap} (SASL_SSL, SCRAM-SHA-512, ACLs)" in started.err
        yield settings
    finally:
        EmbeddedBroker(settings).stop(timeout=10)


def broker_configs(settings: Settings, node: int) -> dict[str, str | None]:
    """The configuration node ``node`` runs with, as it answers DescribeConfigs."""
    client = admin(settings.kafka)
    resource = ConfigResource(ResourceType.BROKER, str(node))
    entries = client.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in entries.items()}


#: Kafka's ApiVersions request, version 0, correlation id 7, no client id: any listener
#: answers it before authentication.
API_VERSIONS = struct.pack(">ihhih", 10, 18, 0, 7, -1)


def first_bytes(sock: socket.socket) -> bytes:
    """Up to 8 bytes ``sock``'s other end sends back to API_VERSIONS: b"" when it hung up
    or (over TLS) refused the connection instead."""
    reply = b""
    try:
        sock.sendall(API_VERSIONS)
        while len(reply) < 8 and (chunk := sock.recv(8 - len(reply))):
            reply += chunk
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return b""
    return reply


def controller_reply(node: KafkaNode, context: ssl.SSLContext | None) -> bytes:
    """What the controller listener of ``node`` sends back to API_VERSIONS over TLS made
    with ``context``, or over plain TCP without one."""
    host, port = node.controller_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        if context is None:
            return first_bytes(raw)
        try:
            tls = context.wrap_socket(raw, server_hostname=host)
        except (ssl.SSLError, ConnectionResetError):
            return b""
        with tls:
            return first_bytes(tls)


def test_secure_nodes_replicate_over_sasl_ssl_and_reach_controllers_over_tls(
    secure_cluster: Settings,
) -> None:
    """Each node, as it answers DescribeConfigs: the brokers talk to each other on the
    SASL_SSL listener with SCRAM-SHA-512, the controllers' listener is SSL. And the
    controller port does what that says: it answers only a TLS client that shows a
    certificate of the authority's."""
    settings = secure_cluster
    home = SecurityHome(settings.state_dir)
    with_cert = ssl.create_default_context(cafile=home.ca_cert)
    with_cert.load_cert_chain(home.broker_pem)
    without_cert = ssl.create_default_context(cafile=home.ca_cert)
    correlation = struct.pack(">i", 7)
    for node in EmbeddedBroker(settings).nodes:
        configs = broker_configs(settings, node.index)
        assert configs["inter.broker.listener.name"] == "SASL_SSL", node.index
        assert configs["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
        assert configs["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
        assert configs["controller.listener.names"] == "CONTROLLER"
        protocols = dict(
            pair.split(":") for pair in (configs["listener.security.protocol.map"] or "").split(",")
        )
        assert protocols == {"CONTROLLER": "SSL", "SASL_SSL": "SASL_SSL"}
        assert configs["listeners"] == (
            f"SASL_SSL://{node.address},CONTROLLER://{node.controller_address}"
        )
        # A Kafka answer: its size, then the request's correlation id.
        assert controller_reply(node, with_cert)[4:] == correlation, node.index
        assert controller_reply(node, without_cert) == b"", node.index
        # In plain TCP, a TLS alert record (content type 21, version 3.x) and no answer.
        assert controller_reply(node, None)[:2] == b"\x15\x03", node.index


def test_a_killed_leader_of_the_secure_cluster_loses_no_acknowledged_record(
    secure_cluster: Settings,
) -> None:
    """The hard bounce on the secure cluster: the new leader is elected, the followers
    catch up after the restart, all over SCRAM and TLS, and every acknowledged record is
    in the log once, where it was acknowledged."""
    settings = secure_cluster
    topic = f"rt-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka, topic, partitions=3)
    with AckedProducer(settings, topic, numbered) as sent:
        sent.wait_acked(RATE, "before the kill")
        figures = kill_leader(settings, topic, 0)
        # Two nodes left are min.insync.replicas: acks=all writes go on.
        sent.wait_acked(RATE, "with the leader dead")
        restarted = run_kappaflow(settings, "kafka", "start")
        assert restarted.code == 0, restarted.err
        assert f"kafka node {int(figures['killed_node'])} started on" in restarted.err
        figures["isr_full_s"] = wait_isr_full(settings, topic)
        sent.wait_acked(RATE, "after the restart")
    figures["longest_silence_s"] = sent.longest_silence()
    figures.update(assert_delivered(settings, topic, sent))
    print(f"\nsecure leader killed: {json.dumps({k: round(v, 2) for k, v in figures.items()})}")


@pytest.mark.skipif(not can_capture(), reason="capturing loopback traffic needs root")
def test_no_record_value_crosses_between_secure_nodes_in_clear(secure_cluster: Settings) -> None:
    """The leader's port carries the producer's writes and the followers' fetches: with
    acks=all a record is acknowledged only once both followers have fetched it, so the
    capture holds its replication too, and shows it nowhere."""
    settings = secure_cluster
    topic = f"wire-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka, topic, partitions=1)
    marker = f"wire-marker-{uuid.uuid4().hex}".encode()
    leader = describe_topic(settings.kafka, topic)["partitions"][0]["leader"]
    client = producer(settings.kafka, acks="all")
    outcome: list[KafkaError | None] = []
    with captured(settings.kafka.node_ports(leader)[0]) as wire:
        client.produce(topic, value=marker, on_delivery=lambda err, _m: outcome.append(err))
        assert client.flush(30) == 0
    assert outcome == [None]
    parts = describe_topic(settings.kafka, topic)["partitions"]
    assert len(parts[0]["isr"]) == NODES, parts
    assert len(wire.payload) > 1000, "nothing was captured"
    assert marker not in wire.payload
