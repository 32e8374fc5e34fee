"""Spark reads Kafka and writes Kafka: in this process, and as a job of its own."""

from __future__ import annotations

import base64
import json
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Producer
from conftest import RunCli, is_loopback, start_clean_job
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kappaflow.errors import JobError
from kappaflow.install.localfs import local_fs_jar
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.procs import ManagedProcess
from kappaflow.settings import Settings, SettingsOverrides, load_settings
from kappaflow.spark.cds import archive_options
from kappaflow.spark.kafka_io import read_batch, read_stream, write_stream
from kappaflow.spark.session import REAL_TIME_CONF, real_time_spark, session_conf
from kappaflow.waiting import wait_for


def _values(settings: Settings, topic: str) -> list[dict[str, object]]:
    return [
        json.loads(m.value() or b"null")
        for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
    ]


def test_session_is_configured_from_settings(spark: SparkSession, kafka: Settings) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.master") == "local[2]"
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert "RocksDBStateStoreProvider" in (
        spark.conf.get("spark.sql.streaming.stateStore.providerClass") or ""
    )
    assert (
        spark.conf.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled")
        == "true"
    )
    jars = conf.get("spark.jars") or ""
    assert "spark-sql-kafka-0-10" in jars and "kafka-clients" in jars
    assert session_conf(kafka, "x")["spark.sql.streaming.checkpointLocation"].startswith(
        str(kafka.state_dir.resolve())
    )


def test_checkpoint_files_go_through_java_nio(
    spark: SparkSession, kafka: Settings, tmp_path: Path
) -> None:
    """Without Hadoop's native library, its local file system runs chmod and readlink
    processes for every checkpoint file (about 120 per batch of a stateful query on two
    partitions). Setup's java.nio file system (install/localfs.py) serves ``file:``
    paths instead, for both Hadoop APIs, and checkpoints keep their usual permissions."""
    if local_fs_jar(kafka) is None:
        pytest.skip("setup found no javac, so Spark uses Hadoop's own local file system")
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI("file:///")
    file_system = jvm.org.apache.hadoop.fs.FileSystem.get(uri, hadoop_conf)
    assert file_system.getRawFileSystem().getClass().getName() == (
        "io.kappaflow.hadoop.NioRawLocalFileSystem"
    )
    context_fs = jvm.org.apache.hadoop.fs.AbstractFileSystem.get(uri, hadoop_conf)
    assert context_fs.getClass().getName() == "io.kappaflow.hadoop.NioLocalFs"

    rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 100).load()
    counts = rows.groupBy((F.col("value") % 10).alias("k")).count()
    checkpoint = tmp_path / "ck"
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        wait_for(
            lambda: query.lastProgress if (checkpoint / "commits" / "3").exists() else None,
            timeout=120,
            what="four committed batches",
        )
    finally:
        query.stop()
    for log in ("offsets", "commits"):
        assert stat.S_IMODE((checkpoint / log / "3").stat().st_mode) == 0o644
    assert (checkpoint / "commits" / ".3.crc").exists()  # still checksummed


def test_a_users_class_path_keeps_the_local_file_system(kafka: Settings) -> None:
    jar = local_fs_jar(kafka)
    if jar is None:
        pytest.skip("setup found no javac, so Spark uses Hadoop's own local file system")
    spark = kafka.spark.model_copy(update={"conf": {"spark.driver.extraClassPath": "/opt/x.jar"}})
    conf = session_conf(kafka.model_copy(update={"spark": spark}), "x")
    assert conf["spark.driver.extraClassPath"].split(":") == ["/opt/x.jar", str(jar.resolve())]
    assert conf["spark.hadoop.fs.file.impl"] == "io.kappaflow.hadoop.NioLocalFileSystem"


def test_a_users_jvm_options_keep_the_log_configuration(kafka: Settings) -> None:
    def with_conf(conf: dict[str, str]) -> Settings:
        return kafka.model_copy(update={"spark": kafka.spark.model_copy(update={"conf": conf})})

    ours = session_conf(with_conf({}), "x")["spark.driver.extraJavaOptions"]
    log, *archive = ours.split(" ", 1)
    assert log.startswith("-Dlog4j2.configurationFile=file:")
    assert archive == [a for a in [archive_options(kafka)] if a is not None]
    options = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}
    conf = session_conf(with_conf(options), "x")
    assert conf["spark.driver.extraJavaOptions"] == f"{ours} -XX:+UseSerialGC"


def test_a_real_time_driver_gets_its_slots_and_the_users_options_win() -> None:
    wait = "spark.shuffle.streaming.networkBufferMaxWaitTimeMs"
    local = load_settings(spark={"master": "local[*]", "conf": {"spark.x": "1"}})
    assert real_time_spark(local, 4) == SettingsOverrides(
        spark_master="local[4]", spark_conf={**REAL_TIME_CONF, "spark.x": "1"}
    )
    mine = load_settings(spark={"master": "spark://h:7077", "conf": {wait: "20"}})
    assert real_time_spark(mine, 4) == SettingsOverrides(
        spark_master="spark://h:7077", spark_conf={wait: "20"}
    )


def test_streaming_round_trip(
    spark: SparkSession, kafka: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    source, dest = new_topic(partitions=2), new_topic()
    producer = Producer(kafka.kafka.client_config())
    sent: list[dict[str, Any]] = [{"user": f"u{n % 7}", "n": n} for n in range(200)]
    for event in sent:
        producer.produce(source, key=str(event["user"]).encode(), value=json.dumps(event).encode())
    assert producer.flush(30) == 0

    schema = "user STRING, n INT"
    events = read_stream(spark, kafka, source).select(
        F.col("key"), F.from_json(F.col("value").cast("string"), schema).alias("e")
    )
    doubled = events.select(
        F.col("key"),
        F.to_json(F.struct(F.col("e.user").alias("user"), (F.col("e.n") * 2).alias("twice"))).alias(
            "value"
        ),
    )
    query = (
        write_stream(doubled, kafka, dest)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None

    received = _values(kafka, dest)
    assert sorted((r["user"], r["twice"]) for r in received) == sorted(
        (e["user"], 2 * e["n"]) for e in sent
    )
    assert read_batch(spark, kafka, dest).count() == len(sent)


def test_clean_job_runs_as_its_own_process(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str], topic_name: str
) -> None:
    source = new_topic(partitions=2)
    dest = f"{topic_name}-out"
    job = f"clean-{topic_name}"
    good = [{"id": n, "kind": "view"} for n in range(20)]
    producer = Producer(kafka.kafka.client_config())
    for event in good:
        producer.produce(source, value=json.dumps(event).encode(), key=str(event["id"]).encode())
    bad = [b"not json", b"[1, 2]", b"\xff\xfe"]
    for raw in bad:
        producer.produce(source, value=raw, partition=0)
    assert producer.flush(30) == 0

    started = start_clean_job(cli, job, source, dest)
    assert started.code == 0, started.err
    jobs = JobManager(kafka)
    record = jobs.get(job)
    assert record.state == "running" and record.pid is not None
    listed = {r["name"]: r for r in map(json.loads, cli("jobs", "list", "--json").lines())}
    assert listed[job]["state"] == "running" and listed[job]["pid"] == record.pid
    # With a local master, nothing of the job listens beyond loopback.
    driver = psutil.Process(record.pid)
    listening = [
        c.laddr
        for process in (driver, *driver.children(recursive=True))
        for c in process.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening, "the driver listens on no port at all"
    assert all(is_loopback(a.ip) for a in listening), listening

    def arrived(topic: str, count: int) -> list[dict[str, object]] | None:
        values = _values(kafka, topic) if topic_exists(kafka, topic) else []
        return values if len(values) >= count else None

    out = wait_for(lambda: arrived(dest, len(good)), timeout=120, what="cleaned events")
    assert sorted(int(str(v["id"])) for v in out) == list(range(20))
    # Each record keeps its key and says where it came from.
    for message in read_records(kafka.kafka, dest, start=StartAt(beginning=True)):
        value = json.loads(message.value() or b"null")
        headers = {
            k: v.decode() if isinstance(v, bytes) else str(v)
            for k, v in list(message.headers() or [])
        }
        assert message.key() == str(value["id"]).encode()
        assert headers["kf.topic"] == source
        origin = next(
            m
            for m in read_records(
                kafka.kafka,
                source,
                start=StartAt(offset=int(headers["kf.offset"])),
                partition=int(headers["kf.partition"]),
                max_records=1,
            )
        )
        assert json.loads(origin.value() or b"null") == value
    dead = wait_for(lambda: arrived(f"{job}.dlq", len(bad)), timeout=60, what="dead letters")
    assert sorted(base64.b64decode(str(d["value_base64"])) for d in dead) == sorted(bad)
    assert {d["error"] for d in dead} == {"not valid JSON", "not a JSON object"}
    assert all(d["source_topic"] == source for d in dead)

    stopped = cli("jobs", "stop", job)
    assert stopped.code == 0, stopped.err
    assert jobs.get(job).state == "stopped"
    assert cli("jobs", "stop", job).code == 1

    # Started again, the job resumes from its checkpoint: new events only, none twice.
    producer.produce(source, value=json.dumps({"id": 20, "kind": "view"}).encode())
    assert producer.flush(30) == 0
    assert start_clean_job(cli, job, source, dest).code == 0
    out = wait_for(lambda: arrived(dest, len(good) + 1), timeout=120, what="the new event")
    assert sorted(int(str(v["id"])) for v in out) == list(range(21))
    assert "running" in cli("jobs", "logs", job, "-n", "200").out

    # A crashed driver is reported as such.
    pid = jobs.get(job).pid
    assert pid is not None
    import os

    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: True if jobs.get(job).state == "crashed" else None,
        timeout=30,
        what="the job to be seen as crashed",
    )


def test_a_job_that_does_not_start_in_time_is_stopped(
    kafka: Settings, new_topic: Callable[..., str], topic_name: str
) -> None:
    jobs = JobManager(kafka)
    job = f"slow-{topic_name}"
    params = {"source": new_topic(), "dest": f"{topic_name}-out"}
    with pytest.raises(JobError, match="did not start within 1s and was stopped"):
        jobs.start(job, "clean", params, timeout=1.0)  # a driver takes seconds to start
    assert jobs.get(job).state not in ("starting", "running")
    assert not jobs.get(job).pid or ManagedProcess.exited(jobs.get(job).pid or 0)


def topic_exists(settings: Settings, topic: str) -> bool:
    from kappaflow.kafka.topics import list_topics

    return any(row["name"] == topic for row in list_topics(settings.kafka))


def test_clean_job_in_real_time_mode(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str], topic_name: str
) -> None:
    """Stateless pipelines run in Spark 4.3's real-time mode: long-running tasks, no batches."""
    source, dest, job = new_topic(), f"{topic_name}-rt", f"rt-{topic_name}"
    started = start_clean_job(cli, job, source, dest, "-P", "trigger=realtime")
    assert started.code == 0, started.err
    producer = Producer(kafka.kafka.client_config())
    for n in range(5):
        producer.produce(source, value=json.dumps({"n": n}).encode())
    producer.produce(source, value=b"{oops")
    assert producer.flush(30) == 0

    def output(topic: str, count: int) -> list[dict[str, object]] | None:
        values = _values(kafka, topic) if topic_exists(kafka, topic) else []
        return values if len(values) >= count else None

    cleaned = wait_for(lambda: output(dest, 5), timeout=120, what="real-time output")
    assert sorted(int(str(v["n"])) for v in cleaned) == list(range(5))
    dead = wait_for(lambda: output(f"{job}.dlq", 1), timeout=60, what="a real-time dead letter")
    assert dead[0]["error"] == "not valid JSON"
    assert cli("jobs", "stop", job).code == 0
