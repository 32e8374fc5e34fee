"""Test fixtures: one real Kafka broker and one SparkSession for the whole session.

Set KAPPAFLOW_TEST_BOOTSTRAP_SERVERS=host:port to run the suite against an existing
Kafka cluster instead of the embedded broker. Every test works on fresh topic names.

Tiers (pytest markers, pyproject.toml): a test that uses a service fixture is marked
``integration`` here; modules that start services of their own mark themselves; every
other test is ``unit``, the tier ``make check`` runs while editing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import file_weights
import pytest
from pyspark.sql import SparkSession

from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.topics import create_topic
from kappaflow.procs import free_port
from kappaflow.settings import Settings, load_settings

REPO = Path(__file__).resolve().parent
JARS = Path(os.environ.get("KAPPAFLOW_TEST_JARS_DIR", REPO / ".kappaflow" / "jars"))
EXTERNAL_KAFKA = os.environ.get("KAPPAFLOW_TEST_BOOTSTRAP_SERVERS")

#: Spark options of every driver the tests start. A job's driver in a test lives a minute
#: or two, and on two cores HotSpot's optimising compiler (C2) took half of such a
#: driver's CPU in that time, compiling code it would not run long enough to pay back:
#: the tests' drivers compile with C1 only. The session every worker shares gets the same,
#: on purpose: each of its harness runs plans and compiles queries of its own, short-lived
#: too. (A long-running job keeps C2: benchmarks/iot-latency.md.) With C1 only the
#: JVM reserves 48 MiB for compiled code instead of 240 MiB, which a driver of the IoT
#: demo's four queries filled within three minutes ("Out of space in CodeCache"): the
#: tests' drivers reserve the default's 240 MiB.
TEST_SPARK_CONF = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
}
#: The same for the embedded brokers the tests start, each of which lives minutes: C1
#: only halves the CPU a broker takes to start (7.4 against 4.3 CPU seconds here).
TEST_KAFKA_JVM = ["-XX:TieredStopAtLevel=1"]

#: Set by CI (.ci/run): a test that would skip, for something this machine lacks (mosquitto,
#: root to capture loopback traffic, javac), fails instead, so that a green run means
#: every test of the tier ran.
NO_SKIPS = os.environ.get("KAPPAFLOW_TEST_NO_SKIPS") == "1"

#: Fixtures that bring up a real service: a test using one is an integration test.
SERVICE_FIXTURES = frozenset({"kafka", "serving", "spark", "cli", "new_topic"})


def pytest_addoption(parser: pytest.Parser) -> None:
    file_weights.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    # Each test file's seconds in a real run of its tier, to run the longest first.
    file_weights.configure(config)
    # The user's own KAPPAFLOW_* settings must not leak into the tests, nor into the
    # processes they start.
    for key in [k for k in os.environ if k.startswith("KAPPAFLOW_") and "_TEST_" not in k]:
        del os.environ[key]


#: The files whose tests use the service's test job (``served``): make test gives them
#: to one worker together, so that the job runs once, not on every worker; their tests'
#: seconds together are their weight. The other files weigh their recorded seconds
#: (tests/support/file_weights.py): the heaviest run first.
SERVED_FILES = frozenset(
    {
        "test_api.py",
        "test_api_push.py",
        "test_api_sql.py",
        "test_api_metrics.py",
        "test_api_topics.py",
        "test_dashboard.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    weights = file_weights.file_weights(config)
    served = sum(weights.get(name, 0.0) for name in SERVED_FILES)

    def weight(item: pytest.Item) -> float:
        return served if item.path.name in SERVED_FILES else weights.get(item.path.name, 0.0)

    # Stable: each file's tests keep their order.
    items.sort(key=lambda item: -weight(item))
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "served" in fixtures and item.path.name not in SERVED_FILES:
            raise pytest.UsageError(
                f"{item.path.name} uses the fixture `served`: add it to SERVED_FILES"
            )
        if "peer_engines" in fixtures and item.get_closest_marker("peers") is None:
            item.add_marker(pytest.mark.peers)
        if SERVICE_FIXTURES & fixtures and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
        if not any(item.get_closest_marker(m) for m in ("integration", "peers")):
            item.add_marker(pytest.mark.unit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report: pytest.TestReport = yield
    if NO_SKIPS and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped ({reason}), which KAPPAFLOW_TEST_NO_SKIPS=1 refuses"
    return report


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadfile``: whole files to each worker, SERVED_FILES as one."""
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    if config.getoption("dist") != "loadfile":
        return None
    # Files in collection order (the slowest first, above), not xdist's default of the
    # files with the most tests first, which left the slowest files, of one or two tests
    # each, to the end of the run.
    config.option.loadscopereorder = False

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope = str(super()._split_scope(nodeid))
            return "served-files" if Path(scope).name in SERVED_FILES else scope

    return Scheduling(config, log)


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # a Java socket on ::ffff:127.0.0.1
    return address.is_loopback


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment variables that make a `kappaflow` process use ``settings``."""
    env = {
        "KAPPAFLOW_STATE_DIR": str(settings.state_dir),
        "KAPPAFLOW_JARS_DIR": str(settings.jars_path),
        "KAPPAFLOW_KAFKA__PORT": str(settings.kafka.port),
        "KAPPAFLOW_KAFKA__CONTROLLER_PORT": str(settings.kafka.controller_port),
        "KAPPAFLOW_REDIS__PORT": str(settings.redis.port),
        "KAPPAFLOW_MQTT__PORT": str(settings.mqtt.port),
        "KAPPAFLOW_API__PORT": str(settings.api.port),
        "KAPPAFLOW_SPARK__MASTER": settings.spark.master,
        "KAPPAFLOW_SPARK__SHUFFLE_PARTITIONS": str(settings.spark.shuffle_partitions),
    }
    if settings.spark.conf:
        env["KAPPAFLOW_SPARK__CONF"] = json.dumps(settings.spark.conf)
    if settings.kafka.jvm_options:
        env["KAPPAFLOW_KAFKA__JVM_OPTIONS"] = json.dumps(settings.kafka.jvm_options)
    if settings.kafka.bootstrap_servers:
        env["KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS"] = settings.kafka.bootstrap_servers
    return env


def make_settings(state_dir: Path, **kafka: object) -> Settings:
    return load_settings(
        state_dir=state_dir,
        jars_dir=JARS,
        kafka=kafka
        or {"port": free_port(), "controller_port": free_port(), "jvm_options": TEST_KAFKA_JVM},
        redis={"port": free_port()},
        mqtt={"port": free_port()},
        api={"port": free_port()},
        spark={"master": "local[2]", "shuffle_partitions": 2, "conf": dict(TEST_SPARK_CONF)},
    )


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    state_dir = tmp_path_factory.mktemp("state")
    if EXTERNAL_KAFKA:
        return make_settings(state_dir, bootstrap_servers=EXTERNAL_KAFKA)
    return make_settings(state_dir)


@pytest.fixture(scope="session")
def kafka(settings: Settings) -> Iterator[Settings]:
    """Settings whose Kafka is running: the embedded broker, or the external cluster."""
    if not settings.kafka.embedded:
        yield settings
        return
    broker = EmbeddedBroker(settings)
    broker.start()
    try:
        yield settings
    finally:
        broker.stop()


@pytest.fixture
def new_topic(kafka: Settings) -> Callable[..., str]:
    """Create a topic with a name no other test uses."""

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        create_topic(kafka.kafka, name, partitions=partitions)
        return name

    return make


@pytest.fixture
def offline(tmp_path: Path) -> Settings:
    """Settings of a state directory of its own, whose services are not running."""
    return make_settings(tmp_path / "state")


@pytest.fixture
def topic_name() -> str:
    """A fresh name for a topic that does not exist yet."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def spark(kafka: Settings) -> Iterator[SparkSession]:
    from kappaflow.iot.jvm.scorer import scorer_jar
    from kappaflow.spark.session import build_session

    # With the IoT scorer's classes, which tests call directly (test_iot_jvm_scorer.py), as
    # the real-time scorer's driver has them.
    jar = scorer_jar(kafka)
    if jar is not None:
        conf = {**kafka.spark.conf, "spark.jars": str(jar.resolve())}
        kafka = kafka.model_copy(update={"spark": kafka.spark.model_copy(update={"conf": conf})})
    session = build_session(kafka, "kappaflow-tests")
    try:
        yield session
    finally:
        session.stop()


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return [line for line in self.out.splitlines() if line.strip()]


RunCli = Callable[..., Result]


def error_line(result: Result, code: str, exit_status: int, program: str = "kappaflow") -> str:
    """The one error line of a failed command: the last on stderr (after any progress
    messages), ``PROGRAM: error[CODE]: …``, with exit status ``exit_status`` and no
    traceback."""
    assert "Traceback" not in result.err, result.err
    lines = [line for line in result.err.splitlines() if line.startswith(f"{program}: error")]
    assert len(lines) == 1, result.err
    assert result.err.rstrip().endswith(lines[0])
    assert lines[0].startswith(f"{program}: error[{code}]: "), lines[0]
    assert result.code == exit_status, (result.code, lines[0])
    return lines[0]


def executable(path: Path, body: str) -> Path:
    """A shell script at ``path`` (a stand-in for a program, such as an old ``java``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def run_kappaflow(
    settings: Settings,
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> Result:
    """Run the real `kappaflow` command in a process of its own."""
    full_env = {**os.environ, **settings_env(settings), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "kappaflow", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli(kafka: Settings) -> RunCli:
    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        return run_kappaflow(kafka, *args, input=input, env=env)

    return run


def start_clean_job(
    cli: RunCli,
    job: str,
    source: str,
    dest: str,
    *params: str,
    global_args: tuple[str, ...] = (),
) -> Result:
    """`kappaflow jobs start` of the clean pipeline from ``source`` to ``dest``."""
    return cli(
        *global_args,
        "jobs",
        "start",
        job,
        "--pipeline",
        "clean",
        "-P",
        f"source={source}",
        "-P",
        f"dest={dest}",
        *params,
    )


@pytest.fixture(scope="session")
def served(serving: Settings) -> Iterator[Any]:
    """The service's test job (tests/support/served.py), running: once per test worker,
    shared by every test of the service (tests/support/service.py)."""
    from service import run_served

    with run_served(serving) as running:
        yield running


@pytest.fixture(scope="session")
def serving(kafka: Settings) -> Iterator[Settings]:
    """Settings whose Redis (the serving store) is running, as well as Kafka."""
    from kappaflow.serving.redis_server import EmbeddedRedis

    store = EmbeddedRedis(kafka)
    store.start()
    try:
        yield kafka
    finally:
        store.stop()
