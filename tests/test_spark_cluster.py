"""Jobs on a Spark standalone cluster (a master and a worker on this machine): the clean
pipeline, and a user's job whose code the cluster gets only by the job shipping it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from confluent_kafka import Producer
from conftest import RunCli, start_clean_job
from live_jobs import send_json, stop_if_running, topic_values, wait_job

from kappaflow.kafka.records import StartAt, read_records
from kappaflow.settings import Settings
from kappaflow.streams.lake_read import read_arrow
from kappaflow.waiting import wait_for

# Starts services of its own.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A standalone master and one worker from PySpark's own distribution."""
    home = Path(pyspark.__file__).parent
    work = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = _distinct_ports(3)
    # The standalone master and worker listen on loopback only, as the tests' drivers do.
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(work),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    spark_class = str(home / "bin" / "spark-class")
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (
            (
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(ui),
                ],
            ),
            (
                "worker",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "2",
                    "--memory",
                    "2g",
                    "--webui-port",
                    str(worker_ui),
                    "--work-dir",
                    str(work / "work"),
                ],
            ),
        ):
            with open(work / f"{name}.log", "ab") as log:
                procs.append(
                    subprocess.Popen(
                        [spark_class, *argv],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
        status_url = f"http://127.0.0.1:{ui}/json/"
        wait_for(
            lambda: True if _alive_workers(status_url) == 1 else None,
            timeout=120,
            what="the standalone worker to register",
        )
        yield url, status_url
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)


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


def _alive_workers(status_url: str) -> int | None:
    try:
        return int(_master_state(status_url).get("aliveworkers", 0))
    except OSError:
        return None


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
        except Exception:
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
