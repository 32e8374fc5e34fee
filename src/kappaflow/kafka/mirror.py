"""Replication to a backup cluster: MirrorMaker 2 in a JVM of its own.

The configured Kafka (embedded or external) is the primary; the mirror copies the topics
``mirror.topics`` names to the backup under the same names (MirrorMaker's
``IdentityReplicationPolicy``), each record to the same partition with its key, value,
headers and timestamp, and translates the committed offsets of the groups
``mirror.groups`` names into the backup's offsets, committing them there while the group
has no member on the backup. Its configuration, log and pid file live under
``<state_dir>/mirror``.

What a failover can lose or repeat, and the runbook: docs/deployment.md.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from kappaflow.errors import (
    InvalidSettingError,
    KafkaUnreachableError,
    KappaflowError,
    MirrorClusterUnreachableError,
    MirrorStartError,
    MirrorTargetError,
)
from kappaflow.install.artifacts import kafka_mirror_jars
from kappaflow.install.jdk import find_java
from kappaflow.kafka.clients import cluster_metadata
from kappaflow.kafka.node import rolling_log4j2, writable_dirs
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.procs import ManagedProcess, ProcState, tail
from kappaflow.settings import KafkaSettings, Settings
from kappaflow.waiting import wait_for

#: The clusters' aliases in MirrorMaker's configuration. They name its internal topics:
#: ``mm2-{offsets,configs,status}.primary.internal`` and ``primary.checkpoints.internal``
#: on the backup, ``mm2-offset-syncs.backup.internal`` on the primary.
PRIMARY, BACKUP = "primary", "backup"
STATUS_TOPIC = f"mm2-status.{PRIMARY}.internal"
CHECKPOINTS_TOPIC = f"{PRIMARY}.checkpoints.internal"
#: What MirrorMaker never replicates (its ``topics.exclude`` default), and its heartbeats.
INTERNAL_TOPICS = re.compile(r".*[\-.]internal|.*\.replica|__.*|heartbeats")

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0

_LOG4J2 = rolling_log4j2("mirror", {"org.apache.kafka.clients": "WARN", "org.reflections": "ERROR"})


@dataclass(frozen=True)
class MirrorPlan:
    """What a running mirror replicates: kept beside its configuration, so that its status
    reads the clusters it was started with, whatever the settings say now."""

    primary: str
    backup: str
    topics: str
    groups: str

    def to_json(self) -> dict[str, str]:
        return {
            "primary": self.primary,
            "backup": self.backup,
            "topics": self.topics,
            "groups": self.groups,
        }


class Mirror:
    """Start, stop and inspect the MirrorMaker of the state directory ``settings`` name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "mirror").resolve()
        self.log_dir = self.home / "logs"
        self.config_file = self.home / "mm2.properties"
        self.plan_file = self.home / "plan.json"
        self.process = ManagedProcess(
            "MirrorMaker", self.home / "mirror.pid", (f"-Dkappaflow.mirror.home={self.home}",)
        )

    @property
    def primary(self) -> KafkaSettings:
        return self.settings.kafka

    def backup(self, target: str | None = None) -> KafkaSettings:
        """The backup cluster: ``target`` over ``mirror.target``."""
        chosen = target or self.settings.mirror.target
        if not chosen:
            raise MirrorTargetError(
                "no backup cluster to mirror to: give it with `kappaflow mirror start --to "
                "HOST:PORT` or the setting mirror.target"
            )
        backup = self.settings.mirror.model_copy(update={"target": chosen}).target_kafka()
        return backup.model_copy(update={"timeout_s": self.primary.timeout_s})

    def plan(self) -> MirrorPlan | None:
        """What the mirror was last started with (None if it never was, or was stopped)."""
        try:
            data = json.loads(self.plan_file.read_text())
        except (OSError, ValueError):
            return None
        return MirrorPlan(**{k: str(data[k]) for k in ("primary", "backup", "topics", "groups")})

    def start(
        self,
        *,
        target: str | None = None,
        topics: str | None = None,
        groups: str | None = None,
        timeout: float = START_TIMEOUT_S,
    ) -> bool:
        """Start replicating and wait until MirrorMaker's source connector runs; False if a
        mirror already runs.

        Both clusters must answer first: nothing is written or started otherwise. A start
        that fails later stops MirrorMaker and removes its configuration (its log stays)."""
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        mirror = self.settings.mirror
        backup = self.backup(target)
        plan = MirrorPlan(
            primary=self.primary.bootstrap,
            backup=backup.bootstrap,
            topics=topics or mirror.topics,
            groups=groups or mirror.groups,
        )
        if set(plan.primary.split(",")) & set(plan.backup.split(",")):
            raise MirrorTargetError(
                f"the backup cluster {plan.backup} is the primary itself: mirror to another cluster"
            )
        for name, regex in (("topics", plan.topics), ("groups", plan.groups)):
            try:
                re.compile(regex)
            except re.error as exc:
                raise InvalidSettingError(
                    f"mirror {name} {regex!r} is not a regular expression: {exc}"
                ) from None
        classpath = kafka_mirror_jars(self.settings)
        java = find_java()
        _answers("primary", self.primary)
        _answers("backup", backup)
        writable_dirs(self.home, self.log_dir)
        try:
            self._write_config(plan, backup)
            argv = [
                str(java.executable),
                f"-Xmx{mirror.heap}",
                f"-Xms{mirror.heap}",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.log_dir}",
                f"-Dkappaflow.mirror.home={self.home}",
                "-cp",
                os.pathsep.join(str(jar) for jar in classpath),
                "org.apache.kafka.connect.mirror.MirrorMaker",
                str(self.config_file),
                "--clusters",
                BACKUP,
            ]
            self.process.spawn(argv, log_file=self.log_dir / "mirror.out")
            self._wait_running(backup, timeout)
        except BaseException:
            self.process.stop(timeout=10)
            self._remove_config()
            raise
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop MirrorMaker (SIGTERM: its tasks commit what they copied), SIGKILL after
        ``timeout``; False if it was not running. What the backup holds stays."""
        self.process.clear_stale()
        stopped = self.process.stop(timeout=timeout)
        self._remove_config()
        return stopped

    def logs(self, lines: int = 50) -> list[str]:
        return tail(self.log_dir / "mirror.log", lines)

    def _remove_config(self) -> None:
        # The configuration holds both clusters' passwords where they have some: it lives
        # only while the mirror runs.
        for path in (self.config_file, self.plan_file, self.home / "log4j2.properties"):
            path.unlink(missing_ok=True)

    def _write_config(self, plan: MirrorPlan, backup: KafkaSettings) -> None:
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(mm2_properties(self.settings, plan, self.primary, backup))
        (self.home / "log4j2.properties").write_text(_LOG4J2)
        self.plan_file.write_text(json.dumps(plan.to_json()) + "\n")

    def _wait_running(self, backup: KafkaSettings, timeout: float) -> None:
        pid = self.process.status().pid
        began = time.time()

        def running() -> bool | None:
            if pid is None or self.process.exited(pid):
                # Its own log's last error; else what the JVM said before it had a log
                # (a bad -Xmx, a missing class).
                errors = [ln for ln in self.logs(200) if " ERROR " in ln][-1:]
                said = errors or [ln for ln in tail(self.log_dir / "mirror.out", 3) if ln]
                raise MirrorStartError(
                    "MirrorMaker exited during start-up: "
                    + (" / ".join(said) if said else f"see {self.log_dir}")
                )
            states = connector_states(backup, since_ms=int(began * 1000), timeout=2.0)
            return True if states.get("MirrorSourceConnector") == "RUNNING" else None

        try:
            wait_for(running, timeout=timeout, interval=1.0, what="MirrorMaker to replicate")
        except TimeoutError:
            raise MirrorStartError(
                f"MirrorMaker's source connector did not run within {timeout:.0f}s; see "
                f"{self.log_dir / 'mirror.log'}"
            ) from None


def _answers(role: str, kafka: KafkaSettings) -> None:
    """A clear error, naming the cluster, if ``kafka`` does not answer."""
    try:
        cluster_metadata(kafka)
    except KafkaUnreachableError as exc:
        raise MirrorClusterUnreachableError(
            f"the {role} cluster at {kafka.bootstrap} does not answer ({exc}): nothing was started"
        ) from None


def java_client_properties(kafka: KafkaSettings) -> dict[str, str]:
    """A cluster's Java client properties: the ones Spark's connector gets, unprefixed."""
    return {k.removeprefix("kafka."): v for k, v in kafka.spark_kafka_options().items()}


def mm2_properties(
    settings: Settings, plan: MirrorPlan, primary: KafkaSettings, backup: KafkaSettings
) -> str:
    """MirrorMaker's configuration: one flow, primary to backup, names unchanged."""
    mirror = settings.mirror
    flow = f"{PRIMARY}->{BACKUP}"
    rf = str(mirror.replication_factor)
    props: dict[str, str] = {"clusters": f"{PRIMARY}, {BACKUP}"}
    for alias, kafka in ((PRIMARY, primary), (BACKUP, backup)):
        for key, value in java_client_properties(kafka).items():
            props[f"{alias}.{key}"] = value
    props.update(
        {
            f"{flow}.enabled": "true",
            f"{BACKUP}->{PRIMARY}.enabled": "false",
            f"{flow}.topics": plan.topics,
            f"{flow}.groups": plan.groups,
            # Names stay the same on the backup, so consumers and jobs fail over by
            # changing only their bootstrap servers. (A cycle is then MirrorMaker's to
            # avoid no longer: never run the reverse flow beside this one.)
            "replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
            # Only committed records: a job's transactions aborted on the primary must not
            # appear as records on the backup.
            f"{PRIMARY}.consumer.isolation.level": "read_committed",
            "sync.group.offsets.enabled": "true",
            "sync.group.offsets.interval.seconds": str(mirror.sync_interval_s),
            "emit.checkpoints.interval.seconds": str(mirror.sync_interval_s),
            # The source task writes an offset mapping every offset.lag.max records, and
            # the partition's latest at each offset flush: with this interval, a partition
            # that went quiet is translated exactly within one sync.
            f"{BACKUP}.offset.flush.interval.ms": str(mirror.sync_interval_s * 1000),
            "offset.lag.max": str(mirror.offset_lag_max),
            "refresh.topics.interval.seconds": str(mirror.refresh_interval_s),
            "refresh.groups.interval.seconds": str(mirror.refresh_interval_s),
            # ACLs are each cluster's own (kappaflow acls); mirroring them half-way (MM2
            # copies only READ rules, as READ) would surprise more than help.
            "sync.topic.acls.enabled": "false",
            "tasks.max": "1",
            "replication.factor": rf,
            "checkpoints.topic.replication.factor": rf,
            "heartbeats.topic.replication.factor": rf,
            "offset-syncs.topic.replication.factor": rf,
            "offset.storage.replication.factor": rf,
            "status.storage.replication.factor": rf,
            "config.storage.replication.factor": rf,
            # Kafka's own plugins declare themselves: without these, MirrorMaker scans its
            # whole classpath by reflection first (18 s on two cores). Once for its own
            # configuration, once for the flow's Connect worker.
            "plugin.discovery": "service_load",
            f"{BACKUP}.plugin.discovery": "service_load",
        }
    )
    return "".join(f"{key} = {_escape(value)}\n" for key, value in props.items())


def _escape(value: str) -> str:
    """A value as a Java properties file reads it back."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def plan_or_settings(mirror: Mirror) -> dict[str, Any]:
    """The running mirror's plan, else what a start would use now (no target: None)."""
    plan = mirror.plan()
    if plan is not None:
        return plan.to_json()
    settings = mirror.settings
    return {
        "primary": settings.kafka.bootstrap,
        "backup": settings.mirror.target,
        "topics": settings.mirror.topics,
        "groups": settings.mirror.groups,
    }


def connector_states(
    backup: KafkaSettings, *, since_ms: int = 0, timeout: float | None = None
) -> dict[str, str]:
    """Each MirrorMaker connector's latest state (``RUNNING``, ``FAILED``, …) as its
    status topic on the backup holds it, from records written at or after ``since_ms``
    (a previous run's states are no answer); empty if the backup does not answer."""
    kafka = backup if timeout is None else backup.model_copy(update={"timeout_s": timeout})
    states: dict[str, tuple[int, str]] = {}
    try:
        for message in read_records(kafka, STATUS_TOPIC, start=StartAt(beginning=True)):
            key = (message.key() or b"").decode()
            if not key.startswith("status-connector-"):
                continue
            stamp = message.timestamp()[1]
            if stamp < since_ms:
                continue
            value = message.value()
            state = json.loads(value)["state"] if value else "DELETED"
            name = key.removeprefix("status-connector-")
            if stamp >= states.get(name, (-1, ""))[0]:
                states[name] = (stamp, str(state))
    except (KappaflowError, KafkaException, ValueError):
        return {}
    return {name: state for name, (_, state) in sorted(states.items())}
