"""Jobs on a Spark standalone cluster (a master and a worker on this machine): the clean
pipeline, and a user's job whose code the cluster gets only by the job shipping it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Producer
from conftest import RunCli, run_kappaflow, start_clean_job
from live_jobs import send_json, stop_if_running, topic_values, wait_job

from kappaflow.errors import TopicNotFoundError
from kappaflow.iot.registry import register
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import COMPACTED, create_topic
from kappaflow.settings import Settings
from kappaflow.spark.standalone import StandaloneCluster
from kappaflow.streams.output.lake_read import read_arrow
from kappaflow.timeutil import from_epoch_ms, iso
from kappaflow.waiting import wait_for
from test_counting import DEFINITION, changelog, events, expected, store_counts, wait_stats
from test_iot_learning import noise, readings

# Starts a cluster of its own, and kills one of its workers.
pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture(scope="module")
def standalone(
    kafka: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A standalone master and two one-core workers, started by `kappaflow spark start`
    (from PySpark's own distribution), in a state directory of their own."""
    port, ui = _distinct_ports(2)
    spark = kafka.spark.model_copy(update={"cluster_port": port, "cluster_ui_port": ui})
    own = kafka.model_copy(
        update={"state_dir": tmp_path_factory.mktemp("standalone"), "spark": spark}
    )
    env = {"KAPPAFLOW_SPARK__CLUSTER_PORT": str(port), "KAPPAFLOW_SPARK__CLUSTER_UI_PORT": str(ui)}
    started = run_kappaflow(
        own, "spark", "start", "--workers", "2", "--cores", "1", "--memory", "1g", env=env
    )
    assert started.code == 0, started.err
    try:
        status = json.loads(run_kappaflow(own, "spark", "status", "--json", env=env).out)
        assert status["alive_workers"] == 2 and status["cores"] == 2, status
        # `kappaflow status` lists the cluster's daemons while they run.
        services = run_kappaflow(own, "status", "--json", env=env).lines()
        listed = {(row["service"], row["state"]) for row in map(json.loads, services)}
        assert {("spark-master", "running"), ("spark-worker-1", "running")} <= listed, listed
        CLUSTERS[status["master"]] = StandaloneCluster(own)
        yield status["master"], f"{status['ui']}/json/"
    finally:
        # `kappaflow down` stops the cluster with everything else of the state directory.
        stopped = run_kappaflow(own, "down", env=env)
        assert stopped.code == 0, stopped.err
    assert "spark master stopped" in stopped.err, stopped.err
    after = json.loads(run_kappaflow(own, "spark", "status", "--json", env=env).out)
    assert {d["state"] for d in after["daemons"]} == {"stopped"}, after


#: The cluster of each master URL the fixture started (to find a worker to kill).
CLUSTERS: dict[str, StandaloneCluster] = {}


def _distinct_ports(n: int) -> list[int]:
    """``n`` free ports, all different: each is held while the next is picked (two picks
    one after the other can be the same port, and two JVMs starting at once then race
    for it: the master's status page was once a worker's)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _master_state(status_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(status_url, timeout=5) as response:
        state: dict[str, Any] = json.loads(response.read())
        return state


def _worker_of(status_url: str, pid: int) -> dict[str, Any]:
    """The master's entry of the worker whose process is ``pid`` (by the ports it
    listens on)."""
    listening = {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    workers: list[dict[str, Any]] = _master_state(status_url)["workers"]
    [worker] = [w for w in workers if w["port"] in listening]
    return worker


def _executors(status_url: str, app_id: str) -> dict[str, int]:
    """The executors of application ``app_id`` on each alive worker that has any, as the
    workers' own status pages (the master's JSON gives their addresses) list them."""
    found: dict[str, int] = {}
    for worker in _master_state(status_url)["workers"]:
        if worker["state"] != "ALIVE":
            continue
        state = _master_state(f"{worker['webuiaddress']}/json/")
        n = sum(1 for e in state["executors"] if e["appid"] == app_id)
        if n:
            found[worker["id"]] = n
    return found


def test_clean_job_on_a_standalone_cluster(
    standalone: tuple[str, str],
    cli: RunCli,
    kafka: Settings,
    new_topic: Callable[..., str],
    topic_name: str,
) -> None:
    url, status_url = standalone
    source, dest, job = new_topic(), f"{topic_name}-out", f"cluster-{topic_name}"
    producer = Producer(kafka.kafka.client_config())
    for n in range(50):
        producer.produce(source, value=json.dumps({"n": n}).encode())
    assert producer.flush(30) == 0

    started = start_clean_job(cli, job, source, dest, global_args=("--spark-master", url))
    assert started.code == 0, started.err
    apps = _master_state(status_url)["activeapps"]
    assert f"kappaflow:{job}" in [app["name"] for app in apps]

    def cleaned() -> list[int] | None:
        try:
            values = [
                json.loads(m.value() or b"{}")["n"]
                for m in read_records(kafka.kafka, dest, start=StartAt(beginning=True))
            ]
        except TopicNotFoundError:  # the job has not created it yet
            return None
        return values if len(values) >= 50 else None

    assert sorted(wait_for(cleaned, timeout=180, what="the cluster's output")) == list(range(50))
    assert cli("jobs", "stop", job).code == 0


# A user's module the cluster's Python workers cannot import unless the job ships it:
# the UDF is pickled by reference to ``shout``.
USER_MODULE = """
from dataclasses import dataclass

from pyspark.sql import functions as F
from pyspark.sql.types import StringType

import kappaflow as kf


def shout(word):
    return word.upper() + "!"


@dataclass
class Word:
    word: str
    at: kf.EventTime


def build(job):
    words = job.source(job.param("topic"), Word)
    loud = words.with_column("loud", F.udf(shout, StringType())("word"))
    loud.select("loud").to(kf.topic(job.param("out")), kf.lake("loud"), name="loud")
"""


def test_a_user_job_on_a_standalone_cluster_with_hadoop_uris(
    standalone: tuple[str, str],
    cli: RunCli,
    kafka: Settings,
    new_topic: Callable[..., str],
    topic_name: str,
    tmp_path: Path,
) -> None:
    url, status_url = standalone
    module = f"shipped_{topic_name.replace('-', '_')}"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{module}.py").write_text(USER_MODULE)
    source, dest, job = new_topic(), f"{topic_name}-loud", f"user-{topic_name}"
    words = [{"word": f"w{n}", "at": 1_795_428_000_000 + n} for n in range(20)]
    send_json(kafka, source, words, key="word")

    # Checkpoints and the lake as Hadoop URIs, not plain paths.
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "code"), os.environ.get("PYTHONPATH", "")]),
        "KAPPAFLOW_CHECKPOINT_DIR": (tmp_path / "checkpoints").as_uri(),
        "KAPPAFLOW_LAKE_DIR": (tmp_path / "lake").as_uri(),
    }
    started = cli(
        "--spark-master", url, "jobs", "start", job, "--app", f"{module}:build",
        "-P", f"topic={source}", "-P", f"out={dest}",
        env=env,
    )  # fmt: skip
    assert started.code == 0, started.err
    apps = _master_state(status_url)["activeapps"]
    assert f"kappaflow:{job}" in [app["name"] for app in apps]

    def shouted() -> list[str] | None:
        values = [v["loud"] for v in topic_values(kafka, dest)]
        return values if len(values) >= 20 else None

    try:
        loud = wait_job(kafka, job, shouted, what="the cluster's output")
    finally:
        stop_if_running(kafka, job)
    assert sorted(loud) == sorted(f"W{n}!" for n in range(20))
    assert (tmp_path / "checkpoints" / job / "loud" / "commits").is_dir()
    lake = read_arrow((tmp_path / "lake").as_uri() + f"/{job}/loud").to_pylist()
    assert sorted(r["loud"] for r in lake) == sorted(loud)


# Three waits of up to 300 s each after the job starts: pytest's timeout must not cut
# them short.
@pytest.mark.timeout(1200)
def test_the_iot_application_on_a_standalone_cluster(
    standalone: tuple[str, str], cli: RunCli, serving: Settings, topic_name: str
) -> None:
    """The IoT application's job, cleaning, training, scoring and alerting, with its tasks
    on the cluster's executors: readings are cleaned, learnt, scored with the model the
    trainer published, and a spike raises an alert."""
    url, status_url = standalone
    job = f"iot-cluster-{topic_name}"
    t = {name: f"{topic_name}-{name}" for name in ("raw", "registry", "clean", "models")}
    t |= {name: f"{topic_name}-{name}" for name in ("scores", "alerts")}
    for name in ("raw", "clean", "scores"):
        create_topic(serving.kafka, t[name], partitions=2)
    create_topic(serving.kafka, t["models"], partitions=1, configs=dict(COMPACTED))
    register(serving.kafka, {"d1": "token"}, topic=t["registry"])
    params = {
        "parts": "clean,train,score,alerts",
        "clean.source": t["raw"],
        "clean.registry": t["registry"],
        "clean.dest": t["clean"],
        "train.source": t["clean"],
        "train.dest": t["models"],
        "score.source": t["clean"],
        "score.models": t["models"],
        "score.dest": t["scores"],
        "alerts.source": t["scores"],
        "alerts.dest": t["alerts"],
    }
    options = [arg for key, value in params.items() for arg in ("-P", f"{key}={value}")]
    app = ("jobs", "start", job, "--app", "kappaflow.iot.app:build", *options)
    started = cli("--spark-master", url, *app)
    assert started.code == 0, started.err
    try:
        apps = _master_state(status_url)["activeapps"]
        assert f"kappaflow:{job}" in [a["name"] for a in apps], "the job does not run there"
        values = noise(130, 9)
        values[120:123] = [v + 20.0 for v in values[120:123]]  # a spike of 40 spreads
        sent = readings("d1", "cpu_temp", values)
        send_json(serving, t["raw"], sent[:60], key="device")
        wait_for(
            lambda: True if topic_values(serving, t["models"]) else None,
            timeout=300,
            what="a model from the cluster's trainer",
        )
        send_json(serving, t["raw"], sent[60:], key="device")

        def scored() -> list[dict[str, Any]] | None:
            found = {s["id"]: s for s in topic_values(serving, t["scores"])}
            later = [found.get(r["id"]) for r in sent[60:]]
            return None if None in later else [s for s in later if s is not None]

        later = wait_for(scored, timeout=300, what="the later readings' scores")
        assert all(s["model_version"] for s in later), "scored with the published model"
        # The spike's first reading alarms; the default model (likelihood) alarms once
        # per incident, holding the two after it below the alert score.
        assert later[60]["score"] >= 0.5 > max(s["score"] for s in later[:55])

        def alerted() -> list[dict[str, Any]] | None:
            raised = [a for a in topic_values(serving, t["alerts"]) if a["rule"] == "anomaly"]
            return raised or None

        raised = wait_for(alerted, timeout=300, what="the spike's alert")
        assert [(a["device"], a["metric"], a["status"]) for a in raised[:1]] == [
            ("d1", "cpu_temp", "raised")
        ]
    finally:
        stop_if_running(serving, job)


def test_counting_on_the_cluster_is_exact_through_a_killed_worker(
    standalone: tuple[str, str], cli: RunCli, serving: Settings, new_topic: Callable[..., str]
) -> None:
    """The counting job's executors on two workers; one worker is killed with SIGKILL
    (its executor goes with it) while the job counts: the other takes its tasks, and the
    counts are exact. Last in the file: the cluster has one worker after it."""
    url, status_url = standalone
    source = new_topic(partitions=2)
    job = f"count-cluster-{source}"
    before, after = events(40), events(40, start=40)
    send_json(serving, source, before, key="page")
    started = cli("--spark-master", url, "count", "start", job, "--source", source, *DEFINITION)
    assert started.code == 0, started.err
    try:
        wait_stats(serving, job, counted=1)
        [app] = [a for a in _master_state(status_url)["activeapps"] if a["name"].endswith(job)]
        pid = CLUSTERS[url].worker_pid(1)
        assert pid is not None
        killed = _worker_of(status_url, pid)
        # The job's executors, one a worker (each has one core), the killed one's among them.
        placed = wait_for(
            lambda: found if len(found := _executors(status_url, app["id"])) == 2 else None,
            timeout=120,
            what="an executor of the job on each worker",
        )
        assert placed[killed["id"]] == 1
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: True if _master_state(status_url)["aliveworkers"] == 1 else None,
            timeout=120,
            what="the master to see the worker gone",
        )
        left = _executors(status_url, app["id"])
        assert killed["id"] not in left and sum(left.values()) < sum(placed.values()), left
        send_json(serving, source, after, key="page")
        wait_stats(serving, job, counted=len(before) + len(after))
    finally:
        stop_if_running(serving, job)
    assert store_counts(serving, job) == expected(before + after)
    wanted = expected(before + after)
    changes = changelog(serving, job)
    latest = {(c["key"], c["window_start"]): c["count"] for c in changes}
    assert latest == {(page, iso(from_epoch_ms(at))): n for (page, at), n in wanted.items()}
