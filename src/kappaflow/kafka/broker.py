"""The embedded Kafka broker: one KRaft node (broker + controller) in a JVM of its own.

Its storage is formatted on first start; data, logs, configuration and the pid file live
under ``<state_dir>/kafka``. Stopping sends SIGTERM (Kafka's shutdown hook does a
controlled shutdown) and kills after a timeout; a restart keeps every topic and record.
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from kappaflow.errors import (
    PortInUseError,
    ServiceExitedError,
    ServiceStartTimeoutError,
    StateDirError,
)
from kappaflow.install.artifacts import kafka_broker_jars
from kappaflow.install.java import find_java
from kappaflow.procs import ManagedProcess, ProcState, port_in_use, tail
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

_LOG4J2 = """\
status = warn
appender.file.type = RollingFile
appender.file.name = SERVER
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = SERVER
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


@dataclass(frozen=True)
class BrokerStatus:
    state: ProcState
    pid: int | None
    bootstrap: str
    data_dir: Path
    started_at: float | None = None


class EmbeddedBroker:
    """Start, stop and inspect the single-node broker described by ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "kafka").resolve()
        self.data_dir = self.home / "data"
        self.log_dir = self.home / "logs"
        self.config_file = self.home / "server.properties"
        self.process = ManagedProcess(
            "Kafka broker", self.home / "broker.pid", (f"-Dkappaflow.kafka.home={self.home}",)
        )

    @property
    def bootstrap(self) -> str:
        return f"{self.settings.kafka.host}:{self.settings.kafka.port}"

    def status(self) -> BrokerStatus:
        proc = self.process.status()
        return BrokerStatus(proc.state, proc.pid, self.bootstrap, self.data_dir, proc.started_at)

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the broker and wait until it answers; False if it was already running."""
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        java = find_java()
        classpath = kafka_broker_jars(self.settings)
        kafka = self.settings.kafka
        for port in (kafka.port, kafka.controller_port):
            if port_in_use(kafka.host, port):
                raise PortInUseError(
                    f"port {kafka.host}:{port} is already in use: stop what holds it or choose "
                    "other ports (KAPPAFLOW_KAFKA__PORT, KAPPAFLOW_KAFKA__CONTROLLER_PORT)"
                )
        self._prepare_dirs()
        self._write_config()
        jvm = [
            str(java.executable),
            f"-Xmx{kafka.heap}",
            f"-Xms{kafka.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dkappaflow.kafka.home={self.home}",
            "-cp",
            os.pathsep.join(str(jar) for jar in classpath),
        ]
        if not (self.data_dir / "meta.properties").exists():
            self._format(jvm)
        self.process.spawn(
            [*jvm, "kafka.Kafka", str(self.config_file)], log_file=self.log_dir / "broker.out"
        )
        self._wait_ready(timeout)
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Controlled shutdown, then SIGKILL after ``timeout``; False if it was not running."""
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)

    def logs(self, lines: int = 50) -> list[str]:
        return tail(self.log_dir / "server.log", lines)

    def _prepare_dirs(self) -> None:
        try:
            for path in (self.home, self.data_dir, self.log_dir):
                path.mkdir(parents=True, exist_ok=True)
            probe = self.home / ".writable"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.home} is not writable ({exc.strerror}): "
                "choose another with --state-dir or KAPPAFLOW_STATE_DIR"
            ) from None

    def _write_config(self) -> None:
        kafka = self.settings.kafka
        host = kafka.host
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{host}:{kafka.controller_port}",
            "listeners": f"PLAINTEXT://{host}:{kafka.port},CONTROLLER://{host}:{kafka.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{kafka.port},"
            f"CONTROLLER://{host}:{kafka.controller_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # One node: nobody else can join a group, so waiting for them only adds latency.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
        }
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(_LOG4J2)

    def _format(self, jvm: list[str]) -> None:
        cluster_id = _cluster_id()
        result = subprocess.run(
            [
                *jvm,
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(self.config_file),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            reason = (result.stderr or result.stdout).strip().splitlines()
            raise ServiceExitedError(
                f"formatting Kafka storage failed: {reason[-1] if reason else '?'}"
            )
        (self.home / "cluster.id").write_text(cluster_id + "\n")

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": "0"})
        pid = self.process.status().pid

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = tail(self.log_dir / "broker.out", 5) or self.logs(5)
                raise ServiceExitedError(
                    "Kafka broker exited during start-up: "
                    + (last[-1] if last else f"see {self.log_dir}")
                )
            try:
                metadata = admin.list_topics(timeout=1.0)
            except Exception:
                return None
            return True if metadata.brokers else None

        try:
            wait_for(ready, timeout=timeout, interval=0.3, what="the Kafka broker to answer")
        except TimeoutError:
            self.stop(timeout=5)
            raise ServiceStartTimeoutError(
                f"Kafka broker did not answer on {self.bootstrap} within {timeout:.0f}s; "
                f"see {self.log_dir / 'server.log'}"
            ) from None


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not '-'-led."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value
